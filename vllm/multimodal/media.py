"""Where an image may come from, as the operator allows (safer than upstream's default):

- `data:` URLs (base64): always;
- local files (`file://` URLs): only under `--allowed-local-media-path`;
- `http(s)://` URLs: refused unless `--allowed-media-domains` names the host, and then
  fetched with a timeout (VLLM_IMAGE_FETCH_TIMEOUT) and a size cap (VLLM_MEDIA_MAX_BYTES).
Every refusal is a `MediaError` (a 400), decided before any pixel is decoded.
"""
from __future__ import annotations

import base64
import binascii
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from PIL import Image

from vllm import envs
from vllm.multimodal.image import MediaError, decode_image


@dataclass(frozen=True)
class MediaPolicy:
    """The operator's media settings (from `ModelConfig`)."""

    allowed_local_media_path: Optional[str] = None
    allowed_media_domains: tuple[str, ...] = ()
    max_bytes: int = field(default_factory=lambda: envs.VLLM_MEDIA_MAX_BYTES)
    timeout_s: float = field(default_factory=lambda: envs.VLLM_IMAGE_FETCH_TIMEOUT)
    max_pixels: int = field(default_factory=lambda: envs.VLLM_MAX_IMAGE_PIXELS)

    def load_image(self, url: str, field_name: str = "messages") -> Image.Image:
        """The image at `url`, decoded safely; MediaError when the policy refuses it."""
        if not isinstance(url, str) or not url:
            raise MediaError("image_url.url must be a non-empty string.", field_name)
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme == "data":
            data = self._data_url(url, field_name)
        elif scheme == "file":
            data = self._local_file(url, field_name)
        elif scheme in ("http", "https"):
            data = self._fetch(url, field_name)
        else:
            raise MediaError(f"Unsupported image URL scheme {scheme or url[:16]!r}: send a "
                             "data: URL (base64), or a file:// URL under the server's "
                             "--allowed-local-media-path.", field_name)
        try:
            return decode_image(data, self.max_pixels)
        except MediaError as exc:
            raise MediaError(str(exc), field_name) from None

    def _too_big(self, size: int, field_name: str) -> MediaError:
        return MediaError(f"The image is {size} bytes, more than the {self.max_bytes} "
                          "allowed (VLLM_MEDIA_MAX_BYTES).", field_name)

    def _data_url(self, url: str, field_name: str) -> bytes:
        header, sep, payload = url.partition(",")
        if not sep or not header.lower().endswith(";base64"):
            raise MediaError("A data: URL must be base64: data:image/png;base64,<data>.",
                             field_name)
        if len(payload) * 3 // 4 > self.max_bytes:
            raise self._too_big(len(payload) * 3 // 4, field_name)
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise MediaError("The data: URL's payload is not valid base64.", field_name) \
                from None

    def _local_file(self, url: str, field_name: str) -> bytes:
        if not self.allowed_local_media_path:
            raise MediaError("Local files are not allowed: start the server with "
                             "--allowed-local-media-path DIR to serve images under DIR.",
                             field_name)
        parsed = urllib.parse.urlparse(url)
        if parsed.netloc not in ("", "localhost"):
            raise MediaError("A file:// URL must name a local path (file:///path).", field_name)
        root = Path(self.allowed_local_media_path).resolve()
        path = Path(urllib.parse.unquote(parsed.path)).resolve()
        if not path.is_relative_to(root):
            raise MediaError(f"The file is outside the allowed local media path {root}.",
                             field_name)
        if not path.is_file():
            raise MediaError("The file does not exist under the allowed local media path.",
                             field_name)
        size = path.stat().st_size
        if size > self.max_bytes:
            raise self._too_big(size, field_name)
        return path.read_bytes()

    def _fetch(self, url: str, field_name: str) -> bytes:
        host = (urllib.parse.urlparse(url).hostname or "").lower()
        if host not in self.allowed_media_domains:
            raise MediaError(f"Fetching images over http(s) is not allowed for host "
                             f"{host!r}: send a data: URL, or start the server with "
                             "--allowed-media-domains naming the host.", field_name)
        try:
            opener = urllib.request.build_opener(_AllowedRedirects(self.allowed_media_domains))
            with opener.open(url, timeout=self.timeout_s) as response:
                declared = response.headers.get("Content-Length")
                if declared and declared.isdigit() and int(declared) > self.max_bytes:
                    raise self._too_big(int(declared), field_name)
                data = response.read(self.max_bytes + 1)
        except MediaError:
            raise
        except Exception as exc:
            raise MediaError(f"The image could not be fetched from {host}: "
                             f"{type(exc).__name__}.", field_name) from None
        if len(data) > self.max_bytes:
            raise self._too_big(len(data), field_name)
        return data


class _AllowedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to an http(s) URL on an allowed host."""

    def __init__(self, allowed: tuple[str, ...]) -> None:
        super().__init__()
        self.allowed = allowed

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102
        target = urllib.parse.urlparse(newurl)
        if target.scheme not in ("http", "https") or \
                (target.hostname or "").lower() not in self.allowed:
            raise MediaError(f"The image URL redirects to {target.hostname!r}, which "
                             "--allowed-media-domains does not name.")
        return super().redirect_request(req, fp, code, msg, headers, newurl)
