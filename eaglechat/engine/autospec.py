"""`speculate="auto"`: speculation only where this machine measures it faster than plain decoding, at the
tree budget it measures fastest; where no tree pays, plain decoding.

Every mode emits exactly the same tokens (greedy: token for token; sampling: the same distribution), so
the engine may switch between them at any step. The modes ("arms") are plain decoding and one or more
tree budgets. The chooser runs them interleaved in probe rounds (one step of each arm per round, the
order rotated from round to round: A B C, B C A, C A B, so no arm always follows another), keeps the
arm it rates fastest, and probes again after `recheck` steps. A re-probe that confirms the choice
doubles the wait before the next one, from 64 up to 1024 steps (geometric spacing: a settled machine
pays less and less for being watched); a change resets it. Its state lasts across turns.

An arm is rated by what whole replies pay for it, relative to plain decoding:

    rating = (mean tokens per step - one standard error) / (its step time / plain's step time)

- Tokens per step (1 for plain) is a property of the text, not of the load: it is averaged over the
  arm's last `history` (64) steps, probe and running steps alike. A probe flatters whichever tree it
  picks (the largest of a few noisy means is biased upward: on the default model on a CPU, probes rated
  small trees 1.2-1.4x plain while the same trees ran 0.9x as whole replies), so the estimate is the
  mean minus its standard error: a tree known from a few steps must win by more than its noise.
- The step-time ratio is measured within each probe round, the tree's step against the plain step of
  the SAME round (a burst of load that slows one round slows both, and cancels); the rating uses the
  median of the last `rounds` (6) rounds' ratios (the first probe's four and a re-probe's two: two
  re-probes that disagree with the past outvote it). A step's time is the wall clock from the previous
  step's end: the drafting, the drafter's catch-up after a plain stretch, the switch and the caller's
  work between steps are all in it, as a reply pays them.

A tree is kept only when its rating exceeds plain's (1.0) times `margin`; while a tree runs, its rating
is updated every `settle` steps from the tokens it delivers, and a tree the probe flattered is dropped
then, not at the next probe. Plain steps are true plain steps: the drafter does not run on them (eager,
they run plain decoding's ops, one for one; engine/decode.py keeps their features, and the prompt's, and
lets the drafter catch up before the next speculative step), so between probes the head does no work.

A record of what was measured on this machine before (fit/speculation_records.py, written by
`eaglechat tune`) seeds the ratings (`seed`): a fresh engine starts on the arm the record rates best and
probes after `recheck` steps instead of at once; an arm's own measurements replace the record's figures
as soon as it has them.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from eaglechat.engine.protocol import TreeBudget

Mode = TreeBudget | None  # None: plain decoding


def lighter(budget: TreeBudget) -> TreeBudget | None:
    """A cheaper tree than `budget` for the chooser to try too (half the nodes, one level less), or None
    where there is none (EAGLE-1's static tree, or a budget already at its smallest). On a machine where
    verifying a token costs nearly a forward (a CPU), a small tree may win where the large one loses."""
    if budget.kind != "dynamic" or budget.total_tokens < 4:
        return None
    depth = max(2, budget.depth - 1)
    small = TreeBudget(total_tokens=budget.total_tokens // 2, depth=depth, draft_top_k=budget.draft_top_k)
    small.total_tokens = min(small.total_tokens, small.pool_size)
    return small if small != budget else None


def arms_for(budget: TreeBudget) -> list[Mode]:
    """The modes speculate="auto" chooses among: plain decoding, `budget`, and a lighter tree."""
    small = lighter(budget)
    return [None, budget] + ([small] if small is not None else [])


def pessimistic_mean(samples) -> float | None:
    """The mean minus one standard error (None under two samples): what a tree known from a few steps
    is credited with."""
    if len(samples) < 2:
        return None
    return statistics.fmean(samples) - statistics.stdev(samples) / math.sqrt(len(samples))


def mode_key(mode: Mode) -> str:
    """An arm's name in a speculation record: 'plain' or the tree's label ('12/3/4')."""
    return "plain" if mode is None else mode.label()


class SpeculationChooser:
    def __init__(self, probe: int = 4, recheck: int = 64, max_recheck: int = 1024, history: int = 64,
                 rounds: int = 6, margin: float = 1.0, settle: int = 16, reprobe: int = 2):
        self.probe, self.reprobe, self.base_recheck, self.max_recheck = probe, reprobe, recheck, max_recheck
        self.history, self.rounds, self.margin, self.settle = history, rounds, margin, settle
        self.known: dict = {}  # a speculation record's arms: name -> {"tokens_per_step", "cost"}
        self.arms: list[Mode] = []
        self.start([None, TreeBudget()])

    def seed(self, record: dict | None) -> None:
        """Start from a speculation record's figures (fit/speculation_records.py: arm name ->
        {"tokens_per_step", "cost"}); they apply to arms of the same names, here and after each change of
        arms, until the arm has its own measurements."""
        self.known = dict(record or {})
        arms, self.arms = self.arms, []
        self.start(arms)

    def start(self, arms: list[Mode]) -> None:
        """Choose among `arms` (plain among them) from now on; the measurements are kept while the arms
        stay the same."""
        if arms == self.arms:
            return
        self.arms = list(arms)
        self.tokens = [deque(maxlen=self.history) for _ in arms]  # tokens per step, per arm
        self.costs = [deque(maxlen=self.rounds) for _ in arms]  # step time over plain's, same round
        self.prior = [self._from_record(mode) for mode in arms]
        self.round: dict[int, float] = {}  # the probe round under way: arm -> seconds
        self.order = 0  # rotates the order of the arms from round to round
        self.since = 0  # steps since the last probe ended
        self.recheck = self.base_recheck
        self.ratio: float | None = None  # the best tree's rating (plain = 1), once rated
        self.choice = 1 if len(arms) > 1 else 0  # speculate until measured otherwise
        self.queue: list[int] = []  # arm indices still to probe
        if len(arms) > 1 and any(p is not None for p in self.prior[1:]):
            self.choice = self._best()  # the record's choice; the first probe comes after `recheck` steps
        else:
            self.queue = self._rounds(self.probe)

    def _from_record(self, mode: Mode) -> tuple[float, float] | None:
        entry = self.known.get(mode_key(mode)) if mode is not None else None
        if not isinstance(entry, dict):
            return None
        return float(entry["tokens_per_step"]), float(entry["cost"])

    def _rounds(self, n: int) -> list[int]:
        arms, queue = list(range(len(self.arms))), []
        for _ in range(n):
            shift = self.order % len(arms)
            queue += arms[shift:] + arms[:shift]
            self.order += 1
        return queue

    def next(self) -> Mode:
        """The mode of the next step."""
        if not self.queue and self.since >= self.recheck:  # a fresh probe: the text or the load may have changed
            # the full probe while a tree has no step-time ratio of its own yet (the record's only), else a short one
            unmeasured = any(mode is not None and not costs for mode, costs in zip(self.arms, self.costs))
            self.queue, self.round = self._rounds(self.probe if unmeasured else self.reprobe), {}
        return self.arms[self.queue[0] if self.queue else self.choice]

    def record(self, mode: Mode, tokens: int, seconds: float) -> None:
        """What a step of `mode` produced, in how long: the wall clock since the previous step ended."""
        arm = self.arms.index(mode)
        self.tokens[arm].append(tokens)
        if self.queue and self.queue[0] == arm:
            self.queue.pop(0)
            self._timed(arm, seconds)
            if not self.queue:
                self._choose()
        else:
            self.since += 1
            if arm == self.choice and mode is not None and self.since % self.settle == 0:
                self._reconsider()

    def _timed(self, arm: int, seconds: float) -> None:
        """A probe step's time; a round complete, each tree's time over plain's in that round."""
        self.round[arm] = seconds
        if len(self.round) < len(self.arms):
            return
        plain = self.round.get(self.arms.index(None)) if None in self.arms else None
        if plain and plain > 0:
            for i, s in self.round.items():
                if self.arms[i] is not None and s > 0:
                    self.costs[i].append(s / plain)
        self.round = {}

    def rating(self, mode: Mode) -> float | None:
        """`mode`'s tokens per unit of plain decoding's time (plain: 1.0): pessimistic tokens per step
        over the same-round step-time ratio; the record's figures where the arm has none yet; None when
        neither is known."""
        if mode is None:
            return 1.0
        arm = self.arms.index(mode)
        prior = self.prior[arm]
        tokens = pessimistic_mean(self.tokens[arm])
        tokens = tokens if tokens is not None else prior[0] if prior else None
        cost = statistics.median(self.costs[arm]) if self.costs[arm] else prior[1] if prior else None
        if tokens is None or not cost:
            return None
        return max(0.0, tokens) / cost

    def _best(self) -> int:
        """The best-rated arm: plain unless a tree's rating beats 1.0 by the margin. Sets `ratio`."""
        rated = [(r, i) for i, r in enumerate(map(self.rating, self.arms)) if self.arms[i] is not None and r is not None]
        if not rated:
            self.ratio = None
            return self.arms.index(None) if None in self.arms else self.choice
        self.ratio, best = max(rated)
        return best if self.ratio > self.margin or None not in self.arms else self.arms.index(None)

    def _choose(self) -> None:
        """The probe is over: keep the best-rated arm; a confirmed choice waits twice as long for the next."""
        rated_before = self.ratio is not None  # the first probe confirms nothing (a record's choice: it does)
        best = self._best()
        confirmed = rated_before and best == self.choice
        self.recheck = min(2 * self.recheck, self.max_recheck) if confirmed else self.base_recheck
        self.choice, self.since = best, 0

    def _reconsider(self) -> None:
        """A tree has run `settle` more steps: rate it again on what it delivered. A change is a choice
        the probe got wrong: the next probe comes sooner."""
        best = self._best()
        if best != self.choice:
            self.choice, self.since, self.recheck = best, 0, self.base_recheck

    @property
    def mode(self) -> Mode:
        return self.arms[self.choice]

    def label(self) -> str:
        """For the status bar: 'auto: on 12/3/4 1.4x' (the tree kept and its rating: tokens per plain
        step's time), 'auto: off 0.7x' (the best tree's rating), or 'auto' before the first rating."""
        if self.ratio is None:
            return "auto"
        if self.mode is None:
            return f"auto: off {self.ratio:.1f}x"
        return f"auto: on {self.mode.label()} {self.ratio:.1f}x"
