"""What a model can be asked: its labels, its pooling tasks, the engine's one task.

A mixin of `ModelConfig` (which supplies `hf_config`, `arch`, `convert`, `architecture`
and `pooler_config`): upstream 0.32 runs one pooling task per engine, chosen from the
tasks the model's pooler supports; the seed's `encode` (and `reward`) stay beside it.
"""
from __future__ import annotations

from typing import Optional

from vllm.tasks import ENGINE_TASKS, TASKS, TOKEN_TASKS, PoolingTask as T


# How `classifier_from_token` turns lm_head rows into a score head (upstream's `method`):
# from_2_way_softmax: two tokens [false, true], one label whose logit is true - false, so the
#   sigmoid of the score is the softmax of the two token logits at "true";
# no_post_processing: one label per token, each its token's logit.
TOKEN_HEAD_METHODS = ("from_2_way_softmax", "no_post_processing")


def token_head_method(hf_config) -> Optional[str]:
    """The checked `method` of a `classifier_from_token` head: the config's own, else
    from_2_way_softmax for the original Qwen3-Reranker (`is_original_qwen3_reranker`), else
    no_post_processing; None without `classifier_from_token`."""
    tokens = getattr(hf_config, "classifier_from_token", None)
    method = getattr(hf_config, "method", None)
    if not tokens:
        if method is not None:
            raise ValueError(f"method={method!r} needs classifier_from_token (the tokens whose "
                             "lm_head rows make the score head).")
        return None
    if not isinstance(tokens, (list, tuple)) or not all(isinstance(t, str) for t in tokens):
        raise ValueError(f"classifier_from_token must be a list of token strings, got "
                         f"{tokens!r}.")
    if method is None:
        method = "from_2_way_softmax" if getattr(
            hf_config, "is_original_qwen3_reranker", False) else "no_post_processing"
    if method not in TOKEN_HEAD_METHODS:
        raise ValueError(f"method={method!r} is not supported; use one of "
                         f"{list(TOKEN_HEAD_METHODS)}.")
    if method == "from_2_way_softmax" and len(tokens) != 2:
        raise ValueError(f"method='from_2_way_softmax' needs exactly two tokens [false, true] "
                         f"in classifier_from_token, got {list(tokens)}.")
    return method


class ModelTasks:
    """Task facts derived from the resolved architecture and pooler config."""

    @property
    def num_labels(self) -> int:
        tokens = getattr(self.hf_config, "classifier_from_token", None)
        if tokens:
            return 1 if token_head_method(self.hf_config) == "from_2_way_softmax" \
                else len(tokens)
        # As upstream: the reward layouts fix their width (Qwen2.5-Math-RM's config.json has
        # no id2label, so transformers' default of 2 labels would not match its 1-wide head).
        if self.architecture.endswith("ForProcessRewardModel"):
            return 2
        if self.architecture.endswith(("ForRewardModel", "ForRewardModeling")):
            return 1
        return int(getattr(self.hf_config, "num_labels", 1) or 1)

    @property
    def is_multi_vector(self) -> bool:
        """One vector per token (ColBERT): served as token_embed, scored by MaxSim."""
        return self.arch.base.multi_vector and self.convert == "embed"

    @property
    def is_token_classifier(self) -> bool:
        """`*ForTokenClassification`: one label distribution per token (NER)."""
        return self.architecture.endswith("ForTokenClassification") and \
            self.convert == "classify"

    @property
    def pooling_tasks(self) -> tuple[str, ...]:
        """Upstream's pooling tasks this model can run (its pooler's tasks)."""
        if self.is_token_classifier:
            return (T.TOKEN_CLASSIFY,)
        if self.is_multi_vector:
            return (T.TOKEN_EMBED,)
        return {"embed": (T.EMBED, T.TOKEN_EMBED), "classify": (T.CLASSIFY, T.TOKEN_CLASSIFY),
                "reward": (T.TOKEN_CLASSIFY,)}[self.convert] + self.arch.base.extra_tasks

    @property
    def pooling_task(self) -> str:
        """The one upstream pooling task this engine runs: `PoolerConfig.task` when set,
        else `token_classify` for a token classifier, else the first the model supports
        in upstream's order (embed, classify, token_embed, token_classify)."""
        tasks = self.pooling_tasks
        chosen = self.pooler_config.task
        if chosen is not None:
            if chosen not in tasks:
                raise ValueError(f"Unsupported task: {chosen!r} Supported tasks: {tasks}")
            return chosen
        for task in ENGINE_TASKS:
            if task in tasks:
                return task
        raise AssertionError(tasks)

    @property
    def scores(self) -> bool:
        """Whether /score and /rerank are served: as upstream, under embed / token_embed
        (cosine / MaxSim) and under classify with one label (a cross-encoder)."""
        task = self.pooling_task
        return task in (T.EMBED, T.TOKEN_EMBED) or (task == T.CLASSIFY and
                                                    self.num_labels == 1)

    @property
    def late_interaction(self) -> bool:
        """Scores are MaxSim of token vectors (an engine running token_embed, as ColBERT)."""
        return self.pooling_task == T.TOKEN_EMBED

    @property
    def supported_tasks(self) -> tuple[str, ...]:
        """Every task this engine accepts: the seed's `encode` (and `reward` on reward
        models), the engine's pooling task, and `score` where scoring is served."""
        tasks = (T.ENCODE, self.pooling_task)
        if self.convert == "reward":
            tasks += (T.REWARD,)
        return tasks + ((T.SCORE,) if self.scores else ())

    @property
    def encode_task(self) -> str:
        """The task of `LLM.encode()` and `POST /pooling` when none is named: the seed's
        `encode` (raw pooled states), except on a token classifier or an engine started
        with `PoolerConfig(task=...)` for a token task, which runs that task."""
        if self.is_token_classifier or self.pooler_config.task in TOKEN_TASKS:
            return self.pooling_task
        return T.ENCODE

    @property
    def gate_pooling_type(self) -> str:
        """The pooling the gate judges: a token task reads every token (as ALL)."""
        return TASKS[T(self.pooling_task)].pooling or self.pooler_config.pooling_type
