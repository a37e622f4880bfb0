"""Library chatter stays off stderr unless asked for: `eaglechat run --quant 8bit` through a pipe prints
the reply and nothing else (it printed one "MatMul8bitLt: inputs will be cast" warning per 8-bit layer
and forward, 336 for 8 tokens of a two-layer model, and transformers' "Loading weights" bar);
`--verbose` shows the bar again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tiny_models import save_tiny_pair

    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


def _run(pair, tmp_path, *extra) -> subprocess.CompletedProcess:
    base, head = pair
    env = dict(os.environ, EAGLECHAT_HOME=str(tmp_path / "home"), PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    argv = [sys.executable, "-m", "eaglechat", "run", str(base), "--head", str(head), "Hello",
            "--max-new-tokens", "8", "--quant", "8bit", *extra]
    return subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)


def test_quantized_run_through_a_pipe_prints_no_library_chatter(pair, tmp_path):
    got = _run(pair, tmp_path)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip()
    assert got.stderr == "", got.stderr[:500]


def test_verbose_shows_the_loading_bar(pair, tmp_path):
    got = _run(pair, tmp_path, "--verbose")
    assert got.returncode == 0, got.stderr
    assert "Loading weights" in got.stderr
    assert "MatMul8bitLt" not in got.stderr  # the per-row int8 layer (engine/int8_rows.py) casts silently
