"""EAGLE-1/2 draft head: one decoder layer that predicts the base model's next *feature*.

Layout (EAGLE, arXiv:2401.15077; SafeAILab/EAGLE `eagle/model/cnets1.py::Model`), with the official
state-dict key names:
  fc                 Linear(2H -> H) over cat([token_embedding, feature]), embedding first, optional bias
  layers.0           a Llama decoder layer *without* input_layernorm (fc output goes straight to attention)
  (shared)           the base model's token embedding and lm_head: no second copy in memory
No final norm: logits are base.lm_head(draft_output). RoPE base comes from the head's own config.
The feature is the base model's last hidden state after its final norm (the lm_head input).

Reduced draft vocabulary (an eaglechat extension of the EAGLE-1 layout, stored the EAGLE-3 way):
config.json has "draft_vocab_size": N and model.safetensors a "d2t" tensor of offsets (draft id d is
target id d + d2t[d]). The head then scores only those N rows of the base lm_head (a frozen copy of
them), which makes a draft step on a small model several times cheaper; verification is unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from eaglechat.errors import WeightsError


@dataclass
class HeadConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling_factor: float = 1.0  # linear scaling only ("type": "linear")
    bias: bool = True  # fc bias; official default when the key is absent
    qkv_bias: bool = False  # Qwen2 heads
    head_dim: int = 0
    draft_vocab_size: int = 0  # 0: the full base vocabulary

    def __post_init__(self):
        if not self.head_dim:
            self.head_dim = self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, raw: dict) -> "HeadConfig":
        try:
            scaling = raw.get("rope_scaling") or None
            factor = 1.0
            if scaling:
                kind = scaling.get("type") or scaling.get("rope_type")
                if kind not in ("linear", "default", None):
                    raise WeightsError(f"head config: rope_scaling type {kind!r} is not supported (linear only)")
                factor = float(scaling.get("factor", 1.0)) if kind == "linear" else 1.0
            return cls(
                hidden_size=int(raw["hidden_size"]),
                intermediate_size=int(raw["intermediate_size"]),
                num_attention_heads=int(raw["num_attention_heads"]),
                num_key_value_heads=int(raw.get("num_key_value_heads") or raw["num_attention_heads"]),
                vocab_size=int(raw["vocab_size"]),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=float(raw.get("rope_theta") or 10000.0),
                rope_scaling_factor=factor,
                bias=bool(raw.get("bias", True)),
                qkv_bias=bool(raw.get("qkv_bias", False)),
                head_dim=int(raw.get("head_dim") or 0),
                draft_vocab_size=int(raw.get("draft_vocab_size") or 0),
            )
        except KeyError as exc:
            raise WeightsError(f"head config.json lacks {exc.args[0]!r}") from None

    def to_dict(self) -> dict:
        """config.json in the official EAGLE-1 layout (a LlamaConfig with one layer)."""
        out = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "num_hidden_layers": 1,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "hidden_act": "silu",
            "bias": self.bias,
            "head_dim": self.head_dim,
        }
        if self.qkv_bias:
            out["qkv_bias"] = True
        if self.rope_scaling_factor != 1.0:
            out["rope_scaling"] = {"type": "linear", "factor": self.rope_scaling_factor}
        if self.draft_vocab_size:
            out["draft_vocab_size"] = self.draft_vocab_size
        return out


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Rotary(nn.Module):
    def __init__(self, head_dim: int, theta: float, scaling_factor: float = 1.0):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq / scaling_factor, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        """positions [B, T] -> cos, sin [B, 1, T, head_dim]"""
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


class DraftKV:
    """Preallocated key/value buffer of the head's single layer (batch 1). Grows by doubling.

    The drafter owns the bookkeeping: entries [0, stable) come from verified features only;
    tree levels are written after them and dropped by simply writing over them next round.
    """

    def __init__(self, cfg: HeadConfig, dtype: torch.dtype, device, capacity: int = 256):
        shape = (1, cfg.num_key_value_heads, capacity, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = start + k.shape[2]
        if end > self.k.shape[2]:
            grow = max(end, 2 * self.k.shape[2]) - self.k.shape[2]
            pad = (0, 0, 0, grow)
            self.k, self.v = F.pad(self.k, pad), F.pad(self.v, pad)
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]


class DraftAttention(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.n_heads * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(h, self.n_kv * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(h, self.n_kv * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=False)

    def forward(self, x, cos, sin, mask, kv: DraftKV | None, kv_start: int):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if kv is not None:
            k, v = kv.write(kv_start, k, v)
        if mask is None:  # training / plain causal
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv != self.n_heads)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.n_kv != self.n_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class DraftMLP(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """Llama decoder layer minus input_layernorm (EAGLE-1/2 layer 0)."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.self_attn = DraftAttention(cfg)
        self.mlp = DraftMLP(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, kv, kv_start):
        x = x + self.self_attn(x, cos, sin, mask, kv, kv_start)
        return x + self.mlp(self.post_attention_layernorm(x))


class EagleHead(nn.Module):
    kind = "eagle2"

    def __init__(self, cfg: HeadConfig, embed_tokens: nn.Embedding, lm_head: nn.Module):
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=cfg.bias)
        self.layers = nn.ModuleList([DraftLayer(cfg)])
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling_factor)
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
        rows = nn.Linear(full.shape[1], index.numel(), bias=False, device=full.device, dtype=full.dtype)
        rows.weight.data = full.data[index].clone()
        self.draft_lm_head = rows.requires_grad_(False)
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
        emb = self.embed_tokens(token_ids).to(features.dtype)
        x = self.fc(torch.cat([emb, features], dim=-1))
        cos, sin = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, kv, kv_start)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits: over the whole vocabulary, or over the draft vocabulary when one is set."""
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
    if cfg.qkv_bias:
        keys.update({
            "layers.0.self_attn.q_proj.bias": (q,),
            "layers.0.self_attn.k_proj.bias": (kv,),
            "layers.0.self_attn.v_proj.bias": (kv,),
        })
    return keys


def check_state(state: dict, expected: dict[str, tuple[int, ...]], base_name: str, *, other_kind: str) -> None:
    """Strict key and shape checks of a head checkpoint, each failure one line naming the key."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        raise WeightsError(f"draft head weights lack {missing[0]}" + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""))
    if unexpected:
        raise WeightsError(f"draft head weights have unexpected key {unexpected[0]} ({other_kind})")
    for key, shape in expected.items():
        if tuple(state[key].shape) != shape:
            raise WeightsError(f"draft head {key} has shape {tuple(state[key].shape)}, expected {shape} for {base_name}")


def read_head_files(head_dir: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """config.json plus model.safetensors or pytorch_model.bin (never unpickled beyond tensors)."""
    head_dir = Path(head_dir)
    cfg_path = head_dir / "config.json"
    if not cfg_path.is_file():
        raise WeightsError(f"draft head folder {head_dir} has no config.json")
    try:
        raw = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise WeightsError(f"cannot read {cfg_path}: {exc}") from None
    st, binf = head_dir / "model.safetensors", head_dir / "pytorch_model.bin"
    try:
        if st.is_file():
            from safetensors.torch import load_file

            state = load_file(str(st))
        elif binf.is_file():
            state = torch.load(binf, map_location="cpu", weights_only=True)
        else:
            raise WeightsError(f"draft head folder {head_dir} has no model.safetensors or pytorch_model.bin")
    except WeightsError:
        raise
    except Exception as exc:  # corrupt or truncated file: safetensors/pickle errors vary by version
        name = st.name if st.is_file() else binf.name
        raise WeightsError(f"draft head weights {head_dir / name} are corrupt or truncated ({type(exc).__name__})") from None
    if not isinstance(state, dict):
        raise WeightsError(f"draft head weights in {head_dir} are not a state dict")
    return raw, state


def load_head(head_dir: Path, base_model, *, base_name: str = "the base model") -> EagleHead:
    """Build an EAGLE-1/2 head (or an EAGLE-3 one: see head3) for `base_model` from an official-format
    folder, with strict checks."""
    raw, state = read_head_files(head_dir)
    from eaglechat.engine.head3 import build_eagle3, is_eagle3

    if is_eagle3(raw, state):
        return build_eagle3(raw, state, base_model, name=Path(head_dir).name, base_name=base_name)
    cfg = HeadConfig.from_dict(raw)
    base_cfg = base_model.config
    base_hidden = int(base_cfg.hidden_size)
    base_vocab = base_model.get_input_embeddings().weight.shape[0]
    if cfg.hidden_size != base_hidden:
        raise WeightsError(
            f"draft head {Path(head_dir).name} is for another base: hidden size {cfg.hidden_size}, "
            f"but {base_name} has {base_hidden}"
        )
    if cfg.vocab_size != base_vocab and abs(cfg.vocab_size - base_vocab) > 256:
        raise WeightsError(
            f"draft head {Path(head_dir).name} is for another base: vocabulary {cfg.vocab_size}, "
            f"but {base_name} has {base_vocab}"
        )
    if "embed_tokens.weight" in state:  # EAGLE-1 checkpoints carry a copy; we share the base's
        emb = state.pop("embed_tokens.weight")
        if emb.shape[-1] != base_hidden:
            raise WeightsError(f"draft head embed_tokens width {emb.shape[-1]} does not match {base_name} ({base_hidden})")
    d2t = state.pop("d2t", None)
    if cfg.draft_vocab_size and (d2t is None or tuple(d2t.shape) != (cfg.draft_vocab_size,)):
        raise WeightsError(f"draft head {Path(head_dir).name}: draft_vocab_size {cfg.draft_vocab_size} needs a "
                           f"d2t tensor of that length, found {None if d2t is None else tuple(d2t.shape)}")
    check_state(state, required_keys(cfg), base_name, other_kind="is it an EAGLE-3 head?")
    head = EagleHead(cfg, base_model.get_input_embeddings(), base_model.get_output_embeddings())
    head.load_state_dict(state, strict=False)
    if d2t is not None:
        head.set_draft_vocab(torch.arange(d2t.numel()) + d2t.long())
    param = next(base_model.parameters())
    dtype = param.dtype if param.dtype.is_floating_point else torch.float16
    device = base_model.get_output_embeddings().weight.device
    return head.to(device=device, dtype=dtype).eval().requires_grad_(False)


def save_head(head, out_dir: Path) -> None:
    """Any draft head with `head_state_dict()` and `config.to_dict()`: official key layout, safetensors."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in head.head_state_dict().items()}
    save_file(state, str(out_dir / "model.safetensors"))
    (out_dir / "config.json").write_text(json.dumps(head.config.to_dict(), indent=2) + "\n")


def head_config_for(base_config, *, bias: bool = True) -> HeadConfig:
    """A head config matching a transformers base config (what the trainer starts from)."""
    heads = int(base_config.num_attention_heads)
    return HeadConfig(
        hidden_size=int(base_config.hidden_size),
        intermediate_size=int(base_config.intermediate_size),
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(base_config, "num_key_value_heads", None) or heads),
        vocab_size=int(base_config.vocab_size),
        rms_norm_eps=float(getattr(base_config, "rms_norm_eps", 1e-6)),
        rope_theta=float(_rope_theta(base_config)),
        bias=bias,
        # Qwen2 always has q/k/v biases (its config has no flag for it); the official Qwen2 heads too
        qkv_bias=bool(getattr(base_config, "attention_bias", False)) or base_config.model_type == "qwen2",
        head_dim=int(getattr(base_config, "head_dim", None) or base_config.hidden_size // heads),
    )


def _rope_theta(base_config) -> float:
    theta = getattr(base_config, "rope_theta", None)
    if theta is None:
        params = getattr(base_config, "rope_parameters", None) or {}
        theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta or 10000.0)


def init_weights(head: nn.Module, std: float = 0.02) -> nn.Module:
    """Random init of a draft head (EAGLE-1/2 or EAGLE-3): every Linear ~ N(0, std), biases zero."""
    for module in head.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    return head
