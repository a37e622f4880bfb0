"""What greedy EAGLE promises on each number format: one table for `eaglechat plan`, `run --verbose`
and the chat's load notice.

A verify forward over a tree and the one-token step of plain decoding never run the same kernels in the
same summation order, so their logits differ by rounding; whether a greedy pick can flip depends on how
coarsely the format rounds (README "Exactness on each number format"; measured with
scripts/quant_exactness.py, BENCHMARKS.md).
"""

from __future__ import annotations

# keyed by the planner's format names (memory.format_for); `--quant 4bit` loads nf4 with double quant
EXACTNESS = {
    "fp32": "greedy EAGLE emits plain greedy decoding's tokens (float32: verify and one-token step agree to ~1e-5)",
    "fp16": "greedy EAGLE = plain greedy up to 16-bit rounding: a near-tie (top-2 logits within ~0.1 %) may flip",
    "bf16": "greedy EAGLE = plain greedy up to 16-bit rounding: a near-tie (top-2 logits within ~0.1 %) may flip "
            "(default model, AVX512-BF16 CPU: 6/20 prompts identical over 64 tokens)",
    "int8": "greedy EAGLE = plain greedy up to int8 rounding (rows keep their own LLM.int8 outliers); "
            "a near-tie may flip (default model, CPU: 8/10 prompts identical over 64 tokens)",
    "nf4": "greedy EAGLE = plain greedy up to the 4-bit kernel's rounding; a near-tie may flip",
    "nf4-dq": "greedy EAGLE = plain greedy up to the 4-bit kernel's rounding; a near-tie may flip "
              "(default model, CPU: 12/20 prompts identical over 64 tokens)",
}


def exactness(fmt: str) -> str:
    return EXACTNESS.get(fmt, EXACTNESS["fp16"])


def is_token_exact(fmt: str) -> bool:
    return fmt == "fp32"
