"""The target (base) model as the decode loop uses it: forwards over new tokens written after its KV
cache, the 4D masks they need, logits, and the step's one device-to-host read.

gpt-fast keeps the model apart from the loop (`model.py` vs `generate.py`); so does this module: the
loop (engine/decode.py) says *what* a step does, this module says how one base forward is laid out.

A forward takes new tokens laid out as a tree: ids and depth [T], and `visible` [T, T] (which new
tokens each may see); a prompt chunk is the chain case. It returns two feature tensors: the post-norm
features the lm_head reads, and what the draft head reads (the same tensor for EAGLE-1/2; for EAGLE-3
heads, the inputs of base layers [2, N//2, N-3] concatenated, captured in the same forward).

Logits are the model's own: its lm_head, then the final logit soft-capping where the config has one
(Gemma 2 and 4: `cap * tanh(logits / cap)`, as transformers' `Gemma4ForCausalLM.forward` does), so
sampling draws from the distribution the model defines.
"""

from __future__ import annotations

import torch

from eaglechat.engine import recurrent
from eaglechat.engine.attention import NAME as TREE_ATTENTION
from eaglechat.engine.attention import use_tree_attention
from eaglechat.engine.cache import TreeKVCache
from eaglechat.engine.int8_rows import make_rows_exact
from eaglechat.errors import UnsupportedModel
from eaglechat.validate import per_layer


class Target:
    """A transformers causal LM over a TreeKVCache of `capacity` slots (grown by `cache.reserve`)."""

    def __init__(self, model, capacity: int, feature_layers: list[int] | None = None):
        self.model = model
        make_rows_exact(model)  # LLM.int8 layers: a verify row computes as its one-token step would
        use_tree_attention(model)  # GQA and attention sinks under a tree mask (eager models need it)
        if model.config._attn_implementation not in ("sdpa", TREE_ATTENTION):
            raise UnsupportedModel(f"{model.config.model_type}: attention {model.config._attn_implementation!r} "
                                   "cannot take a draft tree's mask (eaglechat needs sdpa or its own tree attention)")
        self.backbone = getattr(model, model.base_model_prefix)
        self.lm_head = model.get_output_embeddings()
        self.config = model.config
        self.device = self.lm_head.weight.device
        kinds = recurrent.layer_kinds(model.config)  # refuses layers a tree cannot be verified through
        self.cache = TreeKVCache(self.config.num_hidden_layers, capacity, self.device, kinds,
                                 kv_shapes(model.config, kinds))
        self.softcap = getattr(self.config, "final_logit_softcapping", None)
        recurrent.install(model, kinds)  # Gated DeltaNet layers run tree steps tree-shaped
        self.feature_layers = feature_layers
        self._pinned: torch.Tensor | None = None  # host buffer of the per-step read (CUDA)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, depth: torch.Tensor, visible: torch.Tensor,
                chain: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """ids/depth [T]; visible [T, T] bool among the new tokens, written after the cache (`chain`: a
        prompt chunk, which recurrent layers read with transformers' own chunked kernels; after a tree,
        their state stays where it was until `cache.keep_path`).
        -> (post-norm features [T, H], draft features [T, F]); the cache then holds the T tokens."""
        t = ids.numel()
        self.cache.begin(t, None if chain else (visible, depth))
        out = self.features(ids, depth, visible)
        self.cache.advance(t)
        return out

    def features(self, ids, depth, visible) -> tuple[torch.Tensor, torch.Tensor]:
        """Device work of `forward` (between the cache's begin and advance)."""
        positions = (self.cache.position + depth)[None]
        out = self.backbone(
            input_ids=ids[None], attention_mask=self.attention_mask(visible, positions), position_ids=positions,
            cache=self.cache, use_cache=True, **self._hidden_states(),
        )
        return self._split(out)

    def tree_logits(self, tree) -> tuple[torch.Tensor, torch.Tensor]:
        """A step's verify forward over a DraftTree, on the device only (the host opened the cache with
        `cache.open(tree.size)`): -> (logits [T, V] fp32, draft features [T, F])."""
        self.cache.write_at(tree.size, (tree.ancestors, tree.depth))  # recurrent layers run it tree-shaped
        features, draft_features = self.features(tree.tokens, tree.depth, tree.ancestors)
        self.cache.end_tree()
        self.cache.position += tree.size
        return self._logits(features), draft_features

    @torch.no_grad()
    def forward_chain(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The next prompt tokens as a plain causal chain after the cache. Without a sliding window, no
        mask is passed: transformers' sdpa path then runs causal attention itself (is_causal, no 4D mask,
        native GQA) when nothing is cached, and builds its own causal mask otherwise."""
        if getattr(self.config, "sliding_window", None) or self.config._attn_implementation not in ("sdpa", TREE_ATTENTION):
            chain = torch.arange(ids.numel(), device=self.device)
            return self.forward(ids, chain, chain[:, None] >= chain[None, :], chain=True)
        t = ids.numel()
        self.cache.begin(t)
        window, self.cache.window = self.cache.window, self.cache.length + t  # the causal mask's width
        positions = torch.arange(self.cache.length, self.cache.length + t, device=self.device)[None]
        try:
            out = self.backbone(input_ids=ids[None], position_ids=positions, cache=self.cache, use_cache=True,
                                **self._hidden_states())
        finally:
            self.cache.window = window
        self.cache.advance(t)
        return self._split(out)

    @torch.no_grad()
    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self._logits(features)

    def _logits(self, features: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(features).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def _hidden_states(self) -> dict:
        return {"output_hidden_states": self.feature_layers} if self.feature_layers else {}

    def _split(self, out) -> tuple[torch.Tensor, torch.Tensor]:
        features = out.last_hidden_state[0]
        if self.feature_layers:
            return features, torch.cat([out.hidden_states[i][0] for i in self.feature_layers], dim=-1)
        return features, features

    def attention_mask(self, visible: torch.Tensor, positions: torch.Tensor):
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

    def read(self, summary: torch.Tensor) -> list[int]:
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


def kv_shapes(config, kinds: list[str]) -> list[tuple]:
    """(kv_heads, head_dim) of each attention layer, read per layer (Gemma 4's global layers have their
    own head_dim and KV head count): layers of one shape share one cache buffer."""
    config = getattr(config, "text_config", None) or config
    heads = int(config.num_attention_heads)
    shapes = zip(per_layer(config, "num_key_value_heads", heads), per_layer(config, "head_dim", config.hidden_size // heads))
    return [shape for shape, kind in zip(shapes, kinds) if kind == "attention"]
