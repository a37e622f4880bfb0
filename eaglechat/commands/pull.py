"""`eaglechat pull NAME`: a model and its EAGLE head from the Hugging Face Hub (pre-flight, progress,
resume), Ollama's grammar over the standard Hugging Face cache."""

from __future__ import annotations

import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("pull", help="download a model and its EAGLE head from the Hugging Face Hub")
    p.add_argument("name", help="catalog alias (NAME:TAG for one of its other heads), hf.co/ORG/BASE[:REV] with --head, "
                   "or base=ORG/REPO[@REV],head=ORG/REPO[@REV]; a model in a folder of its repo: ORG/REPO/sub/folder")
    p.add_argument("--head", default=None, metavar="hf.co/ORG/HEAD[:REV]",
                   help="the EAGLE head for a base named hf.co/ORG/BASE: any pair not in the catalog "
                   "(hf.co/ORG/REPO/sub/folder for a head in a folder of its repo)")
    p.add_argument("--dry-run", action="store_true", help="show what would be downloaded, then stop")
    p.set_defaults(func=run)


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
            from eaglechat.units import fmt_bytes

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


def run(args) -> int:
    from eaglechat.models import catalog, hub
    from eaglechat.units import fmt_bytes

    manifest = catalog.resolve_cli(args.name, args.head)
    plan = hub.pull(manifest, ConsoleProgress(), dry_run=args.dry_run)
    if args.dry_run and plan is not None:
        for rp in plan.repos:
            for f in rp.files:
                state = "cached" if f.cached else (f"partial {fmt_bytes(f.partial)}" if f.partial else "to download")
                print(f"{rp.role}  {rp.repo}/{f.filename}  {fmt_bytes(f.size)}  {state}")
    elif manifest.free_form:  # the pair's name is what run, chat, plan and rm know it by
        print(f"pulled as {manifest.name!r}: eaglechat run '{manifest.name}'", file=sys.stderr)
    return 0
