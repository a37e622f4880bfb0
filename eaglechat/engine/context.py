"""Fitting a conversation into the context window: the system prompt stays, the oldest turns go.

A long chat must not die at the context limit. Like llama.cpp's context shift (keep the first
`n_keep` tokens, discard the oldest half of the rest), messages are dropped from the front, but whole
turns at a time so the chat template stays valid (the kept part starts at a user message). The cut is
quantised to every `STRIDE`-th user turn: consecutive turns then drop the same messages, so the
tokenised prefix, and with it the KV cache of the previous turn, stays reusable for several turns
instead of being recomputed after every reply.
"""

from __future__ import annotations

from typing import Callable

from eaglechat.errors import ContextTooLong

STRIDE = 4  # the cut moves by this many user turns at a time


def reply_reserve(max_context: int, max_new_tokens: int) -> int:
    """Room kept free for the reply: its token budget, at most a quarter of the context."""
    return max(1, min(max_new_tokens, max_context // 4))


def fit_conversation(messages: list[dict], encode: Callable[[list[dict]], list[int]], max_context: int,
                     reserve: int) -> tuple[list[int], int]:
    """(prompt ids, number of messages dropped) for the longest tail of the conversation whose prompt
    leaves `reserve` tokens free. Leading system messages always stay. Raises ContextTooLong when
    even the last message alone (with the system prompt) does not fit."""
    ids = encode(messages)
    if len(ids) + reserve <= max_context:
        return ids, 0
    head = 0
    while head < len(messages) and messages[head].get("role") == "system":
        head += 1
    system, rest = messages[:head], messages[head:]
    starts = [i for i, m in enumerate(rest) if i > 0 and m.get("role") == "user"]  # where a kept tail may begin
    fits = None
    lo, hi = 0, len(starts) - 1
    while lo <= hi:  # the prompt only shrinks as more is dropped: binary search the first cut that fits
        mid = (lo + hi) // 2
        candidate = encode(system + rest[starts[mid]:])
        if len(candidate) + reserve <= max_context:
            fits, hi = mid, mid - 1
        else:
            lo = mid + 1
    if fits is not None:
        # round the cut up to the next multiple of STRIDE turns (never past the last user message)
        cut = starts[min(len(starts) - 1, -(-(fits + 1) // STRIDE) * STRIDE - 1)]
        return encode(system + rest[cut:]), cut
    last = len(rest) - 1
    ids = encode(system + rest[last:])
    if len(ids) + 1 > max_context:
        raise ContextTooLong(
            f"the message is {len(ids)} tokens with the system prompt, but the context holds {max_context}; "
            "shorten it"
        )
    return ids, last
