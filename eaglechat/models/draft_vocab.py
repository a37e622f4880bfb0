"""A draft-time vocabulary for EAGLE-1/2 heads that score the whole vocabulary: the N most frequent tokens
(FR-Spec: Zhao et al. 2025, "FR-Spec: Accelerating Large-Vocabulary Language Models via Frequency-Ranked
Speculative Sampling", arXiv:2502.14856).

Such a head drafts through the base model's lm_head, so every tree level multiplies by all V rows
(Vicuna-7B: 32000 x 4096 in fp16, 262 MB read per level). Scoring only the N most frequent tokens cuts
that by V/N (`EagleHead.set_draft_vocab`: a copy of those N rows). Decoding stays exact: verification
scores the full vocabulary with the target; greedy accepts a drafted token only where it is the target's
argmax; the tree rejection sampling (engine/verify.py) accepts a drafted x with probability p(x) under
the target, the draft a point mass, so which tokens are drafted changes how often drafts are accepted,
never the distribution of what is emitted. A head that already has a reduced vocabulary keeps its own.

Where the ranking comes from, the first that exists:
  1. `token_map.pt` in the head folder: token ids, the most frequent first (FR-Spec's published
     frequency files and SGLang's --speculative-token-map use this format), read with
     torch.load(weights_only=True);
  2. the assistant replies of the first ShareGPT conversations (eaglechat.datasets, the training prompts),
     tokenized with the base model's tokenizer: counted once per tokenizer, cached in the user cache dir.
The stop tokens are always in (a draft must be able to end the reply). The size is the profile's
`draft_vocab` (tokens; 0 turns it off; `auto`: V/4 as FR-Spec chose for Llama-3, at least 8192).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable

import torch

TOKEN_MAP = "token_map.pt"
SHAREGPT_CONVERSATIONS = 2000  # ~1.5M reply tokens: the ranking of the first few thousand ids is stable by then
AUTO_MIN = 8192


def draft_size(setting, vocab_size: int) -> int:
    """Tokens in the draft-time vocabulary for a `draft_vocab` setting; 0 = none (also when it would not
    be smaller than the vocabulary)."""
    if setting in (None, 0, False, "off"):
        return 0
    n = max(AUTO_MIN, vocab_size // 4) if setting == "auto" else int(setting)
    return n if 0 < n < vocab_size else 0


def ranked_ids_from_file(head_dir: Path | None) -> torch.Tensor | None:
    path = Path(head_dir) / TOKEN_MAP if head_dir is not None else None
    if path is None or not path.is_file():
        return None
    from eaglechat.errors import WeightsError

    try:
        ids = torch.as_tensor(torch.load(path, map_location="cpu", weights_only=True), dtype=torch.long).reshape(-1)
    except Exception as exc:  # noqa: BLE001 - a damaged file is the user's to fix, in one line
        raise WeightsError(f"{path}: not a tensor of token ids ({type(exc).__name__})") from None
    return ids


def reply_counts(tokenizer, vocab_size: int, cache_dir: Path | None,
                 conversations: Iterable[dict] | None = None) -> torch.Tensor | None:
    """Per-token counts [vocab_size] over ShareGPT's assistant replies, cached per tokenizer; None when
    the data set is not installed."""
    key = _tokenizer_key(tokenizer, vocab_size)
    cached = Path(cache_dir) / f"sharegpt-{key}.pt" if cache_dir is not None else None
    if cached is not None and cached.is_file():
        return torch.load(cached, map_location="cpu", weights_only=True)
    if conversations is None:
        from eaglechat import datasets
        from eaglechat.errors import EaglechatError

        try:
            conversations = datasets.sharegpt_conversations(datasets.SHAREGPT.path("a draft vocabulary"))
        except EaglechatError:  # the data set package is not installed: no ranking from it
            return None
    replies = []
    for i, conv in enumerate(conversations):
        if i >= SHAREGPT_CONVERSATIONS:
            break
        replies += [t.get("value") or "" for t in conv.get("conversations") or [] if t.get("from") == "gpt"]
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for start in range(0, len(replies), 256):
        for ids in tokenizer(replies[start:start + 256], add_special_tokens=False)["input_ids"]:
            if ids:
                counts += torch.bincount(torch.as_tensor(ids).clamp_(0, vocab_size - 1), minlength=vocab_size)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        torch.save(counts, cached)
    return counts


def _tokenizer_key(tokenizer, vocab_size: int) -> str:
    vocab = tokenizer.get_vocab()
    text = "\n".join(f"{i}\t{t}" for t, i in sorted(vocab.items(), key=lambda kv: kv[1]))
    return hashlib.sha256(f"{vocab_size}\n{text}".encode()).hexdigest()[:16]


def pick(n: int, vocab_size: int, *, ranked: torch.Tensor | None = None, counts: torch.Tensor | None = None,
         always: Iterable[int] = ()) -> list[int]:
    """The n ids to draft from, ascending: `always` first, then the ranking (most frequent first) or the
    highest counts (ties by lower id)."""
    order = ranked if ranked is not None else torch.sort(-counts.double(), stable=True).indices
    chosen = {int(t) for t in always if 0 <= int(t) < vocab_size}
    for t in order.tolist():
        if len(chosen) >= n:
            break
        if 0 <= t < vocab_size:
            chosen.add(t)
    return sorted(chosen)


def apply(head, setting, *, head_dir: Path | None, tokenizer, stop_ids: Iterable[int], cache_dir: Path | None) -> str:
    """Give an EAGLE-1/2 head without a reduced vocabulary its draft-time vocabulary; -> a note for the
    load report ("" when nothing changed)."""
    if head is None or getattr(head, "kind", "") != "eagle2" or head.draft_to_target is not None:
        return ""  # EAGLE-3 heads have their own lm_head; a reduced vocabulary stays as trained
    vocab = head.lm_head.weight.shape[0]
    n = draft_size(setting, vocab)
    if not n:
        return ""
    ranked = ranked_ids_from_file(head_dir)
    source = f"{TOKEN_MAP} of the head"
    counts = None
    if ranked is None:
        counts = reply_counts(tokenizer, vocab, cache_dir)
        if counts is None:
            return "draft vocabulary: the full vocabulary (no token_map.pt with the head, ShareGPT not installed)"
        source = "ShareGPT reply frequencies"
    head.set_draft_vocab(pick(n, vocab, ranked=ranked, counts=counts, always=stop_ids))
    return f"draft vocabulary: the {head.draft_to_target.numel()} most frequent of {vocab} tokens ({source})"
