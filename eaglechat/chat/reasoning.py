"""A reasoning model's reply split into its reasoning and its answer.

Qwen3 and the DeepSeek-R1 distills write their reasoning between `<think>` and `</think>` before the
answer (R1's chat template already ends the prompt with `<think>\\n`, so its replies carry only the
closing tag; Qwen3 with `enable_thinking=False` gets an empty think block in the prompt and writes no
tags at all). The answer is what the conversation keeps and what the model reads back in later
turns: both families' templates drop the reasoning of earlier turns, and so does the chat.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Split:
    reasoning: str
    answer: str
    answer_at: int  # where the answer starts in the text (its draft runs are cut there)
    thinking: bool  # the reasoning is still being written (an open block)


def split_reasoning(text: str) -> Split:
    """The reasoning and the answer of `text` (a whole reply, or the part of it streamed so far)."""
    lead = len(text) - len(text.lstrip())
    body = text[lead:]
    opened = body.startswith(OPEN)
    close = text.find(CLOSE)
    if close >= 0:
        start = lead + len(OPEN) if opened else 0
        at = close + len(CLOSE)
        answer = text[at:]
        skipped = len(answer) - len(answer.lstrip())
        return Split(text[start:close].strip(), answer.lstrip(), at + skipped, False)
    if opened:  # the closing tag has not come yet: all of it so far is reasoning
        return Split(body[len(OPEN):].strip(), "", len(text), True)
    if OPEN.startswith(body) and body:  # "<thi" streamed so far: wait for the rest of the tag
        return Split("", "", len(text), True)
    return Split("", text, 0, False)
