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


# bitsandbytes' CPU backend asks the Hub for a kernel at import when the CPU has AVX512-BF16 (its
# `has_avx512bf16` check): this preamble makes every CPU take that path, so the test below fails on an
# AVX2-only machine too when eaglechat lets `kernels` load (it printed "Skipping publisher trust check ...").
# The run below is 8-bit: the kernel fetch happens at import whatever the format, while a 4-bit forward
# under the pretence would call bitsandbytes' AVX512-BF16 native code and die of SIGILL on such a CPU.
_AS_IF_AVX512_BF16 = """
import importlib.abc, importlib.machinery, runpy, sys

class _ForceBf16Cpu(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "bitsandbytes.functional":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module
        def exec_module(module):
            load(module)
            module.has_avx512bf16 = lambda: True
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _ForceBf16Cpu())
sys.argv = ["eaglechat", *sys.argv[1:]]
try:
    runpy.run_module("eaglechat", run_name="__main__")
finally:
    if sys.modules.get("kernels") is not None:
        sys.exit("a Hub kernel loader was imported")
"""


def test_a_cpu_with_avx512_bf16_fetches_no_hub_kernel_and_prints_nothing(pair, tmp_path):
    base, head = pair
    env = dict(os.environ, EAGLECHAT_HOME=str(tmp_path / "home"), PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    argv = [sys.executable, "-c", _AS_IF_AVX512_BF16, "run", str(base), "--head", str(head), "Hello",
            "--max-new-tokens", "8", "--quant", "8bit"]
    got = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip()
    assert got.stderr == "", got.stderr[:500]


def test_verbose_shows_the_loading_bar(pair, tmp_path):
    got = _run(pair, tmp_path, "--verbose")
    assert got.returncode == 0, got.stderr
    assert "Loading weights" in got.stderr
    assert "MatMul8bitLt" not in got.stderr  # the per-row int8 layer (engine/int8_rows.py) casts silently
