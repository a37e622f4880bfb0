"""A reasoning model's reply split into its reasoning and its answer.

Qwen3 and the DeepSeek-R1 distills write their reasoning between `<think>` and `</think>` before the
answer (R1's chat template already ends the prompt with `<think>\\n`, so its replies carry only the
closing tag; Qwen3 with `enable_thinking=False` gets an empty think block in the prompt and writes no
tags at all). The answer is what the conversation keeps and what the model reads back in later
turns: both families' templates drop the reasoning of earlier turns, and so does the chat.

gpt-oss writes OpenAI's harmony format instead (engine/harmony.py, whose markers the engine keeps in
the text): the `analysis` channel's messages are the reasoning, the others (`final`, a `commentary`
preamble) the answer, messages of one side joined by a blank line, the markers and headers dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglechat.engine.harmony import CHANNEL, MARKERS, MESSAGE, MESSAGE_ENDS, START

OPEN, CLOSE = "<think>", "</think>"
HARMONY_LEADS = (CHANNEL, START, MESSAGE)  # how a harmony reply starts (the prompt ended with <|start|>assistant)
LEADS = (OPEN, *HARMONY_LEADS)
LONGEST = max(map(len, MARKERS))


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
    if body.startswith(HARMONY_LEADS):
        return split_harmony(text)
    if body and any(h.startswith(body) for h in HARMONY_LEADS):  # "<|chan" so far: wait for the marker
        return Split("", "", len(text), True)
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
        self.harmony: HarmonyStream | None = None  # the reply is in the harmony format

    def feed(self, delta: str) -> tuple[str, str]:
        if self.harmony is not None:
            return self.harmony.feed(delta)
        self.held += delta
        reasoning, answer = "", ""
        if self.state == "looking":
            body = self.held.lstrip()
            if body.startswith(HARMONY_LEADS):
                self.harmony, held, self.held = HarmonyStream(), self.held, ""
                return self.harmony.feed(held)
            if body.startswith(OPEN):
                self.state, self.held = "thinking", body[len(OPEN):]
            elif body and not any(lead.startswith(body) for lead in LEADS):  # no block: it is all answer
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
        if self.harmony is not None:
            return self.harmony.flush()
        held, self.held = self.held, ""
        if self.state == "looking":
            return "", held
        if self.state == "thinking":
            return (held if self.started else held.lstrip()).rstrip(), ""
        return "", held if self.state == "answer" else ""


class HarmonyStream:
    """A harmony reply (engine/harmony.py) read in pieces: `feed` -> (reasoning, answer) now sure, `flush` at
    the end. A marker cut across pieces is held back until whole; a header (`assistant<|channel|>final`)
    is read whole and dropped. `answer_at`: where the first answer message's text starts in the reply."""

    def __init__(self):
        self.held = ""
        self.side: int | None = None  # inside a message: 0 reasoning (analysis), 1 answer; None: a header
        self.spoken = [False, False]  # each side released some text (a later message is set apart)
        self.gap = False  # the message being read starts a new paragraph on its side
        self.seen = 0  # characters of the reply consumed before `held`
        self.answer_at: int | None = None

    def feed(self, delta: str) -> tuple[str, str]:
        self.held += delta
        out = ["", ""]
        while True:
            if self.side is None:  # a header: wait for <|message|>, then read the channel off it
                at = self.held.find(MESSAGE)
                if at < 0:
                    return out[0], out[1]
                self.side = 0 if channel_of(self.held[:at]) == "analysis" else 1
                self.gap = self.spoken[self.side]
                self._consume(at + len(MESSAGE))
                if self.side == 1 and self.answer_at is None:
                    self.answer_at = self.seen
                continue
            marks = [(i, m) for m in MARKERS if (i := self.held.find(m)) >= 0]
            if not marks:  # all of it is the message's text but a possible start of a marker
                keep = next((n for n in range(min(len(self.held), LONGEST - 1), 0, -1)
                             if any(m.startswith(self.held[-n:]) for m in MARKERS)), 0)
                self._say(out, self.held[: len(self.held) - keep])
                return out[0], out[1]
            at, mark = min(marks)
            self._say(out, self.held[:at])
            # the message ends at <|end|>/<|return|>/<|call|>; a header's marker with no end before it
            # (a malformed reply) starts the next message all the same
            self._consume(at + len(mark) if mark in MESSAGE_ENDS else at)
            self.side = None

    def _say(self, out: list[str], text: str) -> None:
        if text:
            side = self.side
            out[side] += ("\n\n" if self.gap else "") + text
            self.gap, self.spoken[side] = False, True
        self._consume(len(text))

    def _consume(self, n: int) -> None:
        self.seen += n
        self.held = self.held[n:]

    def flush(self) -> tuple[str, str]:
        """What is held when the reply ends: a cut marker's start is text; an unfinished header is dropped."""
        out = ["", ""]
        if self.side is not None:
            self._say(out, self.held)
        self.held = ""
        return out[0], out[1]

    @property
    def thinking(self) -> bool:
        return self.side != 1


def channel_of(header: str) -> str:
    """`assistant<|channel|>final` -> "final"; "" without a channel."""
    if CHANNEL not in header:
        return ""
    words = header.split(CHANNEL, 1)[1].split("<|", 1)[0].split()
    return words[0] if words else ""


def split_harmony(text: str) -> Split:
    """split_reasoning for a harmony reply (one that starts with a harmony marker)."""
    stream = HarmonyStream()
    reasoning, answer = stream.feed(text)
    more = stream.flush()
    at = stream.answer_at if stream.answer_at is not None else len(text)
    return Split(reasoning + more[0], answer + more[1], at, stream.thinking)
