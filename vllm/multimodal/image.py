"""Decode untrusted image bytes safely: format and declared size are checked from the
header before any pixel is decoded, so a decompression bomb costs nothing."""
from __future__ import annotations

import hashlib
import io
import warnings

from PIL import Image

from vllm import envs

# Formats Pillow may decode here; anything else (PSD, TIFF, EPS, ...) is refused before
# its decoder runs.
ALLOWED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")


class MediaError(ValueError):
    """A media input the server refuses (a 400 naming `field`)."""

    def __init__(self, message: str, field: str = "messages") -> None:
        super().__init__(message)
        self.field = field


def max_image_pixels() -> int:
    """The largest width x height an image may declare (VLLM_MAX_IMAGE_PIXELS)."""
    return envs.VLLM_MAX_IMAGE_PIXELS


def check_pixels(width: int, height: int, limit: int) -> None:
    """MediaError when an image's declared size is above `limit` pixels."""
    if width <= 0 or height <= 0:
        raise MediaError(f"The image declares an empty size ({width}x{height}).")
    if width * height > limit:
        raise MediaError(f"The image declares {width}x{height} = {width * height} pixels, "
                         f"more than the {limit} allowed (VLLM_MAX_IMAGE_PIXELS); send a "
                         "smaller image.")


def decode_image(data: bytes, limit: int | None = None) -> Image.Image:
    """`data` as an RGB image. Refused (MediaError) before decoding: bytes Pillow cannot
    identify, a format outside ALLOWED_FORMATS, a declared size above `limit` pixels."""
    limit = max_image_pixels() if limit is None else limit
    try:
        with warnings.catch_warnings():  # its size is checked below, against our own cap
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)  # the header only
    except Image.DecompressionBombError:  # Pillow's own cap (2x its MAX_IMAGE_PIXELS)
        raise MediaError(f"The image declares more pixels than the {limit} allowed "
                         "(VLLM_MAX_IMAGE_PIXELS); send a smaller image.") from None
    except Exception:
        raise MediaError("The image could not be decoded: the bytes are not an image in a "
                         f"supported format ({', '.join(ALLOWED_FORMATS)}).") from None
    check_pixels(image.width, image.height, limit)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image.load()
            return image.convert("RGB")
    except Exception:
        raise MediaError(f"The {image.format} image could not be decoded: its data is "
                         "truncated or corrupt.") from None


def as_rgb(image: object) -> Image.Image:
    """An offline prompt's image (a PIL image) as RGB; anything else is a ValueError."""
    if not isinstance(image, Image.Image):
        raise ValueError(f"multi_modal_data['image'] must be a PIL.Image.Image (or a list of "
                         f"them); got {type(image).__name__}.")
    return image if image.mode == "RGB" else image.convert("RGB")


def image_hash(image: Image.Image) -> str:
    """A digest of the decoded pixels (size, mode and bytes), never of where they came
    from: equal pictures from different URLs hash alike, different pictures never do."""
    digest = hashlib.sha256(f"{image.mode}:{image.width}x{image.height}:".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()
