"""Turning target logits into the distribution we sample from: the same function for plain decoding
and for EAGLE verification, which is what makes sampling lossless (EAGLE-2, arXiv:2406.16858; SafeAILab/EAGLE `eagle/model/utils.py`).

Order as in transformers' generate(): temperature, then top-k, then top-p, then min-p.

Degenerate values keep at least one token, by a stated rule rather than by accident: a temperature
below MIN_TEMPERATURE decodes greedily (vLLM's _SAMPLING_EPS; logits / 1e-40 overflow fp32 and the
softmax turns to NaN), and top-p or min-p always keep the most likely token (a top_p of 1e-300 rounds
to 0 in fp32 and would otherwise drop every token).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from eaglechat.engine.protocol import GenerationParams
from eaglechat.engine.rng import CounterRNG

MIN_TEMPERATURE = 1e-5


@dataclass
class SamplingValues:
    """The sampling settings as device tensors, for a captured step (engine/compile.py): the graph reads
    them where they are, so a new temperature, top-p, top-k or min-p is a fill before the replay, not a
    new graph (the penalties' values are engine/penalties.py's). Whether decoding is greedy stays a host bool: greedy and sampled steps are different
    graphs. Processed with these, `target_probs` gives bit for bit what it gives with the floats."""

    greedy: bool
    temperature: torch.Tensor  # [] float32
    top_p: torch.Tensor  # [] float32
    top_k: torch.Tensor  # [] int64, 0 = off
    min_p: torch.Tensor  # [] float32
    loaded: dict = field(default_factory=dict, repr=False)  # the values the tensors hold, on the host

    @classmethod
    def on(cls, device) -> "SamplingValues":
        def zero(dtype=torch.float32):
            return torch.zeros((), dtype=dtype, device=device)

        return cls(True, zero(), zero(), zero(torch.long), zero())

    def load(self, params: GenerationParams) -> "SamplingValues":
        """In place (a fill per changed value, no upload, no read): what `params` asks for."""
        self.greedy = is_greedy(params)
        for name in ("temperature", "top_p", "top_k", "min_p"):
            value = getattr(params, name)
            if self.loaded.get(name) != value:
                getattr(self, name).fill_(value)
                self.loaded[name] = value
        return self


def is_greedy(params: GenerationParams | SamplingValues) -> bool:
    if isinstance(params, SamplingValues):
        return params.greedy
    return params.temperature < MIN_TEMPERATURE


def target_probs(logits: torch.Tensor, params: GenerationParams | SamplingValues) -> torch.Tensor:
    """logits [..., V] -> processed probabilities [..., V] in fp32."""
    if isinstance(params, SamplingValues):
        return _target_probs_on_device(logits, params)
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if 0.0 < params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        # drop a token when the mass strictly before it already reaches top_p (the first token always stays)
        drop_sorted = (torch.cumsum(sorted_p, dim=-1) - sorted_p) >= params.top_p
        drop_sorted[..., 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    if params.min_p > 0.0:  # the most likely token always passes (p_max >= min_p * p_max)
        probs = probs.masked_fill(probs < params.min_p * probs.amax(-1, keepdim=True), 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def _target_probs_on_device(logits: torch.Tensor, values: SamplingValues) -> torch.Tensor:
    """`target_probs` with the settings as tensors: every filter runs, and a filter that is off selects
    its input unchanged (torch.where), so the result is the float version's bit for bit."""
    logits = logits.float() / values.temperature
    vocab = logits.shape[-1]
    k = torch.where((values.top_k > 0) & (values.top_k < vocab), values.top_k, vocab)  # off: the V-th, the least
    kth = logits.sort(dim=-1, descending=True).values.index_select(-1, (k - 1).reshape(1))
    logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    drop_sorted = (torch.cumsum(sorted_p, dim=-1) - sorted_p) >= values.top_p
    drop_sorted[..., 0] = False
    kept = probs.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), 0.0)
    probs = torch.where((values.top_p > 0.0) & (values.top_p < 1.0), kept / kept.sum(-1, keepdim=True), probs)
    kept = probs.masked_fill(probs < values.min_p * probs.amax(-1, keepdim=True), 0.0)
    return torch.where(values.min_p > 0.0, kept / kept.sum(-1, keepdim=True), probs)


def penalize(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """The repetition penalty of CTRL (arXiv:1909.05858) as transformers' RepetitionPenaltyLogitsProcessor
    applies it, before temperature: the logit of every token already in the context (`seen`, bool
    [..., V]) is divided by `penalty` when positive and multiplied by it otherwise. Plain decoding and
    tree verification both sample from the penalized distribution, so speculation stays exact."""
    logits = logits.float()
    return torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)


def seen_on_paths(seen: torch.Tensor, tokens: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
    """[T, V] bool: what each tree node's context holds: the tokens before the tree (`seen`, [V]) and
    those on the node's path (the root to the node itself, `ancestors` [T, T])."""
    t = tokens.numel()
    rows = seen[None, :].expand(t, -1).to(torch.int32)
    rows = rows.scatter_reduce(1, tokens[None, :].expand(t, t), ancestors.to(torch.int32), reduce="amax")
    return rows.bool()


def sample(probs: torch.Tensor, rng: CounterRNG) -> torch.Tensor:
    """One index drawn from (unnormalised) probabilities [..., V], on the device without a host sync:
    argmax of p_i / E_i with E_i ~ Exp(1) picks i with probability p_i / sum(p) (the exponential race;
    torch.multinomial would read the probabilities back on CUDA)."""
    return (probs / rng.exponential(probs.shape)).argmax(dim=-1)


def next_token(logits: torch.Tensor, params: GenerationParams, rng: CounterRNG) -> torch.Tensor:
    """One token (a 0-d device tensor) from one row of logits: argmax when greedy, else a sample of the
    processed distribution."""
    if is_greedy(params):
        return torch.argmax(logits)
    return sample(target_probs(logits, params), rng)
