"""`--enable-X` flags spelled as upstream 0.33 spells them: each also takes `--disable-X`
(False), and argparse's `--no-enable-X` is still accepted (hidden from the help)."""
from __future__ import annotations

import argparse
from typing import Any, Optional, Sequence


class EnableDisableAction(argparse.BooleanOptionalAction):
    """A BooleanOptionalAction whose `--enable-x` also answers to `--disable-x`."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        disables = ["--disable-" + o[len("--enable-"):] for o in option_strings
                     if o.startswith("--enable-")]
        self.negatives = {o for o in self.option_strings if o.startswith("--no-")}
        self.negatives.update(disables)
        self.option_strings = list(self.option_strings) + disables

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: Optional[str] = None) -> None:
        setattr(namespace, self.dest, option_string not in self.negatives)

    def format_usage(self) -> str:
        return " | ".join(o for o in self.option_strings if not o.startswith("--no-"))
