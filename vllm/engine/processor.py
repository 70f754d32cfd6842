"""Turn user prompts into validated token ids (the engine's input side)."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Optional, Union

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from vllm.config.model import ModelConfig
from vllm.logger import init_logger

logger = init_logger(__name__)

PromptType = Union[str, list[int], dict[str, Any]]


class InvalidTextError(ValueError):
    """A text that is not valid Unicode (a lone UTF-16 surrogate): no tokenizer can encode
    it, and Hugging Face's raises a TypeError deep inside instead of saying so."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def check_text(text: str, field: str = "input") -> str:
    """`text` unchanged, or InvalidTextError naming `field` when it holds a lone surrogate
    (JSON's "\\ud800" or the raw bytes ED A0 80 both decode to one)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = ord(text[exc.start])
        raise InvalidTextError(
            f"`{field}` is not valid Unicode text: it holds a lone UTF-16 surrogate "
            f"(U+{char:04X} at character {exc.start}); send text encoded as UTF-8.",
            field) from None
    return text


@dataclass
class TokenizedPrompt:
    prompt_token_ids: list[int]
    token_type_ids: Optional[list[int]] = None
    cache_salt: Optional[str] = None   # separates prefix-cache entries (e.g. per tenant)


@dataclass
class TextPrompt:
    """A plain string the server hands to the engine untokenized: the engine loop
    tokenizes every text that arrived for a step in one batch (see AsyncLLM)."""
    text: str
    truncate_prompt_tokens: Optional[int] = None


def load_tokenizer(mc: ModelConfig) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(mc.tokenizer, trust_remote_code=mc.trust_remote_code)


class InputProcessor:
    def __init__(self, model_config: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> None:
        self.mc = model_config
        self.tokenizer = tokenizer
        self.vocab_size = max(len(tokenizer), getattr(model_config.hf_config, "vocab_size", 0))
        # sentence_bert_config.json's do_lower_case: sentence-transformers (and upstream
        # vLLM) lower-case the text itself before tokenizing; a fast tokenizer ignores a
        # do_lower_case attribute set after loading.
        self.lower_case = bool(model_config.st_config and model_config.st_config.do_lower_case)

    def _text(self, text: str, field: str = "input") -> str:
        check_text(text, field)
        return text.lower() if self.lower_case else text

    def clone(self) -> "InputProcessor":
        """An equal processor with a tokenizer of its own, for use on another thread: a
        Hugging Face fast tokenizer keeps its truncation settings on the object, so two
        threads sharing one truncate each other's texts (or not) when those differ."""
        return InputProcessor(self.mc, copy.deepcopy(self.tokenizer))

    def _truncation(self, truncate_prompt_tokens: Optional[int]) -> dict:
        if truncate_prompt_tokens is None:
            return {}
        k = truncate_prompt_tokens
        if k == -1:
            k = self.mc.max_model_len
        if k < 1 and k != -1:
            raise ValueError("truncate_prompt_tokens must be -1 or a positive number.")
        if k > self.mc.max_model_len:
            raise ValueError(f"truncate_prompt_tokens value ({k}) is greater than "
                             f"max_model_len ({self.mc.max_model_len}). Please select a "
                             "smaller truncation size.")
        return {"truncation": True, "max_length": k}

    def tokenize_prompt(self, prompt: PromptType, truncate_prompt_tokens: Optional[int] = None,
                        add_special_tokens: bool = True) -> TokenizedPrompt:
        """str / {"prompt": str} / {"prompt_token_ids": [...]} / [int] -> checked ids."""
        trunc = self._truncation(truncate_prompt_tokens)
        salt = None
        if isinstance(prompt, dict):
            salt = prompt.get("cache_salt")
            if salt is not None and not isinstance(salt, str):
                raise ValueError("cache_salt must be a string.")
            if "prompt_token_ids" in prompt:
                prompt = list(prompt["prompt_token_ids"])
            elif "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("A prompt dict needs a 'prompt' or 'prompt_token_ids' key.")
        if isinstance(prompt, str):
            enc = self.tokenizer(self._text(prompt), add_special_tokens=add_special_tokens,
                                 **trunc)
            out = TokenizedPrompt(list(enc["input_ids"]), self._types(enc))
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
            if trunc:
                ids = ids[-trunc["max_length"]:]  # token ids keep their last k, as upstream
            out = TokenizedPrompt(ids)
        else:
            raise ValueError(f"A prompt must be a str, a list of token ids or a dict; got "
                             f"{type(prompt).__name__}.")
        out.cache_salt = salt
        self.check(out)
        return out

    def tokenize_many(self, prompts: list[PromptType],
                      truncate_prompt_tokens: Optional[int] = None) -> list[TokenizedPrompt]:
        """Tokenize a list of prompts, plain strings in one fast-tokenizer batch call."""
        texts = [i for i, p in enumerate(prompts) if isinstance(p, str)]
        out: list[Optional[TokenizedPrompt]] = [None] * len(prompts)
        if len(texts) > 1:
            trunc = self._truncation(truncate_prompt_tokens)
            enc = self.tokenizer([self._text(prompts[i]) for i in texts], **trunc)
            types = enc.get("token_type_ids") if self.mc.uses_token_type_ids else None
            for j, i in enumerate(texts):
                out[i] = TokenizedPrompt(list(enc["input_ids"][j]),
                                         list(types[j]) if types is not None else None)
                self.check(out[i])
        for i, p in enumerate(prompts):
            if out[i] is None:
                out[i] = self.tokenize_prompt(p, truncate_prompt_tokens)
        return out

    def tokenize_texts(self, prompts: list[TextPrompt]) -> list[Union[TokenizedPrompt,
                                                                      ValueError]]:
        """Tokenize texts in one batch call per truncation setting; a text the tokenizer or
        the length check refuses gets its ValueError in its place, the others are kept."""
        out: list[Union[TokenizedPrompt, ValueError, None]] = [None] * len(prompts)
        groups: dict[Optional[int], list[int]] = {}
        for i, p in enumerate(prompts):
            groups.setdefault(p.truncate_prompt_tokens, []).append(i)
        for truncate, idx in groups.items():
            try:
                done = self.tokenize_many([prompts[i].text for i in idx], truncate)
            except Exception:  # find the culprit(s): one text at a time
                done = [self._try_one(prompts[i].text, truncate) for i in idx]
            for i, result in zip(idx, done):
                out[i] = result
        return out  # type: ignore[return-value]

    def _try_one(self, text: str, truncate: Optional[int]) -> Union[TokenizedPrompt,
                                                                    ValueError]:
        try:
            return self.tokenize_prompt(text, truncate)
        except ValueError as exc:
            return exc
        except Exception:  # the tokenizer itself failed on this text: it fails alone
            logger.exception("The tokenizer failed on a %d-character text.", len(text))
            return ValueError("The tokenizer could not encode this text.")

    def tokenize_pair(self, text_1: str, text_2: str,
                      truncate_prompt_tokens: Optional[int] = None) -> TokenizedPrompt:
        """A cross-encoder pair in the tokenizer's own pair form."""
        trunc = self._truncation(truncate_prompt_tokens)  # longest_first, as upstream
        enc = self.tokenizer(self._text(text_1, "text_1"), self._text(text_2, "text_2"),
                             **trunc)
        out = TokenizedPrompt(list(enc["input_ids"]), self._types(enc))
        self.check(out)
        return out

    def _types(self, enc) -> Optional[list[int]]:
        if not self.mc.uses_token_type_ids or "token_type_ids" not in enc:
            return None
        return list(enc["token_type_ids"])

    def check(self, prompt: TokenizedPrompt) -> None:
        ids = prompt.prompt_token_ids
        if not ids:
            raise ValueError("The prompt is empty (it tokenizes to zero tokens); pass some text.")
        if len(ids) > self.mc.max_model_len:
            raise ValueError(
                f"This model's maximum context length is {self.mc.max_model_len} tokens. "
                f"However, you requested {len(ids)} tokens in the input for pooling. Please "
                "reduce the length of the input prompt, or pass truncate_prompt_tokens.")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            hint = (" If these are tiktoken ids from LangChain's OpenAIEmbeddings, create it "
                    "with check_embedding_ctx_length=False so that it sends the texts."
                    if max(bad) >= self.vocab_size else "")
            raise ValueError(f"Token id {bad[0]} is out of vocabulary (vocab size "
                             f"{self.vocab_size}).{hint}")
