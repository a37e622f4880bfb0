"""OpenAI's harmony response format, gpt-oss's (github.com/openai/harmony, docs/format.md).

A reply is a run of messages `<|start|>assistant<|channel|>CHANNEL<|message|>TEXT<|end|>` (the prompt
already ends with `<|start|>assistant`, so the first message starts at `<|channel|>`): the chain of thought
on the `analysis` channel, then the answer on `final`, which ends the reply with `<|return|>` instead of
`<|end|>` (a tool call ends it with `<|call|>`). So `<|end|>` ends a message, not the reply, and the markers
are special tokens that a decoder skipping special tokens drops ("analysis...assistantfinal...").
"""

from __future__ import annotations

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
RETURN, CALL, CONSTRAIN = "<|return|>", "<|call|>", "<|constrain|>"
MARKERS = (START, CHANNEL, MESSAGE, END, RETURN, CALL, CONSTRAIN)
REPLY_ENDS = (RETURN, CALL)  # what ends a reply (<|end|> ends one message of it)
MESSAGE_ENDS = (END, RETURN, CALL)


def is_harmony(tokenizer) -> bool:
    """The tokenizer has harmony's markers (gpt-oss's o200k_harmony vocabulary)."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    return all(marker in vocab for marker in (START, CHANNEL, MESSAGE, END, RETURN))
