"""The expected tokens per EAGLE step of a head never measured here: EAGLE-2's published mean accepted
length (4.36 tokens per step at 60/5/10 on Spec-Bench: Vicuna-7B, RTX 3090, greedy; hemingkx/Spec-Bench
Leaderboard.md), scaled in width by N^0.3 (EAGLE's calibration prior, SafeAILab/EAGLE ea_model.py) and in
depth by a per-level acceptance of 0.8 (an assumption: expected accepted drafts sum_{j<=d} 0.8^j).
bench/costmodel.py predicts tokens/s with it; fit/bnb_dispatch.py sizes 4-bit trees by it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

WIDTH_EXPONENT = 0.3


@dataclass
class PublishedTau:
    tau_ref: float = 4.36  # Spec-Bench EAGLE-2, Vicuna-7B, RTX 3090, greedy
    n_ref: int = 60  # EAGLE's evaluation tree: total_token 60, depth 5, top_k 10
    depth_ref: int = 5
    level_accept: float = 0.8  # assumption: P(level j accepted | level j-1 accepted)

    @property
    def source(self) -> str:
        return (f"published: EAGLE-2 tau {self.tau_ref} at {self.n_ref}/{self.depth_ref}/10 (Spec-Bench, Vicuna-7B), "
                f"width ~N^{WIDTH_EXPONENT}, depth by per-level acceptance {self.level_accept} (assumed)")

    def _depth_factor(self, depth: int) -> float:
        a = self.level_accept
        return sum(a**j for j in range(1, depth + 1))

    def __call__(self, n: int, depth: int, top_k: int = 0) -> float:
        scaled = (self.tau_ref - 1.0) * (n / self.n_ref) ** WIDTH_EXPONENT
        scaled *= self._depth_factor(depth) / self._depth_factor(self.depth_ref)
        return 1.0 + min(scaled, float(min(depth, n)))  # never more than the deepest path accepts

    def to_dict(self) -> dict:
        return {"kind": "published", "source": self.source, **asdict(self)}
