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

from eaglechat.engine.cache import TreeKVCache
from eaglechat.engine.draft import Drafter
from eaglechat.engine.heads import EagleHead
from eaglechat.engine.int8_rows import make_rows_exact
from eaglechat.engine.protocol import GenerationParams, GenerationStats, StepStats, TreeBudget
from eaglechat.engine.sampling import next_token
from eaglechat.engine.tree import DraftTree, root_only, tree_from_parents
from eaglechat.engine.verify import accept
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
        self.prefill_chunk = prefill_chunk
        self.backbone = getattr(model, model.base_model_prefix)
        self.lm_head = model.get_output_embeddings()
        self.config = model.config
        self.cache = TreeKVCache(self.config.num_hidden_layers, max_context)
        self.drafter = Drafter(head) if head is not None else None
        # EAGLE-3 heads read the inputs of base layers [2, N//2, N-3], captured in the same forward
        layers = getattr(head, "feature_layers", None)
        self.feature_layers = layers(self.config.num_hidden_layers) if layers else None
        self.draft_features: torch.Tensor | None = None  # what the drafter reads, from the last forward()
        self.cached_ids: list[int] = []  # token ids whose KV is in the cache, len == cache.length
        self.device = self.lm_head.weight.device
        self._mask_rows = torch.ones(1, 1, 128, max_context, dtype=torch.bool, device=self.device)
        self.stop_reason = ""
        self.stats = GenerationStats()

    def reset(self) -> None:
        """Forget the cached prefix: the next generation prefills its whole prompt."""
        self.cache.truncate(0)
        self.cached_ids = []
        if self.drafter is not None:
            self.drafter.truncate(0)

    @property
    def max_context(self) -> int:
        return self.cache.capacity

    # -- one base forward over new tokens laid out as a tree (a chain for the prompt) --------------
    @torch.no_grad()
    def forward(self, ids: torch.Tensor, depth: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """ids/depth [T]; visible [T, T] bool among the new tokens. Returns post-norm features [T, H]."""
        cur, t = self.cache.length, ids.numel()
        if t <= self._mask_rows.shape[2]:
            # a view of a persistent all-True buffer: allocating a fresh [T, context] mask each step
            # costs more than the bookkeeping itself on a loaded CPU (a parallel fill per step)
            allowed = self._mask_rows[:, :, :t, : cur + t]
        else:
            allowed = torch.ones(1, 1, t, cur + t, dtype=torch.bool, device=self.device)
        allowed[0, 0, :, cur:] = visible
        positions = (cur + depth)[None]
        try:
            out = self.backbone(
                input_ids=ids[None], attention_mask=self._masks(allowed, positions), position_ids=positions,
                cache=self.cache, use_cache=True,
                **({"output_hidden_states": self.feature_layers} if self.feature_layers else {}),
            )
        finally:
            allowed[0, 0, :, cur:] = True  # restore the buffer for the next step
        return self._keep_features(out)

    @torch.no_grad()
    def forward_chain(self, ids: torch.Tensor) -> torch.Tensor:
        """The next prompt tokens as a plain causal chain after the cache. Without a sliding window, no
        mask is passed: transformers' sdpa path then runs causal attention itself (is_causal, no 4D mask,
        native GQA) when nothing is cached, and builds its own causal mask otherwise."""
        if getattr(self.config, "sliding_window", None) or self.config._attn_implementation != "sdpa":
            chain = torch.arange(ids.numel(), device=self.device)
            return self.forward(ids, chain, chain[:, None] >= chain[None, :])
        cur = self.cache.length
        positions = torch.arange(cur, cur + ids.numel(), device=self.device)[None]
        out = self.backbone(
            input_ids=ids[None], position_ids=positions, cache=self.cache, use_cache=True,
            **({"output_hidden_states": self.feature_layers} if self.feature_layers else {}),
        )
        return self._keep_features(out)

    def _keep_features(self, out) -> torch.Tensor:
        features = out.last_hidden_state[0]
        if self.feature_layers:
            self.draft_features = torch.cat([out.hidden_states[i][0] for i in self.feature_layers], dim=-1)
        else:
            self.draft_features = features
        return features

    def _masks(self, allowed: torch.Tensor, positions: torch.Tensor):
        """The 4D bool mask (sdpa: True = attend); models with sliding windows get the window added."""
        window = getattr(self.config, "sliding_window", None)
        if not window or allowed.shape[-1] <= window:
            return allowed
        cur = allowed.shape[-1] - positions.shape[-1]
        k_pos = torch.cat([torch.arange(cur, device=self.device), positions[0]])
        windowed = allowed & ((positions[0][:, None] - k_pos[None, :]) < window)[None, None]
        layer_types = getattr(self.config, "layer_types", None) or []
        if "sliding_attention" in layer_types:
            return {"full_attention": allowed, "sliding_attention": windowed}
        return windowed

    @torch.no_grad()
    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.lm_head(features).float()

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
                sample_root: Callable[[torch.Tensor], int], cancel: threading.Event | None = None,
                on_progress: PrefillProgress | None = None) -> int | None:
        """`read_prompt` run to its end, `on_progress(done, total)` called at each report."""
        return _drive(self.read_prompt(prompt_ids, reuse, speculate, sample_root, cancel), on_progress)

    @torch.no_grad()
    def read_prompt(
        self,
        prompt_ids: list[int],
        reuse: int,
        speculate: bool,
        sample_root: Callable[[torch.Tensor], int],
        cancel: threading.Event | None = None,
    ) -> Iterator[tuple[int, int]]:
        """Read prompt_ids[reuse:] into the caches, `prefill_chunk` tokens per forward, yielding
        (read, to read) before the first chunk and after each, and return the first reply token (the
        root of the first tree), chosen by `sample_root` from the last logits.

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
        root = sample_root(self.logits(features[-1]))
        if speculate:
            self.drafter.extend(self.draft_features, torch.tensor(prompt_ids[start + 1:] + [root], device=self.device))
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
            chunks = self.read_prompt(prompt_ids, reuse, speculate,
                                      lambda logits: next_token(logits, params, generator), cancel)
            while True:
                try:
                    read = next(chunks)
                except StopIteration as end:
                    root = end.value
                    break
                if on_prefill_progress is not None:
                    on_prefill_progress(*read)
                if report_prefill:
                    yield Step([], [], None, prefill=read)
            stats.prefill_s = time.perf_counter() - started
            stats.prefill_tokens = len(self.cached_ids) - reuse
            if root is None:
                self.stop_reason = "cancelled"
                return

            tokens, drafted = emit([root], [False])
            stats.new_tokens += len(tokens)
            if tokens:
                yield Step(tokens, drafted, None)
            while not self.stop_reason:
                if cancel is not None and cancel.is_set():
                    self.stop_reason = "cancelled"
                    break
                step_start = time.perf_counter()
                tree = self.drafter.draft(root, budget) if speculate else root_only(root, self.device)
                tree = self._fit_context(tree)
                if tree is None:
                    self.stop_reason = "context"
                    break
                start = self.cache.length
                features = self.forward(tree.tokens, tree.depth, tree.ancestors)
                path, bonus = accept(tree, self.logits(features), params, generator)
                self.cache.keep(start, path)
                path_tokens = tree.tokens[path].tolist()
                self.cached_ids.extend(path_tokens)
                if speculate:
                    self.drafter.extend(self.draft_features[path], torch.tensor(path_tokens[1:] + [bonus], device=self.device))
                root = bonus
                tokens, drafted = emit(path_tokens[1:] + [bonus], [True] * (len(path) - 1) + [False])
                # tau counts what the step produced: a stop token was produced (and not shown)
                produced = len(tokens) + (self.stop_reason == "stop")
                step = StepStats(accepted=len(path) - 1, tree_size=tree.size,
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

    def _fit_context(self, tree: DraftTree) -> DraftTree | None:
        """Cut the tree (keeping BFS order, hence connectivity) to what the context still holds."""
        room = self.max_context - self.cache.length
        if room < 1:
            return None
        if tree.size <= room:
            return tree
        return tree_from_parents(tree.tokens[:room].tolist(), tree.parents[:room], self.device)
