"""`eaglechat` without a terminal never draws the app into a pipe (it did, and hung): with stdin piped it answers
like `ollama run` (one reply on stdout, the same text `eaglechat run` gives), with nothing on stdin or only stdout
redirected it says so in one line. `eaglechat --model X` is the chat on X."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eaglechat.chat import settings
from eaglechat.cli import main, parse

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tiny_models import save_tiny_pair

    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


def eaglechat(*argv, stdin: bytes | None, home: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, EAGLECHAT_HOME=str(home), PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "eaglechat", *argv], env=env, capture_output=True, timeout=timeout,
                          input=stdin, stdin=subprocess.DEVNULL if stdin is None else None)


def test_a_piped_prompt_gets_the_reply_run_gives_on_the_chats_last_model(pair, hermetic_home, capsys):
    base, head = pair
    settings.remember_model(str(base))  # the model the chat opens with
    settings.update(chat={"defaults": {"max_new_tokens": 6, "system_prompt": "Be brief."}})
    got = eaglechat("--head", str(head), stdin=b"Hello there", home=hermetic_home)  # echo ... | eaglechat --head H
    assert got.returncode == 0, got.stderr.decode()
    assert got.stderr == b""
    assert main(["run", str(base), "Hello there", "--head", str(head), "--max-new-tokens", "6",
                 "--system", "Be brief.", "--speculate", "auto"]) == 0
    same = capsys.readouterr().out
    assert got.stdout.decode() == same and same.strip()


def test_nothing_on_stdin_is_one_line_at_once(hermetic_home, tmp_path):
    out = tmp_path / "out.txt"
    with open(out, "wb") as sink:  # eaglechat < /dev/null > file: hung drawing the app into the file
        got = subprocess.run([sys.executable, "-m", "eaglechat"], stdin=subprocess.DEVNULL, stdout=sink,
                             stderr=subprocess.PIPE, timeout=60,
                             env=dict(os.environ, EAGLECHAT_HOME=str(hermetic_home), PYTHONPATH=str(REPO)))
    assert got.returncode == 2
    assert got.stderr.decode() == ("eaglechat: error: no terminal and no prompt on stdin: run the chat in a terminal, "
                                   "or pipe a prompt in (`echo PROMPT | eaglechat`)\n")
    assert out.read_bytes() == b""


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_on_stdin_but_stdout_redirected_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", FakeTTY())
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eaglechat: error: the chat needs a terminal, and stdout is not one") and err.count("\n") == 1


def test_a_blank_piped_prompt_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"  \n\n")))
    assert main(["--model", "smollm2-135m-eagle2"]) == 2
    assert "no prompt on stdin" in capsys.readouterr().err


@pytest.mark.parametrize("argv, model", [
    ([], None), (["--model", "x"], "x"), (["--debug", "--model", "x"], "x"), (["--model=x", "--quant", "none"], "x"),
])
def test_chat_flags_without_the_verb_open_the_chat(argv, model):
    args = parse(argv)
    assert args.command == "chat" and args.model == model


def test_an_unknown_word_is_still_an_unknown_command(capsys):
    assert main(["chta"]) == 2
    assert "invalid choice: 'chta'" in capsys.readouterr().err
