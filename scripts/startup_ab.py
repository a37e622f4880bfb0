"""Interleaved before/after timing of `eaglechat run` starts: two eaglechat source trees, each with its own
EAGLECHAT_HOME, run in turn (A B, then B A, ...) so a shared machine's changing load falls on both.

    python scripts/startup_ab.py --rounds 5 --case warm A_TREE:A_HOME B_TREE:B_HOME
    python scripts/startup_ab.py --rounds 3 --case cold A_TREE B_TREE        (a fresh home per run)
    python scripts/startup_ab.py --rounds 9 --case nosuch A_TREE:A_HOME B_TREE:B_HOME

Per run: the first reply byte on the pipe, the process's end (both from this parent's clock) and the
child's CPU seconds (user + sys, its reaped children included), with the 1-minute load average at its
start; then the medians per tree. A tree is a folder holding the `eaglechat` package (a checkout, or
`git archive` of a commit). Warm needs the default model converted in each home already.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ARGV = {"warm": ["run", "smollm2-135m-eagle2", "Hi", "--max-new-tokens", "8", "--speculate", "on", "--temperature", "0"],
        "nosuch": ["run", "nosuch", "hi"]}
ARGV["cold"] = ARGV["warm"]


def one(tree: str, home: str, case: str) -> tuple[float | None, float, float]:
    env = dict(os.environ, PYTHONPATH=tree, EAGLECHAT_HOME=home, HF_HUB_OFFLINE="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "eaglechat", *ARGV[case]], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=tree)  # `-m` puts the cwd first on sys.path
    first = None
    while chunk := proc.stdout.read1(4096):
        if first is None and chunk.strip():
            first = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace")
    proc.wait()
    total = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != (1 if case == "nosuch" else 0):
        sys.exit(f"{tree}: exit status {proc.returncode}: {err.strip()[-400:]}")
    return first, total, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(usage=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--case", choices=sorted(ARGV), default="warm")
    parser.add_argument("trees", nargs=2, help="TREE:HOME (warm, nosuch) or TREE (cold)")
    args = parser.parse_args()
    pairs = [(spec.split(":", 1) + [""])[:2] for spec in args.trees]
    results: dict[str, list] = {tree: [] for tree, _ in pairs}
    for r in range(args.rounds):
        for tree, home in (pairs if r % 2 == 0 else pairs[::-1]):
            load = os.getloadavg()[0]
            fresh = tempfile.mkdtemp(prefix="eaglechat-cold-") if args.case == "cold" else None
            try:
                row = one(tree, fresh or home, args.case)
            finally:
                if fresh:
                    shutil.rmtree(fresh, ignore_errors=True)
            results[tree].append(row)
            first = "-" if row[0] is None else f"{row[0]:.2f}"
            print(f"{tree}: first byte {first} s, end {row[1]:.2f} s, CPU {row[2]:.2f} s, load {load:.2f}", flush=True)
    for tree, rows in results.items():
        firsts = [f for f, _, _ in rows if f is not None]
        first = f"{statistics.median(firsts):.2f}" if firsts else "-"
        print(f"median {tree}: first byte {first} s, end {statistics.median(t for _, t, _ in rows):.2f} s, "
              f"CPU {statistics.median(c for _, _, c in rows):.2f} s")


if __name__ == "__main__":
    main()
