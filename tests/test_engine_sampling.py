"""Sampling with EAGLE follows the target distribution (EAGLE-2, arXiv:2406.16858), checked statistically.

A tiny model with an 8-token vocabulary; the exact joint distribution of the 2nd and 3rd generated
tokens (both decided by tree verification) is computed by enumeration and compared with EAGLE
samples by a chi-square test. A plausible wrong acceptance rule must fail the same test.
"""


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare
from tiny_models import ARCHITECTURES_KWARGS, build_model, random_head
from transformers import AutoConfig, LlamaConfig

from eaglechat.engine import verify
from eaglechat.engine.decode import Decoder
from eaglechat.engine.protocol import GenerationParams, TreeBudget
from eaglechat.engine.rng import CounterRNG
from eaglechat.engine.sampling import penalize, sample, target_probs

V = 8
PROMPT = [1, 5, 2]
N_SAMPLES = 800  # p-values are uniform under the null at any n; 800 keeps the wrong rule below 1e-6 (its test)


SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
             max_position_embeddings=64)


def sampling_model(num_layers: int = 1, family: str = "llama"):
    """A seeded model over V tokens whose next-token distributions are neither uniform nor one-hot: a Llama,
    or 2 layers of one of the 2026 architectures (tests/tiny_models.py) with its window shorter than PROMPT."""
    if family == "llama":
        cfg = LlamaConfig(**SMALL, num_hidden_layers=num_layers)
    else:
        kwargs = {**ARCHITECTURES_KWARGS[family], "num_hidden_layers": 2, "head_dim": 16}
        if "sliding_window" in kwargs:
            kwargs["sliding_window"] = 2
        cfg = AutoConfig.for_model(family, **{**SMALL, "max_position_embeddings": 512}, **kwargs)
    m = build_model(cfg, seed=7)
    with torch.no_grad():
        m.lm_head.weight.mul_(12.0)  # spread the distribution
    return m


@pytest.fixture(scope="module")
def model():
    return sampling_model()


def processed(logits, params, contexts):
    """target_probs of each row of logits, after the repetition penalty over that row's context."""
    if params.repetition_penalty != 1.0:
        seen = torch.zeros(len(contexts), V, dtype=torch.bool)
        for row, context in enumerate(contexts):
            seen[row, context] = True
        logits = penalize(logits, seen, params.repetition_penalty)
    return target_probs(logits, params)


def exact_joint(model, params):
    """p(x2, x3) = sum over x1 of p(x1) p(x2|x1) p(x3|x1,x2), with the same processing as decoding."""
    joint = torch.zeros(V, V, dtype=torch.float64)
    with torch.no_grad():
        p1 = processed(model(torch.tensor([PROMPT])).logits[0, -1:], params, [PROMPT])[0].double()
        for x1 in range(V):
            p2 = processed(model(torch.tensor([PROMPT + [x1]])).logits[0, -1:], params, [PROMPT + [x1]])[0].double()
            seqs = [PROMPT + [x1, x2] for x2 in range(V)]
            p3 = processed(model(torch.tensor(seqs)).logits[:, -1], params, seqs).double()
            joint += p1[x1] * p2[:, None] * p3
    return joint


def eagle_counts(model, params, n=N_SAMPLES, draft_vocab=None):
    head = random_head(model, seed=3)
    if draft_vocab is not None:  # drafting from a few tokens only (eaglechat/models/draft_vocab.py)
        head.set_draft_vocab(draft_vocab)
    decoder = Decoder(model, head, 64)
    counts = torch.zeros(V, V)
    budget = TreeBudget(total_tokens=10, depth=3, draft_top_k=3)
    for seed in range(n):
        params.seed = seed
        out = [t for s in decoder.generate(PROMPT, params, budget, set()) for t in s.tokens]
        counts[out[1], out[2]] += 1
    return counts


def chi2_pvalue(counts, joint):
    expected = joint.flatten().numpy() * counts.sum().item()
    observed = counts.flatten().numpy()
    keep = expected >= 5
    obs = list(observed[keep]) + [observed[~keep].sum()]
    exp = list(expected[keep]) + [expected[~keep].sum()]
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    scale = sum(obs) / sum(exp)
    return chisquare(obs, [e * scale for e in exp]).pvalue


@pytest.mark.parametrize("temperature,top_p,min_p,penalty,draft_vocab",
                         [(0.7, 1.0, 0.0, 1.0, None), (1.0, 1.0, 0.0, 1.0, [0, 2, 3, 6]), (0.7, 0.9, 0.0, 1.5, None),
                          (1.0, 0.9, 0.05, 1.0, None)])
def test_eagle_sampling_matches_target_distribution(model, temperature, top_p, min_p, penalty, draft_vocab):
    """Also with a head that drafts from 4 of the 8 tokens: the other 4 are emitted only as bonus tokens,
    at their target probability all the same."""
    params = GenerationParams(temperature=temperature, top_p=top_p, min_p=min_p, repetition_penalty=penalty,
                              max_new_tokens=3)
    joint = exact_joint(model, params)
    assert joint.max() < 0.5 and (joint > 0.01).sum() >= 8  # a distribution worth testing
    counts = eagle_counts(model, params, draft_vocab=draft_vocab)
    p = chi2_pvalue(counts, joint)
    print(f"T={temperature} top_p={top_p} min_p={min_p} penalty={penalty}: chi-square p-value {p:.3f}")
    assert p > 1e-3


@pytest.mark.parametrize("family", ["gpt_oss", "qwen3_5_text"])
def test_eagle_sampling_matches_target_distribution_per_architecture(family):
    """The 2026 architectures whose verify differs beyond the logits (attention sinks and sliding layers;
    recurrent state kept at the sampled node): the same chi-square test, at one setting."""
    model = sampling_model(family=family)
    params = GenerationParams(temperature=1.0, top_p=1.0, max_new_tokens=3)
    joint = exact_joint(model, params)
    assert joint.max() < 0.5 and (joint > 0.01).sum() >= 8
    p = chi2_pvalue(eagle_counts(model, params, n=300), joint)
    print(f"{family}: chi-square p-value {p:.3f}")
    assert p > 1e-3


def wrong_accept(tree, logits, params, rng):
    """A classic bug: SpecInfer's min(1, p/q) with the draft treated as uniform over its candidates.
    Same contract as verify.sample_accept: -> (last accepted node [1], bonus token [1])."""
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    node = 0
    while True:
        p = target_probs(logits[node], params)
        children = [c for c in range(tree.size) if parents[c] == node]
        accepted = None
        for child in children:
            q = 1.0 / len(children)
            if float(rng.uniform(())) < min(1.0, float(p[tokens[child]]) / q):
                accepted = child
                break
            p = torch.clamp(p - torch.nn.functional.one_hot(torch.tensor(tokens[child]), V) * q, min=0)
            p = p / p.sum()
        if accepted is None:
            return torch.tensor([node]), sample(p, rng).reshape(1)
        node = accepted


def test_a_wrong_acceptance_rule_fails_the_same_test(model, monkeypatch):
    params = GenerationParams(temperature=1.0, top_p=1.0, max_new_tokens=3)
    joint = exact_joint(model, params)
    monkeypatch.setattr(verify, "sample_accept", wrong_accept)
    counts = eagle_counts(model, params, n=800)
    p = chi2_pvalue(counts, joint)
    print(f"wrong rule: chi-square p-value {p:.2e}")
    assert p < 1e-6


def test_seeded_sampling_is_reproducible(model):
    decoder = Decoder(model, random_head(model, seed=3), 64)
    params = GenerationParams(temperature=1.0, max_new_tokens=12, seed=1234)
    runs = [[t for s in decoder.generate(PROMPT, params, TreeBudget(10, 3, 3), set()) for t in s.tokens] for _ in range(2)]
    assert runs[0] == runs[1]


def test_min_p_keeps_tokens_within_a_share_of_the_most_likely():
    probs = target_probs(torch.log(torch.tensor([0.5, 0.3, 0.14, 0.06])), GenerationParams(temperature=1.0, min_p=0.25))
    assert probs.tolist() == pytest.approx([0.5 / 0.94, 0.3 / 0.94, 0.14 / 0.94, 0.0])


@pytest.mark.parametrize("change", [{"top_p": 1e-300}, {"top_p": 1e-45}, {"min_p": 1.0}, {"temperature": 1e-40},
                                    {"temperature": 5e-324}])
def test_degenerate_sampling_values_keep_the_most_likely_token(model, change):
    """A top_p that rounds to 0 in fp32, min_p 1 and temperatures near 0 decode greedily, never NaN."""
    from eaglechat.engine.sampling import next_token

    logits = model(torch.tensor([PROMPT])).logits[0, -1].detach()
    params = GenerationParams(**{"temperature": 1.0, **change})
    assert int(next_token(logits, params, CounterRNG(seed=0))) == int(logits.argmax())
    if params.temperature >= 1e-5:
        assert torch.isfinite(target_probs(logits, params)).all()


@settings(derandomize=True, max_examples=200, deadline=None)
@given(temperature=st.one_of(st.floats(0.0, 2.0), st.sampled_from([5e-324, 1e-40, 1e-5, 1e-6])),
       top_p=st.one_of(st.floats(0.0, 1.0, exclude_min=True), st.sampled_from([1e-300, 5e-324, 1e-45])),
       top_k=st.integers(0, V + 2), min_p=st.one_of(st.floats(0.0, 1.0), st.sampled_from([1e-300, 1.0])),
       seed=st.integers(0, 2**64 - 1))
def test_every_valid_sampling_setting_leaves_a_distribution(temperature, top_p, top_k, min_p, seed):
    """Any setting the server or the CLI accepts gives a finite distribution with the chosen token in it."""
    from eaglechat.engine.sampling import is_greedy, next_token

    logits = torch.tensor([3.0, 2.5, -1.0, 0.0, 7.0, 7.0, -30.0, 1e-3])
    params = GenerationParams(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p)
    token = int(next_token(logits, params, CounterRNG(seed=seed)))
    if is_greedy(params):
        assert token in (4, 5)
        return
    probs = target_probs(logits, params)
    assert torch.isfinite(probs).all() and float(probs.sum()) == pytest.approx(1.0, abs=1e-5)
    assert probs[token] > 0
