"""`eaglechat chat` (also bare `eaglechat`): the terminal chat app."""

from __future__ import annotations

from eaglechat.commands.common import (
    add_compile_flag,
    add_context_flag,
    add_device_flag,
    add_dtype_flag,
    add_quant_flag,
    add_remote_flags,
    api_key,
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
    p.add_argument("--save-remote", action="store_true",
                   help="with --remote: open the server's model again on the next plain `eaglechat` "
                        "(by default --remote is for this run only)")
    p.set_defaults(func=run)


def run(args) -> int:
    from eaglechat import paths
    from eaglechat.chat.store import Store
    from eaglechat.tui.app import EagleChatApp

    store = Store(paths.history_db())  # StoreError (newer schema) is one line on stderr
    options = {"quant": args.quant, "compile": args.compile}
    if args.head:
        options["head"] = args.head
    for key in ("device", "dtype", "max_context"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    model, extra = args.model, {}
    if args.remote:  # the server's models first in the picker; open its first unless --model says otherwise
        from eaglechat.tui.sources import catalog_models, remote_entries

        key = api_key(args)
        names = remote_entries(args.remote, key)  # unreachable / refused key: one line, before the app opens
        served = {name.partition("#")[2]: name for name, _ in names}
        if model is None or model in served:
            model = served.get(model) or names[0][0]
        extra["models"] = lambda: names + catalog_models()
        if key:
            options["api_key"] = key
    app = EagleChatApp(store=store, model=model, load_options=options, remember_remote=args.save_remote, **extra)
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
