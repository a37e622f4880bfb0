"""The base model's KV cache: preallocated once, written at a device-side position, compacted on the device
to the accepted path.

`ContiguousLayer` is a transformers cache layer over one buffer of `capacity` slots. New keys/values go
to slots `position + i` (`position` is a device tensor, so no step reads it back), and attention sees a
window of the buffer, the first `window` slots:
- a prompt chunk, and an eager step: the filled part plus the new tokens (`length + t`, known on the host
  from the step's one read): attending over 40 filled slots, not the whole context, is what keeps a CPU
  step cheap;
- a compiled step (`static`): `length + t` rounded up to a power of two (`bucket`), so the shapes change
  only when the conversation crosses a power of two: one graph per bucket, and a step never reads more
  than twice what is cached (slots past `length + t` are masked off).
After verification, `keep_path` moves the accepted tree rows next to the prefix (one gather + one
scatter over a buffer shared by all layers of one KV shape) and forgets the rest (SafeAILab/EAGLE
`update_inference_inputs` does the same copy).

A step's protocol, for whoever adds a kind of layer:
  host `open(t, tree)` -> device `write_at(t, tree)`, the forward's `update` calls, `position += t`,
  `end_tree()`, `keep_path(...)` -> host `commit(length)` once the step's summary is read.
Everything between open and commit runs inside one compiled step: it may not read the device.

Layers whose keys and values differ in shape (Gemma 4: global layers have their own head_dim and KV
head count) get one buffer per distinct shape (a kv group), each compacted by one op. Layers that
reuse an earlier layer's keys and values (Gemma 4's KV-shared layers, `kinds` "shared") hold nothing:
transformers' `DummyLayer` (they read what the producing layer's `update` returned in the same forward).

Recurrent (Gated DeltaNet) layers hold a state instead of slots: a `RecurrentLayer` each
(engine/recurrent.py), set to the accepted node's state by the same `keep_path`. Such a state cannot be
cut back to any earlier length: `reusable` says which lengths a next turn can start from.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DummyLayer

from eaglechat.engine.recurrent import RecurrentLayer
from eaglechat.errors import ContextTooLong

MIN_BUCKET = 64  # the smallest window a compiled step sees


def bucket(n: int, capacity: int) -> int:
    """The window a compiled step over n cached + new slots sees: the next power of two (at least
    MIN_BUCKET), at most `capacity`."""
    return min(capacity, max(MIN_BUCKET, 1 << max(0, n - 1).bit_length()))


class ContiguousLayer(CacheLayerMixin):
    is_compileable = False
    is_croppable = True
    is_sliding = False

    def __init__(self, owner: "TreeKVCache", index: int = 0):
        super().__init__()
        self.owner, self.index = owner, index
        self.grouped = False  # keys/values are views of its kv group's buffer

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        fused = self.owner.fused_buffer(self.index, key_states, value_states)
        if fused is not None:  # views into its kv group's buffer: compaction is one op per group
            slot = self.owner.group_slot[self.index]
            self.keys, self.values = fused[2 * slot], fused[2 * slot + 1]
            self.grouped = True
            self.owner.fused_layers += 1
        else:
            b, h, _, d = key_states.shape
            cap = self.owner.capacity
            self.keys = torch.zeros((b, h, cap, d), dtype=key_states.dtype, device=self.device)
            self.values = torch.zeros((b, h, cap, value_states.shape[-1]), dtype=value_states.dtype, device=self.device)
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slots = self.owner.write_slots
        self.keys.index_copy_(2, slots, key_states)
        self.values.index_copy_(2, slots, value_states)
        window = self.owner.window
        return self.keys[:, :, :window], self.values[:, :, :window]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.window, 0

    def get_seq_length(self) -> int:
        return self.owner.length

    def get_max_length(self) -> int:
        return self.owner.capacity

    def crop(self, tokens_to_remove: int) -> None:
        self.owner.truncate(self.owner.length - abs(tokens_to_remove))

    def reset(self) -> None:
        self.owner.truncate(0)


class TreeKVCache(Cache):
    """A Cache of one layer per decoder layer (ContiguousLayer; RecurrentLayer where `kinds` says
    "recurrent", DummyLayer where it says "shared"), with tree bookkeeping. `shapes`: per attention
    layer, its (kv_heads, head_dim) as the config says (layers of one shape share a buffer); None: all
    layers one shape.

    `length` (host int) and `position` (device [1]) both count the tokens held; the decode loop keeps
    them equal, `position` for the device work and `length` for the host."""

    def __init__(self, num_layers: int, capacity: int, device=None, kinds: list[str] | None = None,
                 shapes: list | None = None):
        kinds = kinds or ["attention"] * num_layers
        layers, ordinal = [], 0
        for kind in kinds:
            if kind == "attention":
                layers.append(ContiguousLayer(self, ordinal))
                ordinal += 1
            else:
                layers.append(RecurrentLayer() if kind == "recurrent" else DummyLayer())
        super().__init__(layers=layers)
        shapes = list(shapes) if shapes is not None else [None] * ordinal
        distinct = list(dict.fromkeys(shapes))
        self.group_of = [distinct.index(shape) for shape in shapes]  # attention layer -> its kv group
        self.group_slot = [self.group_of[:i].count(g) for i, g in enumerate(self.group_of)]  # its place there
        self.group_size = [self.group_of.count(g) for g in range(len(distinct))]
        self.groups: list[torch.Tensor | None] = [None] * len(distinct)  # [2 * layers, B, kv_heads, capacity, head_dim]
        self.attention = [layer for layer in layers if isinstance(layer, ContiguousLayer)]
        self.recurrent = [layer for layer in layers if isinstance(layer, RecurrentLayer)]
        self.tree: tuple[torch.Tensor, torch.Tensor] | None = None  # (visible, depth) of a tree step
        self.state_length = 0  # the length the recurrent layers' state is at (a tree moves it on keep_path)
        self.back_length: int | None = None  # the length their one-back snapshot is at
        self.capacity = capacity
        self.length = 0
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.static = False  # True: steps see bucketed windows (compiled steps)
        self.window = 0  # slots attention sees in the current forward
        self.write_slots = self.position  # slots the current forward writes
        self.fused_layers = 0  # layers whose keys/values are views of a kv group's buffer
        self.slot_ids = torch.arange(capacity, device=device)

    @property
    def fused(self) -> torch.Tensor | None:
        """The one buffer of every layer's keys and values, when all layers share one shape (the usual case)."""
        return self.groups[0] if len(self.groups) == 1 else None

    def fused_buffer(self, index: int, key_states: torch.Tensor, value_states: torch.Tensor) -> torch.Tensor | None:
        """The buffer of attention layer `index`'s kv group, allocated by its first layer (layers whose
        shape is not the group's, or quantized caches, fall back to their own tensors)."""
        if key_states.shape != value_states.shape:
            return None
        b, h, _, d = key_states.shape
        group = self.group_of[index]
        shape = (2 * self.group_size[group], b, h, self.capacity, d)
        buffer = self.groups[group]
        if buffer is None:
            buffer = self.groups[group] = torch.zeros(shape, dtype=key_states.dtype, device=key_states.device)
        elif buffer.shape != shape or buffer.dtype != key_states.dtype:
            return None
        return buffer

    @property
    def is_fused(self) -> bool:
        """Every layer's keys and values are views of its kv group's buffer (set as layers initialise: a
        plain int check, which compiled code can specialise on)."""
        return self.fused_layers == len(self.attention)

    def buffers(self) -> list[torch.Tensor]:
        """The tensors a compiled step mutates in place (to be marked as static addresses)."""
        views = [t for layer in self.attention if layer.is_initialized for t in (layer.keys, layer.values)]
        states = [t for layer in self.recurrent for t in layer.buffers()]
        return [g for g in self.groups if g is not None] + views + states + [self.position]

    def reserve(self, capacity: int) -> None:
        """Grow to `capacity` slots (a turn whose tree needs room past the context limit); keeps the contents."""
        if capacity <= self.capacity:
            return
        old = self.capacity
        self.capacity = capacity
        self.slot_ids = torch.arange(capacity, device=self.position.device)
        for g, buffer in enumerate(self.groups):
            if buffer is not None:
                grown = buffer.new_zeros(*buffer.shape[:3], capacity, buffer.shape[-1])
                grown[..., :old, :] = buffer
                self.groups[g] = grown
        for i, layer in enumerate(self.attention):
            if not layer.is_initialized:
                continue
            if layer.grouped:
                buffer, slot = self.groups[self.group_of[i]], self.group_slot[i]
                layer.keys, layer.values = buffer[2 * slot], buffer[2 * slot + 1]
                continue
            for name in ("keys", "values"):
                t = getattr(layer, name)
                grown = t.new_zeros(*t.shape[:2], capacity, t.shape[-1])
                grown[:, :, :old] = t
                setattr(layer, name, grown)

    def begin(self, t: int, tree: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Before an eager forward over t new tokens (a prompt chunk, a tool's tree): `open` with the exact
        window, then `write_at`. `tree` (visible [t, t], depth [t]) for a tree, which recurrent layers
        then run tree-shaped."""
        self.open(t, tree is not None, exact=True)
        self.write_at(t, tree)

    def open(self, t: int, tree: bool = True, exact: bool = False, need: int = 0) -> None:
        """Host side, before a step over t new tokens: check the room and fix the window attention sees
        (a host int: a compiled step specialises on it, one graph per bucket). `need`: the bucket holds at
        least that many slots (the decoder gives the drafter and the cache one bucket)."""
        if self.length + t > self.capacity:
            raise ContextTooLong(f"the conversation reached the context limit ({self.capacity} tokens)")
        exact = exact or not self.static
        self.window = self.length + t if exact else bucket(max(need, self.length + t), self.capacity)
        if tree and self.recurrent:
            for layer in self.recurrent:
                layer.allocate_back()

    def write_at(self, t: int, tree: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Device side: the t new tokens go to slots position .. position + t - 1."""
        self.write_slots = self.position + self.slot_ids[:t]
        self.tree = tree if self.recurrent else None

    def end_tree(self) -> None:
        """Inside a step, after its tree forward (the recurrent state moves on keep_path, not here)."""
        self.tree = None

    def advance(self, t: int) -> None:
        if self.tree is None:  # a chain moved the recurrent state along, past its snapshot
            self.state_length, self.back_length = self.length + t, None
        self.tree = None
        self.length += t
        self.position += t

    def reusable(self, limit: int) -> int:
        """The longest prefix of at most `limit` tokens the cache can be truncated to: any, with attention
        layers only; with recurrent layers, where their state is, their one-back snapshot, or nothing."""
        if not self.recurrent:
            return limit
        return max([n for n in (self.state_length, self.back_length, 0) if n is not None and n <= limit])

    def truncate(self, length: int) -> None:
        """Forget everything after `length` tokens (multi-turn reuse keeps a common prefix); with recurrent
        layers, `length` must be one `reusable` allows."""
        length = max(0, min(self.length, length))
        if self.recurrent and length != self.state_length:
            if length == self.back_length:
                for layer in self.recurrent:
                    layer.restore_back()
            elif length == 0:
                for layer in self.recurrent:
                    layer.reset()
            else:
                raise ValueError(f"recurrent layers cannot go back to {length} tokens (their state is at "
                                 f"{self.state_length})")
            self.state_length, self.back_length = length, None
        self.length = length
        self.position.fill_(self.length)

    def keep_path(self, path: torch.Tensor, count: torch.Tensor, tree_size: int) -> None:
        """After verifying a tree of `tree_size` rows written last: keep only rows `path` (root first, BFS
        order, so increasing), moved next to the prefix, and forget the rest. On the device: the host
        learns the new length from the step's read (`commit`)."""
        start = self.position - tree_size
        source = start + path
        target = start + self.slot_ids[: path.numel()]
        if self.is_fused:
            for buffer in self.groups:
                buffer.index_copy_(3, target, buffer.index_select(3, source))
        else:
            for layer in self.attention:
                layer.keys.index_copy_(2, target, layer.keys.index_select(2, source))
                layer.values.index_copy_(2, target, layer.values.index_select(2, source))
        if self.recurrent:  # the state after the last accepted node, and after its parent (one back)
            last = path.index_select(0, count - 1)
            parent = path.index_select(0, (count - 2).clamp(min=0))
            for layer in self.recurrent:
                layer.keep(last, parent, count >= 2)
        self.position.copy_(start + count)

    def commit(self, length: int) -> None:
        """The host side of keep_path: the length the device already holds."""
        self.length = length
        if self.recurrent:
            self.state_length, self.back_length = length, length - 1

    def memory_bytes(self) -> int:
        states = sum(layer.memory_bytes() for layer in self.recurrent)
        groups = sum(g.numel() * g.element_size() for g in self.groups if g is not None)
        own = sum(layer.keys.numel() * layer.keys.element_size() * 2 for layer in self.attention
                  if layer.is_initialized and not layer.grouped)
        return groups + own + states
