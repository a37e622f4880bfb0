"""Reduced draft vocabulary: the top-N most frequent target tokens of the training replies
(the EAGLE-3 recipe, arXiv:2503.01840; SafeAILab/EAGLE `eagle/traineagle3/`).

On a small model the draft head's lm_head over the whole vocabulary dominates a draft step (SmolLM2:
49152 x 576); scoring only the N most frequent reply tokens cuts it by vocab/N. The mapping is stored
the official EAGLE-3 way: draft id d is target id d + d2t[d] (d2t holds *offsets*), and t2d[v] marks
the target ids in the draft vocabulary. Drafting never proposes a token outside it; verification still
samples from the full target, so decoding stays exact (only acceptance can drop).

Counting reads the trainer's work folder (distill/ and replies/ shards: rows with `reply_ids`), so it
works before or after feature extraction and needs no model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch


def count_tokens(replies: Iterable[Iterable[int]], vocab_size: int) -> torch.Tensor:
    """Per-token counts [vocab_size] (int64) over the reply tokens (the loss-masked ones)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for reply in replies:
        ids = torch.as_tensor(list(reply), dtype=torch.long)
        if ids.numel():
            counts += torch.bincount(ids.clamp_(0, vocab_size - 1), minlength=vocab_size)
    return counts


def top_n(counts: torch.Tensor, n: int, always: Iterable[int] = ()) -> list[int]:
    """The n most frequent ids, ascending; `always` (e.g. stop tokens) are in regardless. Ties and
    unseen tokens are filled by lowest id, so the result has exactly min(n, vocab) ids."""
    vocab = counts.numel()
    n = min(n, vocab)
    forced = sorted({int(t) for t in always if 0 <= int(t) < vocab})
    if len(forced) > n:
        raise ValueError(f"{len(forced)} forced tokens do not fit a draft vocabulary of {n}")
    score = counts.double().clone()
    score[forced] = float("inf")
    # stable descending sort: equal counts keep ascending id order
    order = torch.sort(-score, stable=True).indices[:n]
    return sorted(order.tolist())


def d2t_t2d(ids: list[int], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Official buffers for ascending target ids: d2t[d] = ids[d] - d (int64), t2d (bool [vocab])."""
    t = torch.as_tensor(ids, dtype=torch.long)
    if t.numel() > 1 and not bool((t[1:] > t[:-1]).all()):
        raise ValueError("draft vocabulary ids must be strictly ascending")
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[t] = True
    return t - torch.arange(t.numel()), t2d


def coverage(counts: torch.Tensor, ids: list[int]) -> float:
    """Fraction of reply tokens that fall in the draft vocabulary."""
    total = int(counts.sum())
    return float(counts[torch.as_tensor(ids, dtype=torch.long)].sum()) / total if total else 0.0


def reply_rows(work: Path) -> Iterable[list[int]]:
    """reply_ids of every row in the work folder's distill/ and replies/ shards."""
    from eaglechat.train import store

    for sub in ("distill", "replies"):
        for shard in store.shards(Path(work) / sub):
            for row in store.load(shard):
                yield list(row["reply_ids"])


def pick_draft_vocab(replies: Iterable[Iterable[int]], vocab_size: int, n: int, always: Iterable[int] = ()) -> dict:
    """Count the reply tokens and pick the top n: -> {ids, vocab_size, draft_vocab_size, reply_tokens, coverage}."""
    counts = count_tokens(replies, vocab_size)
    ids = top_n(counts, n, always)
    return {"ids": ids, "vocab_size": vocab_size, "draft_vocab_size": len(ids),
            "reply_tokens": int(counts.sum()), "coverage": coverage(counts, ids)}


def build_draft_vocab(work: Path, vocab_size: int, n: int, always: Iterable[int] = ()) -> dict:
    """The top n reply tokens of a trainer work folder (distill/ and replies/ shards)."""
    return pick_draft_vocab(reply_rows(work), vocab_size, n, always)


def restrict_eagle2_head(head, ids: list[int] | None):
    """A copy of an EAGLE-1/2 head (same weights) whose draft logits cover only `ids` (None: the whole
    vocabulary, e.g. to measure a reduced-vocabulary head without its reduction)."""
    from dataclasses import replace

    from eaglechat.engine.heads import EagleHead

    copy = EagleHead(replace(head.config, draft_vocab_size=0), head.embed_tokens, head.lm_head)
    copy.load_state_dict(head.state_dict(), strict=False)
    copy = copy.to(device=head.fc.weight.device, dtype=head.fc.weight.dtype).eval().requires_grad_(False)
    return copy if ids is None else copy.set_draft_vocab(ids)
