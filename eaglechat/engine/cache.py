"""The base model's KV cache: preallocated once, appended per verify step, compacted to the accepted path.

transformers' StaticCache returns its whole buffer every step, so sdpa would attend over the entire
context window even when 40 tokens are in use; DynamicCache re-concatenates every layer every step.
`ContiguousLayer` is a transformers cache layer that preallocates like StaticCache but hands attention
only the filled part. After verification, `keep` moves the accepted tree rows next to the prefix
(in place) and forgets the rest (reference: transformers-tree-verification.md section 2).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from eaglechat.errors import ContextTooLong


class ContiguousLayer(CacheLayerMixin):
    is_compileable = False
    is_croppable = True
    is_sliding = False

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.device = key_states.device
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
        super().__init__(layers=[ContiguousLayer(capacity) for _ in range(num_layers)])
        self.capacity = capacity

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
        idx = torch.tensor(rows, device=self.layers[0].device) + start
        for layer in self.layers:
            layer.keys[:, :, start:start + n] = layer.keys.index_select(2, idx)
            layer.values[:, :, start:start + n] = layer.values.index_select(2, idx)
            layer.length = start + n

    def memory_bytes(self) -> int:
        return sum(l.keys.numel() * l.keys.element_size() * 2 for l in self.layers if l.is_initialized)
