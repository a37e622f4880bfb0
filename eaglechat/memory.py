"""Memory estimates: pure functions of (model shape, quantization, context, tree)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs to know about a base model, before any weights are downloaded."""

    params: int  # total parameters of the base model (embeddings included)
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_context: int
    tied_embeddings: bool = False

    @classmethod
    def from_hf_config(cls, cfg) -> "ModelShape":
        heads = int(cfg.num_attention_heads)
        hidden = int(cfg.hidden_size)
        inter = int(cfg.intermediate_size)
        layers = int(cfg.num_hidden_layers)
        kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or hidden // heads)
        vocab = int(cfg.vocab_size)
        tied = bool(getattr(cfg, "tie_word_embeddings", False))
        per_layer = hidden * (heads * head_dim) * 2 + hidden * (kv * head_dim) * 2 + 3 * hidden * inter + 2 * hidden
        params = layers * per_layer + vocab * hidden * (1 if tied else 2) + hidden
        return cls(
            params=params,
            num_layers=layers,
            hidden_size=hidden,
            intermediate_size=inter,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=head_dim,
            vocab_size=vocab,
            max_context=int(getattr(cfg, "max_position_embeddings", 2048)),
            tied_embeddings=tied,
        )
