"""Device-to-host reads and host-to-device uploads per decode step on the default model.

Counts, over a real decode, every call that would make the host wait for a GPU (tests/sync_counter.py:
.item()/.tolist()/.cpu(), tensor truth values, data-dependent ops) and every torch.tensor(python data)
upload, in the decode steps only (the prompt's prefill is counted apart). Run it on any checkout to
compare before and after:

    EAGLECHAT_HOME=... python scripts/decode_syncs.py [--tree 16,4,4] [--max-new-tokens 48] [-v]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", default="16,4,4", help="total_tokens,depth,top_k")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("-v", action="store_true", help="where the reads come from")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from sync_counter import count_decode

    from eaglechat.engine.protocol import GenerationParams, TreeBudget
    from eaglechat.loader import load_engine
    from eaglechat.models import default_model

    budget = TreeBudget(*map(int, args.tree.split(",")))
    engine = load_engine(str(default_model.ensure_default_base()), head=str(default_model.DEFAULT_HEAD_DIR),
                         dtype="float32", tree=budget)
    prompt = engine.encode([{"role": "user", "content": "Write a haiku about the sea."}])
    n = args.max_new_tokens
    for name, params in [("plain greedy", GenerationParams(max_new_tokens=n, speculate=False)),
                         ("EAGLE greedy", GenerationParams(max_new_tokens=n)),
                         ("plain sampling", GenerationParams(max_new_tokens=n, speculate=False, temperature=0.7, top_p=0.9, seed=1)),
                         ("EAGLE sampling", GenerationParams(max_new_tokens=n, temperature=0.7, top_p=0.9, seed=1))]:
        engine.decoder.reset()
        counter, _ = count_decode(engine.decoder, prompt, params, budget)
        steps = engine.decoder.stats.target_forwards
        reads, uploads = counter.count("reads", "decode"), counter.count("uploads", "decode")
        print(f"{name:15} steps {steps:3d}  reads {reads / steps:5.2f}/step  uploads {uploads / steps:5.2f}/step"
              f"  (decode totals {reads} + {uploads}, of which the first token's read once per turn)")
        if args.v:
            print("   ", Counter(counter.where("reads", "decode")).most_common(12))


if __name__ == "__main__":
    main()
