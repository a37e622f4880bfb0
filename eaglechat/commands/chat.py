"""`eaglechat chat` (also bare `eaglechat`): the terminal chat app.

Without a terminal there is no app to draw: with stdin piped (`echo hi | eaglechat`), as `ollama run` does,
the piped text is one prompt and the reply goes to stdout, on the chat's model and its default settings;
with only stdout redirected, one line says so. Neither ever waits on a screen nobody sees.
"""

from __future__ import annotations

from eaglechat.commands.common import (
    add_compile_flag,
    add_context_flag,
    add_device_flag,
    add_dtype_flag,
    add_quant_flag,
    add_remote_flags,
    api_key,
    load_request,
)


def register(subparsers) -> None:
    p = subparsers.add_parser("chat", help="open the chat app (the default verb)",
                              description="Open the terminal chat app on the last used model.")
    p.add_argument("--model", metavar="NAME", default=None,
                   help="model alias to load (default: the last used one, first time smollm2-135m-eagle2)")
    p.add_argument("--head", metavar="PATH", default=None, help="use this EAGLE draft head instead of the catalog's")
    add_quant_flag(p)
    add_device_flag(p)
    add_dtype_flag(p)
    add_context_flag(p)
    add_compile_flag(p)
    add_remote_flags(p)
    p.add_argument("--no-resident", action="store_true",
                   help="load models here even when a local `eaglechat serve` of one is running")
    p.add_argument("--save-remote", action="store_true",
                   help="with --remote: open the server's model again on the next plain `eaglechat` "
                        "(by default --remote is for this run only)")
    p.set_defaults(func=run)


def run(args) -> int:
    import sys

    from eaglechat.errors import UsageError

    if not _is_terminal(sys.stdin):
        return answer_piped(args)
    if not _is_terminal(sys.stdout):
        raise UsageError("the chat needs a terminal, and stdout is not one: `eaglechat run MODEL PROMPT > FILE` "
                         "writes one reply (or pipe the prompt in: `echo PROMPT | eaglechat > FILE`)")
    return open_app(args)


def _is_terminal(stream) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError):  # closed
        return False


def answer_piped(args) -> int:
    """`echo PROMPT | eaglechat [--model X]`: `eaglechat run` on the chat's model (the last one used) with the
    chat's sampling: settings.yaml's defaults for new conversations, else a new conversation's, auto speculation."""
    import argparse

    from eaglechat.chat import settings
    from eaglechat.chat.store import Conversation
    from eaglechat.commands import run as run_verb
    from eaglechat.errors import UsageError

    parser = argparse.ArgumentParser(prog="eaglechat")
    run_verb.register(parser.add_subparsers())
    model = args.model or (None if args.remote else settings.last_model())
    run_args = parser.parse_args(["run", *([model] if model else [])])
    run_args.prompt = run_verb.read_stdin()
    if not run_args.prompt.strip():
        raise UsageError("no terminal and no prompt on stdin: run the chat in a terminal, or pipe a prompt in "
                         "(`echo PROMPT | eaglechat`)")
    for key in ("head", "quant", "device", "dtype", "max_context", "compile", "remote", "api_key"):
        setattr(run_args, key, getattr(args, key))
    fresh = Conversation(0, "")  # what a new conversation starts with
    defaults = {"system_prompt": fresh.system_prompt, "temperature": fresh.temperature, "top_p": fresh.top_p,
                "max_new_tokens": fresh.max_new_tokens, **settings.conversation_defaults()}
    run_args.system = defaults["system_prompt"] or None
    run_args.temperature, run_args.top_p = defaults["temperature"], defaults["top_p"]
    run_args.max_new_tokens = defaults["max_new_tokens"]
    run_args.speculate = "auto"  # the chat's default
    return run_verb.run(run_args)


def open_app(args) -> int:
    from eaglechat import paths
    from eaglechat.chat.store import Store
    from eaglechat.tui.app import EagleChatApp

    store = Store(paths.history_db())  # StoreError (newer schema) is one line on stderr
    model, extra = args.model, {}
    if args.remote:  # the server's models first in the picker; open its first unless --model says otherwise
        from eaglechat.tui.sources import catalog_models, remote_entries

        extra["api_key"] = key = api_key(args)
        names = remote_entries(args.remote, key)  # unreachable / refused key: one line, before the app opens
        served = {name.partition("#")[2]: name for name, _ in names}
        if model is None or model in served:
            model = served.get(model) or names[0][0]
        extra["models"] = lambda: names + catalog_models()
    app = EagleChatApp(store=store, model=model, load_request=load_request(args), resident=not args.no_resident,
                       remember_remote=args.save_remote, **extra)
    return run_app(app, store)


def run_app(app, store) -> int:
    """Run the chat until ctrl+q (or SIGTERM/SIGHUP, which the app turns into the same exit), then
    leave at once. The terminal is already restored and the history closed; what is left is the
    interpreter's teardown, which waits on a model load or reply still running on a daemon thread (a
    prefill chunk or a verify step cannot be interrupted) and, even when idle, spent ~2.8 s freeing
    torch and the model after the chat had returned (measured: ctrl+q -> shell prompt 3.1 s on the
    2-core VM). The process ends here instead: ctrl+q -> shell prompt in ~0.3 s."""
    try:
        app.run()
    finally:
        store.close()
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(app.return_code or 0)
