"""Tiny NomicBERT and GTE ("new") checkpoints, and a float64 reference to check them against.

Both architectures' modeling code ships with their checkpoints (trust_remote_code), which
cannot be fetched here, so the reference is written from the architectures' description:
a post-norm BERT without absolute positions (word + token-type embeddings, LayerNorm),
rotate-half rotary on queries and keys (GTE: fixed NTK scaling, base * f and frequencies
/ f ** (2/d)), softmax attention over a padded batch with a key-padding mask, a gated MLP
(NomicBERT: fc2(fc11(x) * silu(fc12(x))); GTE: down(up * gelu(gate)), [up; gate] =
up_gate_proj(x)), LayerNorm after each residual add. The checkpoints carry the real
models' tensor names and config keys (nomic: `n_embd`, `n_head`, `rotary_emb_base`, ...).
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

VOCAB = 30528  # nomic's padded BERT vocabulary; the bundled BERT tokenizer uses 30522
HIDDEN, HEADS, LAYERS, INNER = 64, 4, 2, 96


def nomic_config(**changes) -> dict:
    cfg = {"architectures": ["NomicBertModel"], "model_type": "nomic_bert",
           "activation_function": "swiglu", "n_embd": HIDDEN, "n_head": HEADS,
           "n_layer": LAYERS, "n_inner": INNER, "n_positions": 8192,
           "max_trained_positions": 2048, "rotary_emb_base": 500, "rotary_emb_fraction": 1.0,
           "rotary_emb_interleaved": False, "rotary_emb_scale_base": None,
           "rotary_scaling_factor": None, "qkv_proj_bias": False, "mlp_fc1_bias": False,
           "mlp_fc2_bias": False, "prenorm": False, "layer_norm_epsilon": 1e-12,
           "type_vocab_size": 2, "vocab_size": VOCAB, "causal": False}
    cfg.update(changes)
    return cfg


def gte_config(arch: str = "GteNewModel", **changes) -> dict:
    cfg = {"architectures": [arch], "model_type": "gte", "hidden_size": HIDDEN,
           "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
           "intermediate_size": INNER, "hidden_act": "gelu", "max_position_embeddings": 8192,
           "rope_theta": 20000.0, "rope_scaling": {"type": "ntk", "factor": 4.0},
           "type_vocab_size": 1, "layer_norm_eps": 1e-12, "vocab_size": VOCAB,
           "position_embedding_type": "rope", "layer_norm_type": "layer_norm",
           "logn_attention_scale": False, "pack_qkv": True, "pad_token_id": 0}
    cfg.update(changes)
    return cfg


def _tensors(cfg: dict, seed: int, prefix: str = "", num_labels: int = 0) -> dict:
    """Seeded weights under the real checkpoints' names; biases only where the config has
    them (nomic: qkv_proj_bias / mlp_fc1_bias / mlp_fc2_bias; GTE: all but up_gate_proj)."""
    gen = torch.Generator().manual_seed(seed)
    nomic = cfg["model_type"] == "nomic_bert"
    h, i = HIDDEN, INNER
    out: dict[str, torch.Tensor] = {}

    def mat(name: str, rows: int, cols: int, bias: bool) -> None:
        out[name + ".weight"] = torch.randn(rows, cols, generator=gen) / math.sqrt(cols)
        if bias:
            out[name + ".bias"] = torch.randn(rows, generator=gen) * 0.1

    def norm(name: str) -> None:
        out[name + ".weight"] = 1 + torch.randn(h, generator=gen) * 0.1
        out[name + ".bias"] = torch.randn(h, generator=gen) * 0.1

    out["embeddings.word_embeddings.weight"] = torch.randn(VOCAB, h, generator=gen)
    if cfg["type_vocab_size"]:
        out["embeddings.token_type_embeddings.weight"] = torch.randn(
            cfg["type_vocab_size"], h, generator=gen) * 0.5
    norm("emb_ln" if nomic else "embeddings.LayerNorm")
    for n in range(LAYERS):
        if nomic:
            p, qb = f"encoder.layers.{n}.", cfg["qkv_proj_bias"]
            mat(p + "attn.Wqkv", 3 * h, h, qb), mat(p + "attn.out_proj", h, h, qb)
            mat(p + "mlp.fc11", i, h, cfg["mlp_fc1_bias"])
            mat(p + "mlp.fc12", i, h, cfg["mlp_fc1_bias"])
            mat(p + "mlp.fc2", h, i, cfg["mlp_fc2_bias"]), norm(p + "norm1"), norm(p + "norm2")
        else:
            p = f"encoder.layer.{n}."
            mat(p + "attention.qkv_proj", 3 * h, h, True), mat(p + "attention.o_proj", h, h, True)
            mat(p + "mlp.up_gate_proj", 2 * i, h, False), mat(p + "mlp.down_proj", h, i, True)
            norm(p + "attn_ln"), norm(p + "mlp_ln")
    if num_labels:
        mat("pooler.dense", h, h, True)
    out = {prefix + k: v.contiguous() for k, v in out.items()}
    if num_labels:
        mat("classifier", num_labels, h, True)
    return out


def write_checkpoint(path, cfg: dict, seed: int = mf.SEED, prefix: str = "",
                     num_labels: int = 0) -> pathlib.Path:
    path = mf._fresh(path)
    if num_labels:
        cfg = {**cfg, "num_labels": num_labels}
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(_tensors(cfg, seed, prefix, num_labels), str(path / "model.safetensors"),
              metadata={"format": "pt"})
    # XLM-R / bert-base tokenizers of the real models emit no token types on pairs for GTE
    mf.save_bert_tokenizer(path, None if cfg["model_type"] == "nomic_bert"
                           else ["input_ids", "attention_mask"])
    return path


def write_mean_st_files(path, hidden: int, prompts: dict[str, str],
                        transformer: str = mf.ST_TRANSFORMER) -> None:
    """sentence-transformers files of a MEAN-pooled, normalised embedder with `prompts`
    (nomic-embed-text's and jina-embeddings-v3's layout; `transformer`: module 0's type)."""
    path = pathlib.Path(path)
    pooling = {"word_embedding_dimension": hidden, "pooling_mode_mean_tokens": True,
               "pooling_mode_cls_token": False, "pooling_mode_lasttoken": False}
    modules = [{"idx": 0, "name": "0", "path": "", "type": transformer},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": mf.ST_POOLING},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": mf.ST_NORMALIZE}]
    for sub in ("1_Pooling", "2_Normalize"):
        (path / sub).mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": prompts, "default_prompt_name": None}))


# --------------------------------------------------------------------------- reference

def _lin(w: dict, name: str, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w[name + ".weight"], w.get(name + ".bias"))


def _ln(w: dict, name: str, x: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], w[name + ".weight"], w[name + ".bias"], eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary: pairs (x_j, x_{j+d/2}) turn by position * inv_freq_j."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def reference_hidden(model_dir, batch: Sequence[Sequence[int]],
                     ntk: Optional[bool] = None) -> list[torch.Tensor]:
    """Final hidden states [n_i, H] (float64) of each id list, run as one padded batch.
    `ntk=False` leaves GTE's rope scaling out (to show it matters)."""
    model_dir = pathlib.Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    w = {k.removeprefix("new."): v.double()
         for k, v in load_file(str(model_dir / "model.safetensors")).items()}
    nomic = cfg["model_type"] == "nomic_bert"
    h, heads = (cfg["n_embd"], cfg["n_head"]) if nomic else (cfg["hidden_size"],
                                                            cfg["num_attention_heads"])
    eps = cfg["layer_norm_epsilon" if nomic else "layer_norm_eps"]
    base = float(cfg["rotary_emb_base" if nomic else "rope_theta"])
    scaling = None if nomic else cfg.get("rope_scaling")
    f = float(scaling["factor"]) if scaling and ntk is not False else 1.0
    d = h // heads
    inv = 1.0 / (base * f) ** (torch.arange(0, d, 2, dtype=torch.float64) / d) / f ** (2 / d)
    n = max(len(ids) for ids in batch)
    ids = torch.tensor([list(s) + [0] * (n - len(s)) for s in batch])
    keep = torch.tensor([[j < len(s) for j in range(n)] for s in batch])
    angles = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)

    x = w["embeddings.word_embeddings.weight"][ids]
    if "embeddings.token_type_embeddings.weight" in w:
        x = x + w["embeddings.token_type_embeddings.weight"][0]
    x = _ln(w, "emb_ln" if nomic else "embeddings.LayerNorm", x, eps)
    bsz = len(batch)
    for layer in range(cfg["n_layer" if nomic else "num_hidden_layers"]):
        p = f"encoder.layers.{layer}." if nomic else f"encoder.layer.{layer}."
        qkv = _lin(w, p + ("attn.Wqkv" if nomic else "attention.qkv_proj"), x)
        q, k, v = (t.view(bsz, n, heads, d).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(bsz, n, h)
        x = _ln(w, p + ("norm1" if nomic else "attn_ln"),
                x + _lin(w, p + ("attn.out_proj" if nomic else "attention.o_proj"), attn), eps)
        if nomic:
            mlp = _lin(w, p + "mlp.fc2", _lin(w, p + "mlp.fc11", x) *
                       F.silu(_lin(w, p + "mlp.fc12", x)))
        else:
            up, gate = _lin(w, p + "mlp.up_gate_proj", x).chunk(2, dim=-1)
            mlp = _lin(w, p + "mlp.down_proj", up * F.gelu(gate))
        x = _ln(w, p + ("norm2" if nomic else "mlp_ln"), x + mlp, eps)
    return [x[b, :len(s)] for b, s in enumerate(batch)]


def reference_logits(model_dir, batch: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """The reranker's logits: classifier(tanh(pooler.dense(CLS state)))."""
    w = {k.removeprefix("new."): v.double() for k, v in
         load_file(str(pathlib.Path(model_dir) / "model.safetensors")).items()}
    return [_lin(w, "classifier", torch.tanh(_lin(w, "pooler.dense", hid[0])))
            for hid in reference_hidden(model_dir, batch)]


# --------------------------------------------------------------------------- transformers 5

def transformers_config(arch: str):
    """A tiny config of transformers 5's own NomicBert / Gte classes (standard key names)."""
    import transformers
    cls = {"NomicBertModel": transformers.NomicBertConfig,
           "GteModel": transformers.GteConfig}[arch]
    return cls(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=HEADS,
               num_hidden_layers=LAYERS, intermediate_size=INNER, max_position_embeddings=512,
               architectures=[arch], pad_token_id=0)


def write_transformers_checkpoint(path, arch: str, renamed: bool = False) -> pathlib.Path:
    """transformers' own class, seeded and perturbed, saved by `save_pretrained` (which
    writes the original checkpoint names); `renamed`: the tensors under transformers'
    in-memory names instead (`layers.N.self_attn.q_proj`, ...)."""
    import transformers
    path = mf._fresh(path)
    torch.manual_seed(mf.SEED + 7)
    model = getattr(transformers, arch)(transformers_config(arch))
    mf._perturb(model)
    mf._save(model, path)
    if renamed:
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    mf.save_bert_tokenizer(path)
    return path


def transformers_hidden(path, ids: Sequence[int]) -> torch.Tensor:
    from transformers import AutoModel
    model = AutoModel.from_pretrained(str(path)).eval()
    with torch.inference_mode():
        return model(input_ids=torch.tensor([list(ids)])).last_hidden_state[0].double()
