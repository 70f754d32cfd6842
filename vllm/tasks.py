"""The pooling tasks and everything the engine knows about each, in one table.

A request's task says which head runs on its pooled hidden states. `TASKS` holds, per task:
the request parameters it accepts, the parameter upstream's `use_activation` stands for,
whether it is one of upstream's per-engine pooling tasks (`PoolerConfig.task`), whether it
answers per token, the HTTP routes that serve it and the `LLM` methods that run it. The
other modules read these facts from here (`pooling_params`, `config.tasks`, the server's
route table, the pooler), so a new task or option is one row.

The bottom layer: no imports of vllm.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class PoolingTask(str, enum.Enum):
    """A pooling task; a `str` (equal to, formatted and shown as its plain name), so a task
    read from a request or a config compares with the members directly."""

    ENCODE = "encode"
    EMBED = "embed"
    CLASSIFY = "classify"
    SCORE = "score"
    REWARD = "reward"
    TOKEN_EMBED = "token_embed"
    TOKEN_CLASSIFY = "token_classify"

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)

    __format__ = str.__format__


@dataclass(frozen=True)
class TaskSpec:
    params: tuple[str, ...]        # request parameters the task accepts
    activation_alias: str          # the parameter `use_activation` stands for
    engine_task: bool = False      # one of upstream's per-engine tasks (PoolerConfig.task)
    token_level: bool = False      # one answer per token
    pooling: str | None = None     # the pooling it runs (None: the model's PoolerConfig)
    routes: tuple[str, ...] = ()   # HTTP routes it serves (besides /invocations)
    llm_methods: tuple[str, ...] = ()  # LLM methods that run it


_EMBED_PARAMS, _CLASSIFY_PARAMS = ("dimensions", "normalize"), ("activation",)
_ENCODE_PARAMS = ("softmax", "step_tag_id", "returned_token_ids")
_SCORE_ROUTES = ("/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank")

# (in the order the server lists its routes and upstream prefers its engine tasks)
TASKS: dict[PoolingTask, TaskSpec] = {
    PoolingTask.EMBED: TaskSpec(_EMBED_PARAMS, "normalize", engine_task=True,
                                routes=("/v1/embeddings", "/v2/embed"),
                                llm_methods=("embed", "encode")),
    PoolingTask.ENCODE: TaskSpec(_ENCODE_PARAMS, "softmax", routes=("/pooling",),
                                 llm_methods=("encode",)),
    PoolingTask.CLASSIFY: TaskSpec(_CLASSIFY_PARAMS, "activation", engine_task=True,
                                   routes=("/classify",), llm_methods=("classify", "encode")),
    PoolingTask.SCORE: TaskSpec(_CLASSIFY_PARAMS, "activation", routes=_SCORE_ROUTES,
                                llm_methods=("score",)),
    PoolingTask.REWARD: TaskSpec(_ENCODE_PARAMS, "softmax", routes=("/pooling",),
                                 llm_methods=("reward", "encode")),
    # token tasks reach /pooling and LLM.encode as the engine's `encode_task` (config.tasks)
    PoolingTask.TOKEN_EMBED: TaskSpec(_EMBED_PARAMS, "normalize", engine_task=True,
                                      token_level=True, pooling="ALL",
                                      routes=("/v1/embeddings",),  # as upstream 0.33
                                      llm_methods=("encode",)),
    PoolingTask.TOKEN_CLASSIFY: TaskSpec(_CLASSIFY_PARAMS, "activation", engine_task=True,
                                         token_level=True, pooling="ALL",
                                      llm_methods=("encode",)),
}

POOLING_TASKS: tuple[PoolingTask, ...] = tuple(PoolingTask)
# upstream's per-engine tasks, in its order of preference when none is chosen
ENGINE_TASKS: tuple[PoolingTask, ...] = tuple(t for t, s in TASKS.items() if s.engine_task)
TOKEN_TASKS: tuple[PoolingTask, ...] = tuple(t for t, s in TASKS.items() if s.token_level)


def route_tasks(route: str) -> tuple[PoolingTask, ...]:
    """The tasks that can serve `route`, in the order the server tries them (it runs the
    first the model supports); () for a route that is not a pooling route."""
    return tuple(t for t, s in TASKS.items() if route in s.routes)


POOLING_ROUTES: tuple[str, ...] = tuple(dict.fromkeys(
    r for s in TASKS.values() for r in s.routes))
