"""The one task table (vllm/tasks.py) is what the rest of the engine reads: the server's
route table, PoolingParams' accepted parameters, the engine tasks, the LLM methods."""
from __future__ import annotations

import pytest

from vllm.entrypoints.llm import LLM
from vllm.entrypoints.openai.serving_engine import ROUTE_TASKS
from vllm.pooling_params import PoolingParams
from vllm.tasks import (ENGINE_TASKS, POOLING_ROUTES, POOLING_TASKS, TASKS, TOKEN_TASKS,
                        PoolingTask, route_tasks)

ALL_PARAMS = ("dimensions", "normalize", "activation", "softmax", "step_tag_id",
              "returned_token_ids")
VALUES = {"dimensions": 8, "normalize": True, "activation": True, "softmax": True,
          "step_tag_id": 3, "returned_token_ids": [1, 2]}


def test_a_task_is_its_plain_name():
    """Members equal, print and show as the strings they replace (messages unchanged)."""
    assert PoolingTask.EMBED == "embed" and PoolingTask("token_embed") is PoolingTask.TOKEN_EMBED
    assert f"{PoolingTask.SCORE}" == str(PoolingTask.SCORE) == "score"
    assert repr(POOLING_TASKS) == repr(tuple(t.value for t in PoolingTask))
    assert {"embed": 1}[PoolingTask.EMBED] == 1


def test_the_servers_routes_come_from_the_table():
    assert ROUTE_TASKS == {route: route_tasks(route) for route in POOLING_ROUTES}
    assert ROUTE_TASKS["/pooling"] == ("encode", "reward")
    assert ROUTE_TASKS["/v1/embeddings"] == ("embed", "token_embed")
    assert all(ROUTE_TASKS[r] == ("score",) for r in ("/score", "/rerank", "/v2/rerank"))


def test_upstreams_engine_tasks_and_token_tasks():
    assert ENGINE_TASKS == ("embed", "classify", "token_embed", "token_classify")
    assert TOKEN_TASKS == ("token_embed", "token_classify")
    assert all(TASKS[t].pooling == "ALL" for t in TOKEN_TASKS)


@pytest.mark.parametrize("task", list(PoolingTask))
def test_verify_accepts_exactly_the_tables_parameters(task):
    spec = TASKS[task]
    for name in ALL_PARAMS:
        params = PoolingParams(**{name: VALUES[name]})
        if name in spec.params:
            params.verify(task)
        else:
            with pytest.raises(ValueError, match=f"does not accept {name}"):
                params.verify(task)
    switched = PoolingParams(use_activation=False)
    switched.verify(task)
    assert getattr(switched, spec.activation_alias) is False


@pytest.mark.parametrize("task", list(PoolingTask))
def test_every_llm_method_named_exists(task):
    assert TASKS[task].llm_methods
    assert all(callable(getattr(LLM, name, None)) for name in TASKS[task].llm_methods)
