"""Where the chat app gets its engine and its model list: the real loader and catalog, imported
lazily (the TUI starts, and its tests run, without torch or a catalog)."""

from __future__ import annotations

from typing import Callable

from eaglechat.engine.protocol import Engine

Loader = Callable[..., Engine]  # loader(model, progress=callable(phase, fraction|None), **options) -> Engine


def default_loader(model: str, progress=None, **options) -> Engine:
    try:
        from eaglechat.engine.load import load_engine
    except ImportError as exc:
        from eaglechat.errors import EaglechatError

        raise EaglechatError(f"the engine is not available in this build ({exc})") from exc
    return load_engine(model, progress=progress, **options)


def catalog_models() -> list[tuple[str, str]]:
    """(name, description) of the catalog; empty when the catalog is unavailable."""
    try:
        from eaglechat.catalog import load_catalog

        return [(name, getattr(m, "description", "") or "") for name, m in load_catalog().items()]
    except Exception:  # noqa: BLE001 - the picker still accepts a typed name
        return []


def plan_badges(names: list[str], quant: str = "none") -> dict[str, str]:
    """fits / tight / wont_fit per catalog model on this machine's free memory (slow: torch probe)."""
    from eaglechat import hardware, memory
    from eaglechat.catalog import load_catalog

    device = hardware.probe()
    catalog = load_catalog()
    out = {}
    for name in names:
        m = catalog.get(name)
        if m is None or m.shape is None:
            continue
        est = memory.estimate(m.shape, memory.format_for(quant, m.dtype), 2048, device_kind=device.kind)
        out[name] = memory.classify(est.total, device.free_bytes)
    return out
