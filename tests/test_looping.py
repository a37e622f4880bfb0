"""The one definition of a looping reply (eaglechat/looping.py) and distillation's early loop stop."""

from __future__ import annotations

import torch

from eaglechat.looping import is_looping, unique_ngram_ratio
from eaglechat.train.distill import LoopStop


def test_a_repeated_phrase_loops_and_distinct_text_does_not():
    assert is_looping([1, 2, 3] * 40)
    assert not is_looping(list(range(100)))
    # 8-grams of a period-3 loop: 3 distinct among 113 -> far under half
    assert unique_ngram_ratio([1, 2, 3] * 40) == 3 / 113


def test_short_replies_are_never_judged():
    assert unique_ngram_ratio([5] * 22) == 1.0  # 15 8-grams: too few
    assert unique_ngram_ratio([5] * 23) == 1 / 16  # 16: judged
    assert not is_looping([5] * 22) and is_looping([5] * 23)


def test_only_the_last_128_tokens_count():
    loop_then_text = [1, 2, 3] * 40 + list(range(100, 228))
    assert not is_looping(loop_then_text)  # the loop ended more than 128 tokens ago
    text_then_loop = list(range(100, 400)) + [1, 2, 3] * 30
    assert is_looping(text_then_loop)
    # at the threshold: 61 distinct 8-grams of the window's 121 are not under half, 60 are
    window = list(range(1000, 1060)) + [7] * 68
    assert unique_ngram_ratio(window) == 61 / 121 and not is_looping(window)
    assert is_looping(list(range(1000, 1059)) + [7] * 69)


def test_distillation_stops_a_row_at_the_third_occurrence_of_an_8gram():
    prompt = [9] * 4
    reply = list(range(100, 110)) + [1, 2, 3, 4, 5, 6, 7, 8] * 4
    stop = LoopStop(prompt_len=len(prompt))
    stopped = None
    for length in range(len(prompt) + 1, len(prompt) + len(reply) + 1):
        ids = torch.tensor([(prompt + reply)[:length]])
        if bool(stop(ids)[0]):
            stopped = length - len(prompt)
            break
    # the 8-gram 1..8 completes at reply lengths 18, 26 and 34: the third occurrence stops the row
    assert stopped == 34 and stop.stopped_at == {0: 34}
