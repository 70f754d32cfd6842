"""Tiny checkpoints whose model classes ship as the checkpoint's own code (config.json's
`auto_map`, a `model_type` transformers does not know), as `trust_remote_code` models do:
a BERT-like encoder (base model and a first-token classifier) and a GPT-like decoder
(base model and causal LM), written plainly in torch on transformers' PreTrainedModel.

`OWN_ATTENTION` in the modeling file picks how attention is computed: through
transformers' attention interface (`ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`,
masks from `transformers.masking_utils`), or by the class itself (a padding mask, no
external attention function).
"""
from __future__ import annotations

import functools
import pathlib

import torch

import model_factory as mf

CONFIGURATION = '''
from transformers import PretrainedConfig


class TinyRemoteConfig(PretrainedConfig):
    model_type = "tiny_remote_{kind}"

    def __init__(self, vocab_size=512, hidden_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=4, intermediate_size=128,
                 max_position_embeddings=256, layer_norm_eps=1e-6, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.layer_norm_eps = layer_norm_eps
        super().__init__(**kwargs)
'''

MODELING = '''
import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_outputs import (BaseModelOutput, CausalLMOutput,
                                           SequenceClassifierOutput)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .configuration_tiny import TinyRemoteConfig

OWN_ATTENTION = {own_attention}
CAUSAL = {causal}


def eager_attention(module, query, key, value, attention_mask, scaling, dropout=0.0,
                    **kwargs):
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = query @ key.transpose(-1, -2) * scaling
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    elif CAUSAL:
        t = scores.shape[-1]
        causal = torch.ones(t, t, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
    probs = scores.softmax(-1)
    return (probs @ value).transpose(1, 2).contiguous(), probs


class TinyAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.is_causal = CAUSAL
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.num_key_value_groups = self.heads // self.kv_heads
        self.head_dim = config.hidden_size // self.heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.head_dim)
        self.k_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim)
        self.v_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size)

    def forward(self, hidden, attention_mask, **kwargs):
        b, t, _ = hidden.shape
        q = self.q_proj(hidden).view(b, t, self.heads, -1).transpose(1, 2)
        k = self.k_proj(hidden).view(b, t, self.kv_heads, -1).transpose(1, 2)
        v = self.v_proj(hidden).view(b, t, self.kv_heads, -1).transpose(1, 2)
        if OWN_ATTENTION:
            out, _ = eager_attention(self, q, k, v, attention_mask, self.scaling)
        else:
            fn = eager_attention
            if self.config._attn_implementation != "eager":
                fn = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
            out, _ = fn(self, q, k, v, attention_mask, scaling=self.scaling, dropout=0.0,
                        **kwargs)
        return self.o_proj(out.reshape(b, t, -1))


class TinyLayer(nn.Module):
    """Post-norm (BERT) for the encoder, pre-norm (GPT) for the decoder."""

    def __init__(self, config):
        super().__init__()
        self.attn = TinyAttention(config)
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)

    def mlp(self, x):
        return self.down(nn.functional.gelu(self.up(x)))

    def forward(self, hidden, attention_mask, **kwargs):
        if CAUSAL:
            hidden = hidden + self.attn(self.norm1(hidden), attention_mask, **kwargs)
            return hidden + self.mlp(self.norm2(hidden))
        hidden = self.norm1(hidden + self.attn(hidden, attention_mask, **kwargs))
        return self.norm2(hidden + self.mlp(hidden))


class TinyPreTrained(PreTrainedModel):
    config_class = TinyRemoteConfig
    base_model_prefix = "model"
    _supports_sdpa = True
    _supports_attention_backend = not OWN_ATTENTION


class TinyModel(TinyPreTrained):
    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_positions = nn.Embedding(config.max_position_embeddings,
                                            config.hidden_size)
        self.embed_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(TinyLayer(config)
                                    for _ in range(config.num_hidden_layers))
        self.post_init()

    def _mask(self, embeds, attention_mask, position_ids):
        if OWN_ATTENTION:
            if attention_mask is None:
                return None
            return attention_mask[:, None, None, :].bool()
        if CAUSAL:
            return create_causal_mask(self.config, embeds, attention_mask, None,
                                      position_ids=position_ids)
        return create_bidirectional_mask(self.config, embeds, attention_mask)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                inputs_embeds=None, use_cache=None, **kwargs):
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if position_ids is None:
            position_ids = torch.arange(inputs_embeds.shape[1],
                                        device=inputs_embeds.device)[None]
        hidden = self.embed_norm(inputs_embeds + self.embed_positions(position_ids))
        mask = self._mask(hidden, attention_mask, position_ids)
        for layer in self.layers:
            hidden = layer(hidden, mask, **kwargs)
        return BaseModelOutput(last_hidden_state=hidden)


class TinyForSequenceClassification(TinyPreTrained):
    """A first-token head (dense + tanh + out), as BERT-like classifiers have."""

    def __init__(self, config):
        super().__init__(config)
        self.model = TinyModel(config)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.out = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                inputs_embeds=None, **kwargs):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids, inputs_embeds=inputs_embeds,
                            **kwargs)[0]
        return SequenceClassifierOutput(logits=self.out(torch.tanh(self.dense(hidden[:, 0]))))


class TinyForCausalLM(TinyPreTrained):
    def __init__(self, config):
        super().__init__(config)
        self.model = TinyModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids, **kwargs)[0]
        return CausalLMOutput(logits=self.lm_head(hidden))
'''

_CLASSES = {"AutoModel": "TinyModel",
            "AutoModelForSequenceClassification": "TinyForSequenceClassification",
            "AutoModelForCausalLM": "TinyForCausalLM"}


def write_checkpoint(path: pathlib.Path, arch: str, *, causal: bool, own_attention: bool,
                     seed: int, **config) -> str:
    """Write the code files, build `arch` from them with a seeded init (plus noise), save
    its weights and config (with `auto_map`), and a tokenizer (BPE for the decoder)."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module
    path = mf._fresh(path)
    kind = "dec" if causal else "enc"
    (path / "configuration_tiny.py").write_text(CONFIGURATION.format(kind=kind))
    (path / "modeling_tiny.py").write_text(
        MODELING.format(own_attention=own_attention, causal=causal))
    keys = ("AutoModel", "AutoModelForCausalLM") if causal else \
        ("AutoModel", "AutoModelForSequenceClassification")
    auto_map = {"AutoConfig": "configuration_tiny.TinyRemoteConfig",
                **{key: f"modeling_tiny.{_CLASSES[key]}" for key in keys}}
    cfg_cls = get_class_from_dynamic_module(auto_map["AutoConfig"], str(path))
    vocab = mf.BPE_VOCAB if causal else mf.BERT_VOCAB
    cfg = cfg_cls(vocab_size=vocab, auto_map=auto_map, pad_token_id=0, **config)
    if causal:
        eos = mf.bpe_token_id(mf.BPE_EOS)
        cfg.bos_token_id = cfg.eos_token_id = cfg.pad_token_id = eos
    torch.manual_seed(mf.SEED + seed)
    model = get_class_from_dynamic_module(f"modeling_tiny.{arch}", str(path))(cfg)
    mf._perturb(model)
    mf._save(model, path)
    if causal:
        mf.save_bpe_tokenizer(path)
    else:
        mf.save_bert_tokenizer(path, model_input_names=["input_ids", "attention_mask"])
    return str(path)


@functools.lru_cache(maxsize=None)
def reference_model(path: str, task: str):
    """The checkpoint's own class run by transformers (trust_remote_code=True)."""
    import transformers
    cls = {"base": transformers.AutoModel,
           "seqcls": transformers.AutoModelForSequenceClassification}[task]
    return cls.from_pretrained(path, trust_remote_code=True, dtype=torch.float32).eval()


def reference_states(path: str, token_ids) -> torch.Tensor:
    with torch.inference_mode():
        out = reference_model(path, "base")(input_ids=torch.tensor([list(token_ids)]))
    return out.last_hidden_state[0].float()


def reference_logits(path: str, token_ids) -> torch.Tensor:
    with torch.inference_mode():
        out = reference_model(path, "seqcls")(input_ids=torch.tensor([list(token_ids)]))
    return out.logits[0].float()
