"""Compiled decode steps (`--compile {off,on,auto}`): torch.compile of the whole decode step (draft +
verify + accept + KV compaction + drafter extend, engine/decode.py `Decoder._step`), one graph per tree
budget, sampling setting and KV-window bucket, each built the first time it is needed.

- CUDA: mode="reduce-overhead", i.e. a step is one CUDA-graph replay plus the step's one summary read:
  the ~1,400-1,900 kernel launches of an eager transformers step (15-25 us of host time each) stop
  costing host time.
- CPU: inductor's default mode (fused C++ kernels).
- `auto`: on for CUDA (a step is one graph: nothing is left between the graphs to cost launches), off
  on CPUs and MPS, where the measured compiled steps did not beat eager decoding (BENCHMARKS.md).
  `--compile off` turns it off; a model the compiler cannot take decodes eagerly, said in one line.
Inductor's caches go to a folder the caller names (the user cache dir), so a second start reuses the
compiled kernels instead of building them again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import torch

from eaglechat.engine.autospec import SpeculationChooser, arms_for
from eaglechat.engine.protocol import GenerationParams

COMPILE_CHOICES = ("off", "on", "auto")


def wanted(setting: str, device_type: str) -> bool:
    if setting not in COMPILE_CHOICES:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_CHOICES)}, got {setting!r}")
    return setting == "on" or (setting == "auto" and device_type == "cuda")  # `auto`: see the module doc


def use_cache_dir(folder: Path) -> None:
    """Inductor's on-disk caches (FX graphs, kernels, autotuning) under `folder`, unless the user chose
    one with TORCHINDUCTOR_CACHE_DIR (inductor writes its default into the variable once it has looked,
    so the default counts as not chosen)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen is None or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        folder.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)


def step_compiler(device_type: str) -> Callable:
    """torch.compile as the decode step needs it: the whole step one graph, shapes never dynamic (each
    tree budget, plain decoding and window bucket get their own static graph)."""
    mode = "reduce-overhead" if device_type == "cuda" else None
    return lambda fn: torch.compile(fn, mode=mode, fullgraph=True, dynamic=False)


def compile_engine(engine, cache_dir: Path | None, report: Callable[[str], None] = lambda text: None) -> float:
    """Compile `engine`'s decode steps and build their graphs now (a short warm-up turn for speculative
    and for plain decoding), reporting progress; -> seconds it took (cache hits make it short).
    A model the compiler cannot take (a graph break in its layers, a backend error) is reported in
    one line and decodes eagerly: compiling is a speed-up, never a reason not to chat."""
    if cache_dir is not None:
        use_cache_dir(cache_dir)
    device_type = torch.device(engine.info.device).type
    engine.compile_steps(step_compiler(device_type),
                         torch.compiler.cudagraph_mark_step_begin if device_type == "cuda" else None)
    decoder = engine.decoder
    prompt = engine.encode([{"role": "user", "content": "Hello"}])
    # "auto" builds every step speculate="auto" may take (each tree it tries, the plain step that keeps
    # the drafter's features, speculate=True's step among them); False the plain step without a head
    modes = (["auto"] if decoder.drafter is not None else []) + [False]
    arms = arms_for(engine.budget)
    started = time.perf_counter()
    chooser, decoder.chooser = decoder.chooser, SpeculationChooser(probe=1)  # warm-up: one step per arm
    try:
        for i, speculate in enumerate(modes, start=1):
            what = "speculative and plain" if speculate else "plain"
            report(f"compiling the {what} decode steps ({i}/{len(modes)}; the first start takes minutes)")
            params = GenerationParams(max_new_tokens=len(arms) * (engine.budget.depth + 1) + 1, speculate=speculate)
            for _ in decoder.generate(prompt, params, engine.budget, set()):
                pass
            decoder.reset()
        failure = decoder.compile_failure  # a step that fell back to eager decoding (Decoder.run_step)
    except Exception as exc:  # noqa: BLE001 - torch.compile raises many kinds; eager decoding still works
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        failure = f"compiling failed ({type(exc).__name__}: {first}); decoding without compiling"
    finally:
        decoder.chooser = chooser  # what the warm-up measured is not the machine's steady state
    if failure:
        engine.eager_steps()
        decoder.compile_failure = ""  # said here, at load
        report(failure)
        return time.perf_counter() - started
    seconds = time.perf_counter() - started
    report(f"compiled the decode steps in {seconds:.0f} s")
    return seconds
