"""EAGLE-3 draft head (arXiv:2503.01840; SafeAILab/EAGLE `eagle/model/cnets.py::Model`).

Layout, with the official state-dict key names:
  fc          Linear(3T -> H, no bias) over the fused target feature cat([h_2, h_{N//2}, h_{N-3}]), where
              h_i is the *input* of base layer i (pre-norm residual stream); applied only to real target
              features: during tree expansion the head's own H-wide output is fed back without fc
  midlayer    residual = h; x = cat([input_layernorm(emb), hidden_norm(h)]) (embedding first, width 2H)
              -> self_attn (q/k/v: 2H -> heads*hd, o: -> H) + residual -> post_attention_layernorm -> mlp
              + residual. Its output is pre-norm: fed back as the next feature and passed to the head.
  norm        RMSNorm(H); logits = lm_head(norm(out))
  lm_head     the head's own Linear(H -> draft_vocab). `tie_word_embeddings: true` is copied from the base's
              config by AngelSlim (train/configs/qwen3-1.7b-eagle3.json) and ignored by the trainers, which
              build and save lm_head as its own Linear (AngelSlim never calls tie_weights; SpecForge's
              AutoDraftModelConfig.from_file sets the flag false): with an lm_head.weight it is that one.
              Without one, the embedding is the lm_head (SGLang's llama_eagle3.py reading), full vocabulary only.
  d2t, t2d    draft id d is target id d + d2t[d] (offsets); t2d marks target ids in the draft
              vocabulary. Both are dropped when the draft vocabulary is the full one.
  embed_tokens the base's (shared), unless the checkpoint carries a different one; its rows as stored
              (common.embed_rows: on Gemma not the base's sqrt(hidden)-scaled forward), times embed_scale
RoPE base: the head config's rope_theta, 10000 when absent (never the target's).

Options of the SpecForge and speculators variants (formats.py says which config key means which):
  aux_layers           the fused hidden states (transformers hidden_states indices), default the above
  norm_before_residual the attention residual is hidden_norm(h), not h
  norm_before_fc       `input_norm`: one RMSNorm over the concatenated fused features before fc
  fc_norm              `fc_norm.{i}`: one RMSNorm per fused feature before fc
  final_norm=False     logits = lm_head(h) (SpecForge norm_output: false)
  norm_feedback        Eagle 3.1: the head outputs norm(h), fed back as is; logits = lm_head(norm(h))
"""

from __future__ import annotations

from dataclasses import dataclass

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
from eaglechat.engine.heads.eagle2 import layer_extras
from eaglechat.errors import WeightsError


@dataclass
class Eagle3Config(HeadConfig):
    # draft_vocab_size (inherited): 0 means the full target vocabulary
    target_hidden_size: int = 0  # 0: same as hidden_size
    aux_layers: tuple[int, ...] | None = None  # None: feature_layers(N)
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    final_norm: bool = True
    norm_feedback: bool = False

    def __post_init__(self):
        super().__post_init__()
        self.bias = False
        if not self.draft_vocab_size:
            self.draft_vocab_size = self.vocab_size
        if not self.target_hidden_size:
            self.target_hidden_size = self.hidden_size

    @property
    def reduced_vocab(self) -> bool:
        return self.draft_vocab_size != self.vocab_size

    @property
    def fused(self) -> int:
        """How many target hidden states fc reads."""
        return len(self.aux_layers) if self.aux_layers else 3

    @classmethod
    def from_dict(cls, raw: dict) -> "Eagle3Config":
        """Own layout (formats.normalize): aux layers as SpecForge spells them, layer outputs."""
        base = HeadConfig.from_dict(raw)  # num_hidden_layers: formats.py refuses anything but 1
        fields = {k: getattr(base, k) for k in HeadConfig.__dataclass_fields__}
        outputs = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        return cls(
            **fields,
            target_hidden_size=int(raw.get("target_hidden_size") or 0),
            aux_layers=tuple(i + 1 for i in outputs) if outputs else None,  # layer i's output: hidden state i + 1
            norm_before_residual=bool(raw.get("norm_before_residual", False)),
            norm_before_fc=bool(raw.get("norm_before_fc", False)),
            fc_norm=bool(raw.get("fc_norm", False)),
            final_norm=raw.get("norm_output") is not False,
            norm_feedback=bool(raw.get("norm_feedback", False)),
        )

    @classmethod
    def for_base(cls, base_config, *, draft_vocab_size: int = 0) -> "Eagle3Config":
        """An EAGLE-3 head config matching a transformers base config (rope base 10000, no q/k/v bias,
        as the official training)."""
        base = HeadConfig.for_base(base_config, bias=False)
        fields = {k: getattr(base, k) for k in HeadConfig.__dataclass_fields__}
        fields.update(rope_theta=10000.0, qkv_bias=False, draft_vocab_size=draft_vocab_size)
        return cls(**fields)

    def to_dict(self) -> dict:
        """config.json in the official EAGLE-3 layout; rope_theta is written only when it is not 10000."""
        out = super().to_dict()
        out["architectures"] = ["LlamaForCausalLMEagle3"]
        out.pop("bias", None)
        out["draft_vocab_size"] = self.draft_vocab_size
        if self.target_hidden_size != self.hidden_size:
            out["target_hidden_size"] = self.target_hidden_size
        if self.rope_theta == 10000.0:
            out.pop("rope_theta")
        if self.aux_layers:
            out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in self.aux_layers]}
        for key in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_feedback"):
            if getattr(self, key):
                out[key] = True
        if not self.final_norm:
            out["norm_output"] = False
        return out


def feature_layers(num_layers: int) -> list[int]:
    """Base layers whose inputs EAGLE-3 fuses, low/mid/high (HF output_hidden_states indices)."""
    return [2, num_layers // 2, num_layers - 3]


class Eagle3Attention(DraftAttention):
    """q/k/v read the 2H-wide cat([emb, hidden]); o_proj writes H. The forward is DraftAttention's."""

    def __init__(self, cfg: HeadConfig):
        super().__init__(cfg, width=2 * cfg.hidden_size)


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.norm_before_residual = cfg.norm_before_residual
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Eagle3Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg)

    def forward(self, emb, hidden, cos, sin, mask, kv, kv_start):
        normed = self.hidden_norm(hidden)
        x = torch.cat([self.input_layernorm(emb), normed], dim=-1)
        hidden = (normed if self.norm_before_residual else hidden) + self.self_attn(x, cos, sin, mask, kv, kv_start)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Head(nn.Module):
    kind = "eagle3"

    def __init__(self, cfg: Eagle3Config, embed_tokens: nn.Embedding):
        super().__init__()
        self.config = cfg
        fused = cfg.fused * cfg.target_hidden_size
        if cfg.norm_before_fc:
            self.input_norm = RMSNorm(fused, cfg.rms_norm_eps)
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in range(cfg.fused))
        self.fc = nn.Linear(fused, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(cfg)
        if cfg.final_norm:
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.rotary = Rotary(cfg)
        if cfg.reduced_vocab:
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self._shared = (embed_tokens,)  # the base's: kept out of the module tree and the state dict
        self.own_embedding: nn.Embedding | None = None  # one the checkpoint brought (saved with the head)

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.own_embedding if self.own_embedding is not None else self._shared[0]

    @property
    def draft_to_target(self) -> torch.Tensor | None:
        """Target id of each draft id, or None when the draft vocabulary is the full one."""
        if not self.config.reduced_vocab:
            return None
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t  # offsets -> ids (microseconds)

    def feature_layers(self, num_layers: int) -> list[int]:
        return list(self.config.aux_layers) if self.config.aux_layers else feature_layers(num_layers)

    def new_kv(self, dtype=None, device=None, capacity: int = 256) -> DraftKV:
        p = self.fc.weight
        return DraftKV(self.config, dtype or p.dtype, device or p.device, capacity)

    def forward(self, features, token_ids, positions, mask=None, kv: DraftKV | None = None, kv_start: int = 0):
        """features [B,T,3T] (fused target features: fc applied) or [B,T,H] (the head's own outputs fed
        back: no fc); token_ids [B,T] (x_{t+1}); positions [B,T] -> pre-norm hidden [B,T,H]."""
        emb = embed_rows(self.embed_tokens, token_ids, self.config.embed_scale).to(features.dtype)
        hidden = self.project(features) if features.shape[-1] != self.config.hidden_size else features
        cos, sin = self.rotary(positions, hidden.dtype)
        out = self.midlayer(emb, hidden, cos, sin, mask, kv, kv_start)
        return self.norm(out) if self.config.norm_feedback else out

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """fc over the fused target features, after their norms when the head has them."""
        if self.config.norm_before_fc:
            features = self.input_norm(features)
        if self.config.fc_norm:
            chunks = features.chunk(self.config.fused, dim=-1)
            features = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(features)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the *draft* vocabulary (map top-k ids through draft_to_target)."""
        if self.config.final_norm and not self.config.norm_feedback:  # a fed-back normed output is normed once
            hidden = self.norm(hidden)
        return self.lm_head(hidden)

    def head_state_dict(self) -> dict[str, torch.Tensor]:
        """The official key layout (midlayer.*, norm, lm_head, d2t/t2d when reduced; no rotary)."""
        out = {k: v for k, v in self.state_dict().items() if not k.startswith("rotary.")}
        own = out.pop("own_embedding.weight", None)
        if own is not None:
            out["embed_tokens.weight"] = own
        return out


def is_eagle3(raw: dict, state: dict) -> bool:
    # not "draft_vocab_size": eaglechat's reduced-vocabulary EAGLE-2 heads carry it too
    return any(k.startswith("midlayer.") for k in state) or "Eagle3" in " ".join(raw.get("architectures") or [])


def required_keys(cfg: Eagle3Config) -> dict[str, tuple[int, ...]]:
    """Official EAGLE-3 key names and their shapes."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    keys = {
        "fc.weight": (h, cfg.fused * cfg.target_hidden_size),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (q, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, q),
        "midlayer.mlp.gate_proj.weight": (i, h),
        "midlayer.mlp.up_proj.weight": (i, h),
        "midlayer.mlp.down_proj.weight": (h, i),
        "lm_head.weight": (cfg.draft_vocab_size, h),
    }
    if cfg.final_norm:
        keys["norm.weight"] = (h,)
    if cfg.norm_before_fc:
        keys["input_norm.weight"] = (cfg.fused * cfg.target_hidden_size,)
    if cfg.fc_norm:
        keys.update({f"fc_norm.{j}.weight": (cfg.target_hidden_size,) for j in range(cfg.fused)})
    keys.update(layer_extras(cfg, "midlayer."))
    if cfg.reduced_vocab:
        keys["d2t"] = (cfg.draft_vocab_size,)
        keys["t2d"] = (cfg.vocab_size,)
    return keys


def build(raw: dict, state: dict, base_model, *, name: str, base_name: str) -> Eagle3Head:
    """An EAGLE-3 head for `base_model` from an official config + state dict, with strict checks."""
    cfg = Eagle3Config.from_dict(raw)
    base_cfg = base_model.config
    base_hidden = int(base_cfg.hidden_size)
    base_vocab = base_model.get_input_embeddings().weight.shape[0]
    base_layers = int(base_cfg.num_hidden_layers)
    what = "target hidden size" if "target_hidden_size" in raw else "hidden size"
    check_base(name, base_name, what=what, head_value=cfg.target_hidden_size, base_value=base_hidden)
    check_vocab(name, base_name, cfg.vocab_size, base_vocab)
    if cfg.draft_vocab_size > cfg.vocab_size:
        raise WeightsError(f"draft head {name}: draft vocabulary {cfg.draft_vocab_size} exceeds the vocabulary {cfg.vocab_size}")
    if cfg.aux_layers is None and base_layers < 3:
        raise WeightsError(f"EAGLE-3 head {name} needs a base with at least 3 layers; {base_name} has {base_layers}")
    for index in cfg.aux_layers or ():
        if index > base_layers:
            raise WeightsError(f"EAGLE-3 head {name} fuses hidden state {index} (the output of base layer {index - 1}); "
                               f"{base_name} has {base_layers} layers")
    if base_layers in (cfg.aux_layers or ()):
        # hidden state N: the last layer's output *before* the final norm (vLLM's boundary N). transformers
        # hands back the normed last_hidden_state there unless the config unties the two
        base_cfg.tie_last_hidden_states = False
    tied = bool(raw.get("tie_word_embeddings")) and "lm_head.weight" not in state
    if tied and cfg.reduced_vocab:
        raise WeightsError(f"draft head {name}: tie_word_embeddings true and no lm_head.weight would make the embedding "
                           f"the draft lm_head, which cannot score a reduced draft vocabulary ({cfg.draft_vocab_size} "
                           f"of {cfg.vocab_size})")
    if cfg.fused * cfg.target_hidden_size == cfg.hidden_size:
        raise WeightsError(f"EAGLE-3 head {name}: its fused features are as wide as its hidden state "
                           f"({cfg.hidden_size}); eaglechat tells the two apart by width")
    state = dict(state)
    if not cfg.final_norm:  # SpecForge keeps the module (norm_output: false), its forward never reads it
        state.pop("norm.weight", None)
    emb_weight = state.pop("embed_tokens.weight", None)
    if not cfg.reduced_vocab:  # full draft vocabulary: the mapping is dropped (all-zero d2t in the wild)
        state.pop("d2t", None)
        state.pop("t2d", None)
    expected = required_keys(cfg)
    if tied:
        del expected["lm_head.weight"]
    check_state(state, expected, base_name, other_kind="not an EAGLE-3 head?")
    if cfg.reduced_vocab:
        d2t = state["d2t"].long()
        target = torch.arange(d2t.numel()) + d2t
        if target.numel() and (int(target.min()) < 0 or int(target.max()) >= base_vocab):
            raise WeightsError(f"draft head {name}: d2t maps draft ids outside the vocabulary of {base_name} ({base_vocab})")
        state["d2t"] = d2t
        state["t2d"] = state["t2d"].bool()
    base_emb = base_model.get_input_embeddings()
    own = None
    if emb_weight is not None:
        if tuple(emb_weight.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise WeightsError(
                f"draft head embed_tokens.weight has shape {tuple(emb_weight.shape)}, expected {(cfg.vocab_size, cfg.hidden_size)}"
            )
        w = base_emb.weight
        if tuple(emb_weight.shape) != tuple(w.shape) or not torch.equal(emb_weight.to(w.device, w.dtype), w.detach()):
            own = nn.Embedding(cfg.vocab_size, cfg.hidden_size)  # the checkpoint's overrides the base's
            own.weight.data.copy_(emb_weight)
    elif cfg.hidden_size != base_hidden:
        raise WeightsError(f"draft head {name} has hidden size {cfg.hidden_size} but no embed_tokens.weight ({base_name}: {base_hidden})")
    head = Eagle3Head(cfg, base_emb)
    head.own_embedding = own
    head.load_state_dict(state, strict=False)
    head = place_on_base(head, base_model)
    if tied:  # the embedding's rows are the lm_head's (one tensor, as SGLang ties them)
        head.lm_head.weight = head.embed_tokens.weight
    return head


def set_draft_vocab(head: Eagle3Head, target_ids) -> None:
    """Install a reduced draft vocabulary (ascending target ids): d2t offsets and the t2d mask."""
    ids = torch.as_tensor(sorted(int(t) for t in target_ids), dtype=torch.long)
    if ids.numel() != head.config.draft_vocab_size:
        raise ValueError(f"{ids.numel()} ids for a draft vocabulary of {head.config.draft_vocab_size}")
    device = head.d2t.device
    head.d2t.copy_((ids - torch.arange(ids.numel())).to(device))
    head.t2d.zero_()
    head.t2d[ids.to(device)] = True
