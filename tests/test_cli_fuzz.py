"""A fuzz of the whole command line (hypothesis): any verb (or none: the chat), any of its flags with good and bad
values, names a user types (catalog aliases, hf.co/ names, free-form pairs, folders, junk), bytes on stdin and
stdout on a full device. The outcome is a clean success, one `eaglechat: error:` line with a non-zero exit, or
the point where real work starts (loading a model, converting, training, pulling) which is where the fuzz
stops; never a traceback. In-process through cli.main and bounded (count, no deadline, derandomized: the same
examples each run), so it stays a few seconds; a handful of typed names also go through a real process."""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglechat import cli

REPO = Path(__file__).resolve().parent.parent
FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


class ReachedWork(Exception):
    """Raised where a valid command starts its real work: the fuzz checks the way there, not the work."""


@pytest.fixture
def work_stops_here(monkeypatch):
    """Stop at the first heavy step of each verb (the steps the verbs call through these modules at run time)."""
    from eaglechat import loader
    from eaglechat.models import default_model, hub
    from eaglechat.train import pipeline

    def stop(*args, **kwargs):
        raise ReachedWork

    monkeypatch.setattr(loader, "load_engine", stop)  # run, chat (piped), serve, bench, tune
    monkeypatch.setattr(default_model, "ensure_default_base", stop)  # the first conversion
    monkeypatch.setattr(pipeline, "run", stop)  # train
    monkeypatch.setattr(hub, "pull", stop)  # pull (offline anyway)


def verbs() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


PARSERS = verbs()
NAMES = ["smollm2-135m-eagle2", "smollm2-135m-eagle2:latest", "smollm2-135m-eagle2:nohead", "vicuna-7b-eagle2",
         "hf.co/a--b/c", "hf.co/a/b..c", "hf.co/a/b.git", "hf.co/-a/b", "hf.co/a/b:main", "hf.co/", "hf.co/a",
         "https://huggingface.co/a/b", "base=a/b,head=c/d", "base=a--b/c,head=x/y", "base=a/b", "head=a/b,kind=eagle9",
         "base=a/b@v1,head=c/d@v2,kind=eagle3", "base=,head=", "/nonexistent/model", "./relative", "~", ".", "..",
         "", " ", "-", "--", "a" * 300, "~0", "~nosuchuser/x", "caf\u00e9", "\u202e", "x\ny", "nosuch", "SMOLLM2-135M-EAGLE2"]
VALUES = ["0", "1", "-1", "2", "8", "16", "1024", "99999999999999999999", "1e309", "nan", "inf", "-inf", "0.5",
          "1.5", "-0.0", "", " ", "abc", "--", "-", "auto", "cpu", "cuda", "cuda:7", "mps", "fp32", "bf16",
          "none", "8bit", "4bit", "on", "off", "static", "dynamic", "rtx3060", "24", "http://127.0.0.1:9",
          "ftp://x", "localhost", "::1", "0.0.0.0", "*", "https://x/", "1,2,3", "8, 16", "mt-bench"]

REMOTES = ["http://127.0.0.1:9", "127.0.0.1:9", "http://[::1]:9/v1/", "ftp://x", "", " ", "http://", "http://[::1",
           "http://127.0.0.1:99999", "http://" + "a" * 300, "http://a..b", "http://\u2603" * 20, "--"]


@st.composite
def command_lines(draw, tmp: Path):
    """A verb (or the bare chat), its positionals from NAMES, and up to four of its flags with values."""
    verb = draw(st.sampled_from([None, *sorted(PARSERS)]))
    parser = PARSERS[verb or "chat"]
    argv = [verb] if verb else []
    paths = [str(tmp / "out"), str(tmp / "a-file"), str(tmp), "/nonexistent/dir/x", ""]
    names = st.one_of(st.sampled_from(NAMES), st.sampled_from(paths), st.text(max_size=8))
    for action in parser._actions:
        if not action.option_strings and action.dest != "help":
            if action.nargs != "?" or draw(st.booleans()):
                argv.append(draw(names))
    flags = [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    for action in draw(st.lists(st.sampled_from(flags), max_size=4, unique_by=id)) if flags else []:
        flag = action.option_strings[-1]
        if action.nargs == 0:
            argv.append(flag)
            continue
        pool = [*(action.choices or []), *VALUES]
        path_like = action.dest in ("out", "work", "init_head", "head", "plot", "json", "export_head", "prompts")
        if action.dest == "remote":  # never a name the resolver would look up: loopback or refused before
            value = draw(st.sampled_from(REMOTES))
        else:
            value = draw(st.one_of(st.sampled_from(pool), st.sampled_from(paths if path_like else NAMES),
                                   st.text(max_size=6)))
        argv += [f"{flag}={value}"] if value.startswith("-") or not value else [flag, value]
    return argv


def run_main(argv: list[str], stdin: bytes, full_stdout: bool) -> tuple[object, str]:
    """cli.main with these streams; (exit code or ReachedWork, stderr)."""
    err = io.StringIO()
    saved = sys.stdin, sys.stdout, sys.stderr
    sink = os.fdopen(os.open("/dev/full", os.O_WRONLY), "w") if full_stdout else io.StringIO()  # never created
    sys.stdin, sys.stdout, sys.stderr = io.TextIOWrapper(io.BytesIO(stdin)), sink, err
    try:
        outcome = cli.main(argv)
    except ReachedWork:
        outcome = ReachedWork
    except SystemExit as exc:  # --help, --version: argparse's own exit
        outcome = exc.code
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
        sink.close()
    return outcome, err.getvalue()


def test_any_command_line_is_a_clean_outcome(tmp_path, work_stops_here):
    (tmp_path / "a-file").write_text("not a folder")
    seen: dict[str, int] = {}

    @FUZZ
    @given(argv=command_lines(tmp_path), stdin=st.sampled_from([b"", b"hello", b"caf\xe9", b"\x00\xff" * 3]),
           full_stdout=st.booleans() if Path("/dev/full").is_char_device() else st.just(False))
    def check(argv, stdin, full_stdout):
        if "--debug" in argv:
            return  # --debug asks for the traceback
        outcome, err = run_main(argv, stdin, full_stdout)
        seen[str(outcome)] = seen.get(str(outcome), 0) + 1
        assert "Traceback" not in err, (argv, err)
        if outcome in (0, None, ReachedWork):
            return
        errors = [line for line in err.splitlines() if line.startswith("eaglechat: error: ")]
        assert len(errors) == 1 and err.endswith(errors[0] + "\n"), (argv, err)

    check()
    # the fuzz reaches every kind of outcome: errors, successes and the start of real work
    assert seen.get("2") and seen.get(str(ReachedWork)) and (seen.get("0") or seen.get("None")), seen


TYPED = [["pull", "hf.co/a--b/c", "--head", "hf.co/x/y"], ["pull", "hf.co/x/y", "--head", "hf.co/a..b/c"],
         ["run", "base=a/b.git,head=x/y", "hi"], ["plan", "base=a/b,head=x/y--z"]]


@pytest.mark.parametrize("argv", TYPED, ids=[" ".join(a) for a in TYPED])
def test_names_the_hub_refuses_are_one_line_in_a_real_process(tmp_path, argv):
    """Online (a Hub endpoint that does not answer): huggingface_hub's HFValidationError was a traceback."""
    env = dict(os.environ, EAGLECHAT_HOME=str(tmp_path), PYTHONPATH=str(REPO), HF_HUB_OFFLINE="0",
               HF_ENDPOINT="http://127.0.0.1:9")
    got = subprocess.run([sys.executable, "-m", "eaglechat", *argv], env=env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 2
    assert got.stderr.startswith("eaglechat: error: ") and "not a Hub repo id" in got.stderr
    assert got.stderr.count("\n") == 1, got.stderr


# what the fuzz found, kept as plain cases (each was a traceback)
FOUND = [
    (["--model", "x", "--remote", "http://" + "a" * 300], "is not a valid URL (encoding with 'idna' codec failed"),
    (["--remote", "http://127.0.0.1:9", "--api-key", "\x80"], "cannot reach"),  # was UnicodeEncodeError in httpx
    (["plan", "a" * 300], ": File name too long"),
    (["tune", "a" * 300], ": File name too long"),
    (["plan", "~0"], "~0: no user '0' with a home folder"),
    (["train", "~nosuchuser/base"], "no user 'nosuchuser' with a home folder"),
]


@pytest.mark.parametrize("argv, says", FOUND, ids=[" ".join(a)[:40] for a, _ in FOUND])
def test_what_the_fuzz_found_is_one_line(work_stops_here, argv, says):
    outcome, err = run_main(argv, b"hello", full_stdout=False)
    assert outcome in (1, 2) and err.startswith("eaglechat: error: ") and err.count("\n") == 1, err
    assert says in err
