"""`eaglechat bench --costs`: measure what one decode step costs on this device, then predict tokens/s.

Measured, per format (dtype + quantization), on a real model or a random-weight one built from a
catalog `shape` (random_model.py), all through the engine's own Decoder (eaglechat/engine/decode.py):

  verify(T, L)   one base forward + logits over a random tree of T rows (T = 1 is the plain step's
                 forward) on top of a KV cache of L tokens, rolled back after each repeat
  draft(d, k)    one full EAGLE-2 draft of depth d and top_k k from the same state
  real steps     a short plain decode and EAGLE decodes with a small and a large tree from L tokens: the
                 median real step beyond its forwards is the per-step overhead (accept, KV compaction,
                 head update on the accepted path), interpolated between the two trees by rows
  acceptance     real models with a head: greedy EAGLE replies to a few chat prompts give the accepted-
                 length histogram (the measured tau curve); random heads use the published curve

Every case and every decode runs once untimed before it is timed: on a GPU the first call of a shape
costs 2-10x a steady one (allocator growth, cuBLAS heuristics, bitsandbytes repacking). Where decode
steps are CUDA-graph replays (`steps="graphs"`, the default on CUDA: engine/compile.py), the forwards are
timed as replays of their own captured graphs and the real decodes run through the graph runner, so the
forecast is of the captured step users get. All timed cases run in interleaved rounds (background load
hits each alike); figures are medians. costmodel.py turns them into tokens/s and speedup per tree budget.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field

import torch

from eaglechat.bench.costmodel import MeasuredTau, PublishedTau, StepCosts, pool_size, predict
from eaglechat.bench.random_model import random_tree
from eaglechat.engine.protocol import GenerationParams, TreeBudget

ROWS = (1, 8, 16, 32, 64, 128)
BUDGETS = (4, 8, 12, 16, 20, 24, 32, 40, 48, 60, 64, 80, 96, 127)
PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a short Python function that checks whether a number is prime.",
    "Give me three tips for staying focused while studying.",
]

# --formats names -> (dtype, bitsandbytes quantization); 8-bit computes in fp16 (LLM.int8 casts to fp16)
FORMATS = {
    "fp32": ("float32", "none"), "fp16": ("float16", "none"), "bf16": ("bfloat16", "none"),
    "int8": ("float16", "8bit"), "nf4": (None, "4bit"),
}


@dataclass
class Plan:
    """What to measure (defaults per device kind: `for_device`)."""

    kv_lengths: list[int]
    rows: list[int] = field(default_factory=lambda: list(ROWS))
    depths: list[int] = field(default_factory=lambda: [2, 3, 4, 5, 6])
    top_ks: list[int] = field(default_factory=lambda: [4, 8, 10])
    repeats: int = 5
    decode_steps: int = 24
    acceptance_tokens: int = 64  # per acceptance prompt (real heads only)
    budgets: list[int] = field(default_factory=lambda: list(BUDGETS))
    min_gain: float = 1.1

    @classmethod
    def for_device(cls, kind: str, max_context: int) -> "Plan":
        if kind == "cpu":
            plan = cls(kv_lengths=[128, 512], depths=[2, 3, 4, 5], top_ks=[4, 8], repeats=3, decode_steps=12)
        else:
            plan = cls(kv_lengths=[128, 1024, 2048], repeats=3)  # 7B/8B x 3 formats in under 5 minutes
        room = max_context - max(plan.rows) - plan.decode_steps * (max(plan.depths) + 2) - 8
        plan.kv_lengths = sorted({max(16, min(L, room)) for L in plan.kv_lengths})
        return plan


def sync(device) -> None:
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def _decode(dec, prompt_ids: list[int], speculate: bool, budget: TreeBudget, steps: int, stop_ids=()):
    """One greedy generation: (per-step seconds, accepted histogram)."""
    params = GenerationParams(temperature=0.0, max_new_tokens=steps + 1, speculate=speculate, seed=0)
    times = []
    for step in dec.generate(prompt_ids, params, budget, set(stop_ids)):
        if step.stats is not None:
            times.append(step.stats.step_s)
    return times, list(dec.stats.accepted_hist)


def replayable(fn, backend, failures: list[str]):
    """`fn` captured as a graph on `backend` (engine/compile.py `CudaGraphs`), -> a callable that replays
    it; `fn` itself when the capture fails (why appended to `failures`). `fn` must already have run once."""
    try:
        captured = backend.capture(fn, [])
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot be captured: time it eagerly
        from eaglechat.engine.compile import first_line

        failures.append(first_line(exc))
        return fn
    return captured.replay


def measure(dec, plan: Plan, *, vocab: int, tick=None, acceptance_prompts: list[list[int]] | None = None,
            stop_ids=(), seed: int = 0, steps: str = "eager", graph_backend=None) -> dict:
    """Every cost of `plan` on the Decoder `dec` (with a drafter). Returns a JSON-ready dict with
    StepCosts per KV length under "costs" (objects) and the raw medians. `steps="graphs"`: forwards timed
    as graph replays and decodes through the graph runner (`graph_backend`: what captures; CUDA's by default)."""
    from eaglechat.engine.compile import graph_backend as default_backend

    tick = tick or (lambda label, n=1: None)
    backend = (graph_backend or default_backend(dec.device)) if steps == "graphs" else None
    failures: list[str] = []
    rng = random.Random(seed)
    ref = TreeBudget(min(60, pool_size(max(plan.depths), max(plan.top_ks)), max(plan.rows) - 1),
                     max(plan.depths), max(plan.top_ks))
    # a second, small tree: the overhead (accept, KV compaction, bookkeeping) grows with the tree
    small = TreeBudget(min(8, pool_size(min(plan.depths), min(plan.top_ks))), min(plan.depths), min(plan.top_ks))
    verify: dict[int, dict[int, list[float]]] = {}
    draft: dict[int, dict[tuple[int, int], list[float]]] = {}
    trees = {t: random_tree(t, vocab, max(plan.depths), rng, dec.device) for t in plan.rows}
    prompts = {L: [rng.randrange(vocab) for _ in range(L)] for L in plan.kv_lengths}
    with torch.no_grad():
        for L in plan.kv_lengths:
            verify[L], draft[L] = _time_forwards(dec, plan, prompts[L], ref, trees, backend, failures, tick)
        # real steps from the shortest KV length: the overhead beyond the timed forwards
        timed = _time_decodes(dec, plan, prompts[plan.kv_lengths[0]], ref, small, backend, failures, tick)
        hist = _acceptance_hist(dec, plan, acceptance_prompts or [], ref, stop_ids, tick)
        dec.reset()
    return _summary(plan, verify, draft, timed, hist, ref, small,
                    steps if backend is not None and not failures else "eager", failures)


def _time_forwards(dec, plan: Plan, prompt: list[int], ref: TreeBudget, trees: dict, backend, failures: list[str],
                   tick) -> tuple[dict[int, list[float]], dict[tuple[int, int], list[float]]]:
    """On a KV cache of len(prompt) tokens: the seconds of each verify forward (by tree rows) and each
    draft (by depth, top_k), `plan.repeats` of each in interleaved rounds."""
    L = len(prompt)
    verify: dict[int, list[float]] = {t: [] for t in plan.rows}
    draft: dict[tuple[int, int], list[float]] = {}
    dec.reset()
    _decode(dec, prompt, True, ref, 0)  # prefill L tokens (drafter too), no decode step
    tick(f"prefill {L}")
    base = dec.cache.length
    root = prompt[-1]

    def verify_once(tree):
        dec.target.logits(dec.target.forward(tree.tokens, tree.depth, tree.ancestors)[0])
        dec.cache.truncate(base)

    cases = [(("v", t), lambda t=t: verify_once(trees[t])) for t in plan.rows]
    cases += [(("d", (d, k)), lambda d=d, k=k: dec.drafter.draft(root, TreeBudget(min(ref.total_tokens, pool_size(d, k)), d, k)))
              for d in plan.depths for k in plan.top_ks]
    for _, fn in cases:  # warm-up: allocator growth, bnb repacking, cuBLAS heuristics
        fn()
    if backend is not None:  # each forward timed as what a captured step runs: a replay
        cases = [(case, replayable(fn, backend, failures)) for case, fn in cases]
        for _, fn in cases:
            fn()
    sync(dec.device)
    for r in range(plan.repeats):
        for (kind, key), fn in cases:
            t0 = time.perf_counter()
            fn()
            sync(dec.device)
            elapsed = time.perf_counter() - t0
            if kind == "v":
                verify[key].append(elapsed)
            else:
                draft.setdefault(key, []).append(elapsed)
            tick(f"L={L} {'verify T=' if kind == 'v' else 'draft d,k='}{key}")
    return verify, draft


def _time_decodes(dec, plan: Plan, prompt: list[int], ref: TreeBudget, small: TreeBudget, backend,
                  failures: list[str], tick) -> dict[str, list[float]]:
    """Per-step seconds of a plain decode and of EAGLE decodes with the large and the small tree from
    `prompt`; each decode runs once untimed first (its shapes' first calls; with graphs, their captures)."""
    from eaglechat.engine.compile import GraphSteps

    if backend is not None:
        dec.use(GraphSteps(dec, backend))
    timed = {}
    for name, speculate, tree in (("plain", False, ref), ("EAGLE", True, ref), ("EAGLE (small tree)", True, small)):
        _decode(dec, prompt, speculate, tree, plan.decode_steps)
        timed[name], _ = _decode(dec, prompt, speculate, tree, plan.decode_steps)
        tick(f"{name} decode", plan.decode_steps)
    runner = dec.runner
    if runner is not None and runner.failure:
        failures.append(runner.failure)
    dec.use(None)
    return timed


def _acceptance_hist(dec, plan: Plan, prompts: list[list[int]], ref: TreeBudget, stop_ids, tick) -> list[int]:
    """The accepted-length histogram of greedy EAGLE replies to `prompts` (empty without prompts)."""
    hist = []
    for ids in prompts:
        dec.reset()
        _, h = _decode(dec, ids, True, ref, plan.acceptance_tokens, stop_ids)
        for j, c in enumerate(h):
            hist += [0] * (j + 1 - len(hist))
            hist[j] += c
        tick("acceptance", 1)
    return hist


def _summary(plan: Plan, verify: dict, draft: dict, timed: dict[str, list[float]], hist: list[int], ref: TreeBudget,
             small: TreeBudget, steps: str, failures: list[str]) -> dict:
    """measure's result: the medians, the per-step overhead beyond the forwards (by tree rows), and the
    StepCosts per KV length."""
    med = lambda xs: statistics.median(xs)  # noqa: E731
    L0 = plan.kv_lengths[0]
    plain_steps, eagle_steps, small_steps = timed["plain"], timed["EAGLE"], timed["EAGLE (small tree)"]
    v0 = {t: med(s) for t, s in verify[L0].items()}
    d0 = {k: med(s) for k, s in draft[L0].items()}
    plain_step = med(plain_steps) if plain_steps else v0[1]
    eagle_step = med(eagle_steps) if eagle_steps else 0.0
    small_step = med(small_steps) if small_steps else 0.0
    at_l0 = StepCosts(L0, v0, d0)
    by_rows = {}
    for tree, step in ((small, small_step), (ref, eagle_step)):
        if step > 0:
            forwards = at_l0.verify(tree.total_tokens + 1) + d0[(tree.depth, tree.draft_top_k)]
            by_rows[tree.total_tokens + 1] = max(0.0, step - forwards)
    overhead = by_rows.get(ref.total_tokens + 1, 0.0)
    plain_overhead = max(0.0, plain_step - v0[1])
    costs = [StepCosts(L, {t: med(s) for t, s in verify[L].items()}, {k: med(s) for k, s in draft[L].items()},
                       overhead, plain_overhead, dict(by_rows)) for L in plan.kv_lengths]
    tau = (MeasuredTau(hist, ref.total_tokens, ref.depth) if sum(hist) else PublishedTau())
    return {
        "costs": costs,
        "tau": tau,
        "ref_tree": ref.to_dict(),
        "plain_step_ms": round(plain_step * 1e3, 4),
        "eagle_step_ms": round(eagle_step * 1e3, 4),
        "small_tree": small.to_dict(),
        "small_step_ms": round(small_step * 1e3, 4),
        "decode_kv_length": L0,
        "accepted_hist": hist,
        # how the steps and forwards were timed; a capture that failed was timed eagerly, said here
        "steps": steps,
        "steps_note": "; ".join(dict.fromkeys(failures)),
    }


def forecast(measured: dict, plan: Plan, *, max_rows: int | None = None, clamp_reason: str = "") -> list:
    """One costmodel.Forecast per KV length."""
    return [predict(c, measured["tau"], budgets=plan.budgets, depth_grid=plan.depths, top_k_grid=plan.top_ks,
                    max_rows=max_rows, clamp_reason=clamp_reason, min_gain=plan.min_gain)
            for c in measured["costs"]]


def total_ticks(plan: Plan, acceptance_prompts: int) -> int:
    cases = len(plan.rows) + len(plan.depths) * len(plan.top_ks)
    return len(plan.kv_lengths) * (1 + plan.repeats * cases) + 3 * plan.decode_steps + acceptance_prompts


# ============================================================================== targets and formats


@dataclass
class Target:
    label: str
    shape: object | None = None  # memory.ModelShape: build random weights of this shape
    model: str | None = None  # a name load_engine resolves: real weights (and head)
    head: str | None = None
    source: str = ""


def resolve_target(spec: str, *, random_weights: bool = False, head: str | None = None) -> Target:
    """A built-in shape name, a manifest file, a catalog alias (real weights when pulled, unless
    `random_weights`), the embedded default, or a local model folder."""
    from pathlib import Path

    from eaglechat.bench.random_model import SHAPES
    from eaglechat.errors import UsageError

    if spec in SHAPES:
        return Target(spec, shape=SHAPES[spec], source=f"random weights, built-in {spec} shape")
    path = Path(spec).expanduser()
    if path.suffix in (".yaml", ".yml") and path.is_file():
        from eaglechat.models.catalog import load_manifest

        manifest = load_manifest(path)
        if manifest.shape is None:
            raise UsageError(f"{path}: the manifest has no `shape`")
        return Target(manifest.name, shape=manifest.shape, source=f"random weights, shape from {path.name}")
    if path.is_dir():
        if random_weights:
            raise UsageError("--random-weights needs a catalog name, a manifest file or a built-in shape")
        return Target(path.name, model=str(path), head=head, source=f"real weights, {path}")
    from eaglechat.models import catalog, default_model, hub

    if spec == default_model.DEFAULT_ALIAS and not random_weights:
        return Target(spec, model=spec, head=head, source="real weights (embedded default)")
    manifest = catalog.resolve(spec)
    if not random_weights and hub.is_pulled(manifest):
        return Target(manifest.name, model=manifest.name, head=head, source="real weights (pulled)")
    if manifest.shape is None:
        raise UsageError(f"{manifest.name} has no `shape` in its manifest and is not pulled: nothing to measure")
    why = "asked" if random_weights else "not pulled"
    return Target(manifest.name, shape=manifest.shape, source=f"random weights ({why}), catalog shape")


def format_settings(fmt: str, device_kind: str) -> tuple[str, str]:
    """(dtype, quant) of a --formats entry on this device (nf4 computes in fp16 on GPUs, fp32 on CPUs)."""
    from eaglechat.errors import UsageError

    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    dtype, quant = FORMATS[fmt]
    if dtype is None:
        dtype = "float32" if device_kind == "cpu" else "float16"
    return dtype, quant


def build(target: Target, *, device: str, dtype: str, quant: str, max_context: int, progress=None):
    """-> (Decoder, vocab size, acceptance prompts as token ids, stop ids, seconds to build)."""
    from eaglechat.engine.decode import Decoder

    t0 = time.perf_counter()
    if target.shape is not None:
        from eaglechat.bench.random_model import random_head, random_model

        torch_dtype = getattr(torch, dtype)
        model = random_model(target.shape, device=device, dtype=torch_dtype, quant=quant,
                             progress=(lambda i, n: progress(f"building layer {i}/{n}")) if progress else None)
        dec = Decoder(model, random_head(model), max_context)
        return dec, target.shape.vocab_size, [], (), time.perf_counter() - t0
    from eaglechat.errors import UsageError
    from eaglechat.loader import load_engine

    engine = load_engine(target.model, head=target.head, device=device, dtype=dtype, quant=quant,
                         max_context=max_context)
    if engine.decoder.drafter is None:
        raise UsageError(f"{target.label} has no EAGLE draft head (pass --head for a local folder)")
    prompts = [engine.encode([{"role": "user", "content": p}]) for p in PROMPTS]
    vocab = engine.decoder.target.lm_head.weight.shape[0]
    return engine.decoder, vocab, prompts, tuple(engine.stop_ids), time.perf_counter() - t0


def release(device: str) -> None:
    """Give the memory of a dropped model back (the caller deletes its references first)."""
    import gc

    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
