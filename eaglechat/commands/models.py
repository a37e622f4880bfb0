"""Verbs for the model catalog: pull, list (ls), rm, show. Ollama's grammar, the HF cache underneath."""

from __future__ import annotations

import json
import sys
import time

from eaglechat.errors import EaglechatError


def register(subparsers) -> None:
    p = subparsers.add_parser("pull", help="download a model and its EAGLE head from the Hugging Face Hub")
    p.add_argument("name", help="catalog alias, or base=ORG/REPO[@REV],head=ORG/REPO[@REV]")
    p.add_argument("--dry-run", action="store_true", help="show what would be downloaded, then stop")
    p.set_defaults(func=cmd_pull)

    p = subparsers.add_parser("list", aliases=["ls"], help="list the catalog: pulled or not, size, format")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_list)

    p = subparsers.add_parser("rm", help="remove a pulled model (files another alias uses stay)")
    p.add_argument("name")
    p.set_defaults(func=cmd_rm)

    p = subparsers.add_parser("show", help="repos, revisions, shape, template and the profile for this machine")
    p.add_argument("name")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--profile", action="store_true", help="print the resolved GPU profile for this machine")
    p.add_argument("--serve", choices=["vllm", "sglang"],
                   help="print the vLLM or SGLang command that serves this model on a GPU box, same tree budget")
    p.add_argument("--tp", type=int, default=1, help="with --serve: tensor-parallel GPUs (default 1)")
    p.add_argument("--gpu", default="h100", help="with --serve: the GPU whose shipped profile sets the tree "
                   "(a name or GiB, as `plan --gpu`; default h100)")
    p.set_defaults(func=cmd_show)


# ------------------------------------------------------------------------------------------------ pull


class ConsoleProgress:
    """Status lines and one tqdm bar per large file (size, rate, ETA) on stderr."""

    min_bar_bytes = 1_000_000  # configs and tokenizers come down silently, as Ollama hides tiny layers

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.bar = None

    def status(self, message: str) -> None:
        print(message, file=self.stream, flush=True)

    def file_start(self, label, total, initial):
        from huggingface_hub import constants
        from tqdm import tqdm

        if total is not None and total < self.min_bar_bytes:
            return
        if constants.HF_HUB_DISABLE_PROGRESS_BARS is True:  # honoured as huggingface_hub does: a plain line
            from eaglechat.hub import fmt_bytes

            resumed = f", resuming at {fmt_bytes(initial)}" if initial else ""
            self.status(f"{label} ({fmt_bytes(total)}{resumed})")
            return
        self.bar = tqdm(
            total=total, initial=initial, desc=label, unit="B", unit_scale=True, unit_divisor=1000,
            file=self.stream, dynamic_ncols=True, leave=True, mininterval=0.25,
            bar_format="{desc}  {percentage:3.0f}% ▕{bar:20}▏ {n_fmt}/{total_fmt}  {rate_fmt}  {remaining}",
        )

    def file_advance(self, n):
        if self.bar is not None:
            self.bar.update(n)

    def file_end(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def cmd_pull(args) -> int:
    from eaglechat import catalog, hub

    manifest = catalog.resolve(args.name)
    plan = hub.pull(manifest, ConsoleProgress(), dry_run=args.dry_run)
    if args.dry_run and plan is not None:
        for rp in plan.repos:
            for f in rp.files:
                state = "cached" if f.cached else (f"partial {hub.fmt_bytes(f.partial)}" if f.partial else "to download")
                print(f"{rp.role}  {rp.repo}/{f.filename}  {hub.fmt_bytes(f.size)}  {state}")
    return 0


# ------------------------------------------------------------------------------------------- list/show


_DEVICE = []


def machine_fit(manifest) -> dict:
    """What the planner and the GPU profiles would pick for `manifest` on this machine.

    The one seam to the planner: hardware.probe() (once per process), then
    memory.plan_model(shape, device, model=..., head_kind=..., checkpoint_dtype=...), imported lazily.
    Anything missing or failing reads as None, which the tables print as "—".
    """
    out = {"format": None, "profile": None, "fits": None}
    if manifest.shape is None:
        return out
    try:
        from eaglechat import hardware, memory

        if not _DEVICE:
            _DEVICE.append(hardware.probe())
        plan = memory.plan_model(
            manifest.shape, _DEVICE[0], model=manifest.name, head_kind=manifest.head_kind,
            checkpoint_dtype=None if manifest.dtype == "auto" else manifest.dtype, explain=False,
        )
        out["profile"] = getattr(plan.profile, "name", plan.profile)
        out["fits"] = plan.choice is not None
        out["format"] = plan.choice.format if plan.choice is not None else "won't fit"
    except EaglechatError:  # a broken profile file is the user's to fix: say which, never "—"
        raise
    except Exception:
        pass
    return out


def resolved_profile(manifest) -> dict | None:
    """profiles.resolve_profile(device, shape, model=...).to_dict(), or None when unavailable."""
    if manifest.shape is None:
        return None
    try:
        from eaglechat import hardware, profiles

        if not _DEVICE:
            _DEVICE.append(hardware.probe())
        prof = profiles.resolve_profile(
            _DEVICE[0], manifest.shape, model=manifest.name,
            checkpoint_dtype=None if manifest.dtype == "auto" else manifest.dtype,
        )
        return prof.to_dict()
    except EaglechatError:
        raise
    except Exception:
        return None


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


def _commits(manifest) -> dict:
    from eaglechat import hub

    record = hub.read_record(manifest.name) or {}
    return {r["role"]: r["commit"] for r in record.get("repos", [])}


def _row(manifest) -> dict:
    from eaglechat import hub

    st = hub.model_status(manifest)
    commits = _commits(manifest)
    fit = machine_fit(manifest)
    return {
        "name": manifest.name,
        "id": commits.get("base", "")[:12] or None,
        "status": st.state,
        "pulled": st.state in ("pulled", "embedded"),
        "size_bytes": st.size_bytes,
        "approx_size_gb": round(manifest.base_size_gb + manifest.head_size_gb, 2),
        "format": fit["format"],
        "modified": _iso(st.modified),
        "base": manifest.base_ref,
        "head": manifest.head_ref,
        "head_kind": manifest.head_kind,
        "gated": manifest.gated,
    }


def cmd_list(args) -> int:
    from eaglechat import catalog, hub

    rows = [_row(m) for m in catalog.load_catalog().values()]
    for record in hub.all_records():  # free-form pulls live only in their records
        if "=" in record.get("name", "") and not any(r["name"] == record["name"] for r in rows):
            rows.append(_row(catalog.resolve(record["name"])))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [("NAME", "ID", "SIZE", "STATUS", "FORMAT", "MODIFIED")]
    for r in rows:
        size = hub.fmt_bytes(r["size_bytes"]) if r["size_bytes"] else f"~{r['approx_size_gb']:.1f} GB"
        table.append((r["name"], r["id"] or "—", size, r["status"], r["format"] or "—", _ago(_ts(r["modified"]))))
    _print_table(table)
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


def _params(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def show_data(manifest) -> dict:
    from eaglechat import hub

    st = hub.model_status(manifest)
    commits = _commits(manifest)
    fit = machine_fit(manifest)
    shape = manifest.shape
    local = {"base": None, "head": None}
    if st.state == "pulled" or (manifest.is_embedded and manifest.head_path):
        try:
            if manifest.is_embedded:
                from eaglechat import default_model

                local = {"base": str(default_model.default_base_dir()), "head": str(manifest.head_path)}
            else:
                base, head = hub.local_paths(manifest)
                local = {"base": str(base), "head": str(head)}
        except Exception:
            pass
    return {
        "name": manifest.name,
        "description": manifest.description,
        "source": manifest.source,
        "base": {
            "repo": manifest.base_repo, "revision": manifest.base_revision, "commit": commits.get("base"),
            "package": manifest.base_package, "path": local["base"],
        },
        "head": {
            "repo": manifest.head_repo, "revision": manifest.head_revision if manifest.head_repo else None,
            "commit": commits.get("head"), "kind": manifest.head_kind, "path": local["head"],
        },
        "parameters": shape.params if shape else None,
        "context_length": shape.max_context if shape else None,
        "shape": dict(shape.__dict__) if shape else None,
        "template": manifest.template,
        "system": manifest.system,
        "stop_tokens": list(manifest.stop_tokens),
        "dtype": manifest.dtype,
        "gated": manifest.gated,
        "license": manifest.license,
        "approx_size_gb": {"base": manifest.base_size_gb, "head": manifest.head_size_gb},
        "status": st.state,
        "size_bytes": st.size_bytes,
        "profile": fit["profile"],
        "format": fit["format"],
    }


def cmd_show(args) -> int:
    from eaglechat import catalog

    manifest = catalog.resolve(args.name)
    if args.serve:
        from eaglechat.launch import serve_recipe

        recipe = serve_recipe(manifest, args.serve, tp=args.tp, gpu=args.gpu)
        if args.json:
            print(json.dumps(recipe, indent=2))
        else:
            print(recipe["command"])
            for note in recipe["notes"]:
                print(f"# {note}")
        return 0
    if args.profile:
        prof = resolved_profile(manifest)
        if args.json:
            print(json.dumps(prof, indent=2, default=str))
        elif prof is None:
            print("—")
        else:
            import yaml

            print(yaml.safe_dump(json.loads(json.dumps(prof, default=str)), sort_keys=False).rstrip())
        return 0
    d = show_data(manifest)
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    kinds = {"eagle2": "EAGLE-2 dynamic tree (EAGLE-1 head layout)", "eagle3": "EAGLE-3 head"}
    b, h = d["base"], d["head"]
    base = b["package"] and f"{b['repo']} (from PyPI {b['package']})" or f"{b['repo']} @ {b['revision']}"
    head = h["repo"] and f"{h['repo']} @ {h['revision']}" or f"{h['path']} (embedded)"
    sections = [
        ("Model", [
            ("name", d["name"]), ("base", base), ("head", head),
            ("commits", f"base {(b['commit'] or '—')[:12]}, head {(h['commit'] or '—')[:12]}" if b["commit"] else "—"),
            ("head kind", kinds.get(h["kind"], h["kind"])),
            ("parameters", _params(d["parameters"]) if d["parameters"] else "—"),
            ("context length", d["context_length"] or "—"),
            ("embedding length", d["shape"]["hidden_size"] if d["shape"] else "—"),
            ("dtype", d["dtype"]), ("status", d["status"]),
        ]),
        ("Prompt", [
            ("template", d["template"]), ("stop tokens", " ".join(d["stop_tokens"]) or "—"),
            ("system", (d["system"] or "—") if len(d["system"] or "") < 70 else d["system"][:67] + "..."),
        ]),
        ("This machine", [("profile", d["profile"] or "—"), ("format", d["format"] or "—")]),
        ("License", [("gated", "yes" if d["gated"] else "no"), ("license", d["license"])]),
    ]
    if d["description"]:
        print(d["description"])
        print()
    for title, items in sections:
        print(f"  {title}")
        for k, v in items:
            print(f"    {k:<18}{v}")
        print()
    return 0


# -------------------------------------------------------------------------------------------------- rm


def cmd_rm(args) -> int:
    from eaglechat import hub

    result = hub.remove(args.name)
    print(f"deleted '{result.name}' ({hub.fmt_bytes(result.freed_bytes)} freed)")
    for ref, users in result.kept:
        print(f"kept {ref} (used by {', '.join(users)})")
    return 0
