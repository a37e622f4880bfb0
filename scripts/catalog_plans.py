"""The catalog's memory verdicts per GPU class: `eaglechat plan NAME --gpu G --json` for every catalog entry
and G in 8, 12, 16, 24 GB, as the Markdown table the README's catalog section carries.

    python scripts/catalog_plans.py [--all] [--gpu 8 12 16 24]

A cell is the format and context the planner picks (`tight`: under 8 % headroom) or `won't fit`. The plans
are simulated cards (total = free = the nominal size, the shipped profile's reserve), from the manifests'
shapes: nothing is downloaded. The MXFP4 verdicts depend on this machine's packages (see the notes).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eaglechat.cli import main  # noqa: E402
from eaglechat.models import catalog  # noqa: E402

GPUS = ("8", "12", "16", "24")


def verdict(name: str, gpu: str, mxfp4_kept: bool | None = None) -> str:
    """One cell: what `eaglechat plan NAME --gpu GPU --json` decides (`mxfp4_kept`: as if transformers kept
    an MXFP4 checkpoint as MXFP4, i.e. with triton and the `kernels` package installed; None: this machine)."""
    from eaglechat.fit import planner

    out = io.StringIO()
    native = planner.mxfp4_native
    if mxfp4_kept is not None:
        planner.mxfp4_native = lambda device: mxfp4_kept
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            main(["plan", name, "--gpu", gpu, "--json"])
    finally:
        planner.mxfp4_native = native
    plan = json.loads(out.getvalue())
    c = plan["choice"]
    if c is None:
        return "won't fit"
    ctx = f"{c['context'] // 1024}k" if c["context"] >= 1024 else str(c["context"])
    return f"{c['format']} {ctx}" + (" (tight)" if c["status"] == "tight" else "")


def table(names: list[str], gpus=GPUS) -> str:
    head = "| model | " + " | ".join(f"{g} GB" for g in gpus) + " |"
    rule = "|---|" + "---|" * len(gpus)
    rows = []
    for n in names:
        rows.append(f"| `{n}` | " + " | ".join(verdict(n, g) for g in gpus) + " |")
        if catalog.resolve(n).shape.checkpoint_quant == "mxfp4":
            rows.append(f"| `{n}`, MXFP4 kept (triton + `kernels`) | "
                        + " | ".join(verdict(n, g, mxfp4_kept=True).replace("bf16", "mxfp4") for g in gpus) + " |")
    return "\n".join([head, rule, *rows])


def catalog_names(include_legacy: bool = False) -> list[str]:
    return [n for n, m in catalog.load_catalog().items() if include_legacy or not m.legacy]


def run(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="legacy entries too")
    ap.add_argument("--gpu", nargs="+", default=list(GPUS), help="GPU classes in GB (default 8 12 16 24)")
    args = ap.parse_args(argv)
    print(table(catalog_names(args.all), args.gpu))
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
