"""Eager against compiled decode steps on the default model: plain, EAGLE and speculate="auto" tokens/s,
interleaved.

Two engines over the same weights and tree budget, one eager and one with --compile on (inductor on a
CPU; the compile itself happens at load and is timed). Per prompt the six runs (eager/compiled x
plain/EAGLE/auto) go in a rotating order; medians of decode-phase tokens/s. Also: graphs dynamo built
after the warm-up (one per window bucket a longer prompt reaches), whether each mode's EAGLE output
equals its plain output, and what auto chose.

    EAGLECHAT_HOME=... python scripts/compile_speed.py --n 8 --max-new-tokens 64 [--tree 16,4,4]
    EAGLECHAT_HOME=... python scripts/compile_speed.py --start-only   # one start with --compile on, timed
    EAGLECHAT_HOME=... python scripts/compile_speed.py --warm ...     # steady state: every graph built first
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

NAMES = {False: "plain", True: "eagle", "auto": "auto"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--tree", default=None, help="total_tokens,depth,top_k (default: the profile's)")
    ap.add_argument("--start-only", action="store_true", help="time one start with --compile on and stop")
    ap.add_argument("--eager-only", action="store_true", help="no compiled engine: plain, EAGLE and auto eagerly")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warm", action="store_true",
                    help="an unmeasured pass over every prompt and mode first, so no graph is built while measuring")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from torch._dynamo.utils import counters

    from eaglechat.bench.prompts import load_prompts
    from eaglechat.engine.protocol import Finished, GenerationParams, TreeBudget
    from eaglechat.loader import load_engine
    from eaglechat.models import default_model

    budget = TreeBudget(*map(int, args.tree.split(","))) if args.tree else None
    base, head = str(default_model.ensure_default_base()), str(default_model.DEFAULT_HEAD_DIR)
    engines = {"eager": load_engine(base, head=head, dtype="float32", tree=budget, compile="off")}
    started, compile_s = time.perf_counter(), 0.0
    if not args.eager_only:
        engines["compiled"] = load_engine(base, head=head, dtype="float32", tree=budget, compile="on",
                                          progress=lambda phase, fraction=None: print(f"[{phase}]", flush=True))
        compile_s = time.perf_counter() - started
    if args.start_only:
        print(json.dumps({"start_with_compile_s": round(compile_s, 1), "tree": engines["eager"].budget.label()}))
        return
    compiled = engines["eager"]  # the budget label below
    prompts = load_prompts("mt-bench", args.n)
    runs = [(mode, spec) for mode in engines for spec in (False, True, "auto")]
    rates: dict = {r: [] for r in runs}
    ids: dict = {r: [] for r in runs}
    warm_s = 0.0
    if args.warm:  # every window bucket each mode reaches, built before the measured pass
        started = time.perf_counter()
        for prompt in prompts:
            for mode, spec in runs:
                engines[mode].decoder.reset()
                params = GenerationParams(max_new_tokens=args.max_new_tokens, speculate=spec)
                list(engines[mode].generate([{"role": "user", "content": prompt.text}], params))
        warm_s = time.perf_counter() - started
    graphs = counters["stats"]["unique_graphs"]
    for i, prompt in enumerate(prompts):
        for k in range(len(runs)):
            mode, spec = runs[(i + k) % len(runs)]
            engine = engines[mode]
            engine.decoder.reset()
            params = GenerationParams(max_new_tokens=args.max_new_tokens, speculate=spec)
            fin = [e for e in engine.generate([{"role": "user", "content": prompt.text}], params) if isinstance(e, Finished)][0]
            rates[(mode, spec)].append(fin.stats.decode_tokens_per_s)
            ids[(mode, spec)].append(fin.token_ids)
    out = {
        "tree": compiled.budget.label(), "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "threads": args.threads,
        "load_with_compile_s": round(compile_s, 1), "warm_pass_s": round(warm_s, 1),
        "graphs_after_warmup": counters["stats"]["unique_graphs"] - graphs,
        "tokens_per_s": {f"{m} {NAMES[s]}": round(statistics.median(v), 2) for (m, s), v in rates.items()},
        "auto_chose": {m: engines[m].decoder.chooser.label() for m in engines},
        "auto_equals_plain": {m: sum(a == b for a, b in zip(ids[(m, "auto")], ids[(m, False)])) for m in engines},
        "eagle_equals_plain": {m: sum(a == b for a, b in zip(ids[(m, True)], ids[(m, False)])) for m in engines},
        "compiled_equals_eager": {NAMES[s]: sum(a == b for a, b in zip(ids[("compiled", s)], ids[("eager", s)]))
                                  for s in (False, True)} if "compiled" in engines else {},
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
