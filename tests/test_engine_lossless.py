"""Greedy EAGLE output equals plain greedy output token for token (fp32), for every family and budget
(the 2023-24 families and the tiny configs of the 2026 architectures in tests/tiny_models.py)."""

import random

import pytest
import torch
from tiny_models import ALL, ARCHITECTURES, random_head, tiny_model

from eaglechat.engine.compile import CompiledSteps
from eaglechat.engine.decode import Decoder
from eaglechat.engine.draft import Drafter
from eaglechat.engine.protocol import GenerationParams, TreeBudget
from eaglechat.engine.tree import tree_from_parents

BUDGETS = [TreeBudget(4, 1, 4), TreeBudget(8, 3, 4), TreeBudget(60, 5, 10), TreeBudget(kind="static")]


class OracleDrafter(Drafter):
    """Drafts the base model's true greedy continuation (plus decoy siblings): full acceptance."""

    def __init__(self, head, decoder):
        super().__init__(head)
        self.decoder = decoder

    def draft(self, root, budget):
        seq = self.decoder.cached_ids + [int(root)]
        chain = []
        with torch.no_grad():
            for _ in range(budget.depth):
                nxt = int(self.decoder.model(torch.tensor([seq + chain])).logits[0, -1].argmax())
                chain.append(nxt)
        tokens, parents = [int(root)], [-1]
        for i, tok in enumerate(chain):
            parent = 0 if i == 0 else len(tokens) - 2  # the previous true node (a decoy follows it)
            tokens += [tok, (tok + 1) % 96]
            parents += [parent, parent]
        return tree_from_parents(tokens, parents)


def plain(model, prompt, n, stop=()):
    decoder = Decoder(model, None, 512)
    return [t for s in decoder.generate(prompt, GenerationParams(max_new_tokens=n, speculate=False), TreeBudget(), set(stop)) for t in s.tokens]


def spec(decoder, prompt, n, budget, stop=()):
    steps = list(decoder.generate(prompt, GenerationParams(max_new_tokens=n), budget, set(stop)))
    return [t for s in steps for t in s.tokens]


def decoder_for(model, head, compiled: bool | str):
    """A Decoder, eager, with its steps compiled (torch.compile, fullgraph; the cheap "eager" backend
    keeps the test fast: what is checked is that the compiled, static-shape steps decode the same), or
    ("graphs") captured and replayed (tests/fake_graphs.py on a CPU)."""
    decoder = Decoder(model, head, 512)
    if compiled == "graphs":
        from fake_graphs import FakeGraphs

        from eaglechat.engine.compile import GraphSteps

        decoder.use(GraphSteps(decoder, FakeGraphs()))
    elif compiled:
        torch._dynamo.reset()  # a fresh decoder per budget: no recompile limit across them
        decoder.use(CompiledSteps(decoder, lambda fn: torch.compile(fn, backend="eager", fullgraph=True, dynamic=False)))
    return decoder


@pytest.mark.parametrize("family,compiled", [(f, False) for f in sorted(ALL)] + [("llama", True), ("qwen2", True),
                                                                                ("qwen2", "graphs")],
                         ids=[f"{f}-eager" for f in sorted(ALL)] + ["llama-compiled", "qwen2-compiled", "qwen2-graphs"])
def test_greedy_equals_plain_random_head(family, compiled):
    model = tiny_model(family)
    head = random_head(model)
    rng = random.Random(family)
    for trial in range(1 if compiled or family in ARCHITECTURES else 2):
        prompt = [rng.randrange(96) for _ in range(rng.randint(1, 20))]
        expected = plain(model, prompt, 20)
        for budget in BUDGETS:
            got = spec(decoder_for(model, head, compiled), prompt, 20, budget)
            assert got == expected, (family, trial, budget)


@pytest.mark.parametrize("family", sorted(ALL))
def test_greedy_equals_plain_oracle_head_full_acceptance(family):
    model = tiny_model(family)
    head = random_head(model)
    prompt = list(range(3, 14))
    expected = plain(model, prompt, 30)
    decoder = Decoder(model, head, 512)
    decoder.drafter = OracleDrafter(head, decoder)
    budget = TreeBudget(8, 4, 2)
    assert spec(decoder, prompt, 30, budget) == expected
    # every step accepts the whole true chain: depth drafted tokens + 1 bonus
    assert decoder.stats.mean_accepted == pytest.approx(5.0, abs=0.5)


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "gpt_oss", "qwen3_5_text", "qwen3_next"])
def test_multi_turn_reuses_the_prefix_cache_and_stays_exact(family):
    model = tiny_model(family)
    head = random_head(model)
    decoder = Decoder(model, head, 512)
    budget = TreeBudget(8, 3, 4)
    first = [5, 6, 7, 8, 9]
    reply = spec(decoder, first, 12, budget)
    assert reply == plain(model, first, 12)
    second = first + reply + [10, 11, 12]  # the next turn extends the conversation
    reply2 = spec(decoder, second, 12, budget)
    assert decoder.stats.reused_tokens >= len(first) + len(reply) - 2
    assert decoder.stats.prefill_tokens <= 5
    assert reply2 == plain(model, second, 12)
    edited = first[:3] + [40, 41]  # an edited history: only the common part is reused
    reply3 = spec(decoder, edited, 12, budget)
    assert decoder.stats.reused_tokens <= 3
    assert reply3 == plain(model, edited, 12)


def test_max_new_tokens_exact_and_stop_tokens_cut():
    model = tiny_model("qwen2")
    head = random_head(model)
    prompt = [1, 2, 3, 4]
    full = plain(model, prompt, 40)
    for n in (1, 2, 7, 13):
        decoder = Decoder(model, head, 512)
        decoder.drafter = OracleDrafter(head, decoder)
        assert spec(decoder, prompt, n, TreeBudget(8, 4, 2)) == full[:n]
        assert decoder.stop_reason == "length"
    stop = full[9]
    cut = full[: full.index(stop)]
    decoder = Decoder(model, head, 512)
    decoder.drafter = OracleDrafter(head, decoder)
    assert spec(decoder, prompt, 40, TreeBudget(8, 4, 2), stop=[stop]) == cut
    assert decoder.stop_reason == "stop"


def test_context_limit_stops_cleanly_and_prompt_too_long_is_an_error():
    from eaglechat.errors import ContextTooLong

    model = tiny_model("llama")
    head = random_head(model)
    decoder = Decoder(model, head, 24)
    out = spec(decoder, list(range(10)), 100, TreeBudget(8, 3, 4))
    assert decoder.stop_reason == "context"
    assert out == plain(model, list(range(10)), 100)[: len(out)]
    assert 10 + len(out) <= 25
    with pytest.raises(ContextTooLong):
        list(Decoder(model, head, 24).generate(list(range(30)), GenerationParams(), TreeBudget(), set()))


def test_cancel_stops_after_the_current_step():
    import threading

    model = tiny_model("llama")
    decoder = Decoder(model, random_head(model), 512)
    cancel = threading.Event()
    got = []
    for step in decoder.generate([1, 2, 3], GenerationParams(max_new_tokens=200), TreeBudget(8, 3, 4), set(), cancel):
        got += step.tokens
        cancel.set()
    assert decoder.stop_reason == "cancelled" and 1 <= len(got) < 10
