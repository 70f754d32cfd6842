"""Per-request pooling parameters, validated against the request's task."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from vllm.tasks import POOLING_TASKS, TASKS, PoolingTask


class ModelFacts(Protocol):
    """What `verify` reads of the model (`vllm.config.ModelConfig` has it; this module sits
    below config, so it names only the fields)."""

    pooler_config: Any
    is_multi_vector: bool

    def verify_dimensions(self, dimensions: int) -> None: ...


@dataclass
class LateChunkingParams:
    """Late chunking (upstream 0.33): one mean vector per run of `chunk_size` tokens of the
    contextual token vectors of a token_embed request (special tokens included)."""

    chunk_size: int

    def verify(self) -> None:
        size = self.chunk_size
        if type(size) is not int or not 0 < size < 2**63:
            raise ValueError("late_chunking_params.chunk_size must be a positive integer "
                             f"less than 2**63; got {size!r}.")

    @classmethod
    def of(cls, value: Any) -> "LateChunkingParams":
        """`value` as LateChunkingParams: one already, or a {"chunk_size": N} mapping."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict) and set(value) == {"chunk_size"}:
            return cls(value["chunk_size"])
        raise ValueError("late_chunking_params takes {'chunk_size': N} (or a "
                         f"LateChunkingParams); got {value!r}.")


@dataclass
class PoolingParams:
    """What to do with a request's pooled hidden state.

    Every field left None takes the model's resolved `PoolerConfig` value.
    `task` is filled in by the entrypoint (`LLM.embed` sets "embed", ...).
    """

    dimensions: Optional[int] = None
    normalize: Optional[bool] = None
    activation: Optional[bool] = None
    softmax: Optional[bool] = None
    step_tag_id: Optional[int] = None
    returned_token_ids: Optional[list[int]] = None
    use_activation: Optional[bool] = None
    task: Optional[str] = None
    late_chunking_params: Optional[LateChunkingParams] = None
    extra_kwargs: dict = field(default_factory=dict)
    # set by a full `verify` (with the model): the front that built the request verified
    # it, so the engine does not run the checks again (clones keep it)
    verified: bool = field(default=False, repr=False, compare=False)

    def clone(self) -> "PoolingParams":
        return PoolingParams(**{k: (list(v) if isinstance(v, list) else
                                    dataclasses.replace(v) if dataclasses.is_dataclass(v) else
                                    dict(v) if isinstance(v, dict) else v)
                                for k, v in self.__dict__.items()})

    def _set_fields(self) -> list[str]:
        names = ("dimensions", "normalize", "activation", "softmax", "step_tag_id",
                 "returned_token_ids")
        return [n for n in names if getattr(self, n) is not None]

    def verify(self, task: str, model_config: Optional[ModelFacts] = None) -> None:
        """Check that every set parameter belongs to `task`, fill defaults from the model.

        Raises ValueError naming the parameters the task accepts. Runs once: params
        already verified with a model for `task` are left as they are.
        """
        if self.verified and self.task == task:
            return
        if task not in POOLING_TASKS:
            raise ValueError(f"Unknown pooling task {task!r}; choose one of {POOLING_TASKS}.")
        if self.task is not None and self.task != task:
            raise ValueError(f"PoolingParams were made for task {self.task!r}, not {task!r}.")
        self.task = task
        spec = TASKS[PoolingTask(task)]
        if self.use_activation is not None:
            alias = spec.activation_alias
            if getattr(self, alias) is not None and getattr(self, alias) != self.use_activation:
                raise ValueError(f"use_activation and {alias} disagree; set only one of them.")
            setattr(self, alias, self.use_activation)
            self.use_activation = None
        allowed = spec.params
        wrong = [n for n in self._set_fields() if n not in allowed]
        if wrong:
            raise ValueError(
                f"Task {task!r} does not accept {', '.join(wrong)}; the parameters it accepts "
                f"are: {', '.join(allowed)}.")
        if self.late_chunking_params is not None:
            self._verify_late_chunking(task)
        if model_config is not None:
            self._fill_from_model(task, model_config)
            self.verified = True

    def _verify_late_chunking(self, task: str) -> None:
        """Late chunking: token_embed only, chunk_size checked, no `dimensions` (the chunk
        vectors keep the model's width, as upstream)."""
        self.late_chunking_params = LateChunkingParams.of(self.late_chunking_params)
        self.late_chunking_params.verify()
        if task != PoolingTask.TOKEN_EMBED:
            raise ValueError("late_chunking_params applies to the token_embed task only; "
                             f"this request runs {task!r}.")
        if self.dimensions is not None:
            raise ValueError("late_chunking_params does not take dimensions: chunk vectors "
                             "keep the model's width.")

    def _fill_from_model(self, task: str, model_config: ModelFacts) -> None:
        pooler = model_config.pooler_config
        family = TASKS[PoolingTask(task)].activation_alias
        if family == "normalize":  # embed, token_embed
            if self.normalize is None:  # ColBERT vectors are unit length unless asked
                self.normalize = True if model_config.is_multi_vector or \
                    pooler.normalize is None else pooler.normalize
            if self.dimensions is None:  # the override's default width, as upstream
                self.dimensions = pooler.dimensions
            if self.dimensions is not None:
                model_config.verify_dimensions(self.dimensions)
        elif family == "activation":  # classify, score, token_classify
            if self.activation is None:
                self.activation = pooler.activation if pooler.activation is not None else True
            if task == PoolingTask.TOKEN_CLASSIFY:  # a STEP model's tags: from its config
                self.step_tag_id = pooler.step_tag_id
                self.returned_token_ids = pooler.returned_token_ids
        else:  # encode, reward
            if self.softmax is None:
                self.softmax = bool(pooler.softmax) if pooler.softmax is not None else False
            if self.step_tag_id is None:
                self.step_tag_id = pooler.step_tag_id
            if self.returned_token_ids is None:
                self.returned_token_ids = pooler.returned_token_ids
