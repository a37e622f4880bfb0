"""Tiny random base models of the four target families, and heads for them (tests only)."""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from eaglechat.engine.head import EagleHead, head_config_for, init_weights

COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)

FAMILIES = {
    "llama": lambda: LlamaConfig(**COMMON),
    "qwen2": lambda: Qwen2Config(**COMMON),  # q/k/v bias
    "qwen3": lambda: Qwen3Config(**COMMON, head_dim=16),  # q/k norm
    "mistral": lambda: MistralConfig(**COMMON, sliding_window=None),
}


def tiny_model(family: str = "llama", seed: int = 0, scale: float = 4.0):
    """A random model whose 2-D weights are scaled up, so a wrong mask or position shows in the logits."""
    torch.manual_seed(seed)
    config = FAMILIES[family]()
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.mul_(scale)
    return model.eval()


def random_head(model, seed: int = 1, bias: bool = True) -> EagleHead:
    torch.manual_seed(seed)
    head = EagleHead(head_config_for(model.config, bias=bias), model.get_input_embeddings(), model.get_output_embeddings())
    return init_weights(head, std=0.1).eval()
