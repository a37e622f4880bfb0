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


class WindowedRepetition:
    """llama.cpp's penalty_last_n as a transformers logits processor: CTRL's penalty on the last n tokens."""

    def __init__(self, penalty: float, n: int):
        self.penalty, self.n = penalty, n

    def __call__(self, input_ids, scores):
        window = input_ids[:, -self.n:]
        picked = scores.gather(1, window)
        picked = torch.where(picked > 0, picked / self.penalty, picked * self.penalty)
        return scores.scatter(1, window, picked)


class PresenceFrequency:
    """OpenAI's definition over the generated tokens (the prompt's `start` tokens excluded)."""

    def __init__(self, presence: float, frequency: float, start: int):
        self.presence, self.frequency, self.start = presence, frequency, start

    def __call__(self, input_ids, scores):
        counts = torch.zeros_like(scores).scatter_add(1, input_ids[:, self.start:],
                                                      torch.ones_like(input_ids[:, self.start:], dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


@pytest.mark.parametrize("window,presence,frequency", [(3, 0.0, 0.0), (12, 0.0, 0.0), (64, 0.0, 0.0),
                                                       (None, 0.8, 0.0), (None, 0.0, 0.6), (5, 0.5, 0.4)])
def test_windowed_and_openai_penalties_are_exact_plain_and_speculative(model, window, presence, frequency):
    from transformers import LogitsProcessorList

    decoder = Decoder(model, random_head(model), 128)
    penalty = 1.6 if window else 1.0
    processors = ([WindowedRepetition(penalty, window)] if window else []) + (
        [PresenceFrequency(presence, frequency, len(PROMPT))] if presence or frequency else [])
    with torch.no_grad():
        reference = model.generate(torch.tensor([PROMPT]), max_new_tokens=N, do_sample=False, eos_token_id=None,
                                   pad_token_id=0, logits_processor=LogitsProcessorList(processors))
    reference = reference[0, len(PROMPT):].tolist()
    fields = {"repetition_penalty": penalty, "repeat_last_n": window or -1, "presence_penalty": presence,
              "frequency_penalty": frequency}
    plain = decode(decoder, GenerationParams(max_new_tokens=N, speculate=False, **fields))
    assert plain == reference
    assert plain != decode(decoder, GenerationParams(max_new_tokens=N, speculate=False))  # it does change the reply
    assert decode(decoder, GenerationParams(max_new_tokens=N, **fields)) == plain
    assert decoder.stats.target_forwards < N  # the tree did accept drafts
    for budget in (TreeBudget(16, 5, 4), TreeBudget(kind="static")):
        assert decode(decoder, GenerationParams(max_new_tokens=N, **fields), budget) == plain


def test_a_window_of_zero_turns_the_repetition_penalty_off(model):
    decoder = Decoder(model, random_head(model), 128)
    off = decode(decoder, GenerationParams(max_new_tokens=12, speculate=False))
    assert decode(decoder, GenerationParams(max_new_tokens=12, repetition_penalty=1.8, repeat_last_n=0)) == off


@pytest.mark.parametrize("window", [1, 2, 3, 6, -1])
def test_each_tree_node_is_penalised_by_the_window_of_its_own_path(window):
    """Penalties.tree against the definition, node by node: the last `window` tokens of (committed
    context + the node's path), and the generated counts plus the path's."""
    from eaglechat.engine.penalties import Penalties
    from eaglechat.engine.tree import ancestors_and_depth

    vocab, prompt = 12, [3, 3, 7, 1]
    params = GenerationParams(repetition_penalty=2.0, repeat_last_n=window, presence_penalty=0.5, frequency_penalty=0.25)
    pen = Penalties(params, vocab, torch.device("cpu")).load(params, prompt)
    committed = [9, 4]  # two steps already committed (generated), one and one token
    for token in committed:
        pen.commit(torch.tensor([token, 0, 0]), torch.tensor([1]))
    parents = torch.tensor([-1, 0, 0, 1, 3, 4, 2])
    tokens = torch.tensor([5, 7, 9, 5, 4, 11, 3])
    ancestors, depth = ancestors_and_depth(parents, 5)
    logits = torch.linspace(-3, 3, vocab).repeat(len(tokens), 1)
    got = pen.tree(logits, tokens, ancestors, depth)
    for i in range(len(tokens)):
        path, node = [], i
        while node >= 0:
            path.insert(0, int(tokens[node]))
            node = int(parents[node])
        context = prompt + committed + path
        window_ids = set(context if window < 0 else context[-window:])
        generated = committed + path
        row = logits[i].clone()
        for t in window_ids:
            row[t] = row[t] / 2.0 if row[t] > 0 else row[t] * 2.0
        for t in set(generated):
            row[t] -= 0.25 * generated.count(t) + 0.5
        assert torch.allclose(got[i], row), (i, window)
