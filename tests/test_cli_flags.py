"""Upstream 0.33's flag spellings: every `--enable-X` also takes `--disable-X`, and
argparse's `--no-enable-X` is still accepted."""
from __future__ import annotations

import pytest

from vllm.entrypoints.openai.cli_args import engine_args_from_namespace, parse_serve_args


@pytest.mark.parametrize("flag", ["prefix-caching", "chunked-prefill"])
@pytest.mark.parametrize("spelling,want", [("--enable-{}", True), ("--disable-{}", False),
                                           ("--no-enable-{}", False), (None, None)])
def test_enable_and_disable_spellings(minilm_dir, flag, spelling, want):
    argv = ["--model", minilm_dir] + ([spelling.format(flag)] if spelling else [])
    args = parse_serve_args(argv)
    field = "enable_" + flag.replace("-", "_")
    assert getattr(args, field) is want
    assert getattr(engine_args_from_namespace(args), field) is want


def test_help_shows_both_spellings(capsys, minilm_dir):
    with pytest.raises(SystemExit):
        parse_serve_args(["--help"])
    out = capsys.readouterr().out
    assert "--enable-prefix-caching | --disable-prefix-caching" in out
