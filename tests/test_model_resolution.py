"""Model ids resolve from a local directory or the Hugging Face cache; a missing model is
a clear error naming the model and the cache path (no hub at test time)."""
from __future__ import annotations

import shutil

import huggingface_hub.constants as hf_constants
import pytest

from vllm import LLM
from vllm.engine.arg_utils import EngineArgs
from vllm.transformers_utils.config import resolve_model_path


def _fake_cache(root, repo_id: str, source) -> None:
    """Lay `source` out as the hub cache does: models--org--name/snapshots/<rev> + refs."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    revision = "0" * 40
    shutil.copytree(source, repo / "snapshots" / revision)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)


def test_hub_id_resolves_from_the_cache(tmp_path, monkeypatch, minilm_dir):
    _fake_cache(tmp_path, "sentence-transformers/all-MiniLM-L6-v2", minilm_dir)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = resolve_model_path("sentence-transformers/all-MiniLM-L6-v2")
    assert (path / "config.json").is_file() and str(tmp_path) in str(path)
    llm = LLM("sentence-transformers/all-MiniLM-L6-v2")
    out = llm.embed("hello world", use_tqdm=False)[0].outputs.embedding
    assert len(out) == 384


def test_missing_model_names_the_model_and_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError) as err:
        LLM("no-such-org/no-such-model")
    message = str(err.value)
    assert "no-such-org/no-such-model" in message and str(tmp_path) in message


def test_deprecated_task_score_on_an_embedding_model_scores_by_cosine(minilm_dir):
    """As upstream: task="score" converts to classify only for a model whose own task is
    classification; an embedding model stays one and scores by cosine similarity."""
    with pytest.warns(DeprecationWarning):
        mc = EngineArgs(model=minilm_dir, task="score").create_engine_config().model_config
    assert mc.convert == "embed" and "score" in mc.supported_tasks
