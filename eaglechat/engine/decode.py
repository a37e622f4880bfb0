"""The decode loop (EAGLE-2, arXiv:2406.16858): prefill -> [draft -> verify -> read -> commit -> emit]
until a stop.

Plain decoding runs the very same loop with a root-only tree (one token per target forward): that is
the baseline every speedup is measured against, and the off switch. The target model's forwards and
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
from typing import Callable, Iterator

import torch

from eaglechat.engine.draft import Drafter
from eaglechat.engine.heads import EagleHead
from eaglechat.engine.protocol import PREFILL_CHUNK, GenerationParams, GenerationStats, StepStats, StopReason, TreeBudget
from eaglechat.engine.sampling import is_greedy, next_token, penalize, seen_on_paths
from eaglechat.engine.target import Target
from eaglechat.engine.tree import STATIC_TREE_26, DraftTree, root_only
from eaglechat.engine.verify import Verdict, accept, greedy_accept, settle
from eaglechat.errors import ContextTooLong, UsageError

PrefillProgress = Callable[[int, int], None]  # (prompt tokens read so far, prompt tokens to read)


@dataclass
class Step:
    tokens: list[int]  # emitted this step, already cut at a stop token or the length limit
    drafted: list[bool]
    stats: StepStats | None  # None for the first token (from the prefill)
    prefill: tuple[int, int] | None = None  # (read, to read): a prompt-reading report, no tokens


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
        self.drafter = Drafter(head, max_context) if head is not None else None
        self.draft_features: torch.Tensor | None = None  # what the drafter reads, from the last forward
        self.cached_ids: list[int] = []  # token ids whose KV is in the cache, len == cache.length
        self.stop_reason: StopReason | None = None
        self.stats = GenerationStats()
        self.seen: torch.Tensor | None = None  # with a repetition penalty: [V] bool, the tokens in the cache
        self.tree_logits, self.finish_greedy = self.target.tree_logits, self._finish_greedy
        self.step_begin: Callable[[], None] | None = None

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
        tree_nodes = budget.total_tokens + 1 if budget.kind == "dynamic" else len(STATIC_TREE_26) + 1
        self.cache.reserve(self.max_context + tree_nodes)
        if self.drafter is not None:
            self.drafter.prepare(budget, self.max_context + budget.depth * max(budget.top_k, 4) + tree_nodes)

    # -- one step's device work ------------------------------------------------------------------
    @torch.no_grad()
    def verify(self, tree: DraftTree, params: GenerationParams, generator: torch.Generator | None) -> Verdict:
        """One target forward over the tree, acceptance, and the KV cache cut to the accepted path: all on
        the device (the host length follows in `commit`, once the step's summary is read)."""
        self.cache.begin(tree.size, (tree.ancestors, tree.depth))  # recurrent layers run it tree-shaped
        logits, draft_features = self.tree_logits(tree.tokens, tree.depth, tree.ancestors)
        self.cache.advance(tree.size)
        if self.seen is not None:  # each node's logits penalized by its own context (cached + path)
            logits = penalize(logits, seen_on_paths(self.seen, tree.tokens, tree.ancestors), params.repetition_penalty)
        if is_greedy(params):
            verdict, self.draft_features = self.finish_greedy(tree, logits, draft_features)
        else:  # sampling draws from a torch.Generator: left out of compiled graphs
            best, bonus = accept(tree, logits, params, generator)
            verdict, self.draft_features = self._finish(tree, best, bonus, draft_features)
        return verdict

    def _finish(self, tree, best, bonus, draft_features) -> tuple[Verdict, torch.Tensor]:
        verdict = settle(tree, best, bonus)
        self.cache.keep_path(verdict.path, verdict.count, tree.size)
        return verdict, draft_features.index_select(0, verdict.path)

    def _finish_greedy(self, tree, logits, draft_features) -> tuple[Verdict, torch.Tensor]:
        best, bonus = greedy_accept(tree, logits)
        return self._finish(tree, best, bonus, draft_features)

    def commit(self, tokens: list[int], verdict: Verdict, speculate: bool) -> None:
        """The host learns what the device did: the cache now ends with `tokens` (root + accepted
        drafts); the drafter reads the verified features of those positions."""
        self.cache.commit(len(self.cached_ids) + len(tokens))
        self.cached_ids.extend(tokens)
        if self.seen is not None:
            self.seen[torch.tensor(tokens, device=self.device)] = True
        if speculate:
            self.drafter.extend(self.draft_features, verdict.next_tokens, verdict.count, len(tokens))

    # -- compiled steps ----------------------------------------------------------------------------
    def compile_steps(self, compiler, step_begin: Callable[[], None] | None = None) -> None:
        """Run the verify forward, the greedy finish and the drafter's steps through `compiler` (e.g.
        torch.compile): attention then sees whole buffers under masks, so every step of a tree budget
        has the same shapes and no step recompiles. `step_begin` runs before each step (CUDA graphs:
        torch.compiler.cudagraph_mark_step_begin, so a step may reuse the previous step's graph memory)."""
        self.step_begin = step_begin
        self.cache.static = True
        self.tree_logits = compiler(self.target.tree_logits)
        self.finish_greedy = compiler(self._finish_greedy)
        if self.drafter is not None:
            self.drafter.compile_steps(compiler)

    def eager_steps(self) -> None:
        """Undo compile_steps (a model the compiler cannot take decodes eagerly instead)."""
        self.step_begin = None
        self.cache.static = False
        self.tree_logits, self.finish_greedy = self.target.tree_logits, self._finish_greedy
        if self.drafter is not None:
            self.drafter.compile_steps(lambda fn: fn)
            self.drafter.static = False
        self.reset()

    def _mark_static_buffers(self) -> None:
        """CUDA graphs replay on fixed addresses: the buffers the steps mutate (KV caches, positions) are
        marked static, so a replay uses them in place instead of copying them into the graph's inputs."""
        if not (self.cache.static and self.device.type == "cuda"):
            return
        for buffer in self.cache.buffers() + (self.drafter.buffers() if self.drafter is not None else []):
            torch._dynamo.mark_static_address(buffer)

    # -- the prompt ----------------------------------------------------------------------------------
    def _reusable_prefix(self, prompt_ids: list[int], speculate: bool) -> int:
        common = 0
        for a, b in zip(self.cached_ids, prompt_ids):
            if a != b:
                break
            common += 1
        limit = min(common - 1, len(prompt_ids) - 1)  # at least one prompt token is recomputed
        if speculate:  # the drafter must hold verified features for every kept position
            limit = min(limit, self.drafter.stable - 1)
        return self.cache.reusable(max(0, limit))  # a recurrent state goes back to few lengths

    @torch.no_grad()
    def read_prompt(
        self,
        prompt_ids: list[int],
        reuse: int,
        speculate: bool,
        sample_root: Callable[[torch.Tensor], torch.Tensor],
        cancel: threading.Event | None = None,
    ) -> Iterator[tuple[int, int]]:
        """Read prompt_ids[reuse:] into the caches, `prefill_chunk` tokens per forward, yielding
        (read, to read) before the first chunk and after each, and return the first reply token (the
        root of the first tree, [1] on the device), chosen by `sample_root` from the last logits.

        Returns None when `cancel` is set between chunks: the base cache, `cached_ids` and the drafter
        then hold exactly the chunks read so far, so the next turn reuses them as a cached prefix."""
        self.truncate(reuse)
        total = len(prompt_ids) - reuse
        yield 0, total
        for start in range(reuse, len(prompt_ids), self.prefill_chunk):
            if start > reuse and cancel is not None and cancel.is_set():
                return None
            end = min(start + self.prefill_chunk, len(prompt_ids))
            features, self.draft_features = self.target.forward_chain(torch.tensor(prompt_ids[start:end], device=self.device))
            self.cached_ids = list(prompt_ids[:end])
            if end == len(prompt_ids):
                break
            if speculate:  # pairs (feature of t, token t+1) for every position of the chunk
                self.drafter.extend(self.draft_features, torch.tensor(prompt_ids[start + 1:end + 1], device=self.device))
            yield end - reuse, total
        root = sample_root(self.target.logits(features[-1])).reshape(1)
        if speculate:
            shifted = torch.tensor(prompt_ids[start + 1:], dtype=torch.long, device=self.device)
            self.drafter.extend(self.draft_features, torch.cat([shifted, root]))
        yield total, total
        return root

    def _prefill(self, chunks, on_progress: PrefillProgress | None, report: bool):
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
        speculate = params.speculate and self.drafter is not None
        stats = self.stats = GenerationStats(speculate=speculate, tree=budget.to_dict() if speculate else {})
        self.stop_reason = None
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        started = time.perf_counter()
        try:
            # prefill: only the part of the prompt whose KV is not already cached from the last turn
            stats.reused_tokens = reuse = self._reusable_prefix(prompt_ids, speculate)
            self.prepare(budget)
            self.seen = None
            if params.repetition_penalty != 1.0:
                vocab = getattr(self.target.lm_head, "out_features", None) or self.model.config.vocab_size
                self.seen = torch.zeros(vocab, dtype=torch.bool, device=self.device)
                self.seen[torch.tensor(prompt_ids, device=self.device)] = True

            def sample_root(logits):
                if self.seen is not None:
                    logits = penalize(logits, self.seen, params.repetition_penalty)
                return next_token(logits, params, generator)

            chunks = self.read_prompt(prompt_ids, reuse, speculate, sample_root, cancel)
            first = yield from self._prefill(chunks, on_prefill_progress, report_prefill)
            stats.prefill_s, stats.prefill_tokens = time.perf_counter() - started, len(self.cached_ids) - reuse
            if first is None:
                self.stop_reason = StopReason.CANCELLED
                return
            self._mark_static_buffers()
            root, root_on_device = first.item(), first  # once per turn: shown before any step
            shown, self.stop_reason = cut([root], stop_ids, params.max_new_tokens)
            stats.new_tokens += shown
            if shown:
                yield Step([root], [False], None)
            while not self.stop_reason:
                room, cancelled = self.max_context - self.cache.length, cancel is not None and cancel.is_set()
                if cancelled or room < 1:
                    self.stop_reason = StopReason.CANCELLED if cancelled else StopReason.CONTEXT
                    break
                step_start = time.perf_counter()
                if self.step_begin is not None:
                    self.step_begin()
                tree = self.drafter.draft(root_on_device, budget) if speculate else root_only(root_on_device)
                verdict = self.verify(tree.cut(room), params, generator)
                summary = self.target.read(verdict.summary)  # the one read: count, accepted tokens, bonus
                accepted = summary[0]
                self.commit([root] + summary[1:accepted + 1], verdict, speculate)
                root, root_on_device = summary[accepted + 1], verdict.bonus.clone()  # outlives a graph replay
                tokens = summary[1:accepted + 2]
                shown, self.stop_reason = cut(tokens, stop_ids, params.max_new_tokens - stats.new_tokens)
                # tau counts what the step produced: a stop token was produced (and not shown)
                step = StepStats(accepted=accepted, tree_size=tree.size, step_s=time.perf_counter() - step_start,
                                 decode_tokens=shown + (self.stop_reason == StopReason.STOP))
                stats.add_step(step, shown)
                yield Step(tokens[:shown], ([True] * accepted + [False])[:shown], step)  # a stop-only step too
        finally:
            stats.finish(time.perf_counter() - started)
