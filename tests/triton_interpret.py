"""Triton kernel modules in the mode this machine runs them, for the TRITON_ATTN tests.

On a machine without a GPU the kernels run in Triton's interpreter: `@triton.jit` picks the
interpreter when the kernel module is imported, so `kernel_modules` sets TRITON_INTERPRET=1
(only while it is entered) and (re)imports the modules under it. With a GPU the same tests
run the compiled kernels on it.
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Iterator, Sequence

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def interpreted(module) -> bool:
    """Whether the module's kernels were imported in interpreter mode."""
    kernel = next(v for k, v in vars(module).items() if k.endswith("_kernel"))
    return type(kernel).__name__ == "InterpretedFunction"


def _interpret_standard_library(mp: pytest.MonkeyPatch) -> None:
    """Triton decides its own standard library's mode (tl.max, tl.sum: `@jit` functions)
    when `triton` is first imported; where that happened before TRITON_INTERPRET=1 was set,
    the interpreter cannot call them: give the tests interpreted twins of the ones the
    kernels use."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    for name in ("max", "sum"):
        fn = getattr(tl, name)
        if not isinstance(fn, InterpretedFunction):
            mp.setattr(tl, name, InterpretedFunction(fn.fn))


@contextlib.contextmanager
def kernel_modules(names: Sequence[str]) -> Iterator[list]:
    """The kernel modules `names`, imported in the mode this machine runs (interpreter on
    the CPU, with TRITON_INTERPRET=1 set until the context exits)."""
    with pytest.MonkeyPatch.context() as mp:
        interpret = DEVICE == "cpu"
        if interpret:
            mp.setenv("TRITON_INTERPRET", "1")
            _interpret_standard_library(mp)
        mods = []
        for name in names:
            mod = importlib.import_module(name)
            if interpreted(mod) != interpret:
                mod = importlib.reload(mod)
            mods.append(mod)
        yield mods
