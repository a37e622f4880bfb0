"""The step-cost model: measured costs + a tau curve -> predicted tokens/s per tree budget (pure, no torch).

One EAGLE-2 step drafts a tree (cost `draft(depth, top_k)`), verifies its N drafted tokens plus the
root in one base forward (`verify(N + 1 rows)` at the current KV length), and pays an `overhead`
(accept, KV compaction, the head's update on the accepted path, Python), measured at a small and a
large tree and interpolated between them by rows. It emits tau tokens, so

    tokens/s = tau(N, depth, top_k) / (draft + verify + overhead)        per step
    plain    = 1 / (verify(1 row) + plain overhead)
    speedup  = tokens/s / plain

as in Sequoia's hardware-aware optimizer (Chen et al. 2024, arXiv 2402.12374) and EAGLE's own
`total_token=-1` calibration (SafeAILab/EAGLE, eagle/model/ea_model.py), which additionally ignores
the draft. Verify costs between measured row counts are interpolated linearly (never extrapolated).

Tau curves:
  MeasuredTau   from the accepted-length histogram of real EAGLE steps with a reference tree:
                depth from the histogram, width by EAGLE's prior (tau ~ N^0.3, its calibration gains
                [1, 1.05, 1.07, 1.10, 1.13] for N = 40..60), never above the reference width.
  PublishedTau  for a head that was never measured (random weights): 4.36 tokens per step at
                60/5/10, the EAGLE-2 mean accepted length on Spec-Bench (Vicuna-7B, RTX 3090, greedy;
                hemingkx/Spec-Bench Leaderboard.md), scaled in width by N^0.3 and in depth by a per-level
                acceptance of 0.8 (an assumption: expected accepted drafts sum_{j<=d} 0.8^j).
Neither curve models top_k: a wider expansion mostly buys candidates for larger N (N <= pool(d, k)).
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field

from eaglechat.engine.protocol import pool_size
from eaglechat.fit.tau import WIDTH_EXPONENT, PublishedTau  # noqa: F401 - PublishedTau: one of this model's curves

# ============================================================================== tau curves


def acceptance_tail(accepted_hist: list[int]) -> list[float]:
    """P(accepted >= j) for j = 1, 2, ... from a histogram of accepted drafts per step."""
    total = sum(accepted_hist)
    if total == 0:
        return []
    tail, out = total, []
    for j in range(1, len(accepted_hist)):
        tail -= accepted_hist[j - 1]
        out.append(tail / total)
    return out


@dataclass
class MeasuredTau:
    accepted_hist: list[int]  # steps of the reference run that accepted 0, 1, 2, ... drafts
    ref_total_tokens: int
    ref_depth: int

    @property
    def source(self) -> str:
        steps = sum(self.accepted_hist)
        return (f"measured: {steps} EAGLE steps of this head with tree {self.ref_total_tokens}/{self.ref_depth}, "
                f"width scaled by N^{WIDTH_EXPONENT} (EAGLE's calibration prior)")

    def __call__(self, n: int, depth: int, top_k: int = 0) -> float:
        tail = acceptance_tail(self.accepted_hist)
        width = min(1.0, n / max(1, self.ref_total_tokens)) ** WIDTH_EXPONENT
        return 1.0 + sum(tail[: min(depth, n)]) * width

    def to_dict(self) -> dict:
        return {"kind": "measured", "source": self.source, **asdict(self)}


# ============================================================================== costs


@dataclass
class StepCosts:
    """Seconds, at one KV length: verify by rows (root included; 1 row = a plain step's forward),
    draft by (depth, top_k), and the per-step extras beyond those forwards."""

    kv_length: int
    verify_s: dict[int, float]
    draft_s: dict[tuple[int, int], float]
    overhead_s: float = 0.0  # EAGLE step: accept, KV compaction, head update on the accepted path
    plain_overhead_s: float = 0.0  # plain step: sampling and bookkeeping beyond the forward
    # the EAGLE overhead measured at several tree sizes (rows -> s): interpolated, flat outside
    overhead_by_rows: dict[int, float] = field(default_factory=dict)

    def verify(self, rows: int) -> float | None:
        """Interpolated linearly between measured row counts; None outside them."""
        xs = sorted(self.verify_s)
        if not xs or rows < xs[0] or rows > xs[-1]:
            return None
        i = bisect.bisect_left(xs, rows)
        if xs[i] == rows:
            return self.verify_s[rows]
        x0, x1 = xs[i - 1], xs[i]
        y0, y1 = self.verify_s[x0], self.verify_s[x1]
        return y0 + (y1 - y0) * (rows - x0) / (x1 - x0)

    def overhead(self, rows: int) -> float:
        """The per-step overhead of a tree of `rows` verified rows."""
        xs = sorted(self.overhead_by_rows)
        if not xs:
            return self.overhead_s
        if rows <= xs[0]:
            return self.overhead_by_rows[xs[0]]
        if rows >= xs[-1]:
            return self.overhead_by_rows[xs[-1]]
        i = bisect.bisect_left(xs, rows)
        x0, x1 = xs[i - 1], xs[i]
        y0, y1 = self.overhead_by_rows[x0], self.overhead_by_rows[x1]
        return y0 + (y1 - y0) * (rows - x0) / (x1 - x0)

    @property
    def plain_step_s(self) -> float:
        return self.verify_s[1] + self.plain_overhead_s

    def to_dict(self) -> dict:
        return {
            "kv_length": self.kv_length,
            "verify_ms": {str(t): round(s * 1e3, 4) for t, s in sorted(self.verify_s.items())},
            "draft_ms": {f"{d},{k}": round(s * 1e3, 4) for (d, k), s in sorted(self.draft_s.items())},
            "overhead_ms": round(self.overhead_s * 1e3, 4),
            "plain_overhead_ms": round(self.plain_overhead_s * 1e3, 4),
            "overhead_ms_by_rows": {str(t): round(v * 1e3, 4) for t, v in sorted(self.overhead_by_rows.items())},
        }


@dataclass
class Prediction:
    total_tokens: int
    depth: int
    top_k: int
    tau: float
    draft_s: float
    verify_s: float
    overhead_s: float
    plain_tokens_per_s: float

    @property
    def step_s(self) -> float:
        return self.draft_s + self.verify_s + self.overhead_s

    @property
    def tokens_per_s(self) -> float:
        return self.tau / self.step_s if self.step_s > 0 else 0.0

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.plain_tokens_per_s if self.plain_tokens_per_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "total_tokens": self.total_tokens, "depth": self.depth, "top_k": self.top_k, "tau": round(self.tau, 4),
            "draft_ms": round(self.draft_s * 1e3, 4), "verify_ms": round(self.verify_s * 1e3, 4),
            "overhead_ms": round(self.overhead_s * 1e3, 4), "step_ms": round(self.step_s * 1e3, 4),
            "tokens_per_s": round(self.tokens_per_s, 4), "speedup": round(self.speedup, 4),
        }


@dataclass
class Forecast:
    """Every candidate, the best (depth, top_k) per tree size, and the overall pick."""

    kv_length: int
    plain_tokens_per_s: float
    tau_source: str
    candidates: list[Prediction]
    per_budget: list[Prediction]  # best per total_tokens, ascending
    best: Prediction | None
    max_rows: int | None = None  # verify rows allowed (a clamp, e.g. a kernel limit), None = any
    clamp_reason: str = ""
    min_gain: float = 1.1
    notes: list[str] = field(default_factory=list)

    @property
    def speculate(self) -> bool:
        return self.best is not None and self.best.speedup >= self.min_gain

    def to_dict(self) -> dict:
        return {
            "kv_length": self.kv_length,
            "plain_tokens_per_s": round(self.plain_tokens_per_s, 4),
            "tau_source": self.tau_source,
            "max_rows": self.max_rows,
            "clamp_reason": self.clamp_reason,
            "min_gain": self.min_gain,
            "speculate": self.speculate,
            "best": self.best.to_dict() if self.best else None,
            "per_budget": [p.to_dict() for p in self.per_budget],
            "notes": list(self.notes),
        }


def predict(
    costs: StepCosts,
    tau,
    *,
    budgets,
    depth_grid,
    top_k_grid,
    max_rows: int | None = None,
    clamp_reason: str = "",
    min_gain: float = 1.1,
) -> Forecast:
    """Predicted tokens/s of every (N, depth, top_k) that is measurable and allowed."""
    plain = 1.0 / costs.plain_step_s if costs.plain_step_s > 0 else 0.0
    candidates = []
    for n in sorted(set(budgets)):
        rows = n + 1
        if n < 1 or (max_rows is not None and rows > max_rows):
            continue
        verify = costs.verify(rows)
        if verify is None:
            continue
        for d in depth_grid:
            for k in top_k_grid:
                if (d, k) not in costs.draft_s or n > pool_size(d, k):
                    continue
                candidates.append(Prediction(n, d, k, tau(n, d, k), costs.draft_s[(d, k)], verify,
                                             costs.overhead(rows), plain))
    per_budget: dict[int, Prediction] = {}
    for c in candidates:
        if c.total_tokens not in per_budget or c.tokens_per_s > per_budget[c.total_tokens].tokens_per_s:
            per_budget[c.total_tokens] = c
    best = max(candidates, key=lambda c: c.tokens_per_s, default=None)
    return Forecast(
        kv_length=costs.kv_length, plain_tokens_per_s=plain, tau_source=getattr(tau, "source", "given"),
        candidates=sorted(candidates, key=lambda c: -c.tokens_per_s),
        per_budget=[per_budget[n] for n in sorted(per_budget)], best=best, max_rows=max_rows,
        clamp_reason=clamp_reason, min_gain=min_gain,
    )
