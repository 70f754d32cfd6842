"""Tiny jina-embeddings-v3 / jina-colbert-v2 checkpoints and a float64 reference for them.

The checkpoints carry the real configs' keys (`XLMRobertaModel`, model_type xlm-roberta,
position_embedding_type rotary, rotary_emb_base, lora_adaptations / lora_rank / lora_alpha,
task_instructions) and the remote "XLM-R flash" code's tensor names, the task LoRAs as
torch parametrizations (`<module>.parametrizations.weight.original` and `.0.lora_A` /
`.0.lora_B`, one adapter per task stacked on dim 0: a linear layer's A [n, r, in] and
B [n, out, r], an embedding table's A [n, V, r] and B [n, r, H]).

The reference is written from that description, one request at a time: each module's weight
with the request's task merged (W + s B A, E + s A B, s = lora_alpha / lora_rank), word +
token-type embeddings, LayerNorm, then per layer rotate-half rotary attention and a GELU MLP,
each followed by a residual add and LayerNorm (post-norm).
"""
from __future__ import annotations

import json
import math
import pathlib
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import model_factory as mf
import rope_encoder_models as rm

VOCAB = 30528
HIDDEN, HEADS, LAYERS, INNER, RANK, COLBERT_DIM = 64, 4, 2, 96, 4, 24
TASKS = ["retrieval.query", "retrieval.passage", "separation", "classification",
         "text-matching"]
INSTRUCTIONS = {"retrieval.query": "Represent the query for retrieving evidence documents: ",
                "retrieval.passage": "Represent the document for retrieval: ",
                "separation": "", "classification": "", "text-matching": ""}
_LORA = ".parametrizations.weight"


def jina_config(arch: str = "XLMRobertaModel", lora: bool = True, **changes) -> dict:
    cfg = {"architectures": [arch], "model_type": "xlm-roberta",
           "auto_map": {"AutoModel": "jinaai/xlm-roberta-flash-implementation--"
                                     "modeling_lora.XLMRobertaLoRA"},
           "hidden_size": HIDDEN, "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
           "intermediate_size": INNER, "hidden_act": "gelu", "vocab_size": VOCAB,
           "max_position_embeddings": 8194, "position_embedding_type": "rotary",
           "rotary_emb_base": 20000.0, "type_vocab_size": 1, "layer_norm_eps": 1e-5,
           "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
    if lora:
        cfg.update(lora_adaptations=TASKS, lora_rank=RANK, lora_alpha=1, lora_dropout_p=0.0,
                   task_instructions=INSTRUCTIONS, load_trained_adapters=True)
    cfg.update(changes)
    return cfg


def _tensors(cfg: dict, seed: int, colbert: bool) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    h, i, n = HIDDEN, INNER, len(cfg.get("lora_adaptations") or ())
    out: dict[str, torch.Tensor] = {}

    def lora(name: str, a: tuple, b: tuple, scale: float) -> None:
        out[name + _LORA + ".0.lora_A"] = torch.randn(n, *a, generator=gen) * scale
        out[name + _LORA + ".0.lora_B"] = torch.randn(n, *b, generator=gen) * scale

    def weight(name: str, value: torch.Tensor) -> str:
        key = name + (_LORA + ".original" if n else ".weight")
        out[key] = value
        return key

    def mat(name: str, rows: int, cols: int) -> None:
        weight(name, torch.randn(rows, cols, generator=gen) / math.sqrt(cols))
        out[name + ".bias"] = torch.randn(rows, generator=gen) * 0.1
        if n:  # big enough for the task to matter (~10% of the weight's effect)
            lora(name, (RANK, cols), (rows, RANK), 0.6 / math.sqrt(math.sqrt(cols * RANK)))

    def norm(name: str) -> None:
        out[name + ".weight"] = 1 + torch.randn(h, generator=gen) * 0.1
        out[name + ".bias"] = torch.randn(h, generator=gen) * 0.1

    for table, rows, scale in (("word_embeddings", VOCAB, 1.0), ("token_type_embeddings",
                                                                 cfg["type_vocab_size"], 0.5)):
        name = "roberta.embeddings." + table
        weight(name, torch.randn(rows, h, generator=gen) * scale)
        if n:
            lora(name, (rows, RANK), (RANK, h), 0.4)
    norm("roberta.emb_ln")
    for layer in range(LAYERS):
        p = f"roberta.encoder.layers.{layer}."
        mat(p + "mixer.Wqkv", 3 * h, h), mat(p + "mixer.out_proj", h, h)
        mat(p + "mlp.fc1", i, h), mat(p + "mlp.fc2", h, i)
        norm(p + "norm1"), norm(p + "norm2")
    mat("roberta.pooler.dense", h, h)  # unused by embeddings, as in the real checkpoint
    if colbert:
        out["linear.weight"] = torch.randn(COLBERT_DIM, h, generator=gen) / math.sqrt(h)
    return {k: v.contiguous() for k, v in out.items()}


def write_checkpoint(path, cfg: dict, seed: int = mf.SEED, colbert: bool = False,
                     mean_pooling: bool = True) -> pathlib.Path:
    """config.json, model.safetensors, a BERT tokenizer (no token types, as XLM-R's) and,
    `mean_pooling`, jina-embeddings-v3's sentence-transformers files (MEAN, Normalize, the
    task prompts)."""
    path = mf._fresh(path)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(_tensors(cfg, seed, colbert), str(path / "model.safetensors"),
              metadata={"format": "pt"})
    mf.save_bert_tokenizer(path, ["input_ids", "attention_mask"])
    if mean_pooling:
        rm.write_mean_st_files(path, HIDDEN, INSTRUCTIONS, "custom_st.Transformer")
    return path


# --------------------------------------------------------------------------- reference

def _weights(model_dir, task: Optional[str]) -> dict[str, torch.Tensor]:
    """The checkpoint in float64 with `task`'s adapter merged into every module (None: the
    plain weights), prefix `roberta.` dropped."""
    model_dir = pathlib.Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    raw = {k: v.double() for k, v in load_file(str(model_dir / "model.safetensors")).items()}
    w: dict[str, torch.Tensor] = {}
    for name, tensor in raw.items():
        if ".lora_" in name:
            continue
        if name.endswith(_LORA + ".original"):
            module = name[: -len(_LORA + ".original")]
            if task is not None:
                t = cfg["lora_adaptations"].index(task)
                a, b = raw[module + _LORA + ".0.lora_A"][t], raw[module + _LORA + ".0.lora_B"][t]
                s = cfg["lora_alpha"] / cfg["lora_rank"]
                tensor = tensor + s * (a @ b if "embeddings" in module else b @ a)
            name = module + ".weight"
        w[name.removeprefix("roberta.")] = tensor
    return w


def _ln(w: dict, name: str, x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], w[name + ".weight"], w[name + ".bias"], 1e-5)


def _lin(w: dict, name: str, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w[name + ".weight"], w[name + ".bias"])


def reference_hidden(model_dir, ids: Sequence[int], task: Optional[str]) -> torch.Tensor:
    """Final hidden states [n, H] (float64) of one request under `task`'s adapter."""
    w = _weights(model_dir, task)
    d, n = HIDDEN // HEADS, len(ids)
    inv = 1.0 / 20000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    x = w["embeddings.word_embeddings.weight"][torch.tensor(list(ids))]
    x = _ln(w, "emb_ln", x + w["embeddings.token_type_embeddings.weight"][0])
    for layer in range(LAYERS):
        p = f"encoder.layers.{layer}."
        q, k, v = (t.view(n, HEADS, d).transpose(0, 1)
                   for t in _lin(w, p + "mixer.Wqkv", x).chunk(3, dim=-1))
        scores = (rotate(q) @ rotate(k).transpose(-1, -2)) / math.sqrt(d)
        attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, HIDDEN)
        x = _ln(w, p + "norm1", x + _lin(w, p + "mixer.out_proj", attn))
        x = _ln(w, p + "norm2", x + _lin(w, p + "mlp.fc2", F.gelu(_lin(w, p + "mlp.fc1", x))))
    return x


def reference_embedding(model_dir, ids: Sequence[int], task: Optional[str]) -> torch.Tensor:
    """jina-embeddings-v3's sentence embedding: mean over the tokens, L2-normalised."""
    return F.normalize(reference_hidden(model_dir, ids, task).mean(0), dim=-1)


def reference_token_vectors(model_dir, ids: Sequence[int]) -> torch.Tensor:
    """jina-colbert-v2's token vectors: `linear` on every state, each L2-normalised."""
    w = load_file(str(pathlib.Path(model_dir) / "model.safetensors"))["linear.weight"].double()
    return F.normalize(reference_hidden(model_dir, ids, None) @ w.T, dim=-1)


def maxsim(q: torch.Tensor, d: torch.Tensor) -> float:
    return float((q @ d.T).max(dim=1).values.sum())
