"""RoPE frequencies of a draft head: the plain rotary base, or a scaled one (linear, llama3, yarn)
computed by transformers' own `ROPE_INIT_FUNCTIONS`, so a head rotates exactly as the model code it
was trained with (transformers `modeling_rope_utils`).

Types whose frequencies depend on the sequence length at run time (dynamic NTK, longrope) or on more
than a rotary base (partial rotary) are refused in one line: a draft step is a fixed computation.
"""

from __future__ import annotations

import contextlib

import torch

from eaglechat.errors import WeightsError

SCALED = ("linear", "llama3", "yarn")


def rope_kind(scaling: dict | None) -> str:
    if not scaling:
        return "default"
    return str(scaling.get("rope_type") or scaling.get("type") or "default")


@contextlib.contextmanager
def _quiet_transformers():
    """transformers logs its rope validation notes (e.g. original_max_position_embeddings above the
    head's max_position_embeddings, which heads copied from long-context bases have): not ours to print."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def rope_frequencies(head_dim: int, theta: float, scaling: dict | None, max_positions: int) -> tuple[torch.Tensor, float]:
    """-> (inv_freq [head_dim // 2], attention scaling of cos/sin)."""
    kind = rope_kind(scaling)
    if kind == "default":  # transformers' compute_default_rope_parameters, written out
        return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)), 1.0
    if kind not in SCALED:
        raise WeightsError(f"head config: rope_scaling type {kind!r} is not supported (supported: {', '.join(SCALED)})")
    params = {k: v for k, v in scaling.items() if k not in ("type", "rope_type", "rope_theta")}
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise WeightsError("head config: rope_scaling.partial_rotary_factor is not supported (full rotary only)")
    try:
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        with _quiet_transformers():
            config = LlamaConfig(hidden_size=head_dim, num_attention_heads=1, head_dim=head_dim,
                                 max_position_embeddings=max_positions,
                                 rope_parameters={"rope_type": kind, "rope_theta": theta, **params})
            inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    except (KeyError, TypeError, ValueError, ZeroDivisionError, ArithmeticError) as exc:
        missing = f"lacks {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc).splitlines()[0]
        raise WeightsError(f"head config: rope_scaling of type {kind!r} {missing}") from None
    inv_freq = inv_freq.float()
    if inv_freq.shape != (head_dim // 2,) or not bool(torch.isfinite(inv_freq).all()):
        raise WeightsError(f"head config: rope_scaling of type {kind!r} gives no usable frequencies")
    return inv_freq, float(scale)
