"""A random-weight base model + EAGLE head built from a catalog `shape` (no download), for step costs.

Speed depends on shapes, dtype and kernels, not on weight values, so a model with the shape of
Vicuna-7B or Llama-3.1-8B and N(0, 0.02) weights costs what the real one costs per forward. Limits:
every shape is built as a Llama (a Qwen2 base's q/k/v biases are left out: a few thousand parameters
per layer), and LLM.int8 sees no activation outliers in a random network (real models have a few
outlier features per layer, whose fp16 side matmul a random model skips).

The model is built on the meta device and materialised one decoder layer at a time on the target
device (quantized right away for 8-bit/4-bit), so the peak memory is the final model plus one layer.
"""

from __future__ import annotations

import random

import torch
from torch import nn

from eaglechat.fit.memory import ModelShape

# a ~1B shape for CPUs: TinyLlama-1.1B (TinyLlama/TinyLlama-1.1B-Chat-v1.0 config.json)
SHAPES = {
    "tinyllama-1.1b": ModelShape(
        params=1_100_048_384, num_layers=22, hidden_size=2048, intermediate_size=5632, num_attention_heads=32,
        num_key_value_heads=4, head_dim=64, vocab_size=32000, max_context=2048, tied_embeddings=False,
    ),
}

INIT_STD = 0.02


def llama_config(shape: ModelShape):
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        vocab_size=shape.vocab_size, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers, num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads, head_dim=shape.head_dim,
        max_position_embeddings=shape.max_context, tie_word_embeddings=shape.tied_embeddings,
    )
    cfg._attn_implementation = "sdpa"
    return cfg


def _fill(module: nn.Module) -> None:
    """N(0, INIT_STD) weights, norms 1, biases 0 (finite values: no denormal slow paths on CPUs)."""
    for name, p in module.named_parameters():
        if name.endswith("bias"):
            p.zero_()
        elif "norm" in name:
            p.fill_(1.0)
        else:
            p.normal_(0.0, INIT_STD)


def quantize_linears(module: nn.Module, quant: str, device, compute_dtype: torch.dtype) -> None:
    """Swap every nn.Linear below `module` for a bitsandbytes layer, quantized on `device`, with the
    settings of the loader's BitsAndBytesConfig (nf4 + double quant; LLM.int8 threshold 6.0)."""
    import bitsandbytes as bnb

    for name, child in list(module.named_children()):
        if type(child) is not nn.Linear:
            quantize_linears(child, quant, device, compute_dtype)
            continue
        bias = child.bias is not None
        if quant == "4bit":
            new = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=bias, compute_dtype=compute_dtype,
                                    quant_type="nf4", compress_statistics=True, device="meta")
            new.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, quant_type="nf4",
                                           compress_statistics=True, module=new)
        else:  # Int8Params quantizes only when it moves from the CPU
            new = bnb.nn.Linear8bitLt(child.in_features, child.out_features, bias=bias, has_fp16_weights=False,
                                      threshold=6.0, device="meta")
            new.weight = bnb.nn.Int8Params(child.weight.data.cpu(), requires_grad=False, has_fp16_weights=False)
        if bias:
            new.bias = nn.Parameter(child.bias.data, requires_grad=False)
        setattr(module, name, new.to(device))


@torch.no_grad()
def random_model(shape: ModelShape, *, device: str, dtype: torch.dtype, quant: str = "none", seed: int = 0,
                 progress=None):
    """A LlamaForCausalLM of this shape with random weights, eval mode, on `device`."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = llama_config(shape)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model = model.to(dtype)
    backbone = model.model
    parts = [backbone.embed_tokens, *backbone.layers, backbone.norm]
    if not shape.tied_embeddings:
        parts.append(model.lm_head)
    for i, part in enumerate(parts):
        part.to_empty(device=device)
        _fill(part)
        if quant != "none" and part in backbone.layers:  # embeddings, norms and lm_head stay 16-bit
            quantize_linears(part, quant, device, dtype)
        if progress is not None:
            progress(i + 1, len(parts))
    if shape.tied_embeddings:
        model.tie_weights()
    # the rotary inverse frequencies are buffers computed at construction: rebuild them for real
    backbone.rotary_emb = type(backbone.rotary_emb)(cfg).to(device)  # built outside the meta context
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    if left:
        raise RuntimeError(f"random model: tensors left on the meta device: {left[:3]}")
    return model.eval().requires_grad_(False)


@torch.no_grad()
def random_head(model, seed: int = 1):
    """An EAGLE-1/2 head for `model` (one decoder layer, its embedding and lm_head shared), random."""
    from eaglechat.engine.heads import EagleHead, HeadConfig, init_weights

    torch.manual_seed(seed)
    lm_head = model.get_output_embeddings()
    head = EagleHead(HeadConfig.for_base(model.config), model.get_input_embeddings(), lm_head)
    head = head.to(device=lm_head.weight.device, dtype=lm_head.weight.dtype)
    return init_weights(head, std=INIT_STD).eval().requires_grad_(False)


def random_tree(rows: int, vocab: int, depth: int, rng: random.Random, device=None):
    """A tree of `rows` nodes (root included), no deeper than `depth`, bushy near the top like a draft."""
    from eaglechat.engine.tree import tree_from_parents

    parents, depths = [-1], [0]
    for i in range(1, rows):
        choices = [j for j in range(i) if depths[j] < depth] or [0]
        parent = rng.choice(choices[-8:])
        parents.append(parent)
        depths.append(depths[parent] + 1)
    return tree_from_parents([rng.randrange(vocab) for _ in range(rows)], parents, device)
