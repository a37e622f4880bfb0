"""The base model's KV cache: preallocated once, appended per verify step, compacted to the accepted path.

transformers' StaticCache returns its whole buffer every step, so sdpa would attend over the entire
context window even when 40 tokens are in use; DynamicCache re-concatenates every layer every step.
`ContiguousLayer` is a transformers cache layer that preallocates like StaticCache but hands attention
only the filled part. After verification, `keep` moves the accepted tree rows next to the prefix
(in place) and forgets the rest (as SafeAILab/EAGLE's `update_inference_inputs` does with its KV buffer).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from eaglechat.errors import ContextTooLong


class ContiguousLayer(CacheLayerMixin):
    is_compileable = False
    is_croppable = True
    is_sliding = False

    def __init__(self, capacity: int, owner: "TreeKVCache | None" = None, index: int = 0):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self.owner, self.index = owner, index

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        fused = self.owner.fused_buffer(key_states, value_states) if self.owner is not None else None
        if fused is not None:  # views into one buffer shared by all layers: compaction is one op
            self.keys, self.values = fused[2 * self.index], fused[2 * self.index + 1]
        else:
            b, h, _, d = key_states.shape
            self.keys = torch.zeros((b, h, self.capacity, d), dtype=key_states.dtype, device=self.device)
            self.values = torch.zeros((b, h, self.capacity, value_states.shape[-1]), dtype=value_states.dtype, device=self.device)
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise ContextTooLong(f"the conversation reached the context limit ({self.capacity} tokens)")
        self.keys[:, :, self.length:end] = key_states
        self.values[:, :, self.length:end] = value_states
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity

    def crop(self, tokens_to_remove: int) -> None:
        self.length -= abs(tokens_to_remove)

    def reset(self) -> None:
        self.length = 0


class TreeKVCache(Cache):
    """A Cache of ContiguousLayers, one per decoder layer, with tree bookkeeping."""

    def __init__(self, num_layers: int, capacity: int):
        super().__init__(layers=[ContiguousLayer(capacity, self, i) for i in range(num_layers)])
        self.capacity = capacity
        self.fused: torch.Tensor | None = None  # [2 * layers, B, kv_heads, capacity, head_dim]

    def fused_buffer(self, key_states: torch.Tensor, value_states: torch.Tensor) -> torch.Tensor | None:
        """One buffer for every layer's keys and values, when all layers share one shape (the usual case;
        layers that differ, or quantized caches, fall back to their own tensors)."""
        if key_states.shape != value_states.shape:
            return None
        b, h, _, d = key_states.shape
        shape = (2 * len(self.layers), b, h, self.capacity, d)
        if self.fused is None:
            self.fused = torch.zeros(shape, dtype=key_states.dtype, device=key_states.device)
        elif self.fused.shape != shape or self.fused.dtype != key_states.dtype:
            return None
        return self.fused

    @property
    def length(self) -> int:
        return self.layers[0].length

    def truncate(self, length: int) -> None:
        """Forget everything after `length` tokens (multi-turn reuse keeps a common prefix)."""
        for layer in self.layers:
            layer.length = min(layer.length, length)

    def keep(self, start: int, rows: list[int]) -> None:
        """After verifying a tree written at [start, start+T): keep only tree rows `rows` (root first),
        moved to [start, start+len(rows)). Rows are increasing, so the copy never overtakes its source."""
        n = len(rows)
        if rows == list(range(n)):  # accepted path is the BFS prefix: nothing to move
            self.truncate(start + n)
            return
        # rows are increasing, so moving them in order never overwrites a row still to be read
        moves = [(start + i, start + r) for i, r in enumerate(rows) if r != i]
        fused = self.fused is not None and all(
            l.keys.data_ptr() == self.fused[2 * i].data_ptr() for i, l in enumerate(self.layers)
        )
        for dst, src in moves:  # at most depth+1 rows: one strided copy each beats index_select
            if fused:
                self.fused[:, :, :, dst] = self.fused[:, :, :, src]
            else:
                for layer in self.layers:
                    layer.keys[:, :, dst] = layer.keys[:, :, src]
                    layer.values[:, :, dst] = layer.values[:, :, src]
        for layer in self.layers:
            layer.length = start + n

    def memory_bytes(self) -> int:
        if self.fused is not None:
            return self.fused.numel() * self.fused.element_size()
        return sum(l.keys.numel() * l.keys.element_size() * 2 for l in self.layers if l.is_initialized)
