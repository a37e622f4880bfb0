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


class ReasoningStream:
    """`split_reasoning` for a reply that arrives in pieces (the server's streamed replies): `feed` each
    delta, get back the (reasoning, answer) text that is now sure, `flush` at the end. A tag cut across
    deltas ("</thi" then "nk>") is held back until it is whole, and so is the whitespace that ends the
    reasoning, so the pieces joined give what `split_reasoning` gives for the whole text (Ollama's
    thinking parser, thinking/parser.go, works the same way). `opened`: the prompt itself ended with the
    opening tag (DeepSeek-R1's template), so the reply starts inside the block and carries only the close."""

    def __init__(self, opened: bool = False):
        self.state = "thinking" if opened else "looking"
        self.held = ""  # text not yet released: a possible tag's start, or whitespace
        self.started = False  # some reasoning was released (whitespace after the opening tag is dropped)

    def feed(self, delta: str) -> tuple[str, str]:
        self.held += delta
        reasoning, answer = "", ""
        if self.state == "looking":
            body = self.held.lstrip()
            if body.startswith(OPEN):
                self.state, self.held = "thinking", body[len(OPEN):]
            elif body and not OPEN.startswith(body):  # no block: it is all answer
                answer, self.state, self.held = self.held, "answer", ""
                return "", answer
            else:
                return "", ""
        if self.state == "thinking":
            close = self.held.find(CLOSE)
            inside = self.held if close < 0 else self.held[:close]
            if not self.started:
                inside = inside.lstrip()
            if close >= 0:
                reasoning, self.state, self.held = inside.rstrip(), "after", self.held[close + len(CLOSE):]
            else:
                # keep back a possible start of the closing tag, and the trailing whitespace before it
                keep = next((n for n in range(min(len(CLOSE) - 1, len(inside)), 0, -1) if CLOSE.startswith(inside[-n:])), 0)
                sure = inside[: len(inside) - keep]
                released = sure.rstrip()
                reasoning, self.held = released, sure[len(released):] + inside[len(inside) - keep:]
            self.started = self.started or bool(reasoning)
        if self.state == "after":  # the whitespace between the closing tag and the answer is dropped
            rest = self.held.lstrip()
            self.held = ""
            if rest:
                self.state = "answer"
            return reasoning, rest
        if self.state == "answer":
            answer, self.held = self.held, ""
        return reasoning, answer

    def flush(self) -> tuple[str, str]:
        """What is still held when the reply ends: an unclosed block's trailing whitespace is dropped, a
        would-be opening tag that never completed is answer text."""
        held, self.held = self.held, ""
        if self.state == "looking":
            return "", held
        if self.state == "thinking":
            return (held if self.started else held.lstrip()).rstrip(), ""
        return "", held if self.state == "answer" else ""
