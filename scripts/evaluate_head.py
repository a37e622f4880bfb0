"""tau of a trained head on the held-out MT-bench first turns, through eaglechat's own engine
(eaglechat/train/evaluate.py), for BENCHMARKS.md and the model card (a program, not part of the CLI):

    THREADS=1 python scripts/evaluate_head.py N MAX_NEW OUT_DIR [HEAD] [--check] [--tree=T,D,K] [--reverse]
                                              [--plain-from=DIR,DIR]
    python scripts/evaluate_head.py --merge DIR DIR ...     (one summary of an evaluation split over folders)

The base is the converted default model in fp32; HEAD defaults to the shipped head. Results are appended
per prompt to OUT_DIR/results.jsonl (an interrupted run resumes); the summary is printed as JSON.
`--reverse` walks the prompts from the other end, so two processes can share one evaluation;
`--plain-from` reuses the plain greedy ids of earlier checked evaluations instead of decoding again.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from eaglechat.train.evaluate import evaluate, load_rows, stored_plain_ids, summarize


def tree(text: str):
    from eaglechat.engine.protocol import TreeBudget

    return TreeBudget(*map(int, text.split(",")))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--merge", nargs="+", metavar="DIR", help="summarize an evaluation split over these folders")
    ap.add_argument("n", type=int, nargs="?", help="prompts (MT-bench first turns, one per category in turn)")
    ap.add_argument("max_new", type=int, nargs="?", help="max new tokens per reply")
    ap.add_argument("out", type=Path, nargs="?", help="evaluation folder (results.jsonl, summary.json)")
    ap.add_argument("head", type=Path, nargs="?", help="head folder (default: the shipped head)")
    ap.add_argument("--check", action="store_true", help="compare every reply with plain greedy decoding")
    ap.add_argument("--tree", type=tree, default=None, help="total_tokens,depth,top_k")
    ap.add_argument("--reverse", action="store_true", help="walk the prompts from the other end")
    ap.add_argument("--plain-from", default="", help="comma-separated folders of checked evaluations")
    args = ap.parse_args(argv)
    if args.merge:
        print(json.dumps(summarize(load_rows([Path(d) for d in args.merge]))))
        return 0
    if args.out is None:
        ap.error("N MAX_NEW OUT_DIR are required (or --merge DIR ...)")
    import torch

    from eaglechat.models.default_model import DEFAULT_HEAD_DIR, ensure_default_base

    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    plain_from = [Path(d) for d in args.plain_from.split(",") if d]
    print(json.dumps(evaluate(None, None, args.head or DEFAULT_HEAD_DIR, args.out, n_prompts=args.n,
                              max_new_tokens=args.max_new, base_dir=ensure_default_base(), tree=args.tree,
                              check_plain=args.check, dtype="float32", reverse=args.reverse,
                              plain_ids=stored_plain_ids(plain_from) or None)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
