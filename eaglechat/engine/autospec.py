"""`speculate="auto"`: speculation only where this machine measures it faster than plain decoding, at the
tree budget it measures fastest.

Every mode emits exactly the same tokens (greedy: token for token; sampling: the same distribution), so
the engine may switch between them at any step. The modes ("arms") are plain decoding and one or more
tree budgets. The chooser runs them interleaved for a few rounds (A B C A B C: a change of load hits
all alike), keeps the fastest, and probes again after
`recheck` steps, so a change of load (another program on the CPU, a thermal limit) is noticed. A
re-probe that confirms the choice doubles the wait before the next one (up to `max_recheck`): a
settled machine pays less and less for being watched. Its state lasts across turns. A tree must beat
plain decoding by `margin` (5 %) to be chosen: within the noise of a few steps' timing, plain decoding
is the choice that cannot make a reply slower.

An arm's speed is its mean tokens per step over its last `history` steps (acceptance depends on the
text, not on the load, so it is averaged long) over the median time of its steps since the last probe
began (the load changes; a median ignores a stall). A median of per-step tokens/s would not do: a
tree's steps take about the same time but emit 1, 2 or 4 tokens, and the median of those rates is
not the rate.

Plain steps are true plain steps: the drafter does not run on them (engine/decode.py keeps their
features and lets the drafter catch up before the next speculative step), so the two rates compared
are the two a user would get.

What a reply pays is what is timed: a step's time is the wall clock from the previous step's end (the
drafter's catch-up after a switch and the caller's work between steps included), not the step's own
work. And a probe flatters whichever tree it picks: each tree's tokens per step is the mean of a few
steps, and the largest of a few noisy means is biased upward (measured on the default model on a CPU,
probes rated small trees 1.2-1.4x plain while the same trees ran 0.9x as whole replies). So the choice
is decided again after every `settle` steps it runs, on its mean over all its steps since: a tree the
probe flattered is dropped then, not at the next probe.
"""

from __future__ import annotations

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


class SpeculationChooser:
    def __init__(self, probe: int = 4, recheck: int = 64, window: int = 8, max_recheck: int = 1024,
                 history: int = 256, margin: float = 1.05, settle: int = 16):
        self.probe, self.base_recheck, self.max_recheck, self.margin = probe, recheck, max_recheck, margin
        self.window, self.history, self.settle = window, history, settle
        self.arms: list[Mode] = []
        self.start([None, TreeBudget()])

    def start(self, arms: list[Mode]) -> None:
        """Choose among `arms` from now on; the measurements are kept while the arms stay the same."""
        if arms == self.arms:
            return
        self.arms = list(arms)
        self.seconds = [deque(maxlen=self.window) for _ in arms]  # recent step times, per arm
        self.tokens = [deque(maxlen=self.history) for _ in arms]  # tokens per step, per arm
        self.choice = 1 if len(arms) > 1 else 0  # speculate until measured otherwise
        self.recheck = self.base_recheck
        self.queue = self._rounds()  # arm indices still to probe
        self.since = 0  # steps since the last probe ended
        self.ratio: float | None = None  # the best speculative arm's tokens/s over plain's, when chosen

    def _rounds(self) -> list[int]:
        others = [i for i in range(len(self.arms)) if i != self.choice]
        return [i for _ in range(self.probe) for i in others + [self.choice]]

    def next(self) -> Mode:
        """The mode of the next step."""
        if not self.queue and self.since >= self.recheck:  # a fresh probe: the load may have changed
            self.queue = self._rounds()
            for samples in self.seconds:
                samples.clear()
        return self.arms[self.queue[0] if self.queue else self.choice]

    def record(self, mode: Mode, tokens: int, seconds: float) -> None:
        """What a step of `mode` produced, in how long: the wall clock since the previous step ended."""
        arm = self.arms.index(mode)
        if seconds > 0:
            self.seconds[arm].append(seconds)
            self.tokens[arm].append(tokens)
        if self.queue and self.queue[0] == arm:
            self.queue.pop(0)
            if not self.queue:
                self._choose()
        else:
            self.since += 1
            if arm == self.choice and self.since % self.settle == 0 and self.ratio is not None:
                self._reconsider()

    def _reconsider(self) -> None:
        """The choice has run `settle` more steps: decide again on what it delivered. A change is a
        choice the probe got wrong: the next probe comes sooner."""
        best = self._best()
        if best != self.choice:
            self.choice, self.since, self.recheck = best, 0, self.base_recheck

    def rate(self, mode: Mode) -> float | None:
        """Tokens per second of `mode` as measured (None before it ran)."""
        arm = self.arms.index(mode)
        if not self.seconds[arm]:
            return None
        return statistics.fmean(self.tokens[arm]) / statistics.median(self.seconds[arm])

    def _choose(self) -> None:
        """The probe is over: keep the fastest arm."""
        first = self.ratio is None  # the first probe confirms nothing
        best = self._best()
        confirmed = not first and best == self.choice
        self.recheck = min(2 * self.recheck, self.max_recheck) if confirmed else self.base_recheck
        self.choice, self.since = best, 0

    def _best(self) -> int:
        """The fastest arm as measured; plain unless a tree beats it by the margin (a gain within the noise
        is not worth a tree). Sets `ratio`, the best tree's rate over plain's."""
        rates = [self.rate(mode) or 0.0 for mode in self.arms]
        best = max(range(len(rates)), key=lambda i: rates[i])
        if None in self.arms and rates[best] < self.margin * rates[self.arms.index(None)]:
            best = self.arms.index(None)
        speculative = [r for mode, r in zip(self.arms, rates) if mode is not None]
        plain = rates[self.arms.index(None)] if None in self.arms else 0.0
        self.ratio = max(speculative) / plain if speculative and plain > 0 else None
        return best

    @property
    def mode(self) -> Mode:
        return self.arms[self.choice]

    def label(self) -> str:
        """For the status bar: 'auto: on 12/3/4 1.4x' (the budget kept; the best tree's tokens/s over
        plain's, as measured), 'auto: off 0.7x', or 'auto' before the first choice."""
        if self.ratio is None:
            return "auto"
        if self.mode is None:
            return f"auto: off {self.ratio:.1f}x"
        return f"auto: on {self.mode.label()} {self.ratio:.1f}x"
