"""The shared flag vocabulary (eaglechat/commands/common.py): every verb spells --device, --dtype,
--quant, --max-context, the tree and the sampling flags the same way, and a bad value is one line
with exit code 2 before anything loads; so are a tree larger than its draft can offer and bytes
that are not UTF-8."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tiny_models import save_tiny_pair

from eaglechat.cli import build_parser, main


@pytest.fixture(autouse=True)
def own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


def one_line_error(capsys, argv) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (argv, code, err)
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("eaglechat: error: "), err
    assert "Traceback" not in err
    return err.strip()


@pytest.mark.parametrize("flag,value,says", [
    ("--temperature", "nan", "finite number >= 0"),
    ("--temperature", "inf", "finite number >= 0"),
    ("--temperature", "-0.5", "finite number >= 0"),
    ("--temperature", "warm", "expected a number"),
    ("--top-p", "0", "in (0, 1]"),
    ("--top-p", "1.5", "in (0, 1]"),
    ("--top-p", "nan", "in (0, 1]"),
    ("--top-k", "-1", "at least 0"),
    ("--max-new-tokens", "0", "at least 1"),
    ("--max-context", "0", "at least 1"),
    ("--seed", "1.5", "expected an integer"),
    ("--seed", "18446744073709551616", "0..2^64-1"),
    ("--seed", "-1", "0..2^64-1"),
    ("--total-tokens", "0", "must be 1..1024"),
    ("--total-tokens", "5000", "must be 1..1024"),
    ("--depth", "17", "must be 1..16"),
    ("--draft-top-k", "33", "must be 1..32"),
    ("--device", "tpu", "expected auto, cpu, cuda, cuda:N or mps"),
    ("--dtype", "int8", "unknown dtype"),
    ("--quant", "3bit", "invalid choice"),
])
def test_run_refuses_bad_values_in_one_line(capsys, flag, value, says):
    err = one_line_error(capsys, ["run", "smollm2-135m-eagle2", "hi", flag, value])
    assert f"argument {flag}" in err and says in err


@pytest.mark.parametrize("verb", [
    ["run", "m", "hi"], ["chat"], ["bench", "m"], ["tune", "m"], ["plan", "m"], ["serve"], ["train", "m"],
])
def test_every_verb_that_loads_takes_the_same_device_flag(capsys, verb):
    err = one_line_error(capsys, [*verb, "--device", "cuda:x"])
    assert "argument --device" in err
    args = build_parser().parse_args([*verb, "--device", "CPU"])
    assert args.device == "cpu"


def test_dtype_short_names_are_accepted_everywhere():
    parser = build_parser()
    assert parser.parse_args(["run", "m", "--dtype", "bf16"]).dtype == "bfloat16"
    assert parser.parse_args(["tune", "m", "--dtype", "fp32"]).dtype == "float32"
    assert parser.parse_args(["train", "m"]).dtype == "auto"
    assert parser.parse_args(["plan", "m", "--context", "2048"]).max_context == 2048  # the old spelling stays


def test_verbs_are_registered_explicitly():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == {"chat", "run", "serve", "pull", "list", "ls", "rm", "show", "plan", "bench", "tune",
                                "train"}


def test_a_tree_larger_than_its_draft_can_offer_is_refused(pair, capsys):
    base, head = pair
    # depth 2, top_k 4: 4 + 1 * 16 = 20 candidates; 60 would silently verify a 20-token tree
    err = one_line_error(capsys, ["run", str(base), "--head", str(head), "--quant", "none", "--total-tokens", "60",
                                  "--depth", "2", "--draft-top-k", "4", "hi"])
    assert "ask for --total-tokens 20 or less" in err
    assert main(["run", str(base), "--head", str(head), "--quant", "none", "--total-tokens", "20", "--depth", "2",
                 "--draft-top-k", "4", "--max-new-tokens", "3", "--json", "hi"]) == 0
    assert '"tree": {"total_tokens": 20' in capsys.readouterr().out


def test_bench_refuses_an_oversized_tree_size(pair, capsys):
    base, head = pair
    err = one_line_error(capsys, ["bench", str(base), "--head", str(head), "--total-tokens", "8,60", "--depth", "2",
                                  "--draft-top-k", "4"])
    assert "a tree of 60 tokens" in err


def test_argv_that_is_not_utf8_is_one_line(pair, capsys):
    base, head = pair
    bad = b"caf\xe9".decode("utf-8", "surrogateescape")  # what Python makes of a Latin-1 byte in argv
    err = one_line_error(capsys, ["run", str(base), "--head", str(head), bad])
    assert "is not valid UTF-8" in err and "caf\\xe9" in err


def test_stdin_that_is_not_utf8_is_one_line(pair, tmp_path):
    base, head = pair
    proc = subprocess.run(
        [sys.executable, "-m", "eaglechat", "run", str(base), "--head", str(head), "--quant", "none"],
        input=b"caf\xe9 au lait", capture_output=True, timeout=300,
        env={**__import__("os").environ, "EAGLECHAT_HOME": str(tmp_path / "home")},
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.strip().splitlines()[-1] == "eaglechat: error: stdin is not valid UTF-8 (byte 3: b'\\xe9 au')"
    assert "Traceback" not in err


class _Stream:
    def __init__(self, tty: bool):
        self.tty, self.text = tty, ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def test_run_says_the_one_off_first_run_steps_on_a_terminal_and_nothing_through_a_pipe():
    from eaglechat.commands.run import progress_printer

    for tty, verbose, expected in [
        (True, False, "eaglechat: converting the default model (once)\n"),  # a minute under a bare bar otherwise
        (False, False, ""),  # a pipe or a log file: quiet
        (False, True, "[loading base]\n[converting the default model (once)]\n"),
    ]:
        stream = _Stream(tty)
        say = progress_printer(verbose, stream)
        say("loading base", 0.1)  # an ordinary phase: only with --verbose
        say("converting the default model (once)")  # a one-off step, no fraction
        assert stream.text == expected, (tty, verbose)
