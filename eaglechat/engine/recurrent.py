"""Gated DeltaNet layers (Qwen3-Next, Qwen3.5/3.6) verified over a draft tree, their state kept at the
accepted node.

A linear-attention layer carries a state instead of a KV cache: the last `K` inputs of its causal conv
and the delta-rule matrix S [heads, d_k, d_v] (Yang et al., "Gated Delta Networks", arXiv:2412.06464).
transformers runs it as a chain (a chunked scan for a prompt, one step per token), which cannot verify a
tree, and keeps only the final state, which cannot be cut back to an accepted path. So a tree step runs
these layers here, in the closed form of the chunked scan with the causal mask replaced by the tree's
ancestor mask (the same algebra as transformers' `torch_chunk_gated_delta_rule`, one chunk = the tree):

    G_i  = sum of the log-decays g along root..i          D_ij = exp(G_i - G_j) for j an ancestor of i
    (I + A) U = beta * (V - exp(G) * (K S0)),             A_ij = beta_i D_ij (k_i . k_j), j a strict ancestor
    o_i  = exp(G_i) q_i S0 + sum_j D_ij (q_i . k_j) u_j   (the output of every node, from its own path)
    S_n  = exp(G_n) S0 + sum_j D_nj k_j u_j^T             (the state after node n, for any n)

and each node's conv reads the last K inputs along its own path (the cached conv inputs before the
root). After acceptance, `RecurrentLayer.keep` sets the state to S_n and the conv inputs to n's window,
n the last accepted node: on the device, in shapes fixed by the tree. Prompt chunks keep running
transformers' own kernels on the same state (transformers' LinearAttentionLayer API).

A recurrent state cannot be cut back to an arbitrary earlier length, which prefix reuse across turns
needs; each step therefore also keeps the state one token back (the accepted node's parent: a next turn
re-reads the last cached token), and a turn that reuses any other length re-reads its whole prompt.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from transformers.cache_utils import LinearAttentionLayer

from eaglechat.errors import UnsupportedModel

# transformers' Gated DeltaNet classes whose forward `tree_forward` reproduces (projections below), and
# the model types built from them
GATED_DELTANET = ("Qwen3NextGatedDeltaNet", "Qwen3_5GatedDeltaNet", "Qwen3_5MoeGatedDeltaNet")
GATED_DELTANET_MODELS = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
ATTENTION_KINDS = ("full_attention", "sliding_attention")


def layer_kinds(config) -> list[str]:
    """"attention", "recurrent" or "shared" (attention over the keys and values of an earlier layer,
    Gemma 4's KV sharing: no cache of its own) per decoder layer, from transformers' own cache layout of
    the config (no weights needed: the loader asks before loading); a layer eaglechat cannot verify
    over a tree is one UnsupportedModel line naming it."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    config = getattr(config, "text_config", None) or config
    if getattr(config, "use_bidirectional_attention", None) == "all":  # "vision": only image tokens, never fed
        raise UnsupportedModel(f"{config.model_type}: use_bidirectional_attention 'all' lets every token attend to "
                               "later ones, which a draft tree cannot verify (eaglechat needs causal attention)")
    kinds, _ = get_layer_types_and_kwargs(config)
    sharing = getattr(config, "kv_sharing_modes", None) or [None] * len(kinds)
    out = []
    for i, kind in enumerate(kinds):
        if kind in ATTENTION_KINDS:
            out.append("attention")
        elif kind == "linear_attention" and config.model_type in GATED_DELTANET_MODELS:
            out.append("recurrent")
        elif kind == "dummy" and sharing[i] == "reuse" and "attention" in out:
            out.append("shared")
        else:
            what = {"chunked_attention": "chunked attention",
                    "dummy": "a layer without a KV cache of its own (shared KV or no attention)",
                    "linear_attention": "a recurrent layer that is not Gated DeltaNet"}.get(kind, f"a {kind!r} layer")
            raise UnsupportedModel(f"{config.model_type}: layer {i} is {what}, which eaglechat cannot verify over a "
                                   "draft tree yet (supported: full and sliding-window attention, Gated DeltaNet)")
    return out


def install(model, kinds: list[str]) -> None:
    """Route the tree steps of the model's Gated DeltaNet layers through `tree_forward` (a chain, i.e.
    a prompt chunk, keeps transformers' own forward)."""
    found = set()
    for module in model.modules():
        if type(module).__name__ in GATED_DELTANET:
            found.add(module.layer_idx)
            if not getattr(module, "_eaglechat_tree", False):
                module.forward = functools.partial(_forward, module, module.forward)
                module._eaglechat_tree = True
    missing = [i for i, kind in enumerate(kinds) if kind == "recurrent" and i not in found]
    if missing:
        raise UnsupportedModel(f"{model.config.model_type}: recurrent layer {missing[0]} is not a Gated DeltaNet "
                               f"module eaglechat knows ({', '.join(GATED_DELTANET)})")


def _forward(module, own_forward, hidden_states, cache=None, attention_mask=None, **kwargs):
    tree = getattr(cache, "tree", None)
    if tree is None:
        return own_forward(hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
    return tree_forward(module, hidden_states, cache.layers[module.layer_idx], *tree)


def _project(module, hidden):
    """transformers' input projections of the two layouts -> conv inputs [B, C, T], z [B, T, Hv, dv], b, a."""
    if hasattr(module, "in_proj_qkvz"):  # Qwen3-Next: heads interleaved per key-head group
        q, k, v, z, b, a = module.fix_query_key_value_ordering(module.in_proj_qkvz(hidden), module.in_proj_ba(hidden))
        mixed = torch.cat([x.reshape(x.shape[0], x.shape[1], -1) for x in (q, k, v)], dim=-1)
    else:  # Qwen3.5
        mixed = module.in_proj_qkv(hidden)
        z = module.in_proj_z(hidden).reshape(hidden.shape[0], hidden.shape[1], -1, module.head_v_dim)
        b, a = module.in_proj_b(hidden), module.in_proj_a(hidden)
    return mixed.transpose(1, 2), z, b, a


def conv_windows(visible: torch.Tensor, depth: torch.Tensor, kernel: int) -> torch.Tensor:
    """[T, K] column of each node's conv input at distance s (0 = itself) in cat(conv state [K], tree [T]):
    its ancestor at that distance, or the cached input (s - depth) steps before the root."""
    cols = []
    for s in range(kernel):
        hit = visible & (depth[None, :] == (depth[:, None] - s))  # the ancestor at distance s
        cols.append(torch.where(depth >= s, kernel + hit.int().argmax(dim=1), kernel - (s - depth)))
    return torch.stack(cols, dim=1)


def tree_forward(module, hidden_states, layer: "RecurrentLayer", visible, depth):
    """The Gated DeltaNet token mixer over T tree nodes (transformers' forward, tree-shaped)."""
    from transformers.activations import ACT2FN

    bsz, t, _ = hidden_states.shape
    kernel = module.conv_kernel_size
    mixed, z, b, a = _project(module, hidden_states)
    if not layer.has_previous_state[0]:  # nothing read yet: transformers' empty state is zeros
        layer.lazy_initialization(
            conv_states=mixed.new_zeros(bsz, mixed.shape[1], kernel), conv_kernel_size=kernel,
            recurrent_states=torch.zeros(bsz, module.num_v_heads, module.head_k_dim, module.head_v_dim,
                                         device=mixed.device))
        layer.has_previous_state[0] = True
        layer.allocate_back()
    inputs = torch.cat([layer.conv_states[0], mixed.to(layer.conv_states[0].dtype)], dim=-1)  # [B, C, K + T]
    windows = conv_windows(visible, depth, kernel)
    weight = module.conv1d.weight[:, 0].flip(-1).to(inputs.dtype)  # [C, K], distance-major
    conv = (inputs[:, :, windows] * weight[None, :, None, :]).sum(-1)  # [B, C, T]
    if module.conv1d.bias is not None:
        conv = conv + module.conv1d.bias[None, :, None]
    mixed = ACT2FN[module.activation](conv).to(hidden_states.dtype).transpose(1, 2)
    q, k, v = torch.split(mixed, [module.key_dim, module.key_dim, module.value_dim], dim=-1)
    q = q.reshape(bsz, t, -1, module.head_k_dim)
    k = k.reshape(bsz, t, -1, module.head_k_dim)
    v = v.reshape(bsz, t, -1, module.head_v_dim)
    beta = b.sigmoid()
    g = -module.A_log.float().exp() * F.softplus(a.float() + module.dt_bias)

    out, keys, news, cum = _delta_rule(q, k, v, g, beta, layer.recurrent_states[0], visible)
    layer.step = (inputs, windows, keys, news, cum, visible)  # what `keep` needs once the path is known
    out = module.norm(out.reshape(-1, module.head_v_dim).to(hidden_states.dtype), z.reshape(-1, module.head_v_dim))
    return module.out_proj(out.reshape(bsz, t, -1))


def _delta_rule(q, k, v, g, beta, state, visible):
    """The gated delta rule over a tree (module docstring), in fp32 as transformers computes it.
    q, k [B, T, Hk, dk]; v [B, T, Hv, dv]; g, beta [B, T, Hv]; state [B, Hv, dk, dv]; visible [T, T]
    (ancestor-or-self). -> (outputs [B, T, Hv, dv], keys, new values U, cumulative log-decays G)."""
    heads = v.shape[2]
    if k.shape[2] != heads:  # each key head serves heads // Hk consecutive value heads
        q, k = (x.repeat_interleave(heads // x.shape[2], dim=2) for x in (q, k))
    q, k, v, beta, g = (x.transpose(1, 2).float() for x in (q, k, v, beta, g))  # heads first
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * q.shape[-1] ** -0.5  # l2norm, then scaling
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    s0 = state.float()
    cum = g @ visible.float().T  # [B, H, T]: G_i
    decay = torch.where(visible, cum[..., :, None] - cum[..., None, :], float("-inf")).exp()  # D_ij
    strict = visible & ~torch.eye(visible.shape[0], dtype=torch.bool, device=visible.device)
    system = torch.where(strict, (k @ k.transpose(-1, -2)) * decay * beta[..., None], 0.0)
    system = system + torch.eye(visible.shape[0], device=visible.device)
    rhs = beta[..., None] * (v - cum.exp()[..., None] * (k @ s0))
    news = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)  # U
    out = cum.exp()[..., None] * (q @ s0) + ((q @ k.transpose(-1, -2)) * decay) @ news
    return out.transpose(1, 2), k, news, cum


class RecurrentLayer(LinearAttentionLayer):
    """transformers' cache layer for one Gated DeltaNet layer (prompt chunks use it as transformers does),
    plus the accepted-node state after a tree step and the snapshot one token back."""

    def __init__(self):
        super().__init__()
        self.step = None  # set by tree_forward: what keep() needs
        self.back: tuple[torch.Tensor, torch.Tensor] | None = None  # (conv inputs, state) one token back

    def state_after(self, node: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(conv inputs [B, C, K], state [B, H, dk, dv]) after tree node `node` ([1]), or the state before
        the tree where `valid` ([1] bool) is False."""
        inputs, windows, keys, news, cum, visible = self.step
        kernel = windows.shape[1]
        conv = inputs.index_select(-1, windows.index_select(0, node)[0].flip(0))
        conv = torch.where(valid, conv, inputs[..., :kernel])
        g_n = cum.index_select(-1, node)  # [B, H, 1]
        weights = torch.where(visible.index_select(0, node), (g_n - cum).exp(), 0.0)  # [B, H, T]
        state = g_n[..., None].exp() * self.recurrent_states[0].float() + torch.einsum("bht,bhtk,bhtv->bhkv", weights, keys, news)
        state = torch.where(valid, state, self.recurrent_states[0].float())
        return conv, state.to(self.recurrent_states[0].dtype)

    def keep(self, last: torch.Tensor, parent: torch.Tensor, has_parent: torch.Tensor) -> None:
        """After a tree step: the state after `last` (the last accepted node) becomes the layer's state, the
        state after its parent (the state before the tree when `last` is the root) the one-back snapshot."""
        back = self.state_after(parent, has_parent)
        live = self.state_after(last, torch.ones_like(has_parent))
        for target, value in zip(self.back + (self.conv_states[0], self.recurrent_states[0]), back + live):
            target.copy_(value)
        self.step = None

    def allocate_back(self) -> None:
        """The snapshot's buffers, once the state exists (before a step: compiled steps never allocate)."""
        if self.back is None and self.is_recurrent_states_initialized[0]:
            self.back = (torch.empty_like(self.conv_states[0]), torch.empty_like(self.recurrent_states[0]))

    def restore_back(self) -> None:
        self.conv_states[0].copy_(self.back[0])
        self.recurrent_states[0].copy_(self.back[1])

    def buffers(self) -> list[torch.Tensor]:
        states = [self.conv_states[0], self.recurrent_states[0]] if self.is_recurrent_states_initialized[0] else []
        return states + (list(self.back) if self.back is not None else [])

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers())
