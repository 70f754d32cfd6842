"""Tiny seeded dual encoders (CLIP, SigLIP) built with Transformers at test time, test images
made with Pillow in memory, and the Transformers references they are checked against."""
from __future__ import annotations

import base64
import io
import pathlib
import struct
import zlib
from typing import Optional

import torch
from PIL import Image, ImageDraw

from model_factory import BERT_VOCAB, SEED, _fresh, _perturb, _save, hf_tokenizer, \
    save_bert_tokenizer

SEP_ID = 102  # the BERT tokenizer's [SEP]: the tiny text towers' EOS
TEXTS = ["a photo of a cat", "hello world"]


def _towers(text_cls, vision_cls, vocab_size: int = BERT_VOCAB, eos: int = SEP_ID,
            pad: int = 0, **vision_extra):
    # head size 16: the CPU_NATIVE kernel runs it (causal for CLIP's text, else not)
    text = text_cls(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                    num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
                    eos_token_id=eos, pad_token_id=pad)
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


# The tiny SentencePiece model's training text: every rotation of a fixed word list.
SPIECE_WORDS = ("a photo of a cat dog hello world the picture red blue green car tree house "
                "two small big white black sky river").split()


def save_siglip_tokenizer(path: pathlib.Path, image_processor=None):
    """A real SiglipTokenizer (SentencePiece unigram, trained here deterministically on
    SPIECE_WORDS: one thread, fixed options; <pad>=0, </s>=1 as pad and EOS, <unk>=2,
    model_max_length 64) saved as spiece.model in `path`, with a SiglipProcessor when
    `image_processor` is given. Returns the tokenizer."""
    import sentencepiece as spm
    from transformers import SiglipProcessor, SiglipTokenizer
    w = SPIECE_WORDS
    lines = [" ".join(w[i:] + w[:i]) for i in range(len(w))]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(path / "spiece"), vocab_size=80,
        hard_vocab_limit=False, model_type="unigram", pad_id=0, eos_id=1, unk_id=2,
        bos_id=-1, pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>", num_threads=1,
        minloglevel=2)
    tok = SiglipTokenizer(str(path / "spiece.model"), model_max_length=64)
    (path / "spiece.vocab").unlink()
    if image_processor is None:
        tok.save_pretrained(str(path))
    else:
        SiglipProcessor(image_processor=image_processor, tokenizer=tok).save_pretrained(
            str(path))
    return tok


def make_siglip(path, seed: int = SEED + 21) -> pathlib.Path:
    """SiglipModel: 64-wide towers of 2 layers, 32x32 images in 8x8 patches; its real
    (SentencePiece) tokenizer and processor, the text vocabulary the tokenizer's."""
    from transformers import (SiglipConfig, SiglipImageProcessor, SiglipModel,
                              SiglipTextConfig, SiglipVisionConfig)
    path = _fresh(path)
    tok = save_siglip_tokenizer(path, SiglipImageProcessor(size={"height": 32, "width": 32}))
    torch.manual_seed(seed)
    text, vision = _towers(SiglipTextConfig, SiglipVisionConfig, vocab_size=len(tok),
                           eos=tok.eos_token_id, pad=tok.pad_token_id)
    text.bos_token_id = None  # SigLIP's tokenizer adds no BOS
    model = SiglipModel(SiglipConfig(text_config=text.to_dict(), vision_config=vision.to_dict()))
    _perturb(model)
    _save(model, path)
    return path


def make_siglip2(path, seed: int = SEED + 24) -> pathlib.Path:
    """Siglip2Model: SigLIP's tiny towers, the vision one at native aspect ratio (a 4x4
    position grid resized per image, at most 16 patches of 8x8)."""
    from transformers import (Siglip2Config, Siglip2ImageProcessor, Siglip2Model,
                              Siglip2TextConfig, Siglip2VisionConfig)
    path = _fresh(path)
    torch.manual_seed(seed)
    text, vision = _towers(Siglip2TextConfig, Siglip2VisionConfig)
    vision_dict = vision.to_dict()
    vision_dict.pop("image_size", None)
    vision_dict["num_patches"] = 16
    model = Siglip2Model(Siglip2Config(text_config=text.to_dict(), vision_config=vision_dict))
    _perturb(model)
    _save(model, path)
    save_bert_tokenizer(path, model_input_names=["input_ids", "attention_mask"])
    Siglip2ImageProcessor(patch_size=8, max_num_patches=16).save_pretrained(str(path))
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
            inputs = dict(proc(images=[img], return_tensors="pt"))
            out_i.append(_unit(model.get_image_features(**inputs)))
    return out_t, out_i


def hf_padded_text_features(path, texts) -> tuple[list[list[int]], list[torch.Tensor]]:
    """The processor's ids for `texts` with padding="max_length" and Transformers'
    get_text_features on them (no attention mask, as SigLIP was trained), normalised."""
    from transformers import AutoModel, AutoProcessor
    model = AutoModel.from_pretrained(str(path), dtype=torch.float32).eval()
    ids = AutoProcessor.from_pretrained(str(path))(text=list(texts),
                                                   padding="max_length")["input_ids"]
    with torch.inference_mode():
        feats = model.get_text_features(input_ids=torch.tensor(ids))
    feats = getattr(feats, "pooler_output", feats)
    return ids, [_unit(f) for f in feats]


def references(path) -> dict[str, list[torch.Tensor]]:
    """Transformers' unit embeddings of TEXTS and of pictures 1 and 2."""
    texts, images = hf_features(path, TEXTS, [picture(1), picture(2)])
    return {"text": texts, "image": images}


def _unit(x) -> torch.Tensor:
    x = getattr(x, "pooler_output", x)
    return torch.nn.functional.normalize(x.reshape(-1).float(), dim=-1)


# --------------------------------------------------------------------------- Qwen2-VL
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
# Qwen2-VL's chat template, reduced to what the tests use (roles, text and image parts).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}"
    "{{ m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif c['type'] == 'text' %}{{ c['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _qwen2_vl_tokenizer(path: pathlib.Path) -> dict[str, int]:
    """The small BPE tokenizer plus Qwen2-VL's vision tokens; their ids."""
    from transformers import AutoTokenizer
    from model_factory import save_bpe_tokenizer
    save_bpe_tokenizer(path)
    tok = AutoTokenizer.from_pretrained(str(path))
    tok.add_tokens(VISION_TOKENS, special_tokens=True)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(path))
    return {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}


def vlm_text_config(mrope_section: list[int], **extra) -> dict:
    """The tiny VLMs' decoder: 2 layers, hidden 64, 4 heads of 16 (2 KV heads), M-RoPE."""
    return dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                rms_norm_eps=1e-6, rope_parameters={"rope_type": "default",
                                                    "rope_theta": 10000.0,
                                                    "mrope_section": mrope_section}) | extra


def make_qwen2_vl(path, seed: int = SEED + 22, text: Optional[dict] = None,
                  vision: Optional[dict] = None, pixels: Optional[dict] = None) -> pathlib.Path:
    """Qwen2VLForConditionalGeneration: a 2-layer decoder (hidden 64, head 16, M-RoPE
    sections 2/3/3), a 2-block vision tower (patch 4, merge 2), the slow image processor;
    `text` / `vision` / `pixels` override config and image-processor sizes (benchmarks)."""
    from transformers import (Qwen2VLConfig, Qwen2VLForConditionalGeneration,
                              Qwen2VLImageProcessor)
    path = _fresh(path)
    ids = _qwen2_vl_tokenizer(path)
    torch.manual_seed(seed)
    config = Qwen2VLConfig(
        text_config=vlm_text_config([2, 3, 3]) | (text or {}),
        vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, patch_size=4,
                           spatial_merge_size=2, temporal_patch_size=2, mlp_ratio=2)
        | (vision or {}),
        image_token_id=ids["<|image_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], bos_token_id=None, eos_token_id=None)
    model = Qwen2VLForConditionalGeneration(config)
    _perturb(model)
    _save(model, path)
    sizes = dict(patch_size=4, min_pixels=8 * 8, max_pixels=64 * 64) | (pixels or {})
    Qwen2VLImageProcessor(merge_size=2, temporal_patch_size=2, **sizes).save_pretrained(str(path))
    return path


def VISION_IDS(path) -> int:  # noqa: N802
    """The `<|image_pad|>` id of a tiny Qwen2-VL checkpoint."""
    return hf_tokenizer(path).convert_tokens_to_ids("<|image_pad|>")


def vlm_text(text: str, images: int = 1, before: str = "") -> str:
    """Upstream's GME-style embedding prompt with `images` image placeholders (after
    `before`, a text ahead of them)."""
    pads = "<|vision_start|><|image_pad|><|vision_end|>" * images
    return f"<|im_start|>user\n{before}{pads}{text}<|im_end|>\n<|im_start|>assistant\n" \
        "<|endoftext|>"


def make_jina_reranker(path, src, hidden: int = 64) -> pathlib.Path:
    """jina-reranker-m0's layout on the tiny Qwen2-VL `src`: JinaVLForRanking, one label,
    a seeded `score` MLP (score.0: h -> h, score.2: h -> 1) beside the backbone."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file
    path = pathlib.Path(path)
    shutil.copytree(src, path)
    weights = load_file(str(path / "model.safetensors"))
    gen = torch.Generator().manual_seed(SEED + 23)
    for name, shape in (("score.0.weight", (hidden, hidden)), ("score.0.bias", (hidden,)),
                        ("score.2.weight", (1, hidden)), ("score.2.bias", (1,))):
        weights[name] = torch.randn(shape, generator=gen) * 0.3
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config.update(architectures=["JinaVLForRanking"], num_labels=1,
                  id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    (path / "config.json").write_text(json.dumps(config))
    return path


def jina_reference(path, query: str, document: str, images=()) -> float:
    """sigmoid(score MLP(last hidden)) of upstream's jina-reranker-m0 prompt + token 100."""
    from safetensors.torch import load_file
    text = f"**Document**:\n{document}\n**Query**:\n{query}"
    hidden = hf_vlm_last_hidden(path, text, images, suffix=[100])
    w = load_file(str(pathlib.Path(path) / "model.safetensors"))
    x = torch.relu(hidden @ w["score.0.weight"].T + w["score.0.bias"])
    return float(torch.sigmoid(x @ w["score.2.weight"].T + w["score.2.bias"]))


def hf_vlm_last_hidden(path, text: str, images=(), suffix=()) -> torch.Tensor:
    """Transformers' Qwen2-VL last-token hidden state (final norm) of one prompt."""
    from transformers import AutoImageProcessor, Qwen2VLForConditionalGeneration
    model = Qwen2VLForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32)
    tok = hf_tokenizer(path)
    ids = tok(text)["input_ids"] + list(suffix)
    kwargs = {}
    if images:
        proc = AutoImageProcessor.from_pretrained(str(path), backend="pil")
        out = proc(images=list(images), return_tensors="pt")
        merge = model.config.vision_config.spatial_merge_size
        pad = model.config.image_token_id
        expanded, grids = [], iter(out["image_grid_thw"].tolist())
        for t in ids:
            expanded += [pad] * (int(torch.tensor(next(grids)).prod()) // merge ** 2) \
                if t == pad else [t]
        ids = expanded
        kwargs = dict(pixel_values=out["pixel_values"], image_grid_thw=out["image_grid_thw"],
                      mm_token_type_ids=torch.tensor([[int(t == pad) for t in ids]]))
    with torch.inference_mode():
        out = model.model(input_ids=torch.tensor([ids]), **kwargs)
    return out.last_hidden_state[0, -1].float()
