"""`eaglechat train BASE`: train an EAGLE draft head (EAGLE-1/2 layout, or EAGLE-3) for a local base model
by self-distillation."""

from __future__ import annotations

import argparse
from pathlib import Path

from eaglechat.commands.common import (
    MAX_THREADS,
    add_device_flag,
    add_dtype_flag,
    int_at_least,
    number_at_least,
    seed,
)
from eaglechat.models.default_model import DEFAULT_ALIAS


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="train an EAGLE draft head for a local model (self-distillation)",
        description="Self-distill replies from BASE, extract its features, train an EAGLE-1/2 head (or an EAGLE-3 "
                    "head with --head-kind eagle3) and export it (config.json + model.safetensors). Every stage "
                    "resumes after an interruption.",
    )
    p.add_argument("base", metavar="BASE", help=f"a local Hugging Face model folder, or {DEFAULT_ALIAS}")
    p.add_argument("--out", help="head output folder (default: <work>/head)")
    p.add_argument("--work", help="work folder for data and checkpoints (default: in the user cache dir)")
    p.add_argument("--prompts", type=int_at_least(0), default=1000, help="ShareGPT training prompts (default 1000)")
    p.add_argument("--max-new-tokens", type=int_at_least(1), default=256, help="cap on each distilled reply (default 256)")
    p.add_argument("--epochs", type=number_at_least(0, above=True), default=3.0, help="training epochs (default 3)")
    p.add_argument("--lr", type=number_at_least(0, above=True), default=1e-3, help="peak learning rate (default 1e-3)")
    p.add_argument("--batch-size", type=int_at_least(1), default=4, help="training sequences per step (default 4)")
    p.add_argument("--gen-batch-size", type=int_at_least(1), default=16, help="prompts per generation batch (default 16)")
    add_device_flag(p, default="auto")
    p.add_argument("--distill-minutes", type=number_at_least(0), default=0.0,
                   help="stop distilling new shards after this many minutes (0: no limit)")
    p.add_argument("--train-minutes", type=number_at_least(0), default=0.0,
                   help="stop training after this many minutes and export (0: no limit)")
    p.add_argument("--threads", type=int_at_least(0, MAX_THREADS), default=0, help="torch CPU threads (default: torch's choice)")
    add_dtype_flag(p, auto=True, default="auto", help="base model dtype (auto: float32 on CPU, bfloat16 on GPU)")
    p.add_argument("--features-minutes", type=number_at_least(0), default=0.0,
                   help="stop extracting new feature shards after this many minutes (0: no limit)")
    p.add_argument("--dataset-replies", type=int_at_least(0), default=0,
                   help="also train on N more ShareGPT prompts with the dataset's own reply (no generation)")
    p.add_argument("--eval-prompts", type=int_at_least(0), default=80, help="held-out MT-bench prompts for tau (0: skip)")
    p.add_argument("--export-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--head-kind", default="eagle2", choices=["eagle2", "eagle3"],
                   help="eagle2: EAGLE-1/2 layout, feature regression (default); eagle3: fused low/mid/high "
                        "features, training-time test, trained online (no feature files)")
    p.add_argument("--draft-vocab", type=int_at_least(0), default=0, metavar="N",
                   help="reduced draft vocabulary: the N most frequent reply tokens (default 0: the full vocabulary)")
    p.add_argument("--init-head", default="", metavar="DIR",
                   help="continue from this EAGLE-1/2 head (e.g. retrain a head on more data) instead of a fresh one")
    p.add_argument("--ttt-steps", type=int_at_least(1, 16), default=None, metavar="K",
                   help="training-time test: draft steps unrolled per position, each fed the previous step's "
                        "prediction (default: 1 for eagle2, the EAGLE-1 recipe; 7 for eagle3)")
    p.add_argument("--skip-prompts", type=int_at_least(0), default=0, metavar="N",
                   help="start after the first N prompts of the shuffled ShareGPT order (e.g. those an "
                        "--init-head was distilled from)")
    p.add_argument("--seed", type=seed, default=0)
    p.set_defaults(func=run)


def check(args: argparse.Namespace) -> None:
    """What argparse cannot see alone, refused before a model is loaded or a prompt drawn."""
    from eaglechat.errors import UsageError

    if args.prompts + args.dataset_replies < 2:
        raise UsageError(f"nothing to train on: --prompts {args.prompts} and --dataset-replies {args.dataset_replies} "
                         "give fewer than 2 replies (the default is --prompts 1000)")
    if args.init_head and args.head_kind == "eagle3":
        raise UsageError("--init-head continues an EAGLE-1/2 head; EAGLE-3 training starts from a fresh head")
    if args.init_head and not (Path(args.init_head).expanduser() / "config.json").is_file():
        raise UsageError(f"--init-head {args.init_head}: not a head folder (no config.json)")
    for flag, value in (("--out", args.out), ("--work", args.work)):
        if value and Path(value).expanduser().exists() and not Path(value).expanduser().is_dir():
            raise UsageError(f"{flag} {value} is a file, not a folder")


def run(args: argparse.Namespace) -> int:
    import os

    check(args)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from eaglechat import paths
    from eaglechat.models.default_model import resolve_base
    from eaglechat.train.pipeline import TrainConfig
    from eaglechat.train.pipeline import run as run_pipeline

    base_dir = resolve_base(args.base, progress=print)
    work = Path(args.work) if args.work else paths.cache_dir() / "train" / Path(base_dir).name
    out = Path(args.out) if args.out else work / "head"
    cfg = TrainConfig(
        base=str(base_dir), out=str(out), work=str(work), prompts=args.prompts, max_new_tokens=args.max_new_tokens,
        epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, gen_batch_size=args.gen_batch_size,
        device=args.device, seed=args.seed, distill_minutes=args.distill_minutes, train_minutes=args.train_minutes,
        eval_prompts=args.eval_prompts, dataset_replies=args.dataset_replies, threads=args.threads,
        dtype=args.dtype, features_minutes=args.features_minutes, export_dtype=args.export_dtype,
        draft_vocab=args.draft_vocab, head_kind=args.head_kind,
        init_head=args.init_head, ttt_steps=args.ttt_steps or 0,
        skip_prompts=args.skip_prompts,
    )
    summary = run_pipeline(cfg, base_dir)
    print(f"head written to {out}")
    ev = summary.get("eval") or {}
    if "tau" in ev:
        print(f"tau on {ev.get('prompts')} held-out prompts: {ev['tau']:.2f}")
    return 0
