"""`eaglechat chat` (also bare `eaglechat`): the terminal chat app."""

from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser("chat", help="open the chat app (the default verb)",
                              description="Open the terminal chat app on the last used model.")
    p.add_argument("--model", metavar="NAME", default=None,
                   help="model alias to load (default: the last used one, first time smollm2-135m-eagle2)")
    p.add_argument("--head", metavar="PATH", default=None, help="use this EAGLE draft head instead of the catalog's")
    p.add_argument("--quant", choices=["auto", "none", "8bit", "4bit"], default="auto",
                   help="quantize the base model's weights (bitsandbytes)")
    p.add_argument("--device", default=None, help="auto (default), cpu, cuda, cuda:N, mps")
    p.set_defaults(func=run)


def run(args) -> int:
    from eaglechat import paths
    from eaglechat.chat.store import Store
    from eaglechat.tui.app import EagleChatApp

    store = Store(paths.history_db())  # StoreError (newer schema) is one line on stderr
    options = {"quant": args.quant}
    if args.head:
        options["head"] = args.head
    if args.device:
        options["device"] = args.device
    app = EagleChatApp(store=store, model=args.model, load_options=options)
    try:
        app.run()
    finally:
        store.close()
    if app.model_loading:
        # quit while a model was loading: the load cannot be interrupted and the interpreter would
        # wait for its thread at exit, so leave now (the history is closed, nothing is pending)
        import os
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
