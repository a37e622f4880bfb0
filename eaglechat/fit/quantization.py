"""Quantization names (`--quant`) and the bitsandbytes config each one loads with.

none: the compute dtype; 8bit: LLM.int8(); 4bit: nf4 with double quantization (the QLoRA recipe,
Dettmers et al. 2023), an MoE's fused experts included (nf4_experts.py). "auto" is not a format: it asks the memory planner (eaglechat/fit/planner.py).
"""

from __future__ import annotations

from eaglechat.errors import UsageError

QUANTS = ("none", "8bit", "4bit")
AUTO = "auto"
QUANT_CHOICES = (AUTO, *QUANTS)  # what the CLI accepts where the planner may choose


def check_quant(quant: str, *, allow_auto: bool = False) -> str:
    allowed = QUANT_CHOICES if allow_auto else QUANTS
    if quant not in allowed:
        raise UsageError(f"unknown quantization {quant!r} ({', '.join(allowed)})")
    return quant


def quantization_config(quant: str, dtype):
    """transformers' BitsAndBytesConfig for `quant` (None for "none"); `dtype` is the 4-bit compute dtype."""
    check_quant(quant)
    if quant == "none":
        return None
    if quant == "8bit":  # LLM.int8 has no kernel for fused 3D expert tensors: an MoE's experts stay 16-bit
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(load_in_8bit=True)
    from eaglechat.fit.nf4_experts import experts_nf4_config

    return experts_nf4_config(dtype, double_quant=True)  # bitsandbytes' nf4, fused MoE experts included
