"""The environment is read in one place (vllm/envs.py; vllm/platforms sets process
variables), and the platform layer's start-up decisions."""
from __future__ import annotations

import ast
import pathlib

import pytest
import torch

import vllm
from vllm import envs

PACKAGE = pathlib.Path(vllm.__file__).parent
ALLOWED = {PACKAGE / "envs.py"}


def _environment_reads(path: pathlib.Path) -> list[str]:
    """`os.environ` / `os.getenv` / `environ` / `getenv` uses in a module (by its AST)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        name = None
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv"):
            name = node.attr
        elif isinstance(node, ast.Name) and node.id in ("environ", "getenv"):
            name = node.id
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                a.name in ("environ", "getenv") for a in node.names):
            name = "from os import"
        if name:
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {name}")
    return found


def test_only_envs_reads_the_environment():
    """Every module but vllm/envs.py reads variables through it; vllm/platforms may set
    process variables (before torch loads) but reads through envs too."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in ALLOWED:
            continue
        reads = _environment_reads(path)
        if path.parent == PACKAGE / "platforms":
            reads = [r for r in reads if not _is_assignment(path, r)]
        offenders += reads
    assert not offenders, offenders


def _is_assignment(path: pathlib.Path, read: str) -> bool:
    """A platforms line that only sets a variable: `os.environ[NAME] = value`."""
    line = path.read_text().splitlines()[int(read.split(":")[1].split()[0]) - 1].strip()
    return line.startswith("os.environ[") and "] = " in line


def test_registry_documents_every_variable(monkeypatch):
    for name, var in envs.environment_variables.items():
        assert var.doc, name
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.5")
    assert envs.VLLM_CPU_KVCACHE_SPACE == 0.5  # read at access, not at import
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    assert envs.VLLM_CPU_KVCACHE_SPACE == 4.0 and not envs.is_set("VLLM_CPU_KVCACHE_SPACE")
    monkeypatch.setenv("VLLM_CPU_KERNELS", "0")
    assert envs.VLLM_CPU_KERNELS is False
    with pytest.raises(AttributeError, match="not an environment variable"):
        envs.VLLM_NO_SUCH_THING


def test_unknown_attention_backend_is_a_clear_error(monkeypatch, bert_embed_dir):
    from vllm import LLM
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "FLASHINFER")
    with pytest.raises(ValueError, match="Unknown attention backend 'FLASHINFER'.*"
                       "CPU_NATIVE, TORCH_SDPA, FLASH_ATTN"):
        LLM(bert_embed_dir)


def test_backend_that_cannot_run_here_says_why(monkeypatch):
    from vllm.platforms import platform_for
    cpu = platform_for("cpu")
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "FLASH_ATTN")
    with pytest.raises(ValueError, match="FLASH_ATTN cannot run here: FLASH_ATTN is not a "
                       "cpu backend"):
        cpu.attention_backend(torch.float32, [32])
    monkeypatch.delenv("VLLM_ATTENTION_BACKEND")
    # float16 or an odd head size is beyond the C++ kernel: the reference runs it.
    assert cpu.attention_backend(torch.float16, [32]) == "TORCH_SDPA"
    assert cpu.attention_backend(torch.float32, [24]) == "TORCH_SDPA"


def test_default_dtypes_follow_upstream():
    """CPU: float32. CUDA (pooling models, as upstream): the checkpoint's half dtype, and
    float16 for a float32 or unstated checkpoint."""
    from vllm.platforms.cpu import CpuPlatform
    from vllm.platforms.cuda import CudaPlatform
    cpu = CpuPlatform("cpu")
    assert cpu.default_dtype(torch.bfloat16) == torch.float32
    cuda = CudaPlatform.__new__(CudaPlatform)  # no GPU needed for the rule itself
    assert cuda.default_dtype(torch.bfloat16) == torch.bfloat16
    assert cuda.default_dtype(torch.float16) == torch.float16
    assert cuda.default_dtype(torch.float32) == torch.float16
    assert cuda.default_dtype(None) == torch.float16


def test_cuda_cache_budget_is_utilization_minus_peak_and_outside_memory():
    from vllm.platforms.cuda import cuda_cache_budget
    gib = 1 << 30
    # 0.9 x 140 GiB - 3 GiB profile peak - 1 GiB CUDA context = 122 GiB
    assert cuda_cache_budget(140 * gib, 0.9, 3 * gib, 1 * gib) == int(0.9 * 140 * gib) - 4 * gib
    assert cuda_cache_budget(10 * gib, 0.1, 3 * gib, 0) == 0   # never negative


def test_cuda_kv_cache_bytes_reads_the_profile_peak(monkeypatch):
    """The platform runs the runner's profile step (which returns nothing) and reads the
    device's peak allocation around it: the first GPU run failed here on a None peak."""
    import types

    from vllm.platforms.cuda import CudaPlatform
    gib = 1 << 30
    state = {"peak": 0, "profiled": 0}

    def profile() -> None:
        state["profiled"] += 1
        state["peak"] = 3 * gib
    fake = {"empty_cache": lambda: None, "synchronize": lambda device=None: None,
            "reset_peak_memory_stats": lambda device=None: state.update(peak=0),
            "max_memory_allocated": lambda device=None: state["peak"],
            "mem_get_info": lambda device=None: (130 * gib, 140 * gib),
            "memory_reserved": lambda device=None: 9 * gib}
    for name, fn in fake.items():
        monkeypatch.setattr(torch.cuda, name, fn)
    cuda = CudaPlatform.__new__(CudaPlatform)
    cuda.device = torch.device("cuda", 0)
    config = types.SimpleNamespace(gpu_memory_utilization=0.9)
    # 0.9 x 140 GiB - 3 GiB peak - (10 GiB used - 9 GiB reserved by torch) outside torch
    assert cuda.kv_cache_bytes(config, profile) == int(0.9 * 140 * gib) - 4 * gib
    assert state["profiled"] == 1


def test_cpu_serving_policies_are_cpu_only():
    from vllm.platforms.cpu import CpuPlatform
    from vllm.platforms.cuda import CudaPlatform
    cpu = CpuPlatform("cpu").serving_policy()
    gpu = CudaPlatform.__new__(CudaPlatform).serving_policy()
    assert cpu.arrival_window and cpu.tokenize_between_steps and cpu.share_heap
    assert not (gpu.arrival_window or gpu.tokenize_between_steps or gpu.share_heap)
