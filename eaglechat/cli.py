"""The `eaglechat` command: verbs chat (default) run serve pull list rm show plan bench tune train.

Each verb lives in eaglechat/commands/<verb>.py with `register(subparsers)`, which adds its parser
and sets `func(args) -> int`; they are listed below explicitly, so a missing one is an ImportError at
once. Heavy imports (torch, transformers, textual) happen inside `func`, so `eaglechat --help` stays
fast. Errors a user can cause are EaglechatError: one line, non-zero exit.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from eaglechat import __version__, startup_gc
from eaglechat.commands import bench, chat, plan, pull, rm, run, serve, show, train, tune
from eaglechat.commands import list as list_
from eaglechat.errors import EaglechatError, UsageError
from eaglechat.output import silence_stdout, watched_stdout

# verb modules, in the order `--help` lists them
COMMANDS = [chat, run, serve, pull, list_, rm, show, plan, bench, tune, train]


class Parser(argparse.ArgumentParser):
    """argparse whose errors are a UsageError: one line (`eaglechat: error: argument --top-p: ...`),
    exit code 2, like every other error a user can cause; `--help` shows the usage."""

    def error(self, message: str):
        raise UsageError(f"{message} (see '{self.prog} --help')")


def check_utf8(argv: list[str]) -> None:
    """Arguments that are not valid UTF-8 (Python keeps the bytes as lone surrogates) are one line
    here, not a UnicodeEncodeError deep in the tokenizer."""
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raw = arg.encode("utf-8", "surrogateescape")
            raise UsageError(f"argument {str(raw)[:60]} is not valid UTF-8") from None


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="eaglechat", description="Fast, exact local chat with EAGLE-2 speculative decoding."
    )
    parser.add_argument("--version", action="version", version=f"eaglechat {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def one_line(text: str) -> str:
    """An error message as exactly one line: control characters and line separators that came in with
    the user's own input (a value with a carriage return, a file name with a newline) are escaped."""
    return re.sub(r"[\x00-\x1f\x7f\x85\u2028\u2029]", lambda m: repr(m.group())[1:-1], text.strip())


def check_dashdash_values(argv: list[str]) -> None:
    """`--flag=--`: Python 3.11's argparse drops the "--" and hands the verb an empty list instead of
    a value (a TypeError deep inside); refuse it here, in one line."""
    for arg in argv:
        flag, eq, value = arg.partition("=")
        if arg.startswith("--") and eq and value == "--":
            raise UsageError(f"argument {flag}: expected a value, got '--' (see 'eaglechat --help')")


def argv_values(argv: list[str]) -> list[str]:
    """Each argument, and the value of each `--flag=value`."""
    return [*argv, *(a.partition("=")[2] for a in argv if a.startswith("--") and "=" in a)]


def with_default_verb(argv: list[str]) -> list[str]:
    """The chat is the default verb: bare `eaglechat`, and `eaglechat --model X ...` (a chat flag first)."""
    i = 0
    while i < len(argv) and argv[i] == "--debug":  # the one top-level flag that does not exit
        i += 1
    if i == len(argv) or (argv[i].startswith("-") and argv[i] not in ("-h", "--help", "--version")):
        return [*argv[:i], "chat", *argv[i:]]
    return argv


def parse(argv: list[str]) -> argparse.Namespace:
    check_utf8(argv)
    check_dashdash_values(argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(with_default_verb(argv))
    # argparse fills an optional positional (run's PROMPT) before later flags: `run M --x 1 PROMPT`
    if len(extra) == 1 and getattr(args, "prompt", None) == "-" and not extra[0].startswith("-"):
        args.prompt, extra = extra[0], []
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """The program (`argv` None: sys.argv, and the process ends after a model ran without the slow
    teardown below) or a call from Python (`argv` given: returns the exit code)."""
    if argv is None:
        startup_gc.starting()  # until an engine is loaded (startup_gc.py)
    code = run_verb(argv)
    if argv is None:
        exit_without_teardown(code)
    return code


def exit_without_teardown(code: int) -> None:
    """End the process once torch has been loaded: the interpreter's own teardown then spends 1-2 s
    (more on a loaded machine) freeing torch's and transformers' modules one object at a time, after the
    reply is out. atexit handlers still run and the standard streams are flushed; only when no other
    non-daemon thread is alive (one the normal exit would wait for)."""
    import threading

    if "torch" not in sys.modules or any(t.is_alive() and not t.daemon for t in threading.enumerate()
                                         if t is not threading.main_thread()):
        return
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or a full device: the normal exit would not report it either
            pass
    os._exit(code)


def run_verb(argv: list[str] | None) -> int:
    from eaglechat import quiet, threads

    threads.apply()  # OpenMP threads and wait policy, before anything imports torch
    argv = list(sys.argv[1:] if argv is None else argv)
    args = None
    try:
        with watched_stdout() as output:
            args = parse(argv)
            quiet.configure(getattr(args, "verbose", False) or getattr(args, "debug", False))
            code = int(args.func(args) or 0)
        return code
    except EaglechatError as exc:
        if "--debug" in argv or getattr(args, "debug", False):
            raise
        print(f"eaglechat: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        if getattr(args, "debug", False):
            raise
        print("eaglechat: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
    except RuntimeError as exc:  # pathlib's expanduser() on `~NAME` where NAME has no home folder
        unknown = [a for a in argv_values(argv) if a.startswith("~") and os.path.expanduser(a) == a]
        if "home directory" not in str(exc) or not unknown or getattr(args, "debug", False):
            raise
        print(f"eaglechat: error: {one_line(unknown[0][:80])}: no user {unknown[0][1:].split('/')[0]!r} "
              "with a home folder (~NAME is that user's)", file=sys.stderr)
        return 2
    except OSError as exc:
        if getattr(args, "debug", False):
            raise
        if output.failed is not None:
            silence_stdout()
            print(f"eaglechat: error: could not write the output to stdout: {exc.strerror or exc}", file=sys.stderr)
            return 1
        if exc.filename is None:
            raise  # not a file or folder named anywhere: a fault, with its traceback
        # a path that cannot be used (a name too long for one, no permission, a loop of links): the user's
        # input or their folders, said in one line
        name = str(exc.filename)
        name = name if len(name) <= 80 else name[:60] + "..." + name[-17:]
        print(f"eaglechat: error: {one_line(name)}: {exc.strerror or exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
