"""sentence-transformers prompts (`prompts` / `default_prompt_name` of
config_sentence_transformers.json, or a raw prefix) put before texts, as
`SentenceTransformer.encode` does, and the number of tokens they take."""
from __future__ import annotations

from typing import Any, Optional, Union

PromptType = Union[str, list[int], dict[str, Any]]


class SentenceTransformersPrompts:
    """Mixed into `InputProcessor`: uses its `mc` (the model config), `tokenizer`, `_text`
    and `_prompt_lens` (the prompt -> token count cache)."""

    def with_prompt(self, prompts: list[PromptType], prompt_name: Optional[str] = None,
                    prompt: Optional[str] = None, default: bool = True) -> list[PromptType]:
        """Prefix each text with a sentence-transformers prompt: `prompt` (raw) or the
        model's prompt named `prompt_name`, else (`default`) its default_prompt_name's, as
        `SentenceTransformer.encode`. The prompt's tokens are part of the input."""
        prompt = self._resolve_prompt(prompts, prompt_name, prompt, default)
        if not prompt:
            return prompts
        out = []
        for p in prompts:
            text = text_of(p)
            if text is None:
                raise ValueError("A prompt (prompt_name or prompt) applies to text inputs; "
                                 "token-id inputs already hold their prompt.")
            out.append(prompt + text if isinstance(p, str) else {**p, "prompt": prompt + text})
        return out

    def prompt_len(self, prompts: list[PromptType], prompt_name: Optional[str] = None,
                   prompt: Optional[str] = None, default: bool = True) -> Optional[int]:
        """How many leading tokens of each of `with_prompt`'s texts are the prompt, counted
        as sentence-transformers does (the prompt tokenized alone, less a trailing special
        token); None when no prompt applies."""
        prompt = self._resolve_prompt(prompts, prompt_name, prompt, default)
        if not prompt:
            return None
        if prompt not in self._prompt_lens:
            ids = self.tokenizer(self._text(prompt, "prompt"))["input_ids"]
            trailing = bool(ids) and ids[-1] in self.tokenizer.all_special_ids
            self._prompt_lens[prompt] = len(ids) - int(trailing)
        return self._prompt_lens[prompt]

    def task_adapter(self, prompt_name: Optional[str] = None, prompt: Optional[str] = None,
                     default: bool = True) -> Optional[str]:
        """The task LoRA the prompt name selects on a model with task adapters (the
        default prompt's name when `default` and nothing is named), else None."""
        adapters = self.mc.task_adapters
        if not adapters:
            return None
        name = prompt_name if prompt_name is not None or prompt is not None or not default \
            else self.mc.default_prompt_name
        return name if name in adapters else None

    def _resolve_prompt(self, prompts: list[PromptType], prompt_name: Optional[str],
                        prompt: Optional[str], default: bool) -> Optional[str]:
        if prompt is not None and prompt_name is not None:
            raise ValueError("Pass either prompt or prompt_name, not both.")
        known = self.mc.prompts
        if prompt_name is not None:
            if prompt_name not in known:
                raise ValueError(f"Unknown prompt_name {prompt_name!r}; this model's prompts "
                                 f"are: {', '.join(map(repr, known)) or 'none'}.")
            return known[prompt_name]
        if prompt is None and default and self.mc.default_prompt_name is not None:
            if not all(text_of(p) is not None for p in prompts):
                return None  # token ids as given: the default prompt is for texts
            return known[self.mc.default_prompt_name]
        return prompt


def text_of(prompt: PromptType) -> Optional[str]:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, dict) and isinstance(prompt.get("prompt"), str) \
            and "prompt_token_ids" not in prompt:
        return prompt["prompt"]
    return None
