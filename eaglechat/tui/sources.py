"""Where the chat app gets its engine and its model list: the real loader and catalog, imported
lazily (the TUI starts, and its tests run, without torch or a catalog)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from eaglechat import startup_gc
from eaglechat.engine.protocol import Engine

if TYPE_CHECKING:
    from eaglechat.fit.choose import LoadRequest

# loader(model, request=LoadRequest, progress=callable(phase, fraction|None), api_key=str|None, resident=bool) -> Engine
Loader = Callable[..., Engine]


def is_remote(model: str) -> bool:
    """Remote models are named URL#MODEL_ID (what `eaglechat chat --remote URL` lists)."""
    return model.startswith(("http://", "https://"))


def default_loader(model: str, request: LoadRequest | None = None, *, progress=None, api_key: str | None = None,
                   resident: bool = True, **asked) -> Engine:
    """The engine for `model` as `request` asks (commands/common.load_request; `asked`: LoadRequest's fields
    by name, on top): a remote model's server, else the resident engine that holds it so (unless
    `resident` is False), else loaded here. `api_key`: the server's, default $EAGLECHAT_API_KEY."""
    from dataclasses import replace

    from eaglechat.fit.choose import LoadRequest

    request = replace(request or LoadRequest(), **asked)
    if is_remote(model):
        import os

        from eaglechat.engine.remote import RemoteEngine

        url, _, name = model.partition("#")
        engine = RemoteEngine(url, model=name or None, api_key=api_key or os.environ.get("EAGLECHAT_API_KEY"),
                              progress=progress)
        startup_gc.settled()  # as load_engine does: the start is over (startup_gc.py)
        return engine
    engine = resident_engine(model, request, progress, api_key) if resident else None
    if engine is not None:
        startup_gc.settled()
        return engine
    try:
        from eaglechat.loader import load_engine
    except ImportError as exc:
        from eaglechat.errors import EaglechatError

        raise EaglechatError(f"the engine is not available in this build ({exc})") from exc
    return load_engine(model, request, progress=progress)


def resident_engine(model: str, request: LoadRequest, progress, api_key: str | None) -> Engine | None:
    """The local `eaglechat serve` that holds `model` as `request` would load it (eaglechat/resident.py), as a
    RemoteEngine, its URL in the load's progress; None when there is none."""
    import os

    from eaglechat import resident

    found = resident.find(model, request, api_key or os.environ.get("EAGLECHAT_API_KEY"))
    if found is None:
        return None
    from eaglechat.engine.remote import RemoteEngine

    if progress:
        progress(f"using {found.describe()}", None)
    return RemoteEngine(found.url, model=found.served, api_key=found.api_key)


def catalog_models() -> list[tuple[str, str]]:
    """(name, description) of the catalog, ready-to-run models first (embedded, or pulled), legacy entries
    only once pulled; empty when the catalog is unavailable (the picker still accepts a typed name)."""
    try:
        from eaglechat.models.catalog import load_catalog

        catalog = load_catalog()
    except Exception:  # noqa: BLE001
        return []
    try:
        from eaglechat.models.hub import read_record
    except Exception:  # noqa: BLE001
        read_record = None

    ready, other = [], []
    for name, m in catalog.items():
        desc = getattr(m, "description", "") or ""
        if getattr(m, "is_embedded", False):
            state, bucket = "built in", ready
        elif read_record is not None and read_record(name) is not None:
            state, bucket = "pulled", ready
        elif getattr(m, "legacy", False):  # `eaglechat list --all` shows these; a typed name still opens them
            continue
        else:
            size = getattr(m, "base_size_gb", 0) + getattr(m, "head_size_gb", 0)
            state, bucket = f"not pulled: enter pulls it (about {size:.1f} GB)", other
        bucket.append((name, f"{state} · {desc}" if desc else state))
    return ready + other


def remote_entries(url: str, api_key: str | None = None) -> list[tuple[str, str]]:
    """(URL#MODEL, description) of what an OpenAI-compatible server serves; RemoteError (one line) when
    it is unreachable or refuses the key."""
    from eaglechat.engine.remote import RemoteEngine

    engine = RemoteEngine(url, api_key=api_key, timeout=10.0)
    engine.close()
    return [(f"{engine.url}#{name}", f"remote · {engine.kind} server · {engine.url}") for name in engine.model_ids]


def remote_models(url: str, api_key: str | None = None) -> list[tuple[str, str]]:
    """remote_entries, or none when the server cannot be asked (the picker still lists local models)."""
    try:
        return remote_entries(url, api_key)
    except Exception:  # noqa: BLE001 - loading a remote model says why
        return []


def plan_badges(names: list[str], quant: str = "auto", device: str | None = None) -> dict[str, str]:
    """fits / tight / wont_fit per catalog model on this machine: the planner's status, the same answer
    `eaglechat list` and `show` give (slow: probes the device). Models whose shape is unknown (base
    config not cached) get no badge."""
    from eaglechat.fit.planner import Planner
    from eaglechat.models.catalog import load_catalog

    planner = Planner.here(device)
    catalog = load_catalog()
    out = {}
    for name in names:
        m = catalog.get(name)
        plan = planner.plan_for(m, quant=quant) if m is not None else None
        if plan is not None:
            out[name] = plan.status
    return out


def pull_size(model: str) -> float | None:
    """Approximate download size in GB of a catalog model that is not on this machine yet; None when
    it needs no pull (embedded, pulled, remote, unknown: the loader then says what is wrong)."""
    if is_remote(model):
        return None
    try:
        from eaglechat.models import hub
        from eaglechat.models.catalog import resolve

        manifest = resolve(model)
        if manifest.free_form or hub.is_pulled(manifest):
            return None
    except Exception:  # noqa: BLE001 - not a catalog model: loading it will say why
        return None
    return manifest.base_size_gb + manifest.head_size_gb


def pull_model(model: str, progress: Callable[[str, float | None], None], cancel) -> None:
    """`eaglechat pull MODEL` for the chat: the same hub.pull (pre-flight, resume, verification),
    its reports turned into loading-screen phases and a byte fraction; setting `cancel` stops it
    at the next chunk (the partial file is kept, so pulling again resumes)."""
    from eaglechat.models import hub
    from eaglechat.models.catalog import resolve

    class ChatProgress(hub.Progress):
        label, total, done = "", None, 0

        def _check(self) -> None:
            if cancel.is_set():
                raise KeyboardInterrupt

        def status(self, message: str) -> None:
            self._check()
            progress(message.strip(), None)

        def file_start(self, label: str, total: int | None, initial: int) -> None:
            self._check()
            self.label, self.total, self.done = label, total, initial
            progress(label, initial / total if total else None)

        def file_advance(self, n: int) -> None:
            self._check()
            self.done += n
            progress(self.label, self.done / self.total if self.total else None)

    hub.pull(resolve(model), ChatProgress())
