"""Attention over a masked draft tree, registered with transformers' AttentionInterface.

A tree verify always passes a 4D bool mask (True = attend). Two things transformers' own functions get
wrong or slow under such a mask, and this one function handles:

- Grouped-query attention. transformers' sdpa path repeats every layer's keys and values `groups` times
  whenever a mask is given (`repeat_kv`: torch's fused kernels do not take a mask together with GQA): at
  8k context on Llama-3-8B that is ~2 GB of copies per step. Folding the query groups instead costs
  nothing: the `groups` query heads that share one KV head become `groups * T` query rows of that KV
  head, and the [T, kv] mask is tiled `groups` times (bool, no head dimension). Any sdpa kernel takes that.
- Attention sinks (gpt-oss: a learned per-head logit `s_aux` that joins every softmax and carries no
  value). transformers refuses sdpa for such models, and its eager function adds the mask to the scores,
  which a bool mask silently breaks. Here the scores are computed as in transformers' gpt-oss eager
  attention (openai/gpt-oss `sdpa` reference: softmax over [scores, sink], the sink column dropped), with
  the bool mask applied as -inf and the query groups folded the same way, so nothing is repeated.
- Attention logit soft-capping (Gemma 2: `softcap * tanh(scores / softcap)` before the mask, as in
  transformers' `eager_attention_forward` for Gemma 2). transformers' sdpa function refuses `softcap`
  and its fused kernels cannot apply it, so such scores are computed here the same explicit way.

Sliding windows need nothing here: the decoder's mask already holds each layer type's window.

`use_tree_attention(model)` registers the function and switches an "sdpa" or "eager" model to it; calls
that are neither masked multi-query GQA nor sinks go to transformers' own sdpa function unchanged. The
name must not contain "sdpa": transformers checks a model's sdpa support for any such name.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from eaglechat.validate import grouped_query

NAME = "eaglechat_tree"


def tree_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                   is_causal=None, s_aux=None, softcap=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if s_aux is not None or softcap is not None:
        return _explicit(module, query, key, value, attention_mask, scaling, s_aux, softcap)
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


def _explicit(module, query, key, value, attention_mask, scaling, sinks=None, softcap=None):
    """softmax([capped(q k^T * scaling) + mask, sink]) without the sink column, times v (no sink column
    without sinks, no cap without softcap); query groups folded."""
    b, heads, t, d = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    folded = query.reshape(b, kv_heads, groups * t, d)
    scores = torch.matmul(folded, key.transpose(2, 3)) * (d ** -0.5 if scaling is None else scaling)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is None:  # transformers' "no mask": causal, the new tokens last
        rows = torch.arange(t, device=query.device) + (kv_len - t)
        attention_mask = (torch.arange(kv_len, device=query.device)[None, :] <= rows[:, None])[None, None]
    mask = attention_mask.repeat(1, 1, groups, 1) if attention_mask.shape[1] == 1 else \
        attention_mask.reshape(b, kv_heads, groups * t, kv_len)
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    else:
        scores = scores + mask
    if sinks is None:
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    else:
        sink = sinks.reshape(1, kv_heads, groups, 1, 1).expand(b, -1, -1, t, -1).reshape(b, kv_heads, groups * t, 1)
        logits = torch.cat([scores, sink.to(scores.dtype)], dim=-1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        probs = F.softmax(logits, dim=-1, dtype=logits.dtype)[..., :-1].to(value.dtype)
    out = torch.matmul(probs, value)  # [b, kv_heads, groups * t, dv]
    return out.reshape(b, heads, t, -1).transpose(1, 2).contiguous(), None


def use_tree_attention(model) -> bool:
    """Switch a model to `tree_attention` where it matters: eager models (a bool mask is wrong there;
    attention sinks and soft-capping make transformers choose eager), and sdpa GQA models; -> whether
    the model now uses it."""
    config = model.config
    if config._attn_implementation == NAME:
        return True
    eager = config._attn_implementation == "eager"
    gqa = getattr(config, "num_attention_heads", None) and grouped_query(config)  # in any layer (Gemma 4: per layer)
    if config._attn_implementation not in ("sdpa", "eager") or not (eager or gqa):
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, tree_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, TypeError, AttributeError):  # a model class that refuses custom attention
        return False
    return config._attn_implementation == NAME
