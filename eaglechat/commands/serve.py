"""`eaglechat serve [MODEL]`: the OpenAI-compatible API (http://HOST:PORT/v1) and Ollama's (/api) over
the local engine.

Binds 127.0.0.1 unless told otherwise; serving beyond this machine without --api-key prints a loud
warning. Requests are decoded one at a time in arrival order (see eaglechat/server/worker.py).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys

from eaglechat.commands.common import add_model_flags, add_tree_flags, load_request

API_KEY_ENV = "EAGLECHAT_API_KEY"


def register(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible API server", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=None, help="catalog alias or local folder (default: the embedded default)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=port, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on /v1 (default: ${API_KEY_ENV} if set)")
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: MODEL)")
    p.add_argument("--max-queue", type=int, default=16, help="requests that may wait; beyond it 429 (default 16)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body (default 1 MiB)")
    p.add_argument("--default-max-tokens", type=int, default=1024,
                   help="new tokens when a request sets no max_tokens (default 1024, at most the context)")
    p.add_argument("--max-messages", type=int, default=1024, help="messages one request may hold (default 1024)")
    p.add_argument("--max-prompt-tokens", type=int, default=0,
                   help="prompt tokens one request may hold before old messages are dropped (default 16 x the context)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a Host name clients may use besides loopback names, IP addresses and --host (repeat; "
                        "'*' allows any: this turns off the DNS-rebinding guard)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web origin (e.g. http://localhost:3000) whose pages may call this server, or a pattern "
                        "with one '*' (chrome-extension://*, http://localhost:*) (repeat; default: none)")
    p.add_argument("--cors-local-apps", action="store_true",
                   help="allow Ollama's default origins: this machine's pages on any port, app://, file://, "
                        "tauri://, vscode-webview:// and vscode-file://")
    p.add_argument("--strict-model", action="store_true",
                   help="404 for a request naming another model (default: the served model answers any name)")
    p.add_argument("--no-speculate", action="store_true", help="plain decoding only (the head is not loaded)")
    p.add_argument("--keep-alive", type=resident_duration, default=None, metavar="DURATION",
                   help="stop after this long without a request (300, 90s, 30m, 2h; default: run until stopped). "
                        "While it runs, `eaglechat run` and the chat on this machine use it instead of loading "
                        "the model themselves (when they ask for the same model and load options)")
    p.add_argument("--verbose", action="store_true", help="log every request")
    add_model_flags(p)
    add_tree_flags(p)
    p.set_defaults(func=run)


def resident_duration(text: str) -> float:
    from eaglechat.resident import duration

    return duration(text)


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer in 0..65535, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {value}")
    return value


def allowed_hosts(host: str, extra: list[str]) -> tuple[str, ...]:
    """Host names the DNS-rebinding guard lets through besides loopback names and IP literals:
    the bound name, this machine's names when bound to every interface, and --allow-host."""
    import socket

    names = list(extra)
    if host in ("0.0.0.0", "::", ""):
        names += [socket.gethostname(), socket.getfqdn()]
    elif not is_loopback(host):
        names.append(host)
    return tuple(dict.fromkeys(n for n in names if n))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int):
    """The listening socket, bound here so a busy port is one clear line, not a uvicorn traceback."""
    import socket

    from eaglechat.errors import UsageError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from eaglechat.errors import UsageError
    from eaglechat.loader import load_engine
    from eaglechat.models import default_model
    from eaglechat.server import create_app

    for flag, value in (("--max-queue", args.max_queue), ("--max-body-bytes", args.max_body_bytes),
                        ("--default-max-tokens", args.default_max_tokens), ("--max-messages", args.max_messages)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1")
    if args.max_prompt_tokens < 0:
        raise UsageError("--max-prompt-tokens must be at least 1 (0: 16 x the context)")
    from eaglechat.server.origins import is_pattern_or_origin

    for origin in args.cors_origin:
        if not is_pattern_or_origin(origin):
            raise UsageError(f"--cors-origin {origin!r}: an origin is scheme://host[:port], e.g. http://localhost:3000 "
                             "(one '*' makes a pattern: chrome-extension://*)")
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    sock = bind(args.host, args.port)  # before loading: a busy port fails in a second, not after the model
    if not is_loopback(args.host) and not api_key:
        bar = "!" * 78
        print(f"{bar}\nWARNING: serving on {args.host} WITHOUT an API key: anyone who can reach this "
              f"machine can use the model.\nPass --api-key KEY (or set {API_KEY_ENV}) to require one.\n{bar}",
              file=sys.stderr, flush=True)

    def progress(phase, fraction=None):
        print(f"[{phase}]", file=sys.stderr, flush=True)

    model = args.model or default_model.DEFAULT_ALIAS
    engine = load_engine(model, load_request(args), progress=progress)
    app = create_app(engine, model=args.served_model_name or engine.info.model, api_key=api_key,
                     max_queue=args.max_queue, max_body_bytes=args.max_body_bytes,
                     default_max_tokens=args.default_max_tokens,
                     aliases=tuple({model, engine.info.model} - {args.served_model_name}),
                     allow_hosts=allowed_hosts(args.host, args.allow_host), cors_origins=tuple(args.cors_origin),
                     cors_local_apps=args.cors_local_apps, strict_model=args.strict_model,
                     max_messages=args.max_messages, max_prompt_tokens=args.max_prompt_tokens)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    info = engine.info
    print(f"eaglechat: serving {app.state.server.config.model} at http://{shown}:{port}/v1 "
          f"({info.device} {info.dtype}, tree {info.tree.label()}, "
          f"context {info.max_context}{', API key required' if api_key else ''}); Ctrl-C stops",
          file=sys.stderr, flush=True)
    from eaglechat import resident
    from eaglechat.commands.common import resident_options
    from eaglechat.server.http import TimedH11Protocol

    watch = resident.IdleWatch(app)
    config = uvicorn.Config(watch, log_level="info" if args.verbose else "warning", access_log=args.verbose,
                            timeout_graceful_shutdown=5, http=TimedH11Protocol)
    server = uvicorn.Server(config)
    if args.keep_alive:
        resident.stop_when_idle(server, watch, args.keep_alive, lambda line: print(line, file=sys.stderr, flush=True))
    served = app.state.server.config
    advertised = resident.Advertised(
        url=resident.loopback_url(host, port), served=served.model,
        names=[*resident.names_for(model), engine.info.model, served.model, *served.aliases],
        request=resident_options(args, speculate=bool(engine.info.head)), api_key_required=bool(api_key))
    import signal

    def stopped(signum, frame):  # uvicorn stops gracefully on SIGTERM, then re-raises it here: end like Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stopped)
    try:
        with advertised:  # `run` and the chat find this server while it runs
            server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled: stopping is the normal end here
        pass
    print("eaglechat: server stopped", file=sys.stderr)
    return 0
