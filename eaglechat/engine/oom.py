"""The out-of-memory ladder: what to give back after a CUDA/MPS out-of-memory error mid-chat.

Pure arithmetic; LocalEngine applies it (engine/local.py) and keeps the chat open.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Shrink:
    """One step down after an out-of-memory error: what changed, and the new settings."""

    what: str  # "tree" | "context"
    total_tokens: int
    depth: int
    draft_top_k: int
    context: int
    message: str  # one line for the user


def shrink_after_oom(
    total_tokens: int,
    depth: int,
    draft_top_k: int,
    context: int,
    *,
    used_tokens: int = 0,
    min_tree: int = 4,
    min_context: int = 512,
) -> Shrink | None:
    """The next smaller setting after a CUDA/MPS out-of-memory error during chat:
    first halve the tree (down to `min_tree` drafted tokens, depth and draft_top_k trimmed to match), then
    halve the context (never below what the conversation already holds, nor `min_context`), then
    None: nothing left to give back, report the error and keep the chat open."""
    if total_tokens > min_tree:
        n = max(min_tree, total_tokens // 2)
        d = max(2, min(depth, depth - 1 if n < 16 else depth))
        k = max(2, min(draft_top_k, n))
        return Shrink("tree", n, d, k, context, f"out of memory: draft tree reduced to {n} tokens (depth {d}, draft_top_k {k})")
    floor = max(min_context, used_tokens + 64)
    if context // 2 >= floor:
        c = context // 2
        return Shrink("context", total_tokens, depth, draft_top_k, c, f"out of memory: context window reduced to {c} tokens")
    return None
