"""Tiny seeded dual encoders (CLIP, SigLIP) built with Transformers at test time, test images
made with Pillow in memory, and the Transformers references they are checked against."""
from __future__ import annotations

import base64
import io
import pathlib
import struct
import zlib

import torch
from PIL import Image, ImageDraw

from model_factory import BERT_VOCAB, SEED, _fresh, _perturb, _save, hf_tokenizer, \
    save_bert_tokenizer

SEP_ID = 102  # the BERT tokenizer's [SEP]: the tiny text towers' EOS
TEXTS = ["a photo of a cat", "hello world"]


def _towers(text_cls, vision_cls, **vision_extra):
    # head size 16: the CPU_NATIVE kernel runs it (causal for CLIP's text, else not)
    text = text_cls(vocab_size=BERT_VOCAB, hidden_size=64, intermediate_size=128,
                    num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
                    eos_token_id=SEP_ID, pad_token_id=0)
    vision = vision_cls(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, image_size=32, patch_size=8, **vision_extra)
    return text, vision


def make_clip(path, seed: int = SEED + 20) -> pathlib.Path:
    """CLIPModel: 64-wide towers of 2 layers, 32x32 images in 8x8 patches, projection 16."""
    from transformers import (CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTextConfig,
                              CLIPVisionConfig)
    path = _fresh(path)
    torch.manual_seed(seed)
    text, vision = _towers(CLIPTextConfig, CLIPVisionConfig)
    model = CLIPModel(CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                 projection_dim=16))
    _perturb(model)
    _save(model, path)
    save_bert_tokenizer(path, model_input_names=["input_ids", "attention_mask"])
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
                       ).save_pretrained(str(path))
    return path


def make_siglip(path, seed: int = SEED + 21) -> pathlib.Path:
    """SiglipModel: 64-wide towers of 2 layers, 32x32 images in 8x8 patches."""
    from transformers import (SiglipConfig, SiglipImageProcessor, SiglipModel,
                              SiglipTextConfig, SiglipVisionConfig)
    path = _fresh(path)
    torch.manual_seed(seed)
    text, vision = _towers(SiglipTextConfig, SiglipVisionConfig)
    model = SiglipModel(SiglipConfig(text_config=text.to_dict(), vision_config=vision.to_dict()))
    _perturb(model)
    _save(model, path)
    save_bert_tokenizer(path, model_input_names=["input_ids", "attention_mask"])
    SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(str(path))
    return path


# --------------------------------------------------------------------------- images
def picture(seed: int, size: tuple[int, int] = (48, 40)) -> Image.Image:
    """A seeded RGB picture: a background and a few shapes."""
    gen = torch.Generator().manual_seed(seed)
    colors = [tuple(int(c) for c in torch.randint(0, 256, (3,), generator=gen))
              for _ in range(4)]
    img = Image.new("RGB", size, colors[0])
    draw = ImageDraw.Draw(img)
    w, h = size
    draw.rectangle([w // 8, h // 8, w // 2, h // 2], fill=colors[1])
    draw.ellipse([w // 3, h // 3, w - 2, h - 2], fill=colors[2])
    draw.line([0, h - 1, w - 1, 0], fill=colors[3], width=3)
    return img


def encoded(img: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def png_declaring(width: int, height: int) -> bytes:
    """A small valid PNG whose header is rewritten to declare width x height pixels (a
    decompression bomb's header: decoding it would need width * height * 3 bytes)."""
    data = bytearray(encoded(Image.new("RGB", (8, 8), (9, 9, 9))))
    ihdr = 8 + 8  # signature, then the IHDR chunk's length and type
    data[ihdr:ihdr + 8] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[12:ihdr + 13]))
    data[ihdr + 13:ihdr + 17] = struct.pack(">I", crc)
    return bytes(data)


# --------------------------------------------------------------------------- references
def hf_features(path, texts=(), images=()) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Transformers' get_text_features (one text at a time, no padding) and
    get_image_features (the slow image processor), L2-normalised, in float32."""
    from transformers import AutoImageProcessor, AutoModel
    model = AutoModel.from_pretrained(str(path), dtype=torch.float32).eval()
    tok = hf_tokenizer(path)
    proc = AutoImageProcessor.from_pretrained(str(path), backend="pil")
    out_t, out_i = [], []
    with torch.inference_mode():
        for t in texts:
            ids = torch.tensor([tok(t)["input_ids"]])
            out_t.append(_unit(model.get_text_features(input_ids=ids)))
        for img in images:
            pixels = proc(images=[img], return_tensors="pt")["pixel_values"]
            out_i.append(_unit(model.get_image_features(pixel_values=pixels)))
    return out_t, out_i


def references(path) -> dict[str, list[torch.Tensor]]:
    """Transformers' unit embeddings of TEXTS and of pictures 1 and 2."""
    texts, images = hf_features(path, TEXTS, [picture(1), picture(2)])
    return {"text": texts, "image": images}


def _unit(x) -> torch.Tensor:
    x = getattr(x, "pooler_output", x)
    return torch.nn.functional.normalize(x.reshape(-1).float(), dim=-1)
