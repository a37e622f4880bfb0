"""EAGLE-1/2 draft head: one decoder layer that predicts the base model's next *feature*.

Layout (EAGLE, arXiv:2401.15077; SafeAILab/EAGLE `eagle/model/cnets1.py::Model`), with the official
state-dict key names:
  fc                 Linear(2H -> H) over cat([token_embedding, feature]), embedding first, optional bias
  layers.0           a Llama decoder layer *without* input_layernorm (fc output goes straight to attention)
  (shared)           the base model's token embedding and lm_head: no second copy in memory. The embedding's
                     rows as stored, times the config's embed_scale (1 unless it says otherwise): on Gemma not
                     the base's sqrt(hidden)-scaled forward (common.embed_rows says why)
No final norm: logits are base.lm_head(draft_output). RoPE base comes from the head's own config.
The feature is the base model's last hidden state after its final norm (the lm_head input).

`layernorms` (EAGLE-1/HASS in the speculators format, `EagleSpeculator` with layernorms=True) adds
three RMSNorms: `embedding_layernorm` on the token embedding before fc, the decoder layer's own
`input_layernorm` on the fc output, and `pre_lm_head_layernorm` before the lm_head (the fed-back
feature stays the layer output). The draft layer may also have Qwen3 q/k norms and biases (common.py).

Reduced draft vocabulary (an eaglechat extension of the EAGLE-1 layout, stored the EAGLE-3 way):
config.json has "draft_vocab_size": N and model.safetensors a "d2t" tensor of offsets (draft id d is
target id d + d2t[d]). The head then scores only those N rows of the base lm_head (a frozen copy of
them), which makes a draft step on a small model several times cheaper; verification is unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from eaglechat.engine.heads.common import (
    DraftAttention,
    DraftKV,
    DraftMLP,
    HeadConfig,
    RMSNorm,
    Rotary,
    check_base,
    check_state,
    check_vocab,
    embed_rows,
    place_on_base,
)
from eaglechat.errors import WeightsError


class DraftLayer(nn.Module):
    """Llama decoder layer minus input_layernorm (EAGLE-1/2 layer 0)."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        if cfg.layernorms:  # a full Llama decoder layer (the residual stays un-normed)
            self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.mlp = DraftMLP(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, kv, kv_start):
        normed = self.input_layernorm(x) if hasattr(self, "input_layernorm") else x
        x = x + self.self_attn(normed, cos, sin, mask, kv, kv_start)
        return x + self.mlp(self.post_attention_layernorm(x))


class EagleHead(nn.Module):
    kind = "eagle2"

    def __init__(self, cfg: HeadConfig, embed_tokens: nn.Embedding, lm_head: nn.Module):
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=cfg.bias)
        self.layers = nn.ModuleList([DraftLayer(cfg)])
        if cfg.layernorms:
            self.embedding_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.pre_lm_head_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg)
        # shared with the base model; kept out of the module tree so state_dict/optimizers skip them
        self._shared = (embed_tokens, lm_head)
        # reduced draft vocabulary (set_draft_vocab): target ids of the draft rows and their lm_head rows
        self.register_buffer("draft_to_target", None, persistent=False)
        self.draft_lm_head: nn.Linear | None = None

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self._shared[0]

    @property
    def lm_head(self) -> nn.Module:
        return self._shared[1]

    def set_draft_vocab(self, ids) -> "EagleHead":
        """Score only the target ids `ids` (strictly ascending) when drafting: a frozen copy of those
        rows of the base lm_head. The drafter maps draft ids back through `draft_to_target`."""
        full = self.lm_head.weight
        index = torch.as_tensor(ids, dtype=torch.long, device=full.device)
        if index.numel() < 1 or (index.numel() > 1 and not bool((index[1:] > index[:-1]).all())):
            raise WeightsError("draft vocabulary ids must be non-empty and strictly ascending")
        if int(index[0]) < 0 or int(index[-1]) >= full.shape[0]:
            raise WeightsError(f"draft vocabulary id {int(index[-1])} is outside the base vocabulary ({full.shape[0]})")
        rows = nn.Linear(full.shape[1], index.numel(), bias=False, device="meta")  # no init: replaced below
        rows.weight = nn.Parameter(full.detach()[index].clone(), requires_grad=False)
        self.draft_lm_head = rows
        self.draft_to_target = index
        self.config.draft_vocab_size = index.numel()
        return self

    def new_kv(self, dtype=None, device=None, capacity: int = 256) -> DraftKV:
        p = self.fc.weight
        return DraftKV(self.config, dtype or p.dtype, device or p.device, capacity)

    def forward(self, features, token_ids, positions, mask=None, kv: DraftKV | None = None, kv_start: int = 0):
        """features [B,T,H] (f_t), token_ids [B,T] (x_{t+1}), positions [B,T] -> predicted f_{t+1} [B,T,H].

        mask: bool [B|1, 1, T, kv_start+T] (True = attend) or None for causal attention without cache.
        """
        emb = embed_rows(self.embed_tokens, token_ids, self.config.embed_scale).to(features.dtype)
        if self.config.layernorms:
            emb = self.embedding_layernorm(emb)
        x = self.fc(torch.cat([emb, features], dim=-1))
        cos, sin = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, kv, kv_start)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits: over the whole vocabulary, or over the draft vocabulary when one is set."""
        if self.config.layernorms:
            hidden = self.pre_lm_head_layernorm(hidden)
        return (self.draft_lm_head or self.lm_head)(hidden)

    def head_state_dict(self) -> dict[str, torch.Tensor]:
        """The official key layout (no embed_tokens, no rotary buffers), plus d2t offsets for a
        reduced draft vocabulary."""
        state = {k: v for k, v in self.state_dict().items()
                 if not k.startswith(("rotary.", "draft_lm_head."))}
        if self.draft_to_target is not None:
            ids = self.draft_to_target.cpu()
            state["d2t"] = ids - torch.arange(ids.numel())
        return state


def required_keys(cfg: HeadConfig) -> dict[str, tuple[int, ...]]:
    """Official EAGLE-1/2 key names and their shapes."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    keys = {
        "fc.weight": (h, 2 * h),
        "layers.0.self_attn.q_proj.weight": (q, h),
        "layers.0.self_attn.k_proj.weight": (kv, h),
        "layers.0.self_attn.v_proj.weight": (kv, h),
        "layers.0.self_attn.o_proj.weight": (h, q),
        "layers.0.mlp.gate_proj.weight": (i, h),
        "layers.0.mlp.up_proj.weight": (i, h),
        "layers.0.mlp.down_proj.weight": (h, i),
        "layers.0.post_attention_layernorm.weight": (h,),
    }
    if cfg.bias:
        keys["fc.bias"] = (h,)
    if cfg.layernorms:
        keys.update({"embedding_layernorm.weight": (h,), "layers.0.input_layernorm.weight": (h,),
                     "pre_lm_head_layernorm.weight": (h,)})
    keys.update(layer_extras(cfg, "layers.0."))
    return keys


def layer_extras(cfg: HeadConfig, prefix: str) -> dict[str, tuple[int, ...]]:
    """Keys of the draft layer's optional parts: biases and Qwen3 q/k norms (both layouts)."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    keys = {}
    if cfg.qkv_bias:
        keys.update({f"{prefix}self_attn.q_proj.bias": (q,), f"{prefix}self_attn.k_proj.bias": (kv,),
                     f"{prefix}self_attn.v_proj.bias": (kv,)})
    if cfg.o_bias:
        keys[f"{prefix}self_attn.o_proj.bias"] = (h,)
    if cfg.qk_norm:
        keys.update({f"{prefix}self_attn.q_norm.weight": (d,), f"{prefix}self_attn.k_norm.weight": (d,)})
    if cfg.mlp_bias:
        keys.update({f"{prefix}mlp.gate_proj.bias": (i,), f"{prefix}mlp.up_proj.bias": (i,),
                     f"{prefix}mlp.down_proj.bias": (h,)})
    return keys


def build(raw: dict, state: dict, base_model, *, name: str, base_name: str) -> EagleHead:
    """An EAGLE-1/2 head for `base_model` from an official config + state dict, with strict checks."""
    cfg = HeadConfig.from_dict(raw)
    state = dict(state)
    base_cfg = base_model.config
    base_hidden = int(base_cfg.hidden_size)
    base_vocab = base_model.get_input_embeddings().weight.shape[0]
    check_base(name, base_name, what="hidden size", head_value=cfg.hidden_size, base_value=base_hidden)
    check_vocab(name, base_name, cfg.vocab_size, base_vocab)
    if "embed_tokens.weight" in state:  # EAGLE-1 checkpoints carry a copy; we share the base's
        emb = state.pop("embed_tokens.weight")
        if emb.shape[-1] != base_hidden:
            raise WeightsError(f"draft head embed_tokens width {emb.shape[-1]} does not match {base_name} ({base_hidden})")
    if "lm_head.weight" in state:  # EAGLE-1 shares the base's lm_head: a copy must be that one
        w = base_model.get_output_embeddings().weight
        own = state.pop("lm_head.weight")
        if tuple(own.shape) != tuple(w.shape) or not torch.equal(own.to(w.device, w.dtype), w.detach()):
            raise WeightsError(f"draft head {name} carries an lm_head.weight that is not the one of {base_name}; "
                               "EAGLE-1 heads use the base's lm_head")
    d2t = state.pop("d2t", None)
    if cfg.draft_vocab_size and (d2t is None or tuple(d2t.shape) != (cfg.draft_vocab_size,)):
        raise WeightsError(f"draft head {name}: draft_vocab_size {cfg.draft_vocab_size} needs a "
                           f"d2t tensor of that length, found {None if d2t is None else tuple(d2t.shape)}")
    check_state(state, required_keys(cfg), base_name, other_kind="is it an EAGLE-3 head?")
    head = EagleHead(cfg, base_model.get_input_embeddings(), base_model.get_output_embeddings())
    head.load_state_dict(state, strict=False)
    if d2t is not None:
        head.set_draft_vocab(torch.arange(d2t.numel()) + d2t.long())
    return place_on_base(head, base_model)
