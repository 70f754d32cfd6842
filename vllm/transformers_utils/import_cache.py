"""Import `transformers` once, not twice over: a start-up fix installed by `import vllm`.

transformers 5 builds its lazy import table by reading every file of its ~1100 model
folders (`create_import_structure_from_path`, behind an `lru_cache` of 128 entries). It does
so when `transformers` is imported, and again when `transformers.models` is (any
`AutoConfig` / `AutoTokenizer` use): the first pass has evicted all but 128 folders by then,
so the second pass reads them all again, ~0.65 CPU s of a MiniLM cold start of ~6 (issue 18).
Making that cache unbounded before the first pass turns the second into cache hits; the
table itself is unchanged (tests/test_startup_imports.py compares it).

Only the function's cache changes, and only where transformers still has it in that form
and was not imported before vllm; otherwise nothing is done. No transformers import here.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Optional, Sequence

from vllm.logger import init_logger

logger = init_logger(__name__)

MODULE = "transformers.utils.import_utils"
FUNCTION = "create_import_structure_from_path"


def unbound_cache(module: ModuleType) -> bool:
    """Give `module`'s import-table builder an unbounded cache; True if it was changed."""
    fn = getattr(module, FUNCTION, None)
    inner = getattr(fn, "__wrapped__", None)
    if inner is None or not hasattr(fn, "cache_info") or fn.cache_info().maxsize is None:
        return False
    setattr(module, FUNCTION, functools.lru_cache(maxsize=None)(inner))  # recursion uses it
    logger.debug("transformers' import table cache unbounded (it is read once, not twice)")
    return True


class _Finder(importlib.abc.MetaPathFinder):
    """Finds transformers' import_utils as usual and patches it right after it runs."""

    def find_spec(self, name: str, path: Optional[Sequence[str]], target=None):
        if name != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        sys.meta_path.remove(self)  # once; safe: a found spec ends the finders' loop
        loader = spec.loader
        if isinstance(loader, importlib.machinery.SourceFileLoader):
            run = loader.exec_module

            def exec_module(module: ModuleType) -> None:
                run(module)
                unbound_cache(module)
            loader.exec_module = exec_module  # this spec's own loader object
        return spec


def install() -> bool:
    """Before transformers is imported: patch its import-table cache when it loads."""
    if MODULE in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, _Finder())
    return True
