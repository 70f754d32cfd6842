"""A tiny seeded Qwen3-VL checkpoint built with Transformers at test time (the layout
Qwen3-VL-Embedding and Qwen3-VL-Reranker use), and the Transformers references it is
checked against: Qwen3VLModel's last hidden state, and the LM head's yes/no logits."""
from __future__ import annotations

import functools
import pathlib
from typing import Sequence

import torch

from mm_models import _qwen2_vl_tokenizer, vlm_text_config
from model_factory import SEED, _fresh, _perturb, _save, hf_tokenizer

# Deepstack features are added after decoder layers 0 and 1 (of 3): vision blocks 0 and 2.
DEEPSTACK = [0, 2]
RERANKER_OVERRIDES = {"architectures": ["Qwen3VLForSequenceClassification"],
                      "classifier_from_token": ["no", "yes"],
                      "is_original_qwen3_reranker": True}


def make_qwen3_vl(path, seed: int = SEED + 30) -> pathlib.Path:
    """Qwen3VLForConditionalGeneration: a 3-layer Qwen3 decoder (hidden 64, head 16, q/k
    norms, interleaved M-RoPE sections 4/2/2), a 3-block vision tower (hidden 32, patch 4,
    merge 2, a 4x4 learned position grid, deepstack mergers after blocks 0 and 2), the
    slow Qwen2-VL image processor, the BPE tokenizer with the vision tokens (and yes/no)."""
    from transformers import (Qwen2VLImageProcessor, Qwen3VLConfig,
                              Qwen3VLForConditionalGeneration)
    path = _fresh(path)
    ids = _qwen2_vl_tokenizer(path)
    torch.manual_seed(seed)
    text = vlm_text_config([4, 2, 2], num_hidden_layers=3, head_dim=16)
    text["rope_parameters"]["mrope_interleaved"] = True
    config = Qwen3VLConfig(
        text_config=text,
        vision_config=dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2,
                           patch_size=4, spatial_merge_size=2, temporal_patch_size=2,
                           out_hidden_size=64, num_position_embeddings=16,
                           deepstack_visual_indexes=DEEPSTACK),
        image_token_id=ids["<|image_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False)
    model = Qwen3VLForConditionalGeneration(config)
    _perturb(model)
    with torch.no_grad():  # yes/no logits well apart: reranker probabilities spread from 0.5
        model.lm_head.weight.add_(torch.randn_like(model.lm_head.weight) * 0.3)
    _save(model, path)
    Qwen2VLImageProcessor(merge_size=2, temporal_patch_size=2, patch_size=4,
                          min_pixels=8 * 8, max_pixels=64 * 64).save_pretrained(str(path))
    return path


@functools.lru_cache(maxsize=4)
def _hf_model(path: str):
    from transformers import Qwen3VLForConditionalGeneration
    return Qwen3VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()


def hf_inputs(path, text: str, images: Sequence = ()) -> dict:
    """input_ids (each <|image_pad|> expanded to its merged patches) and the image inputs
    of one prompt, as Qwen3VLProcessor would hand them to the model."""
    from transformers import AutoImageProcessor
    model = _hf_model(str(path))
    ids = hf_tokenizer(path)(text)["input_ids"]
    if not images:
        return {"input_ids": torch.tensor([ids])}
    out = AutoImageProcessor.from_pretrained(str(path), backend="pil")(
        images=list(images), return_tensors="pt")
    merge = model.config.vision_config.spatial_merge_size
    pad = model.config.image_token_id
    grids = iter(out["image_grid_thw"].tolist())
    expanded: list[int] = []
    for t in ids:
        expanded += [pad] * (int(torch.tensor(next(grids)).prod()) // merge ** 2) \
            if t == pad else [t]
    return {"input_ids": torch.tensor([expanded]), "pixel_values": out["pixel_values"],
            "image_grid_thw": out["image_grid_thw"],
            "mm_token_type_ids": torch.tensor([[int(t == pad) for t in expanded]])}


def hf_last_hidden(path, text: str, images: Sequence = ()) -> torch.Tensor:
    """Qwen3VLModel's last hidden state (final norm) at the prompt's last token."""
    with torch.inference_mode():
        out = _hf_model(str(path)).model(**hf_inputs(path, text, images))
    return out.last_hidden_state[0, -1].float()


def hf_p_yes(path, text: str, images: Sequence = ()) -> float:
    """Qwen3-VL-Reranker's score: softmax over the LM head's ("no", "yes") logits at the
    last position, the probability of "yes"."""
    tok = hf_tokenizer(path)
    no, yes = tok.convert_tokens_to_ids("no"), tok.convert_tokens_to_ids("yes")
    with torch.inference_mode():
        logits = _hf_model(str(path))(**hf_inputs(path, text, images)).logits[0, -1].float()
    return float(torch.softmax(logits[[no, yes]], dim=-1)[1])


def reranker_text(query: str, document: str, images: int = 0) -> str:
    """Qwen3-VL-Reranker's prompt shape (system, then the query and the document, with the
    document's images, then the empty think block): the score is read at its last token."""
    pads = "<|vision_start|><|image_pad|><|vision_end|>" * images
    return ("<|im_start|>system\nJudge whether the Document meets the requirements based on "
            "the Query and the Instruct provided. Note that the answer can only be \"yes\" or "
            f"\"no\".<|im_end|>\n<|im_start|>user\n<Query>: {query}\n<Document>: {pads}"
            f"{document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")


def old_layout(src, dst) -> pathlib.Path:
    """`src` saved with the older names (`visual.*`, `model.*` for the decoder)."""
    import shutil

    from safetensors.torch import load_file, save_file
    dst = pathlib.Path(dst)
    shutil.copytree(src, dst)
    renamed = {}
    for name, tensor in load_file(str(dst / "model.safetensors")).items():
        for new, old in (("model.visual.", "visual."), ("model.language_model.", "model.")):
            if name.startswith(new):
                name = old + name[len(new):]
                break
        renamed[name] = tensor
    save_file(renamed, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst
