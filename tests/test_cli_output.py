"""stdout that cannot take the output (`> /dev/full`: a full disk) is one line and exit 1 for every verb that
prints, not a traceback; a fault elsewhere is not mistaken for it."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eaglechat.cli import main
from eaglechat.output import WatchedStdout

REPO = Path(__file__).resolve().parent.parent
FULL = Path("/dev/full")
pytestmark = pytest.mark.skipif(not FULL.is_char_device(), reason="needs the /dev/full device (Linux)")


def open_full():
    """/dev/full for writing, never created: open(..., "w") would make a plain file where the device is missing."""
    return os.fdopen(os.open(FULL, os.O_WRONLY), "w")
SAYS = "eaglechat: error: could not write the output to stdout: No space left on device\n"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tiny_models import save_tiny_pair

    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


def main_into_full_stdout(argv: list[str], monkeypatch) -> tuple[int, str]:
    """main(argv) with stdout on /dev/full (set in the test body: pytest's capture resets it after fixtures)."""
    err = io.StringIO()
    with open_full() as sink:
        monkeypatch.setattr(sys, "stdout", sink)
        monkeypatch.setattr(sys, "stderr", err)
        code = main(argv)
        monkeypatch.undo()
    return code, err.getvalue()


@pytest.mark.parametrize("argv", [
    ["list"], ["list", "--json"], ["plan", "smollm2-135m-eagle2", "--device", "cpu"],
    ["plan", "smollm2-135m-eagle2", "--json"], ["show", "smollm2-135m-eagle2"],
])
def test_a_full_stdout_is_one_line(monkeypatch, argv):
    assert main_into_full_stdout(argv, monkeypatch) == (1, SAYS)


@pytest.mark.parametrize("extra", [[], ["--json"], ["--verbose"]])
def test_run_into_a_full_stdout_is_one_line(pair, monkeypatch, extra):
    base, head = pair
    code, err = main_into_full_stdout(["run", str(base), "Hello", "--head", str(head), "--max-new-tokens", "4", *extra],
                                      monkeypatch)
    assert code == 1 and err.endswith(SAYS) and "Traceback" not in err


def test_run_into_dev_full_through_the_shell_leaves_no_second_report(pair, tmp_path):
    base, head = pair
    env = dict(os.environ, EAGLECHAT_HOME=str(tmp_path / "home"), PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    with open_full() as sink:
        got = subprocess.run([sys.executable, "-m", "eaglechat", "run", str(base), "Hello", "--head", str(head),
                              "--max-new-tokens", "4", "--json"], stdin=subprocess.DEVNULL, stdout=sink,
                             stderr=subprocess.PIPE, env=env, timeout=300)
    assert got.returncode == 1
    assert got.stderr.decode() == SAYS  # not also "Exception ignored ... OSError" at the interpreter's exit


def test_an_os_error_that_is_not_the_output_keeps_its_traceback(monkeypatch):
    from eaglechat.commands import list as list_verb

    def fails(args):
        raise OSError(28, "No space left on device")  # from a file of its own, not stdout

    monkeypatch.setattr(list_verb, "run", fails)
    monkeypatch.setattr("eaglechat.cli.COMMANDS", [list_verb])
    with pytest.raises(OSError):
        main(["list"])


def test_the_watch_passes_everything_else_through(capsys):
    watched = WatchedStdout(sys.stdout)
    watched.write("x")
    watched.flush()
    assert watched.failed is None and watched.isatty() is sys.stdout.isatty()
    assert capsys.readouterr().out == "x"
