"""The decode loop: prefill -> draft -> verify -> accept -> keep accepted KV -> emit, until a stop.

Plain decoding runs the very same loop with a root-only tree (one token per target forward): that is
the baseline every speedup is measured against, and the off switch.

The prompt is prefilled in chunks of `prefill_chunk` tokens (what the memory planner budgets for), with
a cancel check and a progress report between chunks.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterator

import torch

from eaglechat.engine.attention import NAME as GQA_SDPA, use_tree_attention
from eaglechat.engine.cache import TreeKVCache
from eaglechat.engine.draft import Drafter
from eaglechat.engine.heads import EagleHead
from eaglechat.engine.int8_rows import make_rows_exact
from eaglechat.engine.protocol import GenerationParams, GenerationStats, StepStats, TreeBudget
from eaglechat.engine.sampling import next_token
from eaglechat.engine.tree import STATIC_TREE_26, DraftTree, root_only
from eaglechat.engine.sampling import is_greedy
from eaglechat.engine.verify import Verdict, accept, greedy_accept, settle
from eaglechat.errors import ContextTooLong, UsageError


PREFILL_CHUNK = 512  # tokens per prefill forward unless the loader passes the planner's

PrefillProgress = Callable[[int, int], None]  # (prompt tokens read so far, prompt tokens to read)


@dataclass
class Step:
    tokens: list[int]  # emitted this step, already cut at a stop token or the length limit
    drafted: list[bool]
    stats: StepStats | None  # None for the first token (from the prefill)
    prefill: tuple[int, int] | None = None  # (read, to read): a prompt-reading report, no tokens


def _drive(chunks: Iterator[tuple[int, int]], on_progress: PrefillProgress | None):
    """Run a prompt-reading generator to its end, reporting each (done, total); return its value."""
    while True:
        try:
            done, total = next(chunks)
        except StopIteration as end:
            return end.value
        if on_progress is not None:
            on_progress(done, total)


class Decoder:
    """Owns the base model's KV cache and the drafter; keeps them across turns for prefix reuse."""

    def __init__(self, model, head: EagleHead | None, max_context: int, prefill_chunk: int = PREFILL_CHUNK):
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be positive, got {prefill_chunk}")
        self.model = model
        make_rows_exact(model)  # LLM.int8 layers: a verify row computes as its one-token step would
        use_tree_attention(model)  # GQA and attention sinks under a tree mask (eager models need it)
        self.prefill_chunk = prefill_chunk
        self.max_context = max_context
        self.backbone = getattr(model, model.base_model_prefix)
        self.lm_head = model.get_output_embeddings()
        self.config = model.config
        self.device = self.lm_head.weight.device
        self.cache = TreeKVCache(self.config.num_hidden_layers, max_context, self.device)
        self.drafter = Drafter(head, max_context) if head is not None else None
        # EAGLE-3 heads read the inputs of base layers [2, N//2, N-3], captured in the same forward
        layers = getattr(head, "feature_layers", None)
        self.feature_layers = layers(self.config.num_hidden_layers) if layers else None
        self.draft_features: torch.Tensor | None = None  # what the drafter reads, from the last forward()
        self.cached_ids: list[int] = []  # token ids whose KV is in the cache, len == cache.length
        self.stop_reason = ""
        self.stats = GenerationStats()
        self._pinned: torch.Tensor | None = None  # host buffer of the per-step read (CUDA)
        self.tree_logits, self.finish_greedy = self._tree_logits, self._finish_greedy
        self.step_begin: Callable[[], None] | None = None

    def reset(self) -> None:
        """Forget the cached prefix: the next generation prefills its whole prompt."""
        self.cache.truncate(0)
        self.cached_ids = []
        if self.drafter is not None:
            self.drafter.truncate(0)

    def prepare(self, budget: TreeBudget) -> None:
        """Once per turn: room past the context limit for one tree (its nodes are written before the cut
        is known) and for the head's tree levels, so no step allocates or checks capacity."""
        tree_nodes = budget.total_tokens + 1 if budget.kind == "dynamic" else len(STATIC_TREE_26) + 1
        self.cache.reserve(self.max_context + tree_nodes)
        if self.drafter is not None:
            self.drafter.prepare(budget, self.max_context + budget.depth * max(budget.top_k, 4) + tree_nodes)

    # -- one base forward over new tokens laid out as a tree (a chain for the prompt) --------------
    @torch.no_grad()
    def forward(self, ids: torch.Tensor, depth: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """ids/depth [T]; visible [T, T] bool among the new tokens, written after the cache.
        Returns post-norm features [T, H] (and sets `draft_features`)."""
        t = ids.numel()
        self.cache.begin(t)
        features, self.draft_features = self._features(ids, depth, visible)
        self.cache.advance(t)
        return features

    def _features(self, ids, depth, visible) -> tuple[torch.Tensor, torch.Tensor]:
        """Device work of `forward`: -> (post-norm features, what the drafter reads)."""
        positions = (self.cache.position + depth)[None]
        out = self.backbone(
            input_ids=ids[None], attention_mask=self._attention_mask(visible, positions), position_ids=positions,
            cache=self.cache, use_cache=True,
            **({"output_hidden_states": self.feature_layers} if self.feature_layers else {}),
        )
        return self._split_features(out)

    @torch.no_grad()
    def forward_chain(self, ids: torch.Tensor) -> torch.Tensor:
        """The next prompt tokens as a plain causal chain after the cache. Without a sliding window, no
        mask is passed: transformers' sdpa path then runs causal attention itself (is_causal, no 4D mask,
        native GQA) when nothing is cached, and builds its own causal mask otherwise."""
        if getattr(self.config, "sliding_window", None) or self.config._attn_implementation not in ("sdpa", GQA_SDPA):
            chain = torch.arange(ids.numel(), device=self.device)
            return self.forward(ids, chain, chain[:, None] >= chain[None, :])
        t = ids.numel()
        self.cache.begin(t)
        window, self.cache.window = self.cache.window, self.cache.length + t  # the causal mask's width
        positions = torch.arange(self.cache.length, self.cache.length + t, device=self.device)[None]
        try:
            out = self.backbone(
                input_ids=ids[None], position_ids=positions, cache=self.cache, use_cache=True,
                **({"output_hidden_states": self.feature_layers} if self.feature_layers else {}),
            )
        finally:
            self.cache.window = window
        self.cache.advance(t)
        features, self.draft_features = self._split_features(out)
        return features

    def _split_features(self, out) -> tuple[torch.Tensor, torch.Tensor]:
        features = out.last_hidden_state[0]
        if self.feature_layers:
            return features, torch.cat([out.hidden_states[i][0] for i in self.feature_layers], dim=-1)
        return features, features

    def _attention_mask(self, visible: torch.Tensor, positions: torch.Tensor):
        """The 4D bool mask (sdpa: True = attend) over the cache window: the cached prefix, then the new
        tokens as `visible` says; models with sliding windows get the window added. Built on the device
        from the cache's device position."""
        t, window = visible.shape[0], self.cache.window
        rel = self.cache.slot_ids[:window] - self.cache.position  # key slot relative to the first new token
        new = visible.index_select(1, rel.clamp(0, t - 1)) & ((rel >= 0) & (rel < t))[None, :]
        allowed = ((rel < 0)[None, :] | new)[None, None]
        sliding = getattr(self.config, "sliding_window", None)
        if not sliding or window <= sliding:
            return allowed
        key_positions = torch.where(rel < 0, self.cache.slot_ids[:window], positions[0][rel.clamp(0, t - 1)])
        windowed = allowed & ((positions[0][:, None] - key_positions[None, :]) < sliding)[None, None]
        layer_types = getattr(self.config, "layer_types", None) or []
        if "sliding_attention" in layer_types:
            return {"full_attention": allowed, "sliding_attention": windowed}
        return windowed

    @torch.no_grad()
    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.lm_head(features).float()

    @torch.no_grad()
    def verify(self, tree: DraftTree, params: GenerationParams, generator: torch.Generator | None) -> Verdict:
        """One base forward over the tree, acceptance, and the KV cache cut to the accepted path: all on
        the device (the host length follows in `commit`, once the step's summary is read)."""
        self.cache.begin(tree.size)
        logits, draft_features = self.tree_logits(tree.tokens, tree.depth, tree.ancestors)
        self.cache.advance(tree.size)
        if is_greedy(params):
            verdict, self.draft_features = self.finish_greedy(tree, logits, draft_features)
        else:  # sampling draws from a torch.Generator: left out of compiled graphs
            best, bonus = accept(tree, logits, params, generator)
            verdict, self.draft_features = self._finish(tree, best, bonus, draft_features)
        return verdict

    # the device-only parts of a step, which `compile_steps` may replace by compiled versions
    def _tree_logits(self, tokens, depth, ancestors) -> tuple[torch.Tensor, torch.Tensor]:
        """The verify forward: -> (logits [T, V] fp32, draft features [T, F])."""
        features, draft_features = self._features(tokens, depth, ancestors)
        return self.lm_head(features).float(), draft_features

    def _finish(self, tree, best, bonus, draft_features) -> tuple[Verdict, torch.Tensor]:
        verdict = settle(tree, best, bonus)
        self.cache.keep_path(verdict.path, verdict.count, tree.size)
        return verdict, draft_features.index_select(0, verdict.path)

    def _finish_greedy(self, tree, logits, draft_features) -> tuple[Verdict, torch.Tensor]:
        best, bonus = greedy_accept(tree, logits)
        return self._finish(tree, best, bonus, draft_features)

    def compile_steps(self, compiler, step_begin: Callable[[], None] | None = None) -> None:
        """Run the verify forward, the greedy finish and the drafter's steps through `compiler` (e.g.
        torch.compile): attention then sees whole buffers under masks, so every step of a tree budget
        has the same shapes and no step recompiles. `step_begin` runs before each step (CUDA graphs:
        torch.compiler.cudagraph_mark_step_begin, so a step may reuse the previous step's graph memory)."""
        self.step_begin = step_begin
        self.cache.static = True
        self.tree_logits = compiler(self._tree_logits)
        self.finish_greedy = compiler(self._finish_greedy)
        if self.drafter is not None:
            self.drafter.compile_steps(compiler)

    def eager_steps(self) -> None:
        """Undo compile_steps (a model the compiler cannot take decodes eagerly instead)."""
        self.step_begin = None
        self.cache.static = False
        self.tree_logits, self.finish_greedy = self._tree_logits, self._finish_greedy
        if self.drafter is not None:
            self.drafter.compile_steps(lambda fn: fn)
            self.drafter.static = False
        self.reset()

    def _mark_static_buffers(self) -> None:
        """CUDA graphs replay on fixed addresses: the buffers the steps mutate (KV caches, positions) are
        marked static, so a replay uses them in place instead of copying them into the graph's inputs."""
        buffers = self.cache.buffers() + (self.drafter.buffers() if self.drafter is not None else [])
        for buffer in buffers:
            torch._dynamo.mark_static_address(buffer)

    def _read(self, summary: torch.Tensor) -> list[int]:
        """The step's one device-to-host read. On CUDA: an asynchronous copy into a pinned buffer and a
        wait on its event, the one sync `torch.cuda.set_sync_debug_mode` is told to allow."""
        if summary.device.type != "cuda":
            return summary.tolist()
        if self._pinned is None or self._pinned.numel() < summary.numel():
            self._pinned = torch.empty(max(summary.numel(), 64), dtype=summary.dtype, pin_memory=True)
        host = self._pinned[: summary.numel()]
        host.copy_(summary, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)
        try:
            done.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode(mode)
        return host.tolist()

    def commit(self, tokens: list[int], verdict: Verdict, speculate: bool) -> None:
        """The host learns what the device did: the cache now ends with `tokens` (root + accepted
        drafts); the drafter reads the verified features of those positions."""
        self.cache.commit(len(self.cached_ids) + len(tokens))
        self.cached_ids.extend(tokens)
        if speculate:
            self.drafter.extend(self.draft_features, verdict.next_tokens, verdict.count, len(tokens))

    # -- the loop --------------------------------------------------------------------------------
    def _reusable_prefix(self, prompt_ids: list[int], speculate: bool) -> int:
        common = 0
        for a, b in zip(self.cached_ids, prompt_ids):
            if a != b:
                break
            common += 1
        limit = min(common - 1, len(prompt_ids) - 1)  # at least one prompt token is recomputed
        if speculate:  # the drafter must hold verified features for every kept position
            limit = min(limit, self.drafter.stable - 1)
        return max(0, limit)

    @torch.no_grad()
    def prefill(self, prompt_ids: list[int], reuse: int, speculate: bool,
                sample_root: Callable[[torch.Tensor], torch.Tensor], cancel: threading.Event | None = None,
                on_progress: PrefillProgress | None = None) -> torch.Tensor | None:
        """`read_prompt` run to its end, `on_progress(done, total)` called at each report."""
        return _drive(self.read_prompt(prompt_ids, reuse, speculate, sample_root, cancel), on_progress)

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
        total = len(prompt_ids) - reuse
        yield 0, total
        for start in range(reuse, len(prompt_ids), self.prefill_chunk):
            if start > reuse and cancel is not None and cancel.is_set():
                return None
            end = min(start + self.prefill_chunk, len(prompt_ids))
            features = self.forward_chain(torch.tensor(prompt_ids[start:end], device=self.device))
            self.cached_ids = list(prompt_ids[:end])
            if end == len(prompt_ids):
                break
            if speculate:  # pairs (feature of t, token t+1) for every position of the chunk
                self.drafter.extend(self.draft_features, torch.tensor(prompt_ids[start + 1:end + 1], device=self.device))
            yield end - reuse, total
        root = sample_root(self.logits(features[-1])).reshape(1)
        if speculate:
            shifted = torch.tensor(prompt_ids[start + 1:], dtype=torch.long, device=self.device)
            self.drafter.extend(self.draft_features, torch.cat([shifted, root]))
        yield total, total
        return root

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
        speculate = params.speculate and self.drafter is not None
        n = len(prompt_ids)
        if n == 0:
            raise UsageError("empty prompt")
        if n + 1 > self.max_context:
            raise ContextTooLong(f"the prompt is {n} tokens but the context limit is {self.max_context}")
        stats = self.stats = GenerationStats(speculate=speculate, tree=asdict(budget) if speculate else {})
        self.stop_reason = ""
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        started = time.perf_counter()

        # prefill: only the part of the prompt whose KV is not already cached from the last turn
        reuse = self._reusable_prefix(prompt_ids, speculate)
        self.cache.truncate(reuse)
        self.cached_ids = list(prompt_ids[:reuse])
        if self.drafter is not None:
            self.drafter.truncate(reuse)

        def emit(tokens: list[int], drafted: list[bool]) -> tuple[list[int], list[bool]]:
            for i, tok in enumerate(tokens):
                if tok in stop_ids:
                    self.stop_reason = "stop"
                    return tokens[:i], drafted[:i]
                if stats.new_tokens + i + 1 >= params.max_new_tokens:
                    self.stop_reason = "length"
                    return tokens[: i + 1], drafted[: i + 1]
            return tokens, drafted

        stats.reused_tokens = reuse
        decode_tokens = 0
        try:
            self.prepare(budget)
            chunks = self.read_prompt(prompt_ids, reuse, speculate,
                                      lambda logits: next_token(logits, params, generator), cancel)
            while True:
                try:
                    read = next(chunks)
                except StopIteration as end:
                    first = end.value
                    break
                if on_prefill_progress is not None:
                    on_prefill_progress(*read)
                if report_prefill:
                    yield Step([], [], None, prefill=read)
            stats.prefill_s = time.perf_counter() - started
            stats.prefill_tokens = len(self.cached_ids) - reuse
            if first is None:
                self.stop_reason = "cancelled"
                return
            root = first.item()  # once per turn: the first reply token is shown before any step
            if self.cache.static and self.device.type == "cuda":
                self._mark_static_buffers()

            tokens, drafted = emit([root], [False])
            stats.new_tokens += len(tokens)
            if tokens:
                yield Step(tokens, drafted, None)
            root_on_device = first
            while not self.stop_reason:
                if cancel is not None and cancel.is_set():
                    self.stop_reason = "cancelled"
                    break
                step_start = time.perf_counter()
                if self.step_begin is not None:
                    self.step_begin()
                room = self.max_context - self.cache.length
                if room < 1:
                    self.stop_reason = "context"
                    break
                tree = self.drafter.draft(root_on_device, budget) if speculate else root_only(root_on_device)
                verdict = self.verify(tree.cut(room), params, generator)
                # the one device-to-host read of the step: accepted count, accepted tokens, bonus
                summary = self._read(verdict.summary)
                accepted = summary[0]
                self.commit([root] + summary[1:accepted + 1], verdict, speculate)
                root, root_on_device = summary[accepted + 1], verdict.bonus.clone()  # outlives a graph replay
                tokens, drafted = emit(summary[1:accepted + 2], [True] * accepted + [False])
                # tau counts what the step produced: a stop token was produced (and not shown)
                produced = len(tokens) + (self.stop_reason == "stop")
                step = StepStats(accepted=accepted, tree_size=tree.size,
                                 step_s=time.perf_counter() - step_start, decode_tokens=produced)
                stats.target_forwards += 1
                stats.new_tokens += len(tokens)
                decode_tokens += produced
                while len(stats.accepted_hist) <= step.accepted:
                    stats.accepted_hist.append(0)
                stats.accepted_hist[step.accepted] += 1
                yield Step(tokens, drafted, step)  # also a step that produced only the stop token
        finally:
            stats.elapsed_s = time.perf_counter() - started
            decode_s = stats.elapsed_s - stats.prefill_s
            stats.decode_tokens = decode_tokens
            stats.mean_accepted = decode_tokens / stats.target_forwards if stats.target_forwards else 0.0
            stats.tokens_per_s = stats.new_tokens / stats.elapsed_s if stats.elapsed_s > 0 else 0.0
            stats.decode_tokens_per_s = decode_tokens / decode_s if decode_s > 0 else 0.0
