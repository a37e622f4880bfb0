"""CPU thread settings A/B: `eaglechat run MODEL --json` in fresh processes, interleaved, medians.

    python scripts/threads_ab.py [--rounds 5] [--model smollm2-135m-eagle2] [--max-new-tokens 96]

Configurations (every round runs each of them, plain and EAGLE, in a rotating order):
  torch default   EAGLECHAT_AUTO_THREADS=0, no OMP_* variables: torch's thread count, OpenMP's spin policy
  2 passive       OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE
  1 thread        OMP_NUM_THREADS=1
  auto            what eaglechat/threads.py picks at that moment (recorded per run)
Prints one JSON object: per configuration and mode the decode tokens/s of every run and the median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PROMPTS = ["Explain in a few sentences why the sky is blue.",
           "Write a short Python function that checks whether a number is prime."]
CONFIGS = {
    "torch default": {"EAGLECHAT_AUTO_THREADS": "0"},
    "2 passive": {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"},
    "1 thread": {"OMP_NUM_THREADS": "1"},
    "auto": {},
}
PROBE = ("import os, eaglechat.threads as t; c = t.apply(); import torch; "
         "print(os.environ.get('OMP_NUM_THREADS'), os.environ.get('OMP_WAIT_POLICY'), torch.get_num_threads())")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--model", default="smollm2-135m-eagle2")
    p.add_argument("--max-new-tokens", type=int, default=96)
    args = p.parse_args()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_") and k != "EAGLECHAT_AUTO_THREADS"}
    results = {c: {"plain": [], "eagle": []} for c in CONFIGS}
    auto_picks, loads = [], []
    names = list(CONFIGS)
    for r in range(args.rounds):
        prompt = PROMPTS[r % len(PROMPTS)]
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            env = {**base_env, **CONFIGS[name]}
            if name == "auto":
                auto_picks.append(subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                                                 text=True).stdout.strip())
            for mode in ("plain", "eagle"):
                loads.append(os.getloadavg()[0])
                cmd = [sys.executable, "-m", "eaglechat", "run", args.model, prompt, "--json",
                       "--max-new-tokens", str(args.max_new_tokens)] + (["--no-speculate"] if mode == "plain" else [])
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
                stats = json.loads(out)["stats"]
                results[name][mode].append(round(stats["decode_tokens_per_s"], 3))
                print(f"round {r + 1} {name:14} {mode:5} {stats['decode_tokens_per_s']:.2f} tok/s", file=sys.stderr,
                      flush=True)
    summary = {name: {mode: {"runs": v, "median": round(statistics.median(v), 3)} for mode, v in modes.items()}
               for name, modes in results.items()}
    print(json.dumps({"model": args.model, "rounds": args.rounds, "max_new_tokens": args.max_new_tokens,
                      "cores": os.cpu_count(), "load_1min": {"min": min(loads), "median": statistics.median(loads),
                                                             "max": max(loads)},
                      "auto_picks (OMP_NUM_THREADS, OMP_WAIT_POLICY, torch threads)": auto_picks,
                      "results": summary}, indent=1))


if __name__ == "__main__":
    main()
