"""`eaglechat tune`: measure this machine, pick the draft tree with the most tokens/s, cache it.

Measured (the recipe of Sequoia, Chen et al. 2024, arXiv:2402.12374, and of EAGLE-2's `total_token=-1`
auto-configuration in SafeAILab/EAGLE `ea_model.py`, extended to the draft cost):
  plain step     real plain decoding of a few chat prompts: median seconds per step (= per token)
  reference run  real EAGLE decoding of the same prompts with the largest tree of the grid: the
                 accepted-length histogram (acceptance per depth) and the median step time
  T_verify(N)    one base forward + logits over a random tree of N drafted nodes (+ root) on top of a
                 KV cache of realistic length, rolled back after each repeat; N = 0 is a plain step
  T_draft(d, k)  one full EAGLE-2 draft (depth d, top_k k) from the same state
                 (all sizes timed in interleaved rounds, so background load hits each alike; medians)
Model: the step-cost model of `eaglechat bench --costs` (eaglechat/bench/costmodel.py):
  tau(N, d)      measured acceptance per depth, width by EAGLE's prior (tau ~ N^0.3)   (MeasuredTau)
  tokens/s       = tau / (T_draft(d, k) + T_verify(N + 1 rows) + overhead), overhead = what the
                 reference run's real step took beyond its T_verify + T_draft
  plain tokens/s = 1 / plain step;  speculation is turned off under `min_gain` (1.1x)
  4-bit bases on CUDA never verify more rows than bitsandbytes' fused kernel takes (bnb_dispatch.py).
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field

from eaglechat.bench.costmodel import MeasuredTau, Prediction, StepCosts, acceptance_tail, predict  # noqa: F401
from eaglechat.engine.protocol import GenerationParams, TreeBudget, pool_size

PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a short Python function that checks whether a number is prime.",
    "Give me three tips for staying focused while studying.",
    "What is the capital of France, and what is it famous for?",
]


@dataclass
class Measurements:
    kv_length: int
    repeats: int
    verify_s: dict[int, float]  # N drafted tokens (root excluded) -> median seconds; 0 = plain forward
    draft_s: dict[tuple[int, int], float]  # (depth, top_k) -> median seconds of one draft
    plain_step_s: float  # median real plain decoding step
    ref_tree: TreeBudget
    ref_step_s: float  # median real EAGLE step with ref_tree
    accepted_hist: list[int]  # steps of the reference run that accepted 0, 1, 2, ... drafts
    ref_tau: float  # measured tokens per target forward in the reference run

    def to_dict(self) -> dict:
        return {
            "kv_length": self.kv_length,
            "repeats": self.repeats,
            "verify_ms": {str(n): round(s * 1e3, 3) for n, s in sorted(self.verify_s.items())},
            "draft_ms": {f"{d},{k}": round(s * 1e3, 3) for (d, k), s in sorted(self.draft_s.items())},
            "plain_step_ms": round(self.plain_step_s * 1e3, 3),
            "ref_tree": self.ref_tree.to_dict(),
            "ref_step_ms": round(self.ref_step_s * 1e3, 3),
            "accepted_hist": list(self.accepted_hist),
            "ref_tau": round(self.ref_tau, 4),
        }


@dataclass
class Choice:
    tree: TreeBudget
    speculate: bool
    predicted_speedup: float
    plain_tokens_per_s: float
    predicted_tokens_per_s: float
    best: Prediction | None
    ranking: list[Prediction] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "tree": self.tree.to_dict(),
            "speculate": self.speculate,
            "predicted_speedup": round(self.predicted_speedup, 4),
            "plain_tokens_per_s": round(self.plain_tokens_per_s, 3),
            "predicted_tokens_per_s": round(self.predicted_tokens_per_s, 3),
            "ranking": [c.to_dict() for c in self.ranking[:8]],
        }


# ============================================================================== the model (pure)


def tau_estimate(n: int, depth: int, accepted_hist: list[int], ref: TreeBudget) -> float:
    """Expected tokens per target forward for a tree of n drafted nodes and this depth."""
    return MeasuredTau(accepted_hist, ref.total_tokens, ref.depth)(n, depth)


def step_costs(m: Measurements) -> StepCosts:
    """The measurements as the cost model's input: verify by rows (N drafted + the root)."""
    verify = {n + 1: s for n, s in m.verify_s.items()}
    ref_rows = m.ref_tree.total_tokens + 1
    overhead = m.ref_step_s - verify.get(ref_rows, 0.0) - m.draft_s.get((m.ref_tree.depth, m.ref_tree.draft_top_k), 0.0)
    return StepCosts(m.kv_length, verify, dict(m.draft_s), overhead_s=max(0.0, overhead),
                     plain_overhead_s=max(0.0, m.plain_step_s - verify.get(1, m.plain_step_s)))


def choose(m: Measurements, *, depth_grid, top_k_grid, min_gain: float = 1.1, max_rows: int | None = None) -> Choice:
    """The (total_tokens, depth, top_k) with the most predicted tokens/s; speculation off below min_gain."""
    costs = step_costs(m)
    tau = MeasuredTau(m.accepted_hist, m.ref_tree.total_tokens, m.ref_tree.depth)
    fc = predict(costs, tau, budgets=[n for n in m.verify_s if n > 0], depth_grid=depth_grid, top_k_grid=top_k_grid,
                 max_rows=max_rows, min_gain=min_gain)
    plain = 1.0 / m.plain_step_s if m.plain_step_s > 0 else 0.0
    if fc.best is None or plain <= 0:
        return Choice(m.ref_tree, False, 0.0, plain, plain, None, fc.candidates)
    best = fc.best
    gain = best.tokens_per_s / plain
    tree = TreeBudget(best.total_tokens, best.depth, best.top_k)
    return Choice(tree, gain >= min_gain, gain, plain, best.tokens_per_s if gain >= min_gain else plain, best,
                  fc.candidates)


def speculation_arms(m: Measurements, *trees: TreeBudget) -> dict[str, dict]:
    """What speculate="auto" starts from on this machine (fit/speculation_records.py): for each tree it
    would choose among with one of `trees` (engine/autospec.py `arms_for`), the predicted tokens per step
    and the step's time over a plain step's, where the measurements cover it."""
    from eaglechat.engine.autospec import arms_for

    costs = step_costs(m)
    tau = MeasuredTau(m.accepted_hist, m.ref_tree.total_tokens, m.ref_tree.depth)
    arms = {}
    for arm in (arm for tree in trees for arm in arms_for(tree)[1:]):
        fc = predict(costs, tau, budgets=[arm.total_tokens], depth_grid=[arm.depth], top_k_grid=[arm.draft_top_k],
                     min_gain=1.0)
        if fc.best is not None and costs.plain_step_s > 0:
            arms[arm.label()] = {"tokens_per_step": round(fc.best.tau, 4),
                                 "cost": round(fc.best.step_s / costs.plain_step_s, 4)}
    return arms


# ============================================================================== measuring


def _sync(device) -> None:
    import torch

    if getattr(device, "type", str(device)).startswith("cuda"):
        torch.cuda.synchronize(device)
    elif getattr(device, "type", str(device)) == "mps":
        torch.mps.synchronize()


def _kv_prompt(engine, length: int) -> list[int]:
    text = " ".join(PROMPTS) + " "
    ids = engine.encode([{"role": "user", "content": text * 8}])
    while len(ids) < length:
        ids = ids + ids
    return ids[:length]


def _run(engine, prompt_ids: list[int], speculate: bool, budget: TreeBudget, max_new: int, tick=None):
    """One greedy generation through the decoder: (stats, per-step seconds); tick(label, n) per step."""
    dec = engine.decoder
    dec.reset()
    steps = []
    params = GenerationParams(temperature=0.0, max_new_tokens=max_new, speculate=speculate)
    for step in dec.generate(prompt_ids, params, budget, set(getattr(engine, "stop_ids", ()) or ())):
        if step.stats is not None:
            steps.append(step.stats.step_s)
        if tick is not None:
            tick("EAGLE decoding" if speculate else "plain decoding", len(step.tokens))
    return dec.stats, steps


def _reference_runs(engine, prompts: list[str], ref: TreeBudget, max_new_tokens: int, tick):
    """Plain and EAGLE decoding of each prompt in turn: (plain step seconds, EAGLE step seconds, accepted
    histogram, target forwards, tokens decoded)."""
    plain_steps, ref_steps, hist, forwards, tokens = [], [], [], 0, 0
    for ids in (engine.encode([{"role": "user", "content": p}]) for p in prompts):
        _, steps = _run(engine, ids, False, ref, max_new_tokens, tick)
        plain_steps += steps
        stats, steps = _run(engine, ids, True, ref, max_new_tokens, tick)
        ref_steps += steps
        for j, c in enumerate(stats.accepted_hist):
            hist += [0] * (j + 1 - len(hist))
            hist[j] += c
        forwards += stats.target_forwards
        tokens += sum((j + 1) * c for j, c in enumerate(stats.accepted_hist))
    return plain_steps, ref_steps, hist, forwards, tokens


def measure(
    engine,
    *,
    n_grid,
    depth_grid,
    top_k_grid,
    repeats: int = 3,
    kv_length: int = 256,
    max_new_tokens: int = 32,
    prompts: list[str] | None = None,
    progress=None,
) -> Measurements:
    """Everything `choose` needs, measured on the loaded engine (greedy, temperature 0)."""
    import torch

    from eaglechat.bench.random_model import random_tree

    dec = engine.decoder
    if dec.drafter is None:
        from eaglechat.errors import UsageError

        raise UsageError("tune needs a model with an EAGLE head (this one decodes without speculation)")
    device = dec.device
    sync = lambda: _sync(device)  # noqa: E731
    tick = progress or (lambda label, n=1: None)
    d_max, k_max = max(depth_grid), max(top_k_grid)
    n_ref = max(n for n in n_grid if n <= pool_size(d_max, k_max))
    ref = TreeBudget(n_ref, d_max, k_max)
    kv_length = max(16, min(kv_length, dec.max_context - max(n_grid) - 2))

    # 1-2. real decoding: plain and EAGLE with the reference tree (interleaved per prompt)
    plain_steps, ref_steps, hist, forwards, tokens = _reference_runs(engine, prompts or PROMPTS, ref, max_new_tokens, tick)

    # 3-4. micro-benchmarks at a realistic KV length
    rng = random.Random(0)
    long_ids = _kv_prompt(engine, kv_length)
    dec.reset()
    list(dec.generate(long_ids, GenerationParams(max_new_tokens=1, speculate=True), ref, set()))
    base_len = dec.cache.length
    vocab = dec.target.lm_head.weight.shape[0]
    root = long_ids[-1]
    cases: dict = {}
    for n in sorted({0, *n_grid}):
        tree = random_tree(n + 1, vocab, d_max, rng, device)

        def verify_once(tree=tree):
            dec.target.logits(dec.target.forward(tree.tokens, tree.depth, tree.ancestors)[0])
            dec.cache.truncate(base_len)

        cases[("verify", n)] = verify_once
    for d in depth_grid:
        for k in top_k_grid:
            budget = TreeBudget(min(n_ref, pool_size(d, k)), d, k)
            cases[("draft", (d, k))] = lambda b=budget: dec.drafter.draft(root, b)
    times: dict = {key: [] for key in cases}
    with torch.no_grad():
        for fn in cases.values():  # warm-up: allocator growth, bnb CPU repack, cuBLAS heuristics
            fn()
        sync()
        for r in range(repeats):  # interleaved rounds: background load hits every size alike
            for key, fn in cases.items():
                t0 = time.perf_counter()
                fn()
                sync()
                times[key].append(time.perf_counter() - t0)
            tick(f"timing round {r + 1}/{repeats}", len(cases))
    verify = {key[1]: statistics.median(v) for key, v in times.items() if key[0] == "verify"}
    draft = {key[1]: statistics.median(v) for key, v in times.items() if key[0] == "draft"}
    dec.reset()
    return Measurements(
        kv_length=base_len,
        repeats=repeats,
        verify_s=verify,
        draft_s=draft,
        plain_step_s=statistics.median(plain_steps) if plain_steps else 0.0,
        ref_tree=ref,
        ref_step_s=statistics.median(ref_steps) if ref_steps else 0.0,
        accepted_hist=hist,
        ref_tau=tokens / forwards if forwards else 1.0,
    )


def check(engine, tree: TreeBudget, *, rounds: int = 2, max_new_tokens: int = 48, prompts=None) -> dict:
    """Measured speedup of `tree` over plain decoding: same prompts, runs interleaved, decode tok/s."""
    plain_t = eagle_t = 0.0
    plain_n = eagle_n = 0
    taus = []
    for _ in range(rounds):
        for p in prompts or PROMPTS:
            ids = engine.encode([{"role": "user", "content": p}])
            for speculate in (False, True):
                stats, steps = _run(engine, ids, speculate, tree, max_new_tokens)
                decode_s = sum(steps)  # decode phase only: the prefill is the same for both
                decode_n = int(round(stats.mean_accepted * stats.target_forwards))
                if speculate:
                    eagle_t, eagle_n = eagle_t + decode_s, eagle_n + decode_n
                    taus.append(stats.mean_accepted)
                else:
                    plain_t, plain_n = plain_t + decode_s, plain_n + decode_n
    plain_rate = plain_n / plain_t if plain_t else 0.0
    eagle_rate = eagle_n / eagle_t if eagle_t else 0.0
    return {
        "plain_tokens_per_s": round(plain_rate, 3),
        "eagle_tokens_per_s": round(eagle_rate, 3),
        "measured_speedup": round(eagle_rate / plain_rate, 4) if plain_rate else 0.0,
        "mean_accepted": round(statistics.mean(taus), 4) if taus else 0.0,
        "rounds": rounds,
        "prompts": len(prompts or PROMPTS),
        "max_new_tokens": max_new_tokens,
    }


BUSY_FRACTION = 0.5  # other work on more than half the cores slows and skews every timing


def machine_load() -> dict | None:
    """The 1-minute load average before measuring (the work of other processes) and the cores it
    runs on; None where the OS has no load average (Windows)."""
    from eaglechat.threads import load_average, usable_cores

    load, cores = load_average(), usable_cores()
    if load is None:
        return None
    return {"load1": round(load, 2), "cores": cores, "busy": load > BUSY_FRACTION * cores}


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for dist in ("torch", "transformers", "bitsandbytes", "eaglechat"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out
