"""Turn user prompts into validated token ids (the engine's input side)."""
from __future__ import annotations

import copy
import functools
import dataclasses
from typing import Any, Optional, Sequence, Union

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from vllm.config.model import ModelConfig
from vllm.engine.mm_prompts import ImagePromptsMixin
from vllm.engine.padding import pad_prompts
from vllm.engine.prompt_types import (TRUNCATION_SIDES, TextPrompt, TokenCap,
                                       TokenizedPrompt, check_text, cut_ids)
from vllm.engine.st_prompts import PromptType, SentenceTransformersPrompts
from vllm.logger import init_logger

logger = init_logger(__name__)


def _all_ints(values: Sequence[Any]) -> bool:
    """Whether every value is an int (bools count, as isinstance says); the types are
    collected in C, and only an unusual type falls back to isinstance per value."""
    kinds = set(map(type, values))
    return kinds <= {int, bool} or all(isinstance(t, int) for t in values)


def load_tokenizer(mc: ModelConfig) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(mc.tokenizer, trust_remote_code=mc.trust_remote_code)


class InputProcessor(SentenceTransformersPrompts, ImagePromptsMixin):
    """The one place where a text becomes token ids and where truncation is validated
    (`check_truncation`, `check_side`); `LLM` and the server both come through here."""

    def __init__(self, model_config: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> None:
        self.mc = model_config
        self.tokenizer = tokenizer
        # The server's / LLM's --truncation-side; None = the tokenizer's own side.
        self.default_side = getattr(model_config, "truncation_side", None)
        self.vocab_size = max(len(tokenizer), getattr(model_config.hf_config, "vocab_size", 0))
        # sentence_bert_config.json's do_lower_case: sentence-transformers (and upstream
        # vLLM) lower-case the text itself before tokenizing; a fast tokenizer ignores a
        # do_lower_case attribute set after loading.
        self.lower_case = bool(model_config.st_config and model_config.st_config.do_lower_case)
        self._prompt_lens: dict[str, int] = {}

    def _text(self, text: str, field: str = "input") -> str:
        check_text(text, field)
        return text.lower() if self.lower_case else text

    def clone(self) -> "InputProcessor":
        """An equal processor with a tokenizer of its own, for use on another thread: a
        Hugging Face fast tokenizer keeps its truncation settings on the object, so two
        threads sharing one truncate each other's texts (or not) when those differ."""
        return InputProcessor(self.mc, copy.deepcopy(self.tokenizer))

    def check_truncation(self, truncate_prompt_tokens: Optional[int]) -> Optional[int]:
        """`truncate_prompt_tokens` as a number of tokens (-1 = max_model_len), or None;
        a ValueError saying what to change when it is out of range."""
        k = truncate_prompt_tokens
        if k is None:
            return None
        if k == -1:
            return self.mc.max_model_len
        if k < 1:
            raise ValueError("truncate_prompt_tokens must be -1 (= max_model_len) or a "
                             f"positive number of tokens; got {k}.")
        if k > self.mc.max_model_len:
            raise ValueError(f"truncate_prompt_tokens={k} cannot be greater than "
                             f"max_model_len = {self.mc.max_model_len}. Please request a "
                             "smaller truncation size.")  # upstream 0.32's words
        return k

    @staticmethod
    def check_side(side: Optional[str]) -> Optional[str]:
        if side is not None and side not in TRUNCATION_SIDES:
            raise ValueError(f"truncation_side must be 'left' or 'right'; got {side!r}.")
        return side

    def encode(self, text: Union[str, list[str]], pair: Optional[str] = None,
                truncate_prompt_tokens: Optional[int] = None, side: Optional[str] = None,
                strategy: Union[bool, str] = True, **kwargs: Any):
        """The tokenizer call, cutting at `side` (else the default side)."""
        return self._call(text, pair, self.check_truncation(truncate_prompt_tokens), side,
                          strategy, **kwargs)

    def _call(self, text: Union[str, list[str]], pair: Optional[str], max_length: Optional[int],
              side: Optional[str], strategy: Union[bool, str] = True, **kwargs: Any):
        trunc = {} if max_length is None else {"truncation": strategy, "max_length": max_length}
        side = self.check_side(side) or self.default_side
        tok = self.tokenizer
        own = tok.truncation_side
        if trunc and side is not None:
            tok.truncation_side = side
        try:
            first, second = ("input", None) if pair is None else ("text_1", "text_2")
            text = [self._text(t) for t in text] if isinstance(text, list) else \
                self._text(text, first)
            return tok(text, None if pair is None else self._text(pair, second), **trunc,
                       **kwargs)
        finally:
            tok.truncation_side = own

    def id_cut(self, k: Optional[int], side: Optional[str]) -> Optional[str]:
        """The side at which a text's token ids are cut to `k` after tokenizing it whole
        (upstream's cut for an explicit side: special tokens are ids like the others, so
        "left" drops the leading [CLS], "right" the trailing [SEP]), when a side is given (by
        the request or as the server's default) and `k` is set; None when the tokenizer
        makes its own cut (no side given, or a `TokenCap`) or none is made."""
        side = self.check_side(side) or self.default_side
        return None if k is None or side is None or isinstance(k, TokenCap) else side

    @functools.cached_property
    def max_chars_per_token(self) -> int:
        return max(map(len, self.tokenizer.get_vocab()), default=1)

    def _pretrim(self, text: str, side: str) -> str:
        """A text to be cut at `side` after tokenizing it whole, first cut there to the
        characters `max_model_len` tokens can span (as upstream), so that an overlong text
        costs no more to tokenize than the longest one a model can take."""
        limit = self.mc.max_model_len * self.max_chars_per_token
        if len(text) <= limit:
            return text
        check_text(text)
        return text[-limit:] if side == "left" else text[:limit]

    def _encode_cut(self, text: Union[str, list[str]], k: Optional[int], side: Optional[str],
                    **kwargs: Any):
        """The tokenizer call for one text or a batch truncated to `k` tokens at `side`: the
        tokenizer's own cut, or (`id_cut`) the whole text, returned with the side at which
        its ids are still to be cut."""
        cut = self.id_cut(k, side)
        if cut is None:
            return self._call(text, None, k, side, **kwargs), None
        text = [self._pretrim(t, cut) for t in text] if isinstance(text, list) else \
            self._pretrim(text, cut)
        return self._call(text, None, None, None, **kwargs), cut

    def _prompt(self, ids: list[int], types: Optional[list[int]], k: Optional[int],
                cut: Optional[str]) -> TokenizedPrompt:
        """The ids (and token types, cut alike) as a prompt, cut at `cut` when given."""
        ids, types = list(ids), None if types is None else list(types)
        if cut is not None:
            ids, types = cut_ids(ids, k, cut), None if types is None else cut_ids(types, k, cut)
        out = TokenizedPrompt(ids, types)
        self.check(out)
        return out

    def check_cap(self, max_tokens: int, name: str) -> int:
        """A per-text token cap (max_tokens_per_query / max_tokens_per_doc): 0 = none."""
        if max_tokens < 0 or max_tokens > self.mc.max_model_len:
            raise ValueError(f"{name} must be 0 (no cap) or between 1 and max_model_len "
                             f"({self.mc.max_model_len}); got {max_tokens}.")
        return max_tokens

    def cap_as_truncation(self, max_tokens: int,
                          truncate_prompt_tokens: Optional[int]) -> Optional[int]:
        """A text embedded alone and capped at `max_tokens` tokens (special tokens not
        counted) is the tokenizer's cut to `max_tokens` + its special tokens (a `TokenCap`,
        special tokens kept at any side). With a smaller `truncate_prompt_tokens` k, cutting
        the capped ids to k at a side cuts the same ids as cutting the whole text's, so it
        is k."""
        k = self.check_truncation(truncate_prompt_tokens)
        if not max_tokens:
            return k
        capped = min(max_tokens + self.tokenizer.num_special_tokens_to_add(pair=False),
                     self.mc.max_model_len)
        return TokenCap(capped) if k is None or capped <= k else k

    def num_tokens(self, text: str) -> int:
        return len(self.tokenizer(self._text(text), add_special_tokens=False)["input_ids"])

    def cap_text(self, text: str, max_tokens: int, side: Optional[str] = None) -> str:
        """`text` cut to its first (or, side "left", last) `max_tokens` tokens, special
        tokens not counted, for the query of a cross-encoder pair. The cut is made in the
        text at token offsets (as upstream does for templated pairs)."""
        if not max_tokens:
            return text
        enc = self.tokenizer(self._text(text), add_special_tokens=False,
                             return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
        if len(offsets) <= max_tokens:
            return text
        if (self.check_side(side) or self.default_side or "right") == "left":
            return text[offsets[-max_tokens][0]:]
        return text[:offsets[max_tokens - 1][1]]

    def tokenize_prompt(self, prompt: PromptType, truncate_prompt_tokens: Optional[int] = None,
                        add_special_tokens: bool = True,
                        truncation_side: Optional[str] = None) -> TokenizedPrompt:
        """str / {"prompt": str} / {"prompt_token_ids": [...]} / [int] -> checked ids."""
        k = self.check_truncation(truncate_prompt_tokens)
        side = self.check_side(truncation_side) or self.default_side
        salt = None
        if isinstance(prompt, dict):
            salt = prompt.get("cache_salt")
            if salt is not None and not isinstance(salt, str):
                raise ValueError("cache_salt must be a string.")
            if "multi_modal_data" in prompt:
                ids, images = self._image_ids(prompt, add_special_tokens)
                out = TokenizedPrompt(ids, images=images, cache_salt=salt)
                self.check(out)
                return out
            if "suffix_ids" in prompt:  # a scoring template's prompt, then the score token
                prompt = self._template_ids(prompt)
            elif "prompt_token_ids" in prompt:
                prompt = list(prompt["prompt_token_ids"])
            elif "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("A prompt dict needs a 'prompt' or 'prompt_token_ids' key.")
        if isinstance(prompt, str):
            enc, cut = self._encode_cut(prompt, k, side, add_special_tokens=add_special_tokens)
            out = self._prompt(enc["input_ids"], self._types(enc), k, cut)
        elif isinstance(prompt, (list, tuple)) and _all_ints(prompt):
            # token ids keep their last k unless told "right", as upstream
            out = self._prompt(prompt, None, k, None if k is None else side or "left")
        else:
            raise ValueError(f"A prompt must be a str, a list of token ids or a dict; got "
                             f"{type(prompt).__name__}.")
        return out if salt is None else dataclasses.replace(out, cache_salt=salt)

    def pad(self, prompts: list[TokenizedPrompt], padding: Optional[str]) -> list[TokenizedPrompt]:
        """Upstream's `padding` applied to tokenized prompts, up to max_model_len (see
        vllm.engine.padding); the prompts, padded in place."""
        return pad_prompts(prompts, padding, self.tokenizer, self.mc.max_model_len)

    def tokenize_many(self, prompts: list[PromptType],
                      truncate_prompt_tokens: Optional[int] = None,
                      truncation_side: Optional[str] = None) -> list[TokenizedPrompt]:
        """Tokenize a list of prompts, plain strings in one fast-tokenizer batch call."""
        texts = [i for i, p in enumerate(prompts) if isinstance(p, str)]
        out: list[Optional[TokenizedPrompt]] = [None] * len(prompts)
        if len(texts) > 1:
            k = self.check_truncation(truncate_prompt_tokens)
            enc, cut = self._encode_cut([prompts[i] for i in texts], k, truncation_side)
            types = enc.get("token_type_ids") if self.mc.uses_token_type_ids else None
            for j, i in enumerate(texts):
                out[i] = self._prompt(enc["input_ids"][j],
                                      types[j] if types is not None else None, k, cut)
        for i, p in enumerate(prompts):
            if out[i] is None:
                out[i] = self.tokenize_prompt(p, truncate_prompt_tokens,
                                              truncation_side=truncation_side)
        return out

    def tokenize_texts(self, prompts: list[TextPrompt]) -> list[Union[TokenizedPrompt,
                                                                      ValueError]]:
        """Tokenize texts in one batch call per truncation setting; a text the tokenizer or
        the length check refuses gets its ValueError in its place, the others are kept."""
        out: list[Union[TokenizedPrompt, ValueError, None]] = [None] * len(prompts)
        groups: dict[tuple[Optional[int], bool, Optional[str]], list[int]] = {}
        for i, p in enumerate(prompts):  # a TokenCap equals its int, but cuts otherwise
            key = (p.truncate_prompt_tokens, isinstance(p.truncate_prompt_tokens, TokenCap),
                   p.truncation_side)
            groups.setdefault(key, []).append(i)
        for (truncate, _, side), idx in groups.items():
            try:
                done = self.tokenize_many([prompts[i].text for i in idx], truncate, side)
            except Exception:  # find the culprit(s): one text at a time
                done = [self._try_one(prompts[i].text, truncate, side) for i in idx]
            for i, result in zip(idx, done):
                if isinstance(result, TokenizedPrompt):
                    result = dataclasses.replace(result, prompt_len=prompts[i].prompt_len,
                                                 cache_salt=prompts[i].cache_salt,
                                                 task_adapter=prompts[i].task_adapter)
                out[i] = result
        return out  # type: ignore[return-value]

    def _try_one(self, text: str, truncate: Optional[int],
                 side: Optional[str]) -> Union[TokenizedPrompt, ValueError]:
        try:
            return self.tokenize_prompt(text, truncate, truncation_side=side)
        except ValueError as exc:
            return exc
        except Exception:  # the tokenizer itself failed on this text: it fails alone
            logger.exception("The tokenizer failed on a %d-character text.", len(text))
            return ValueError("The tokenizer could not encode this text.")

    def tokenize_pair(self, text_1: str, text_2: str,
                      truncate_prompt_tokens: Optional[int] = None,
                      truncation_side: Optional[str] = None,
                      max_tokens_2: int = 0) -> TokenizedPrompt:
        """A cross-encoder pair in the tokenizer's own pair form; `max_tokens_2` caps the
        second text's tokens (only_second at the side, as upstream's max_tokens_per_doc).
        `truncate_prompt_tokens` is the tokenizer's longest_first cut when no side is given;
        with a side (`id_cut`), the pair's ids and token types (capped, else whole) are cut
        at that side, as upstream."""
        strategy: Union[bool, str] = True
        k = self.check_truncation(truncate_prompt_tokens)
        cut = self.id_cut(k, truncation_side)
        length = None if cut else k
        if max_tokens_2 and self.num_tokens(text_2) > max_tokens_2:
            capped = self.num_tokens(text_1) + max_tokens_2 + \
                self.tokenizer.num_special_tokens_to_add(pair=True)
            # the id cut (k <= max_model_len) comes after: the cap alone is the doc's cut
            length = capped if cut else min(capped, length or capped, self.mc.max_model_len)
            strategy = "only_second"
        enc = self._call(text_1, text_2, length, truncation_side, strategy)
        return self._prompt(enc["input_ids"], self._types(enc), k, cut)

    def _types(self, enc) -> Optional[list[int]]:
        if not self.mc.uses_token_type_ids or "token_type_ids" not in enc:
            return None
        return list(enc["token_type_ids"])

    def check(self, prompt: TokenizedPrompt, chunked: Optional[bool] = None) -> None:
        """Empty, too long or out-of-vocabulary prompts are a ValueError. `chunked`: the
        prompt may be embedded in chunks (default: when the pooler config enables it)."""
        ids = prompt.prompt_token_ids
        if not ids:
            raise ValueError("The prompt is empty (it tokenizes to zero tokens); pass some text.")
        pooler = self.mc.pooler_config
        if chunked is None:
            chunked = bool(pooler.enable_chunked_processing)
        if chunked and pooler.max_embed_len and len(ids) > pooler.max_embed_len:
            raise ValueError(
                f"This model's max_embed_len is {pooler.max_embed_len} tokens (chunked "
                f"processing). However, you requested {len(ids)} tokens in the input for "
                "pooling. Please reduce the length of the input prompt, or pass "
                "truncate_prompt_tokens.")
        dual_image = prompt.images is not None and not self.mc.is_causal  # not text positions
        if not chunked and not dual_image and len(ids) > self.mc.max_model_len:
            raise ValueError(
                f"This model's maximum context length is {self.mc.max_model_len} tokens. "
                f"However, you requested {len(ids)} tokens in the input for pooling. Please "
                "reduce the length of the input prompt, or pass truncate_prompt_tokens"
                + ("" if self.mc.convert != "embed" else ", or embed it in chunks: start "
                   "with pooler_config {\"enable_chunked_processing\": true, "
                   "\"max_embed_len\": N}") + ".")
        # min/max in C first: a per-id Python test cost ~0.1 ms per 1k ids on every prompt
        bad = [t for t in ids if not 0 <= t < self.vocab_size] \
            if ids and (min(ids) < 0 or max(ids) >= self.vocab_size) else []
        if bad:
            hint = (" If these are tiktoken ids from LangChain's OpenAIEmbeddings, create it "
                    "with check_embedding_ctx_length=False so that it sends the texts."
                    if max(bad) >= self.vocab_size else "")
            raise ValueError(f"Token id {bad[0]} is out of vocabulary (vocab size "
                             f"{self.vocab_size}).{hint}")

