"""`eaglechat show NAME [--json] [--profile]`: repos, revisions, shape, template, and the profile and
format the planner picks on this machine."""

from __future__ import annotations

import json
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser("show", help="repos, revisions, shape, template and the profile for this machine")
    p.add_argument("name", help="catalog alias (NAME:TAG for one of its other heads), hf.co/ORG/BASE with --head, "
                   "or the free form base=...,head=...")
    p.add_argument("--head", default=None, metavar="hf.co/ORG/HEAD", help="with hf.co/ORG/BASE: the EAGLE head of the pair")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--profile", action="store_true", help="print the resolved GPU profile for this machine")
    p.add_argument("--serve", choices=["vllm", "sglang"],
                   help="print the vLLM or SGLang command that serves this model on a GPU box, same tree budget")
    p.add_argument("--tp", type=int, default=1, help="with --serve: tensor-parallel GPUs (default 1)")
    p.add_argument("--export-head", metavar="DIR", default=None,
                   help="with --serve: write a copy of the (embedded or pulled) head that the server loads to DIR "
                        "(a reduced draft vocabulary becomes a full one, plus SGLang's --speculative-token-map)")
    p.add_argument("--gpu", default="h100", help="with --serve: the GPU whose shipped profile sets the tree "
                   "(a name or GiB, as `plan --gpu`; default h100)")
    p.set_defaults(func=run)


def resolved_profile(manifest, device) -> dict | None:
    """profiles.resolve_profile(device, shape, model=...).to_dict(); None while the shape is unknown."""
    from eaglechat.fit import profiles

    if manifest.shape is None:
        return None
    prof = profiles.resolve_profile(
        device, manifest.shape, model=manifest.name,
        checkpoint_dtype=None if manifest.dtype == "auto" else manifest.dtype,
    )
    return prof.to_dict()


def _params(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def show_data(manifest, planner) -> dict:
    from eaglechat.commands.list import commits as pulled_commits
    from eaglechat.commands.list import machine_format
    from eaglechat.models import hub

    st = hub.model_status(manifest)
    commits = pulled_commits(manifest)
    fmt, profile = machine_format(planner, manifest)
    shape = manifest.shape
    local = {"base": None, "head": None}
    if st.state == "pulled" or (manifest.is_embedded and manifest.head_path):
        try:
            if manifest.is_embedded:
                from eaglechat.models import default_model

                local = {"base": str(default_model.default_base_dir()), "head": str(manifest.head_path)}
            else:
                base, head = hub.local_paths(manifest)
                local = {"base": str(base), "head": str(head)}
        except Exception:
            pass
    from eaglechat.models import sampling as sampling_defaults

    base_dir = Path(local["base"]) if local["base"] and (st.state == "pulled" or manifest.is_embedded) else None
    sampling, sampling_source = sampling_defaults.for_model(base_dir, manifest)
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
            "draft_vocab": manifest.draft_vocab, "why": manifest.head_why or None,
        },
        "alternative_heads": [{"tag": a.tag, "name": f"{manifest.name}:{a.tag}", "repo": a.repo, "revision": a.revision,
                               "kind": a.kind, "why": a.why} for a in manifest.alt_heads],
        "pinned": manifest.pinned,
        "legacy": manifest.legacy,
        "sources": dict(manifest.sources),
        "parameters": shape.params if shape else None,
        "context_length": shape.max_context if shape else None,
        "shape": dict(shape.__dict__) if shape else None,
        "template": manifest.template,
        "system": manifest.system,
        "stop_tokens": list(manifest.stop_tokens),
        # the model's own sampling defaults (chat, run and serve use them where not told otherwise);
        # source "" with pulled false: its generation_config.json is read once pulled
        "sampling": {"values": sampling, "source": sampling_source, "pulled": base_dir is not None},
        "dtype": manifest.dtype,
        "gated": manifest.gated,
        "license": manifest.license,
        "approx_size_gb": {"base": manifest.base_size_gb, "head": manifest.head_size_gb},
        "status": st.state,
        "size_bytes": st.size_bytes,
        "profile": profile,
        "format": fmt,
    }


def sampling_line(sampling: dict) -> str:
    from eaglechat.models.sampling import describe

    if sampling["source"]:
        return f"{describe(sampling['values'])} ({sampling['source']})"
    if sampling["pulled"]:
        return "greedy (the model states no sampling)"
    return "its generation_config.json's, read once pulled (greedy if it states none)"


def run(args) -> int:
    from eaglechat.fit.planner import Planner
    from eaglechat.models import catalog

    manifest = catalog.resolve_cli(args.name, args.head)
    if args.export_head and not args.serve:
        from eaglechat.errors import UsageError

        raise UsageError("--export-head goes with --serve vllm|sglang")
    if args.serve:
        from eaglechat.models.launch import serve_recipe

        recipe = serve_recipe(manifest, args.serve, tp=args.tp, gpu=args.gpu, export_dir=args.export_head)
        if args.json:
            print(json.dumps(recipe, indent=2))
        else:
            print(recipe["command"])
            for note in recipe["notes"]:
                print(f"# {note}")
        return 0
    planner = Planner.here()
    if args.profile:
        prof = resolved_profile(manifest, planner.device)
        if args.json:
            print(json.dumps(prof, indent=2, default=str))
        elif prof is None:
            print("—")
        else:
            import yaml

            print(yaml.safe_dump(json.loads(json.dumps(prof, default=str)), sort_keys=False).rstrip())
        return 0
    d = show_data(manifest, planner)
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    kinds = {"eagle2": "EAGLE-2 dynamic tree (EAGLE-1 head layout)", "eagle3": "EAGLE-3 head"}
    b, h = d["base"], d["head"]
    unpinned = "" if d["pinned"] or manifest.is_embedded else " (not pinned)"
    base = b["package"] and f"{b['repo']} (from PyPI {b['package']})" or f"{b['repo']} @ {b['revision']}{unpinned}"
    head = h["repo"] and f"{h['repo']} @ {h['revision']}{unpinned}" or f"{h['path']} (embedded)"
    sections = [
        ("Model", [
            ("name", d["name"]), ("base", base), ("head", head),
            ("commits", f"base {(b['commit'] or '—')[:12]}, head {(h['commit'] or '—')[:12]}" if b["commit"] else "—"),
            ("head kind", kinds.get(h["kind"], h["kind"]) + (f", draft vocabulary {h['draft_vocab']}" if h["draft_vocab"] else "")),
            ("parameters", _params(d["parameters"]) if d["parameters"] else "—"),
            ("context length", d["context_length"] or "—"),
            ("embedding length", d["shape"]["hidden_size"] if d["shape"] else "—"),
            ("dtype", d["dtype"]), ("status", d["status"]),
        ]),
        ("Prompt", [
            ("template", d["template"]), ("stop tokens", " ".join(d["stop_tokens"]) or "—"),
            ("system", (d["system"] or "—") if len(d["system"] or "") < 70 else d["system"][:67] + "..."),
            ("sampling", sampling_line(d["sampling"])),
        ]),
        ("This machine", [("profile", d["profile"] or "—"), ("format", d["format"] or "—")]),
        ("License", [("gated", "yes" if d["gated"] else "no"), ("license", d["license"])]),
    ]
    if h["why"] or d["alternative_heads"]:
        sections.append(("Heads", [("this head", h["why"] or "—")] + [
            (a["name"], f"{a['repo']}: {a['why']}") for a in d["alternative_heads"]]))
    if d["sources"]:
        sections.append(("Sources", list(d["sources"].items())))
    if d["description"]:
        print(d["description"] + (" (legacy: listed by 'list --all')" if d["legacy"] else ""))
        print()
    for title, items in sections:
        print(f"  {title}")
        for k, v in items:
            print(f"    {k:<17} {v}")
        print()
    return 0
