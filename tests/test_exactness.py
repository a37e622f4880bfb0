"""Where greedy EAGLE is not token for token (16-bit and quantized formats), users are told: `run --verbose`
prints the format's exactness line, `plan` and the chat use the same table."""

from __future__ import annotations

import pytest

from eaglechat import cli
from eaglechat.fit.exactness import EXACTNESS, exactness, is_token_exact
from eaglechat.fit.memory import format_for


@pytest.mark.parametrize(("dtype", "quant", "fmt"), [
    ("float32", "none", "fp32"), ("bfloat16", "none", "bf16"), ("float16", "none", "fp16"),
    ("float32", "8bit", "int8"), ("bfloat16", "4bit", "nf4-dq"), ("float16", "8bit", "int8"),
])
def test_every_loaded_format_has_its_line(dtype, quant, fmt):
    """The engine's dtype and --quant name a format (4-bit loads with double quant) that has a line."""
    assert format_for(quant, dtype) == fmt
    assert exactness(fmt) == EXACTNESS[fmt]
    assert is_token_exact(fmt) == (fmt == "fp32")


def test_every_planner_format_has_a_line():
    from eaglechat.fit.memory import FORMAT_BITS

    assert set(FORMAT_BITS) == set(EXACTNESS)


@pytest.mark.parametrize(("dtype", "told"), [("float32", False), ("bfloat16", True)])
def test_run_verbose_states_exactness(tmp_path, capsys, dtype, told):
    from tiny_models import save_tiny_pair

    base, head = save_tiny_pair(tmp_path)
    rc = cli.main(["run", str(base), "--head", str(head), "--device", "cpu", "--dtype", dtype, "--verbose",
                   "--max-new-tokens", "4", "Hello world"])
    assert rc == 0
    err = capsys.readouterr().err
    assert ("[exact: bf16: greedy EAGLE = plain greedy up to 16-bit rounding" in err) == told, err
    # plain decoding has nothing to compare: no line
    cli.main(["run", str(base), "--head", str(head), "--device", "cpu", "--dtype", dtype, "--verbose",
              "--no-speculate", "--max-new-tokens", "4", "Hello world"])
    assert "[exact:" not in capsys.readouterr().err
