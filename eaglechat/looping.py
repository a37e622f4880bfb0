"""Looping replies: the one definition that training, evaluation and `eaglechat bench` share.

Greedy small models fall into repetition loops, and a loop is trivially predictable, so tau is reported
with and without looping replies. A reply *loops* when fewer than half of the 8-grams of its last 128
tokens are distinct (`is_looping`); replies too short to hold 16 such 8-grams are never judged looping.
Self-distillation stops a reply earlier, at the third occurrence of any 8-gram (train/distill.LoopStop),
which keeps two repetitions in the training data and spends no generation time on the rest of the loop.
"""

from __future__ import annotations

NGRAM = 8
WINDOW = 128
THRESHOLD = 0.5
STOP_REPEATS = 3
DESCRIPTION = f"unique {NGRAM}-gram ratio < {THRESHOLD} over the last {WINDOW} tokens"


def unique_ngram_ratio(ids: list[int], n: int = NGRAM, window: int = WINDOW) -> float:
    """Distinct n-grams / n-grams over the last `window` tokens (1.0 when there are fewer than 2n)."""
    tail = list(ids[-window:])
    grams = [tuple(tail[i:i + n]) for i in range(len(tail) - n + 1)]
    return len(set(grams)) / len(grams) if len(grams) >= 2 * n else 1.0


def repeated_fraction(ids: list[int], n: int = NGRAM) -> float:
    """The share of a reply's n-grams that repeat an earlier one of the same reply (0.0 when it has no
    n-gram): the repeated-text fraction BENCHMARKS.md reports for the models' sampling defaults."""
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return (len(grams) - len(set(grams))) / len(grams) if grams else 0.0


def is_looping(ids: list[int]) -> bool:
    return unique_ngram_ratio(ids) < THRESHOLD

