"""Training prompts (ShareGPT first turns) and the held-out evaluation prompts (MT-bench, HumanEval).

Where the three files are, and how the truncated ShareGPT JSON is read record by record: eaglechat/datasets.py.
Training prompts that appear in MT-bench or HumanEval are skipped.
"""

from __future__ import annotations

import random
import re

from eaglechat import datasets
from eaglechat.datasets import sharegpt_conversations


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def heldout_texts() -> list[str]:
    """Normalised texts of every evaluation prompt (MT-bench both turns, HumanEval prompts)."""
    out = [_norm(t) for q in datasets.mtbench_questions("training data") for t in q["turns"]]
    out += [_norm(p["prompt"]) for p in datasets.humaneval_problems("training data")]
    return [t for t in out if t]


def _overlaps(prompt: str, heldout: list[str], heldout_set: set[str]) -> bool:
    p = _norm(prompt)
    if p in heldout_set:
        return True
    # a held-out prompt pasted inside a longer one, or a long prefix of one
    return any((len(h) >= 40 and h in p) or (len(p) >= 40 and p in h) for h in heldout)


def sharegpt_pairs(n: int, *, seed: int = 0, min_chars: int = 20, max_chars: int = 1000,
                   ascii_only: bool = True) -> list[tuple[str, str]]:
    """`n` ShareGPT (first human turn, first gpt reply) pairs, shuffled with `seed`, none an eval prompt."""
    heldout = heldout_texts()
    heldout_set = set(heldout)
    seen: set[str] = set()
    pool: list[tuple[str, str]] = []
    for conv in sharegpt_conversations():
        turns = conv.get("conversations") or []
        if not turns or turns[0].get("from") != "human":
            continue
        text = (turns[0].get("value") or "").strip()
        if not (min_chars <= len(text) <= max_chars) or (ascii_only and not text.isascii()):
            continue
        key = _norm(text)
        if key in seen:
            continue
        seen.add(key)
        reply = (turns[1].get("value") or "").strip() if len(turns) > 1 and turns[1].get("from") == "gpt" else ""
        pool.append((text, reply))
    random.Random(seed).shuffle(pool)
    out: list[tuple[str, str]] = []
    for text, reply in pool:
        if len(out) >= n:
            break
        if not _overlaps(text, heldout, heldout_set):
            out.append((text, reply))
    return out


def sharegpt_prompts(n: int, *, seed: int = 0, **kwargs) -> list[str]:
    """`n` ShareGPT first-turn human prompts, shuffled with `seed`, none of them an eval prompt."""
    return [p for p, _ in sharegpt_pairs(n, seed=seed, **kwargs)]
