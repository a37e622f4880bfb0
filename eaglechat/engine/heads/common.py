"""What the EAGLE-1/2 and EAGLE-3 heads share: the config, the building blocks of their single decoder
layer (RMSNorm, RoPE, attention over a preallocated KV buffer, SwiGLU MLP), the strict checkpoint
checks, reading and writing a head folder, and the random init.

Key names and layouts follow the official EAGLE code (https://github.com/SafeAILab/EAGLE), so its
published checkpoints load as they are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from eaglechat.engine.heads.files import read_head_files  # noqa: F401  (re-exported: its old home)
from eaglechat.engine.heads.rope import SCALED
from eaglechat.errors import WeightsError
from eaglechat.validate import SchemaError, boolean, config_value, integer, mapping, number


@dataclass
class HeadConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # transformers' rope_scaling dict (linear, llama3, yarn): see rope.py
    max_position_embeddings: int = 2048  # read by the scaled rope types only
    bias: bool = True  # fc bias; official default when the key is absent
    qkv_bias: bool = False  # Qwen2 heads
    o_bias: bool = False  # LlamaConfig.attention_bias: q/k/v *and* o_proj biases
    mlp_bias: bool = False  # LlamaConfig.mlp_bias
    qk_norm: bool = False  # Qwen3 attention: an RMSNorm over each q and k head before RoPE
    layernorms: bool = False  # EAGLE-1 in the speculators format (HASS): embedding / fc-output / pre-lm_head norms
    head_dim: int = 0
    draft_vocab_size: int = 0  # 0: the full base vocabulary
    # the token embedding rows are fed times this: 1 = the rows as stored (embed_rows)
    embed_scale: float = 1.0

    def __post_init__(self):
        if not self.head_dim:
            self.head_dim = self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, raw: dict) -> "HeadConfig":
        """A config in eaglechat's own layout (formats.normalize has translated any other)."""
        try:
            scaling = raw.get("rope_scaling") or None
            if scaling:
                from eaglechat.engine.heads.rope import rope_kind

                scaling = dict(scaling) if rope_kind(scaling) != "default" else None
            attention_bias = bool(raw.get("attention_bias", False))
            return cls(
                hidden_size=int(raw["hidden_size"]),
                intermediate_size=int(raw["intermediate_size"]),
                num_attention_heads=int(raw["num_attention_heads"]),
                num_key_value_heads=int(raw.get("num_key_value_heads") or raw["num_attention_heads"]),
                vocab_size=int(raw["vocab_size"]),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=float(raw.get("rope_theta") or 10000.0),
                rope_scaling=scaling,
                max_position_embeddings=int(raw.get("max_position_embeddings") or 2048),
                bias=bool(raw.get("bias", True)),
                qkv_bias=bool(raw.get("qkv_bias", False)) or attention_bias,
                o_bias=attention_bias,
                mlp_bias=bool(raw.get("mlp_bias", False)),
                qk_norm=bool(raw.get("qk_norm", False)),
                layernorms=bool(raw.get("layernorms", False)),
                head_dim=int(raw.get("head_dim") or 0),
                draft_vocab_size=int(raw.get("draft_vocab_size") or 0),
                embed_scale=float(raw.get("embed_scale") or 1.0),
            )
        except KeyError as exc:
            raise WeightsError(f"head config.json lacks {exc.args[0]!r}") from None

    @classmethod
    def for_base(cls, base_config, *, bias: bool = True) -> "HeadConfig":
        """A head config matching a transformers base config (what the trainer starts from; where the
        base's layers differ in attention shape, Gemma 4, or in MLP width, Gemma 3n, its first layer's)."""
        heads = int(base_config.num_attention_heads)
        widths = base_config.intermediate_size  # Gemma 3n lists one per layer
        return cls(
            hidden_size=int(base_config.hidden_size),
            intermediate_size=int(widths[0] if isinstance(widths, (list, tuple)) else widths),
            num_attention_heads=heads,
            num_key_value_heads=int(config_value(base_config, "num_key_value_heads", heads)),
            vocab_size=int(base_config.vocab_size),
            rms_norm_eps=float(getattr(base_config, "rms_norm_eps", 1e-6)),
            rope_theta=rope_theta(base_config),
            bias=bias,
            # Qwen2 always has q/k/v biases (its config has no flag for it); the official Qwen2 heads too
            qkv_bias=bool(getattr(base_config, "attention_bias", False)) or base_config.model_type == "qwen2",
            head_dim=int(config_value(base_config, "head_dim", base_config.hidden_size // heads)),
        )

    def to_dict(self) -> dict:
        """config.json in the official EAGLE-1 layout (a LlamaConfig with one layer), plus the keys of
        the options beyond it (read back by from_dict)."""
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
        if self.o_bias:
            out["attention_bias"] = True
        elif self.qkv_bias:
            out["qkv_bias"] = True
        for key in ("mlp_bias", "qk_norm", "layernorms"):
            if getattr(self, key):
                out[key] = True
        if self.rope_scaling:
            out["rope_scaling"] = dict(self.rope_scaling)
            out["max_position_embeddings"] = self.max_position_embeddings
        if self.draft_vocab_size:
            out["draft_vocab_size"] = self.draft_vocab_size
        if self.embed_scale != 1.0:
            out["embed_scale"] = self.embed_scale
        return out


def embed_rows(embedding: nn.Embedding, token_ids: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """The embedding rows of `token_ids` as stored, times `scale` (1 by default), which is what every
    trainer feeds its head: SpecForge (`specforge/modeling/draft/llama3_eagle.py`), speculators
    (`src/speculators/model.py`), AngelSlim and SafeAILab/EAGLE copy the base's `embed_tokens.weight` into
    a plain nn.Embedding. Not the base module's forward: Gemma's scaled embedding multiplies its rows by
    sqrt(hidden_size) there (transformers `Gemma3TextScaledWordEmbedding`), which no trainer saw."""
    rows = F.embedding(token_ids, embedding.weight)
    return rows * scale if scale != 1.0 else rows


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
    """cos/sin of the head's RoPE (rope.py: plain, or scaled the transformers way)."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        from eaglechat.engine.heads.rope import rope_frequencies

        inv_freq, self.attention_scaling = rope_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling,
                                                            cfg.max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        """positions [B, T] -> cos, sin [B, 1, T, head_dim]"""
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.attention_scaling != 1.0:  # yarn's attention factor, applied to cos/sin as transformers does
            cos, sin = cos * self.attention_scaling, sin * self.attention_scaling
        return cos.to(dtype)[:, None], sin.to(dtype)[:, None]


class DraftKV:
    """Preallocated key/value buffer of the head's single layer (batch 1).

    The drafter owns the bookkeeping: entries [0, stable) come from verified features only;
    tree levels are written after them and dropped by simply writing over them next round.
    Written at a host int (training, tools: grows by doubling) or at a device position (the decode loop:
    no host read; the buffer is sized up front by `reserve`).
    """

    def __init__(self, cfg: HeadConfig, dtype: torch.dtype, device, capacity: int = 256):
        shape = (1, cfg.num_key_value_heads, capacity, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def reserve(self, capacity: int) -> None:
        if capacity > self.capacity:
            pad = (0, 0, 0, capacity - self.capacity)
            self.k, self.v = F.pad(self.k, pad), F.pad(self.v, pad)

    def write(self, start, k: torch.Tensor, v: torch.Tensor, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k/v [1, heads, t, d] at `start` (int or device [1]); return the first `width` entries
        (default: up to the written ones, which needs a host int start)."""
        if isinstance(start, torch.Tensor):
            slots = start + torch.arange(k.shape[2], device=start.device)
            self.k.index_copy_(2, slots, k)
            self.v.index_copy_(2, slots, v)
            return self.k[:, :, :width], self.v[:, :, :width]
        end = start + k.shape[2]
        self.reserve(max(end, 2 * self.capacity) if end > self.capacity else end)
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        return self.k[:, :, : width or end], self.v[:, :, : width or end]


class DraftAttention(nn.Module):
    def __init__(self, cfg: HeadConfig, width: int = 0):
        """width: the input width (default hidden_size; EAGLE-3's q/k/v read 2 * hidden_size)."""
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        w = width or h
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(w, self.n_heads * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(w, self.n_kv * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(w, self.n_kv * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=cfg.o_bias)
        if cfg.qk_norm:  # Qwen3Attention: q_norm/k_norm over head_dim, before RoPE
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, kv: DraftKV | None, kv_start: int):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if kv is not None:  # the mask's width is the part of the cache attention sees
            k, v = kv.write(kv_start, k, v, None if mask is None else mask.shape[-1])
        if mask is None:  # training / plain causal
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv != self.n_heads)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.n_kv != self.n_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class DraftMLP(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def check_state(state: dict, expected: dict[str, tuple[int, ...]], base_name: str, *, other_kind: str) -> None:
    """Strict key and shape checks of a head checkpoint, each failure one line naming the key."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    def first(keys):
        return ", ".join(keys[:3]) + (f" (+{len(keys) - 3} more)" if len(keys) > 3 else "")

    if missing:
        raise WeightsError(f"draft head weights lack {first(missing)}")
    if unexpected:
        raise WeightsError(f"draft head weights have unexpected key{'s' * (len(unexpected) > 1)} {first(unexpected)} ({other_kind})")
    for key, shape in expected.items():
        if tuple(state[key].shape) != shape:
            raise WeightsError(f"draft head {key} has shape {tuple(state[key].shape)}, expected {shape} for {base_name}")


_HEAD_SIZES = {"hidden_size": 1 << 20, "intermediate_size": 1 << 22, "num_attention_heads": 1 << 12,
               "vocab_size": 1 << 24}


def check_head_config(raw, path: Path) -> None:
    """A head config.json is a JSON object whose sizes are positive integers and whose other fields
    have the types the official layout gives them; each problem is one line naming the file and key."""
    if not isinstance(raw, dict):
        raise WeightsError(f"head config {path} must be a JSON object, got a {type(raw).__name__}")
    try:
        for key, hi in _HEAD_SIZES.items():
            if key not in raw:
                raise SchemaError(f"lacks {key!r}")
            integer(raw[key], key, 1, hi)
        for key, lo in (("num_key_value_heads", 1), ("head_dim", 1), ("draft_vocab_size", 0),
                        ("target_hidden_size", 1), ("num_hidden_layers", 1), ("max_position_embeddings", 1)):
            if raw.get(key) is not None:
                integer(raw[key], key, lo, _HEAD_SIZES["vocab_size"])
        if "rms_norm_eps" in raw:  # read as given (null included), unlike rope_theta whose null means the default
            number(raw["rms_norm_eps"], "rms_norm_eps", 0, above=True)
        if raw.get("rope_theta") is not None:
            number(raw["rope_theta"], "rope_theta", 0, above=True)
        if raw.get("embed_scale") is not None:
            number(raw["embed_scale"], "embed_scale", 0, above=True)
        for key in ("bias", "qkv_bias", "attention_bias", "mlp_bias", "qk_norm", "layernorms"):
            if raw.get(key) is not None:
                boolean(raw[key], key)
        scaling = raw.get("rope_scaling")
        if scaling is not None:
            mapping(scaling, "rope_scaling")
            kind = scaling.get("rope_type") or scaling.get("type") or "default"
            if kind not in ("default", *SCALED):
                raise SchemaError(f"rope_scaling type {kind!r} is not supported (supported: {', '.join(SCALED)})")
            for key, value in scaling.items():  # the numbers transformers' rope functions read
                if key not in ("type", "rope_type", "truncate") and value is not None:
                    number(value, f"rope_scaling.{key}", 0, above=key not in ("beta_slow", "mscale_all_dim"))
        heads, kv = raw["num_attention_heads"], raw.get("num_key_value_heads") or raw["num_attention_heads"]
        if not raw.get("head_dim") and raw["hidden_size"] % heads:
            raise SchemaError(f"hidden_size {raw['hidden_size']} is not a multiple of num_attention_heads {heads}")
        if heads % kv:
            raise SchemaError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    except SchemaError as exc:
        raise WeightsError(f"head config {path}: {exc}") from None


def check_base(name: str, base_name: str, *, what: str, head_value: int, base_value: int) -> None:
    """A head made for another base model is one line naming the mismatch."""
    if head_value != base_value:
        raise WeightsError(f"draft head {name} is for another base: {what} {head_value}, but {base_name} has {base_value}")


def check_vocab(name: str, base_name: str, head_vocab: int, base_vocab: int) -> None:
    """Vocabularies may differ by padding rows (up to 256), not more."""
    if head_vocab != base_vocab and abs(head_vocab - base_vocab) > 256:
        check_base(name, base_name, what="vocabulary", head_value=head_vocab, base_value=base_vocab)


def place_on_base(head: nn.Module, base_model) -> nn.Module:
    """The head in the base model's dtype (float16 under a quantized base) on its lm_head's device,
    frozen. Floating tensors only: integer and bool buffers (d2t, t2d) keep their types."""
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


def rope_theta(base_config) -> float:
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
