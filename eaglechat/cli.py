"""The `eaglechat` command: verbs chat (default) run serve pull list rm show plan bench tune train.

Each verb lives in eaglechat/commands/<verb>.py with `register(subparsers)`, which adds its parser
and sets `func(args) -> int`; they are listed below explicitly, so a missing one is an ImportError at
once. Heavy imports (torch, transformers, textual) happen inside `func`, so `eaglechat --help` stays
fast. Errors a user can cause are EaglechatError: one line, non-zero exit.
"""

from __future__ import annotations

import argparse
import sys

from eaglechat import __version__
from eaglechat.commands import bench, chat, plan, pull, rm, run, serve, show, train, tune
from eaglechat.commands import list as list_
from eaglechat.errors import EaglechatError

# verb modules, in the order `--help` lists them
COMMANDS = [chat, run, serve, pull, list_, rm, show, plan, bench, tune, train]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eaglechat", description="Fast, exact local chat with EAGLE-2 speculative decoding."
    )
    parser.add_argument("--version", action="version", version=f"eaglechat {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:  # bare `eaglechat` opens the chat
        args, extra = parser.parse_known_args([*argv, "chat"])
    # argparse fills an optional positional (run's PROMPT) before later flags: `run M --x 1 PROMPT`
    if len(extra) == 1 and getattr(args, "prompt", None) == "-" and not extra[0].startswith("-"):
        args.prompt, extra = extra[0], []
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.func(args) or 0)
    except EaglechatError as exc:
        if args.debug:
            raise
        print(f"eaglechat: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("eaglechat: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
