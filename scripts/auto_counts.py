"""What speculate="auto" costs where it runs plain, counted, not timed: per decode step the eager aten ops
and the matmul FLOPs, per reply those of the prompt's forwards and of the draft head's reads (the prompt
and the catch-ups), for plain decoding (speculate=False) and for auto held on plain (its chooser answers
plain at every step). Counts do not move with the machine's load, so they say what wall-clock figures
on a shared CPU cannot resolve.

    EAGLECHAT_HOME=... python scripts/auto_counts.py [--model smollm2-135m-eagle2] [--n 8] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import collections

# matmul ops whose FLOPs are counted: 2 * m * k * n
MATMULS = {"aten.mm.default": (0, 1), "aten.addmm.default": (1, 2), "aten.bmm.default": (0, 1)}


def counting_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.phase, self.ops, self.flops = "other", collections.Counter(), collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[self.phase] += 1
            where = MATMULS.get(str(func))
            if where is not None:
                a, b = args[where[0]], args[where[1]]
                self.flops[self.phase] += 2 * a.numel() * b.shape[-1]
            return func(*args, **(kwargs or {}))

    return Counts()


def phased(counts, fn, phase):
    """`fn` with its ops counted under `phase` (a generator's too, while it runs)."""
    def run(*args, **kwargs):
        before, counts.phase = counts.phase, phase
        try:
            out = fn(*args, **kwargs)
        finally:
            counts.phase = before
        return drive(counts, out, phase) if hasattr(out, "__next__") else out
    return run


def drive(counts, gen, phase):
    while True:
        before, counts.phase = counts.phase, phase
        try:
            item = next(gen)
        except StopIteration as end:
            return end.value
        finally:
            counts.phase = before
        yield item


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage=__doc__.split("\n\n")[-1].strip())
    parser.add_argument("--model", default="smollm2-135m-eagle2")
    parser.add_argument("--n", type=int, default=8, help="MT-bench first turns")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()

    import torch

    from eaglechat.bench.prompts import load_prompts
    from eaglechat.engine.autospec import SpeculationChooser
    from eaglechat.engine.protocol import GenerationParams, TreeBudget
    from eaglechat.loader import load_engine

    class Plain(SpeculationChooser):
        def next(self):
            return None

    torch.set_num_threads(1)
    engine = load_engine(args.model, device="cpu", compile="off")
    decoder = engine.decoder
    prompts = [engine.encode([{"role": "user", "content": p.text}]) for p in load_prompts("mt-bench", args.n)]
    totals = {}
    for prompt in prompts:
        for name, speculate in (("plain", False), ("auto held on plain", "auto")):
            counts = counting_mode()
            for owner, attr, phase in ((decoder, "read_prompt", "prompt"), (decoder, "run_step", "step"),
                                       (decoder.drafter, "extend", "head")):
                setattr(owner, attr, phased(counts, getattr(owner, attr), phase))
            decoder.reset()
            decoder.chooser = Plain()
            params = GenerationParams(max_new_tokens=args.max_new_tokens, speculate=speculate, temperature=0)
            try:
                with counts:
                    steps = sum(1 for s in decoder.generate(prompt, params, TreeBudget(12, 3, 4), set()) if s.stats)
            finally:
                for owner, attr in ((decoder, "read_prompt"), (decoder, "run_step"), (decoder.drafter, "extend")):
                    delattr(owner, attr)
            total = totals.setdefault(name, collections.Counter())
            total.update({f"ops {k}": v for k, v in counts.ops.items()})
            total.update({f"flops {k}": v for k, v in counts.flops.items()})
            total["steps"] += steps
    print(f"{args.model}, {len(prompts)} MT-bench prompts, {args.max_new_tokens} new tokens, greedy, eager, 1 thread")
    print(f"{'':<20} {'steps':>6} {'ops/step':>9} {'MFLOP/step':>11} {'prompt MFLOP':>13} {'head MFLOP':>11}")
    for name, t in totals.items():
        n = t["steps"]
        print(f"{name:<20} {n:>6} {t['ops step'] / n:>9.2f} {t['flops step'] / n / 1e6:>11.2f} "
              f"{t['flops prompt'] / 1e6:>13.0f} {t['flops head'] / 1e6:>11.1f}")


if __name__ == "__main__":
    main()
