"""Turning target logits into the distribution we sample from: the same function for plain decoding
and for EAGLE verification, which is what makes sampling lossless (EAGLE-2, arXiv:2406.16858; SafeAILab/EAGLE `eagle/model/utils.py`).

Order as in transformers' generate(): temperature, then top-k, then top-p.
"""

from __future__ import annotations

import torch

from eaglechat.engine.protocol import GenerationParams


def is_greedy(params: GenerationParams) -> bool:
    return params.temperature <= 0.0


def target_probs(logits: torch.Tensor, params: GenerationParams) -> torch.Tensor:
    """logits [..., V] -> processed probabilities [..., V] in fp32."""
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if 0.0 < params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        # drop a token when the mass strictly before it already reaches top_p (the first token always stays)
        drop_sorted = (torch.cumsum(sorted_p, dim=-1) - sorted_p) >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator).item())


def uniform(generator: torch.Generator | None, device) -> float:
    return float(torch.rand((), generator=generator, device=device).item())


def next_token(logits: torch.Tensor, params: GenerationParams, generator: torch.Generator | None) -> int:
    """One token from one row of logits: argmax when greedy, else a sample of the processed distribution."""
    if is_greedy(params):
        return int(torch.argmax(logits).item())
    return sample(target_probs(logits, params), generator)
