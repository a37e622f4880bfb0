"""CPU threads for torch, chosen from the machine before torch is imported (OpenMP reads its settings once).

OpenMP's default wait policy spins a finished thread for a while before it sleeps. On a small or busy
machine the spinning threads steal the cores the other threads (and other processes) need: on a
loaded 2-core VM, 2 threads decoded 2-9x slower than 1 (BENCHMARKS.md, "CPU threads"), and
`OMP_WAIT_POLICY=PASSIVE` (threads sleep at once) recovered most of it. So, unless the user set them:

  OMP_WAIT_POLICY  PASSIVE on machines with at most 4 usable cores, or when other work keeps the
                   cores busy (1-minute load average >= half the cores); else OpenMP's default
  OMP_NUM_THREADS  the usable cores (this process's CPU affinity) minus the cores other processes
                   keep busy (the load average, rounded), at least 1

Environment variables the user set always win; EAGLECHAT_AUTO_THREADS=0 turns the choice off.
`apply()` runs first thing in the `eaglechat` entry point (eaglechat/cli.py), before any torch import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SMALL_MACHINE_CORES = 4


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows
        return None


def choose(env: Mapping[str, str], cores: int, load: float | None) -> dict[str, str]:
    """The variables to set (only those the user did not set); pure, for tests."""
    if env.get("EAGLECHAT_AUTO_THREADS", "1").strip().lower() in ("0", "off", "false", "no"):
        return {}
    busy = 0 if load is None else int(load + 0.5)
    out = {}
    if "OMP_WAIT_POLICY" not in env and (cores <= SMALL_MACHINE_CORES or busy * 2 >= cores):
        out["OMP_WAIT_POLICY"] = "PASSIVE"
    if "OMP_NUM_THREADS" not in env:
        out["OMP_NUM_THREADS"] = str(max(1, cores - busy))
    return out


def apply(env=None) -> dict[str, str]:
    """Set the chosen variables in `env` (os.environ); returns what was set. No effect once torch is
    imported (its thread pool already exists), so it is a no-op then."""
    import sys

    env = os.environ if env is None else env
    if "torch" in sys.modules:
        return {}
    chosen = choose(env, usable_cores(), load_average())
    env.update(chosen)
    return chosen
