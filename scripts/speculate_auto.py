"""speculate="auto" against its fixed alternatives on the default model: plain decoding, EAGLE at the
profile's tree, EAGLE at the lighter tree auto also tries, and auto itself, interleaved.

One eager engine; per prompt the four runs go in a rotating order (A B C D / B C D A / ...), each from an
empty cache; auto's chooser keeps what it measured across the prompts, as it does across a chat's turns
(so its first prompt pays the first probe). Reported: medians of decode tokens/s, each over plain, auto's
last choice, the share of auto's steps per mode, and whether every reply equals plain decoding's.

    EAGLECHAT_HOME=... python scripts/speculate_auto.py --n 10 --max-new-tokens 64 [--tree 12,3,4]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--tree", default=None, help="total_tokens,depth,top_k (default: the profile's)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from eaglechat.bench.prompts import load_prompts
    from eaglechat.engine.autospec import lighter
    from eaglechat.engine.protocol import Finished, GenerationParams, TextDelta, TreeBudget
    from eaglechat.loader import load_engine
    from eaglechat.models import default_model

    budget = TreeBudget(*map(int, args.tree.split(","))) if args.tree else None
    base, head = str(default_model.ensure_default_base()), str(default_model.DEFAULT_HEAD_DIR)
    engine = load_engine(base, head=head, dtype="float32", tree=budget, compile="off")
    budget = engine.budget
    small = lighter(budget)
    runs = {"plain": (False, budget), f"eagle {budget.label()}": (True, budget),
            f"eagle {small.label()}": (True, small), "auto": ("auto", budget)}
    names = list(runs)
    rates = {name: [] for name in names}
    replies = {name: [] for name in names}
    auto_steps: collections.Counter = collections.Counter()
    for i, prompt in enumerate(load_prompts("mt-bench", args.n)):
        for k in range(len(names)):
            name = names[(i + k) % len(names)]
            speculate, tree = runs[name]
            engine.decoder.reset()
            engine.info.tree = tree
            params = GenerationParams(max_new_tokens=args.max_new_tokens, speculate=speculate)
            for event in engine.generate([{"role": "user", "content": prompt.text}], params):
                if isinstance(event, TextDelta) and event.step and speculate == "auto":
                    auto_steps["plain" if event.step.tree_size == 1 else f"tree of {event.step.tree_size - 1}"] += 1
                if isinstance(event, Finished):
                    rates[name].append(event.stats.decode_tokens_per_s)
                    replies[name].append(event.token_ids)
    plain = statistics.median(rates["plain"])
    out = {
        "tree": budget.label(), "prompts": args.n, "max_new_tokens": args.max_new_tokens, "threads": args.threads,
        "tokens_per_s": {name: round(statistics.median(r), 2) for name, r in rates.items()},
        "vs_plain": {name: round(statistics.median(r) / plain, 2) for name, r in rates.items()},
        "auto_chose": engine.decoder.chooser.label(),
        "auto_steps": dict(auto_steps),
        "equal_to_plain": {name: sum(a == b for a, b in zip(replies[name], replies["plain"])) for name in names},
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
