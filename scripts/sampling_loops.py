"""Repeated text in a model's chat replies under its sampling defaults, against greedy decoding.

For each of N MT-bench first turns (round-robin over the categories), one reply of up to --max-new-tokens
tokens, (a) greedy and (b) with the sampling `eaglechat chat` / `run` / `serve` use when nobody says
(the model's own: eaglechat.models.sampling), or with --sampling JSON to try other values. Reports, per
setting, the mean repeated-text fraction (eaglechat.looping.repeated_fraction: the share of a reply's
8-grams that repeat an earlier one), how many replies loop (looping.is_looping) and how many ran to the
token limit.

    python scripts/sampling_loops.py [MODEL] [--n 20] [--max-new-tokens 256] [--threads 1] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def measure(engine, prompts, params) -> dict:
    from eaglechat.engine.protocol import Finished
    from eaglechat.looping import is_looping, repeated_fraction

    rows = []
    for i, prompt in enumerate(prompts):
        params.seed = i  # the same seed per prompt for every setting (greedy ignores it)
        final = next(e for e in engine.generate(prompt.messages, params) if isinstance(e, Finished))
        rows.append({"id": prompt.id, "tokens": len(final.token_ids), "stop": str(final.stop_reason),
                     "repeated": round(repeated_fraction(final.token_ids), 4), "looping": is_looping(final.token_ids)})
    return {
        "mean_repeated": round(statistics.mean(r["repeated"] for r in rows), 4),
        "looping": sum(r["looping"] for r in rows),
        "hit_limit": sum(r["stop"] == "length" for r in rows),
        "replies": rows,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default="smollm2-135m-eagle2")
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sampling", default=None, help="JSON of sampling fields to measure instead of the model's own")
    p.add_argument("--no-greedy", action="store_true", help="skip the greedy run")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)

    import torch

    from eaglechat.bench.prompts import load_prompts
    from eaglechat.engine.protocol import GenerationParams
    from eaglechat.loader import load_engine
    from eaglechat.models import sampling as sampling_defaults

    torch.set_num_threads(args.threads)
    engine = load_engine(args.model, device="cpu")
    prompts = load_prompts("mt-bench", args.n)
    own = json.loads(args.sampling) if args.sampling else engine.info.sampling
    settings = {} if args.no_greedy else {"greedy": GenerationParams(max_new_tokens=args.max_new_tokens)}
    settings[sampling_defaults.describe(own)] = sampling_defaults.fill(
        GenerationParams(max_new_tokens=args.max_new_tokens), own, given=())
    out = {"model": args.model, "n": len(prompts), "max_new_tokens": args.max_new_tokens, "threads": args.threads,
           "model_sampling": engine.info.sampling, "source": engine.info.sampling_source, "settings": {}}
    for label, params in settings.items():
        start = time.perf_counter()
        result = measure(engine, prompts, params)
        result["seconds"] = round(time.perf_counter() - start, 1)
        out["settings"][label] = result
        print(f"{label}: mean repeated-text fraction {result['mean_repeated']:.1%}, looping {result['looping']}/"
              f"{len(prompts)}, at the token limit {result['hit_limit']}/{len(prompts)} ({result['seconds']} s)",
              flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
