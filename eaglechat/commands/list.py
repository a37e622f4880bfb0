"""`eaglechat list` (`ls`): the catalog and what is pulled, with the format the planner picks here."""

from __future__ import annotations

import json
import time


def register(subparsers) -> None:
    p = subparsers.add_parser("list", aliases=["ls"], help="list the catalog: pulled or not, size, format")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--all", action="store_true", help="also the legacy models (2023-24 bases and heads)")
    p.set_defaults(func=run)


def machine_format(planner, manifest) -> tuple[str | None, str | None]:
    """(weight format the planner picks here or "won't fit", profile name); (None, None) while the
    base config is not cached. A broken profile file is the user's to fix: its one-line error shows."""
    plan = planner.plan_for(manifest)
    if plan is None:
        return None, None
    return (plan.choice.format if plan.choice is not None else "won't fit"), plan.profile


def commits(manifest) -> dict:
    """role -> commit of the pulled repos (from the pull record)."""
    from eaglechat.models import hub

    record = hub.read_record(manifest.name) or {}
    return {r["role"]: r["commit"] for r in record.get("repos", [])}


def _iso(ts: float | None) -> str | None:
    return None if ts is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _ago(ts: float | None) -> str:
    if ts is None:
        return "—"
    s = max(time.time() - ts, 0)
    for unit, secs in (("week", 604800), ("day", 86400), ("hour", 3600), ("minute", 60)):
        if s >= secs:
            n = int(s // secs)
            return f"{n} {unit}{'s' if n > 1 else ''} ago"
    return "just now"


def row(manifest, planner) -> dict:
    from eaglechat.models import hub

    st = hub.model_status(manifest)
    ids = commits(manifest)
    fmt, _ = machine_format(planner, manifest)
    return {
        "name": manifest.name,
        "id": ids.get("base", "")[:12] or None,
        "status": st.state,
        "pulled": st.state in ("pulled", "embedded"),
        "size_bytes": st.size_bytes,
        "approx_size_gb": round(manifest.base_size_gb + manifest.head_size_gb, 2),
        "format": fmt,
        "modified": _iso(st.modified),
        "base": manifest.base_ref,
        "head": manifest.head_ref,
        "head_kind": manifest.head_kind,
        "gated": manifest.gated,
        "legacy": manifest.legacy,
    }


def run(args) -> int:
    from eaglechat.errors import EaglechatError
    from eaglechat.fit.planner import Planner
    from eaglechat.models import catalog, hub
    from eaglechat.units import fmt_bytes

    planner = Planner.here()
    shown = [m for m in catalog.load_catalog().values() if args.all or not m.legacy or hub.is_pulled(m)]
    rows = [row(m, planner) for m in shown]
    for record in hub.all_records():  # free-form pairs and NAME:TAG heads live only in their records
        name = record.get("name", "")
        if ("=" in name or ":" in name) and not any(r["name"] == name for r in rows):
            try:
                rows.append(row(catalog.resolve(name), planner))
            except EaglechatError:  # a tag its manifest no longer lists: rm still finds the record
                continue
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    # ID: the pulled base's commit (Ollama's column); only pulls have one, so no column of dashes before the first
    with_id = any(r["id"] for r in rows)
    table = [("NAME", *(("ID",) if with_id else ()), "SIZE", "STATUS", "FORMAT", "MODIFIED")]
    for r in rows:
        size = fmt_bytes(r["size_bytes"]) if r["size_bytes"] else f"~{r['approx_size_gb']:.1f} GB"
        table.append((r["name"], *((r["id"] or "",) if with_id else ()), size, r["status"], r["format"] or "—",
                      _ago(_ts(r["modified"]))))
    _print_table(table)
    if not args.all:
        hidden = sum(1 for m in catalog.load_catalog().values() if m.legacy) - sum(1 for r in rows if r["legacy"])
        if hidden:
            print(f"({hidden} legacy models not shown: eaglechat list --all)")
    return 0


def _ts(iso: str | None) -> float | None:
    if iso is None:
        return None
    import calendar

    return calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ"))


def _print_table(rows) -> None:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("    ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
