"""The repetition penalty (CTRL, arXiv:1909.05858) is exact in plain and speculative decoding: plain
greedy equals transformers' generate(repetition_penalty=...) token for token, and greedy EAGLE (every
tree node penalized by its own path) equals plain greedy. Sampling with it follows the target
distribution: tests/test_engine_sampling.py."""

from __future__ import annotations

import pytest
import torch
from tiny_models import random_head, tiny_model

from eaglechat.engine.decode import Decoder
from eaglechat.engine.protocol import GenerationParams, TreeBudget

PROMPT = [5, 17, 42, 8, 17, 90, 3]
N = 32


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def decode(decoder, params, budget=TreeBudget(8, 3, 4)) -> list[int]:
    return [t for s in decoder.generate(PROMPT, params, budget, set()) for t in s.tokens]


@pytest.mark.parametrize("penalty", [1.3])  # both branches: the logits have both signs
def test_plain_greedy_equals_transformers_and_eagle_equals_plain(model, penalty):
    decoder = Decoder(model, random_head(model), 128)
    params = GenerationParams(max_new_tokens=N, repetition_penalty=penalty, speculate=False)
    plain = decode(decoder, params)
    with torch.no_grad():
        reference = model.generate(torch.tensor([PROMPT]), max_new_tokens=N, do_sample=False, repetition_penalty=penalty,
                                   eos_token_id=None, pad_token_id=0)[0, len(PROMPT):].tolist()
    assert plain == reference
    assert plain != decode(decoder, GenerationParams(max_new_tokens=N, speculate=False))  # it does change the reply
    eagle = decode(decoder, GenerationParams(max_new_tokens=N, repetition_penalty=penalty))
    assert eagle == plain
    assert decoder.stats.target_forwards < N  # the tree did accept drafts (not a plain run in disguise)
