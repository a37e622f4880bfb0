"""The decode loop (EAGLE-2, arXiv:2406.16858): prefill -> [draft -> verify -> read -> commit -> emit]
until a stop.

Plain decoding runs the very same loop with a root-only tree (one token per target forward): that is
the baseline every speedup is measured against, and the off switch. speculate="auto" lets
engine/autospec.py pick, step by step, plain decoding or one of a few tree budgets by measured speed;
its plain steps leave the head alone (eager, they are plain decoding's steps op for op) and keep their
features, and the drafter catches up on them before the next speculative step. The target model's forwards and
masks live in engine/target.py, the tree in engine/tree.py and engine/draft.py, acceptance in
engine/verify.py; this module only sequences them and keeps the host's view of the caches.

The prompt is prefilled in chunks of `prefill_chunk` tokens (what the memory planner budgets for), with
a cancel check and a progress report between chunks.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

import torch

from eaglechat.engine.autospec import Mode, SpeculationChooser, arms_for
from eaglechat.engine.draft import BACKLOG_ROWS, Drafter
from eaglechat.engine.heads import EagleHead
from eaglechat.engine.penalties import Penalties, wanted
from eaglechat.engine.protocol import PREFILL_CHUNK, GenerationParams, GenerationStats, StepStats, StopReason, TreeBudget
from eaglechat.engine.rng import CounterRNG
from eaglechat.engine.sampling import next_token
from eaglechat.engine.target import Target
from eaglechat.engine.tree import STATIC_TREE_26, STATIC_TREE_EXPANDED, root_only
from eaglechat.engine.verify import accept, settle
from eaglechat.errors import ContextTooLong, UsageError

PrefillProgress = Callable[[int, int], None]  # (prompt tokens read so far, prompt tokens to read)


@dataclass
class Step:
    tokens: list[int]  # emitted this step, already cut at a stop token or the length limit
    drafted: list[bool]
    stats: StepStats | None  # None for the first token (from the prefill)
    prefill: tuple[int, int] | None = None  # (read, to read): a prompt-reading report, no tokens


class StepRunner(Protocol):
    """How decode steps run when not eagerly (engine/compile.py): `run` does one `Decoder._step` and its
    one read; `start_reply` comes once per reply before the first step; `report` adds the runner's
    figures to a reply's stats."""

    static_windows: bool  # steps see power-of-two windows (engine/cache.py `bucket`): one shape per bucket

    def start_reply(self) -> None: ...

    def run(self, budget: TreeBudget, params: GenerationParams, speculate: bool, follow: bool) -> list[int]: ...

    def report(self, stats: GenerationStats) -> None: ...


def tree_size(budget: TreeBudget, speculate: bool) -> int:
    """Nodes one verify forward reads, root included: fixed by the budget (plain decoding: the root)."""
    if not speculate:
        return 1
    return budget.total_tokens + 1 if budget.kind == "dynamic" else len(STATIC_TREE_26) + 1


def draft_room(budget: TreeBudget) -> int:
    """Head-cache entries a step writes above the drafter's verified ones at most: the tree levels,
    then the accepted path."""
    return budget.depth * max(budget.draft_top_k, STATIC_TREE_EXPANDED) + tree_size(budget, True)


def cut(tokens: list[int], stop_ids: set[int], left: int) -> tuple[int, StopReason | None]:
    """How many of `tokens` are shown when `left` more may be, and why the reply ends there (a stop
    token is not shown; the token that reaches the length limit is)."""
    for i, tok in enumerate(tokens):
        if tok in stop_ids:
            return i, StopReason.STOP
        if i + 1 >= left:
            return i + 1, StopReason.LENGTH
    return len(tokens), None


class Decoder:
    """Owns the target's KV cache and the drafter; keeps them across turns for prefix reuse."""

    def __init__(self, model, head: EagleHead | None, max_context: int, prefill_chunk: int = PREFILL_CHUNK):
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be positive, got {prefill_chunk}")
        self.model = model
        self.prefill_chunk = prefill_chunk
        self.max_context = max_context
        # EAGLE-3 heads read the inputs of base layers [2, N//2, N-3], captured in the same forward
        layers = getattr(head, "feature_layers", None)
        self.target = Target(model, max_context, layers(model.config.num_hidden_layers) if layers else None)
        self.cache, self.device = self.target.cache, self.target.device
        self.drafter = Drafter(head, max_context, prefill_chunk) if head is not None else None
        self.cached_ids: list[int] = []  # token ids whose KV is in the cache, len == cache.length
        self.stop_reason: StopReason | None = None
        self.stats = GenerationStats()
        self.penalties: Penalties | None = None  # with a penalty: what the reply's context holds, on the device
        self._penalty_buffers: Penalties | None = None  # kept across replies (`_penalties`)
        self.root = torch.zeros(1, dtype=torch.long, device=self.device)  # the next tree's root (in place)
        self.rng = CounterRNG(self.device)  # sampling's random numbers, drawn inside the step
        self.chooser = SpeculationChooser()  # speculate="auto": plain or speculative, step by step
        self.runner: StepRunner | None = None  # how steps run (`use`); None: eagerly
        self.plain_pair: tuple[torch.Tensor, torch.Tensor] | None = None  # eager plain step: (feature, next token)

    def reset(self) -> None:
        """Forget the cached prefix: the next generation prefills its whole prompt."""
        self.truncate(0)

    def truncate(self, length: int) -> None:
        self.cache.truncate(length)
        self.cached_ids = self.cached_ids[:length]
        if self.drafter is not None:
            self.drafter.truncate(length)

    def prepare(self, budget: TreeBudget) -> None:
        """Once per turn: room past the context limit for one tree (its nodes are written before the cut
        is known) and for the head's tree levels, so no step allocates or checks capacity."""
        self.cache.reserve(self.max_context + tree_size(budget, True))
        if self.drafter is not None:
            self.drafter.prepare(budget, self.max_context + draft_room(budget))

    # -- one step, on the device ---------------------------------------------------------------
    def _step(self, budget: TreeBudget, params: GenerationParams, speculate: bool, follow: bool) -> torch.Tensor:
        """draft -> verify -> accept -> keep the accepted KV -> feed the drafter, with no host read: the
        root, h_last, the caches' positions and the RNG state are buffers read and written in place, and
        the context limit is a device mask. Captured or compiled, the whole step is one graph (one replay).
        `follow`: a captured or compiled plain step writes the root's feature into the drafter's backlog
        (speculate="auto" may speculate later; the head does not run now). An eager plain step, under
        speculate="auto" or not, runs the same ops and leaves its feature and next token in `plain_pair`
        (references: no device work), which auto's loop hands to the drafter.
        -> the summary: accepted drafts a, the a accepted tokens, the bonus token (`Verdict.summary`)."""
        if follow:  # the root's row in the backlog, read before the forward moves the cache's position
            row = self.cache.position - self.drafter.position
        tree = self.drafter.draft(self.root, budget) if speculate else root_only(self.root)
        tree = tree.cut(self.max_context - self.cache.position)  # nodes past the context never count
        logits, draft_features = self.target.tree_logits(tree)
        if self.penalties is not None:  # each node's logits penalized by its own context (cached + path)
            logits = self.penalties.tree(logits, tree.tokens, tree.ancestors, tree.depth)
        verdict = settle(tree, *accept(tree, logits, params, self.rng))
        self.cache.keep_path(verdict.path, verdict.count, tree.size)
        if self.penalties is not None:  # the root and the accepted drafts join the context
            self.penalties.commit(tree.tokens.index_select(0, verdict.path), verdict.count)
        if speculate:  # the verified features of the accepted path, paired with the token after each
            self.drafter.extend_device(draft_features.index_select(0, verdict.path), verdict.next_tokens, verdict.count)
        elif follow:
            self.drafter.remember(draft_features[:1], verdict.bonus, row)
        elif self.runner is None:
            self.plain_pair = draft_features, verdict.bonus
        self.root.copy_(verdict.bonus)
        return verdict.summary

    def open(self, budget: TreeBudget, speculate: bool) -> None:
        """Host side, before a step: the windows its attention reads, exact when eager; captured or
        compiled, one power-of-two bucket for both caches (one graph per bucket, not per pair of them)."""
        t = tree_size(budget, speculate)
        need = max(self.cache.length + t, self.drafter.stable + draft_room(budget) if speculate else 0)
        self.cache.open(t, need=need)
        if speculate and self.drafter.static:
            self.drafter.open(need)

    def commit(self, tokens: list[int], speculate: bool, follow: bool, keep: bool = False) -> None:
        """The host learns what the device did: the caches now end with `tokens` (root + accepted drafts).
        `keep`: an eager plain step under speculate="auto": its feature waits for the drafter."""
        self.cache.commit(len(self.cached_ids) + len(tokens))
        self.cached_ids.extend(tokens)
        if speculate:
            self.drafter.commit(len(tokens))
        elif follow:
            self.drafter.behind += 1
        elif keep:
            self.drafter.keep(*self.plain_pair)

    # -- how a step runs -------------------------------------------------------------------------
    def use(self, runner: StepRunner | None, keep_cache: bool = False) -> None:
        """Run steps through `runner` (engine/compile.py: captured CUDA graphs, or torch.compile), or
        eagerly (None). The caches hold the same entries either way; only the windows attention reads
        change (a runner may ask for bucketed ones), set by `open` per step."""
        if keep_cache and self.drafter is not None and self.drafter.behind:
            self.drafter.catch_up()  # waiting rows are kept one way per runner (engine/draft.py)
        self.runner = runner
        static = runner is not None and runner.static_windows
        self.cache.static = static
        if self.drafter is not None:
            self.drafter.static = static
        if not keep_cache:
            self.reset()

    def run_step(self, budget: TreeBudget, params: GenerationParams, speculate: bool, follow: bool) -> list[int]:
        """One step and its one read (`Target.read`)."""
        if self.runner is None:
            return self.target.read(self._step(budget, params, speculate, follow))
        return self.runner.run(budget, params, speculate, follow)

    def _penalties(self, params: GenerationParams, prompt_ids: list[int]) -> Penalties:
        """The reply's penalty state, in the buffers of the last reply with the same layout (a captured
        step reads them where they are)."""
        vocab = getattr(self.target.lm_head, "out_features", None) or self.model.config.vocab_size
        kept = self._penalty_buffers
        if kept is None or not kept.fits(params, vocab):
            kept = self._penalty_buffers = Penalties(params, vocab, self.device)
        return kept.load(params, prompt_ids)

    # -- the prompt ----------------------------------------------------------------------------------
    def _reusable_prefix(self, prompt_ids: list[int], speculate: bool, defer: bool = False) -> int:
        common = 0
        for a, b in zip(self.cached_ids, prompt_ids):
            if a != b:
                break
            common += 1
        limit = min(common - 1, len(prompt_ids) - 1)  # at least one prompt token is recomputed
        if speculate:  # the drafter must hold (or have waiting, `defer`) verified features for every kept position
            drafter = self.drafter
            upto = min(limit, drafter.covered)
            if upto > drafter.stable and not defer:  # what the last turn's plain steps kept (positions the prompt shares)
                drafter.truncate(upto)
                drafter.catch_up()
            limit = upto if defer else min(limit, drafter.stable)  # entry stable-1 pairs with token `stable`
        return self.cache.reusable(max(0, limit))  # a recurrent state goes back to few lengths

    @torch.no_grad()
    def read_prompt(
        self,
        prompt_ids: list[int],
        reuse: int,
        speculate: bool,
        sample_root: Callable[[torch.Tensor], torch.Tensor],
        cancel: threading.Event | None = None,
        defer: bool = False,
    ) -> Iterator[tuple[int, int]]:
        """Read prompt_ids[reuse:] into the caches, `prefill_chunk` tokens per forward, yielding
        (read, to read) before the first chunk and after each, and return the first reply token (the
        root of the first tree, [1] on the device), chosen by `sample_root` from the last logits.

        `defer` (eager speculate="auto"): the chunks' features wait for the drafter's next catch-up (a reply
        that stays plain never runs the head) instead of being read now.

        Returns None when `cancel` is set between chunks: the base cache, `cached_ids` and the drafter
        then hold exactly the chunks read so far, so the next turn reuses them as a cached prefix."""
        feed = self.drafter.keep if defer else self.drafter.extend if speculate else None
        self.truncate(reuse)
        total = len(prompt_ids) - reuse
        yield 0, total
        for start in range(reuse, len(prompt_ids), self.prefill_chunk):
            if start > reuse and cancel is not None and cancel.is_set():
                return None
            end = min(start + self.prefill_chunk, len(prompt_ids))
            features, draft_features = self.target.forward_chain(torch.tensor(prompt_ids[start:end], device=self.device))
            self.cached_ids = list(prompt_ids[:end])
            if end == len(prompt_ids):
                break
            if speculate:  # pairs (feature of t, token t+1) for every position of the chunk
                feed(draft_features, torch.tensor(prompt_ids[start + 1:end + 1], device=self.device))
            yield end - reuse, total
        root = sample_root(self.target.logits(features[-1])).reshape(1)
        if speculate:
            shifted = torch.tensor(prompt_ids[start + 1:], dtype=torch.long, device=self.device)
            feed(draft_features, torch.cat([shifted, root]))
        yield total, total
        return root

    @torch.no_grad()
    def embed(self, ids: list[int]) -> torch.Tensor:
        """The mean of the base model's last hidden states (post-norm) over `ids`, read alone (the cache is
        emptied before and after: the next turn prefills its whole prompt) -> [H] fp32."""
        self._check(ids)
        self.truncate(0)
        total = None
        try:
            for start in range(0, len(ids), self.prefill_chunk):
                chunk = torch.tensor(ids[start:start + self.prefill_chunk], device=self.device)
                features, _ = self.target.forward_chain(chunk)
                part = features.float().sum(dim=0)
                total = part if total is None else total + part
        finally:
            self.truncate(0)
        return total / len(ids)

    def _prefill(self, prompt_ids: list[int], params: GenerationParams, budget: TreeBudget, speculative: bool,
                 cancel: threading.Event | None, on_progress: PrefillProgress | None, report: bool, started: float):
        """Read the part of the prompt whose KV is not already cached from the last turn (`read_prompt`),
        reporting each (read, to read); -> the first reply token ([1] on the device, also in `self.root`, the
        buffer the first step drafts from), None when cancelled."""
        stats = self.stats
        defer = speculative and params.speculate == "auto" and self.runner is None  # eager auto: `read_prompt`
        stats.reused_tokens = reuse = self._reusable_prefix(prompt_ids, speculative, defer)
        self.prepare(budget)
        self.penalties = self._penalties(params, prompt_ids) if wanted(params) else None

        def sample_root(logits):
            if self.penalties is not None:
                logits = self.penalties.root(logits)
            return next_token(logits, params, self.rng)

        chunks = self.read_prompt(prompt_ids, reuse, speculative, sample_root, cancel, defer)
        first = yield from self._report_prefill(chunks, on_progress, report)
        stats.prefill_s, stats.prefill_tokens = time.perf_counter() - started, len(self.cached_ids) - reuse
        if first is not None:
            if self.runner is not None:
                self.runner.start_reply()  # the buffers a step reads are all in place now
            self.root.copy_(first)
        return first

    def _report_prefill(self, chunks, on_progress: PrefillProgress | None, report: bool):
        """Drive `read_prompt` to its end (-> its value), reporting each (read, to read)."""
        while True:
            try:
                read = next(chunks)
            except StopIteration as end:
                return end.value
            if on_progress is not None:
                on_progress(*read)
            if report:
                yield Step([], [], None, prefill=read)

    def _check(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise UsageError("empty prompt")
        if len(prompt_ids) + 1 > self.max_context:
            raise ContextTooLong(f"the prompt is {len(prompt_ids)} tokens but the context limit is {self.max_context}")

    # -- the loop --------------------------------------------------------------------------------
    @torch.no_grad()  # on a generator, torch re-enters no_grad at every resume (the caller is unaffected)
    def generate(
        self,
        prompt_ids: list[int],
        params: GenerationParams,
        budget: TreeBudget,
        stop_ids: set[int],
        cancel: threading.Event | None = None,
        on_prefill_progress: PrefillProgress | None = None,
        report_prefill: bool = False,
    ) -> Iterator[Step]:
        """Decode a reply to `prompt_ids`, one Step per verify step. `on_prefill_progress(done, total)` is
        called before the first prefill chunk and after each one (prompt tokens not taken from the cache);
        with `report_prefill` each report is also yielded as a token-less Step (a generator can hand
        them to a UI while the prompt is read, which a callback on this thread cannot)."""
        self._check(prompt_ids)
        speculative = bool(params.speculate) and self.drafter is not None  # the prefill feeds the drafter
        auto = params.speculate == "auto" and speculative
        if auto:
            self.chooser.start(arms_for(budget))
        stats = self.stats = GenerationStats(speculate=speculative, tree=budget.to_dict() if speculative else {},
                                             steps="eager")
        self.stop_reason = None
        self.rng.manual_seed(params.seed if params.seed is not None else random.getrandbits(63))
        started = time.perf_counter()
        try:
            first = yield from self._prefill(prompt_ids, params, budget, speculative, cancel, on_prefill_progress,
                                             report_prefill, started)
            if first is None:
                self.stop_reason = StopReason.CANCELLED
                return
            root = first.item()  # once per turn: the first reply token is shown before any step
            shown, self.stop_reason = cut([root], stop_ids, params.max_new_tokens)
            stats.new_tokens += shown
            if shown:
                yield Step([root], [False], None)
            last_end = time.perf_counter()  # auto times each step as the reply pays for it, from here
            while not self.stop_reason:
                room, cancelled = self.max_context - self.cache.length, cancel is not None and cancel.is_set()
                if cancelled or room < 1:
                    self.stop_reason = StopReason.CANCELLED if cancelled else StopReason.CONTEXT
                    break
                step_start = time.perf_counter()
                mode: Mode = self.chooser.next() if auto else budget if speculative else None
                speculate = mode is not None
                # plain under auto: a compiled step writes its feature into the drafter's backlog; an eager
                # one is plain decoding's step and its feature waits in the drafter's `pending` (`keep`)
                plain_under_auto = auto and not speculate
                follow, keep = plain_under_auto and self.runner is not None, plain_under_auto and self.runner is None
                if auto and (speculate and self.drafter.behind or follow and self.drafter.behind == BACKLOG_ROWS):
                    self.drafter.catch_up()  # a switch's cost, charged to the step that needed it
                self.open(mode or budget, speculate)
                summary = self.run_step(mode or budget, params, speculate, follow)
                accepted = summary[0]
                self.commit([root] + summary[1:accepted + 1], speculate, follow, keep)
                root, tokens = summary[accepted + 1], summary[1:accepted + 2]
                shown, self.stop_reason = cut(tokens, stop_ids, params.max_new_tokens - stats.new_tokens)
                # tau counts what the step produced: a stop token was produced (and not shown)
                step = StepStats(accepted=accepted, tree_size=tree_size(mode or budget, speculate),
                                 step_s=time.perf_counter() - step_start,
                                 decode_tokens=shown + (self.stop_reason == StopReason.STOP))
                stats.add_step(step, shown)
                if auto:
                    now = time.perf_counter()  # what the reply paid: catch-up and the caller's work included
                    self.chooser.record(mode, accepted + 1, now - last_end)
                    last_end = now
                    stats.speculation = self.chooser.label()
                yield Step(tokens[:shown], ([True] * accepted + [False])[:shown], step)  # a stop-only step too
        finally:
            if self.runner is not None:
                self.runner.report(stats)
            stats.finish(time.perf_counter() - started)
