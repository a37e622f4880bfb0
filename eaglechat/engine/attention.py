"""Grouped-query attention over a masked tree without copying K/V.

transformers' sdpa path repeats every layer's keys and values `groups` times whenever a mask is given
(`repeat_kv`: torch's fused kernels do not take a mask together with GQA), which is what a tree verify
always passes: at 8k context on Llama-3-8B that is ~2 GB of copies per step. Folding the query groups
instead costs nothing: the `groups` query heads that share one KV head become `groups * T` query rows of
that KV head, and the [T, kv] mask is tiled `groups` times (bool, no head dimension). Any sdpa kernel
takes that, on every device.

`use_folded_gqa(model)` registers this function with transformers' AttentionInterface and switches a
GQA model from "sdpa" to it; everything that is not a masked multi-query GQA call goes to transformers'
own sdpa function unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "eaglechat_sdpa"


def folded_gqa_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                    is_causal=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if (groups == 1 or not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 4
            or attention_mask.shape[1] != 1 or kwargs.get("position_bias") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    b, heads, t, d = query.shape
    kv_heads = key.shape[1]
    # query head h reads KV head h // groups (repeat_kv's order): [b, kv_heads, groups * t, d]
    folded = query.reshape(b, kv_heads, groups * t, d)
    mask = attention_mask.repeat(1, 1, groups, 1)  # row g * t + i is query i's row
    out = F.scaled_dot_product_attention(folded, key, value, attn_mask=mask,
                                         dropout_p=dropout if module.training else 0.0, scale=scaling)
    return out.reshape(b, heads, t, d).transpose(1, 2).contiguous(), None


def use_folded_gqa(model) -> bool:
    """Switch an sdpa GQA model to the folded attention; -> whether it was switched."""
    config = model.config
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if config._attn_implementation == NAME:
        return True
    if config._attn_implementation != "sdpa" or not heads or heads == kv_heads:
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, folded_gqa_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, TypeError, AttributeError):  # a model class that refuses custom attention: keep sdpa
        return False
    return config._attn_implementation == NAME
