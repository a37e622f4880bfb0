"""Fill-in-the-middle prompts in the format each code model was trained on, found by its vocabulary.

Prefix-suffix-middle order: `<prefix-token> prefix <suffix-token> suffix <middle-token>`, after which
the model writes the middle (StarCoder/SantaCoder `<fim_prefix>`..., Qwen2.5-Coder `<|fim_prefix|>`...,
DeepSeek-Coder `<｜fim▁begin｜>`...; CodeLlama `<PRE>`/`<SUF>`/`<MID>`). A tokenizer with none of
them cannot fill in the middle: that is refused, never approximated by a plain continuation.
"""

from __future__ import annotations

from eaglechat.errors import UsageError

FORMATS = [  # (prefix, suffix, middle)
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
    ("▁<PRE>", "▁<SUF>", "▁<MID>"),
]
NAMES = ", ".join("/".join(f) for f in FORMATS)


def fim_tokens(tokenizer) -> tuple[int, int, int] | None:
    """The (prefix, suffix, middle) token ids of the tokenizer's FIM format, or None."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    for names in FORMATS:
        if all(n in vocab for n in names):
            return tuple(vocab[n] for n in names)
    return None


def fim_prompt(tokenizer, prefix: str, suffix: str) -> list[int]:
    """Token ids of a fill-in-the-middle prompt; UsageError when the tokenizer has no FIM tokens.
    The texts are encoded without special tokens, so typed marker text stays text."""
    ids = fim_tokens(tokenizer)
    if ids is None:
        raise UsageError(f"this model has no fill-in-the-middle tokens ({NAMES}): 'suffix' cannot be used")
    pre, suf, mid = ids
    bos = [tokenizer.bos_token_id] if getattr(tokenizer, "add_bos_token", False) and tokenizer.bos_token_id is not None else []

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"] if text else []

    return [*bos, pre, *encode(prefix), suf, *encode(suffix), mid]
