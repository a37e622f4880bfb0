"""speculate="auto": the engine measures plain decoding and a few tree budgets interleaved and keeps the
fastest, re-checking as load changes; its plain steps are true plain steps (the head does not run) and
the drafter catches up on their features before it drafts again. Switching at any step keeps greedy
decoding exact, and the drafter ends up holding what it would hold had it read every position."""

import pytest
import torch
from tiny_models import random_head, tiny_model
from torch._dynamo.testing import CompileCounterWithBackend

from eaglechat.engine.autospec import SpeculationChooser, arms_for, lighter
from eaglechat.engine.compile import CompiledSteps
from eaglechat.engine.decode import Decoder
from eaglechat.engine.draft import BACKLOG_ROWS
from eaglechat.engine.protocol import GenerationParams, TreeBudget

BUDGET = TreeBudget(8, 3, 4)
SMALL = lighter(BUDGET)


def drive(chooser, seconds_per_token, steps):
    """Feed the chooser steps whose speed per mode comes from seconds_per_token[label]; -> labels run."""
    labels = []
    for _ in range(steps):
        mode = chooser.next()
        label = "plain" if mode is None else mode.label()
        tokens = 1 if mode is None else 3
        chooser.record(mode, tokens, tokens * seconds_per_token[label])
        labels.append(label)
    return labels


def test_the_arms_are_plain_the_budget_and_a_lighter_tree():
    assert arms_for(TreeBudget(12, 3, 4)) == [None, TreeBudget(12, 3, 4), TreeBudget(6, 2, 4)]
    assert lighter(TreeBudget(60, 6, 10)) == TreeBudget(30, 5, 10)
    assert lighter(TreeBudget(4, 2, 2)) == TreeBudget(2, 2, 2)
    assert lighter(TreeBudget(3, 2, 2)) is None and lighter(TreeBudget(kind="static")) is None
    small = lighter(TreeBudget(40, 2, 4))  # the pool of a 2-level tree holds 4 + 16 candidates
    assert small.total_tokens <= small.pool_size


def test_probes_every_arm_interleaved_keeps_the_fastest_and_backs_off_while_it_holds():
    chooser = SpeculationChooser(probe=4, recheck=16, max_recheck=64)
    chooser.start(arms_for(BUDGET))
    speeds = {"plain": 0.02, BUDGET.label(): 0.01, SMALL.label(): 0.015}
    first = drive(chooser, speeds, 12)
    assert first == ["plain", SMALL.label(), BUDGET.label()] * 4  # A B C A B C: load hits all alike
    assert chooser.mode == BUDGET and chooser.label() == f"auto: on {BUDGET.label()} 2.0x"
    # confirmed choices wait twice as long before the next probe: 16, then 32, then 64 (the cap)
    later = drive(chooser, speeds, 16 + 12 + 32 + 12 + 64 + 12 + 64)
    probes = [i for i, label in enumerate(later) if label == "plain"]
    assert [probes[0], probes[4], probes[8]] == [16, 16 + 12 + 32, 16 + 12 + 32 + 12 + 64]
    assert later.count("plain") == 12 and chooser.recheck == 64


def test_a_change_of_load_is_noticed_within_settle_steps_and_at_the_next_probe():
    chooser = SpeculationChooser(probe=4, recheck=20, settle=8)
    chooser.start(arms_for(BUDGET))
    drive(chooser, {"plain": 0.02, BUDGET.label(): 0.01, SMALL.label(): 0.015}, 12)
    # speculation becomes slower (another program takes the CPU): after `settle` steps the choice is
    # slower than the small tree as last measured, which takes over at once; after its `settle` steps
    # plain does, the wait reset each time; the next probe confirms plain; later the small tree wins one
    loaded = {"plain": 0.02, BUDGET.label(): 0.05, SMALL.label(): 0.04}
    ran = drive(chooser, loaded, 8 + 8 + 20 + 12)
    assert ran[:16] == [BUDGET.label()] * 8 + [SMALL.label()] * 8 and ran[16:36] == ["plain"] * 20
    assert chooser.mode is None and chooser.label() == "auto: off 0.5x" and chooser.recheck == 40
    drive(chooser, {"plain": 0.02, BUDGET.label(): 0.05, SMALL.label(): 0.005}, 40 + 12)
    assert chooser.mode == SMALL and chooser.recheck == 20


def test_a_tree_the_probe_flattered_is_dropped_after_settle_steps():
    """The probe's four steps of a tree accepted 3 tokens each (the best of a few noisy means flatters
    the tree it picks); running, it accepts 1 per step. Its mean over all its steps falls below plain's
    after `settle` steps, and plain takes over then, not at the next probe 64 steps later."""
    chooser = SpeculationChooser(probe=4, recheck=64, settle=8)
    chooser.start([None, BUDGET])
    labels = []
    for step in range(8 + 24):
        mode = chooser.next()
        if mode is None:
            chooser.record(None, 1, 0.01)
        else:
            chooser.record(mode, 3 if step < 8 else 1, 0.02)
        labels.append("plain" if mode is None else "tree")
    assert labels[:8] == ["plain", "tree"] * 4
    assert labels[8:16] == ["tree"] * 8 and labels[16:] == ["plain"] * 16
    assert chooser.label() == "auto: off 0.8x"  # (4 x 3 + 8 x 1) / 12 tokens per 0.02 s, over 100 tok/s


def test_speed_is_mean_tokens_per_step_over_the_median_step_time():
    """A tree's steps take the same time but emit 1 or 4 tokens: 1, 1, 1, 4, 4 in 0.02 s each is 110
    tokens/s (the median of per-step rates would say 50), faster than plain's 100."""
    chooser = SpeculationChooser(probe=5, recheck=100)
    chooser.start([None, BUDGET])
    emitted = iter([1, 1, 1, 4, 4])
    for _ in range(10):
        mode = chooser.next()
        chooser.record(mode, 1, 0.01) if mode is None else chooser.record(mode, next(emitted), 0.02)
    assert chooser.rate(BUDGET) == pytest.approx(110.0) and chooser.rate(None) == pytest.approx(100.0)
    assert chooser.mode == BUDGET and chooser.label() == f"auto: on {BUDGET.label()} 1.1x"
    # a stall in one step moves the median time, not the figure
    chooser.start([None, TreeBudget(4, 2, 4)])
    for seconds in (0.01, 0.01, 3.0, 0.01, 0.01):
        chooser.record(None, 1, seconds)
    assert chooser.rate(None) == pytest.approx(100.0)


def test_a_tree_must_beat_plain_by_the_margin():
    chooser = SpeculationChooser(probe=2, recheck=8)
    chooser.start([None, BUDGET])
    drive(chooser, {"plain": 0.010, BUDGET.label(): 0.0098}, 4)  # 2 % faster: within the noise
    assert chooser.mode is None and chooser.label() == "auto: off 1.0x"
    drive(chooser, {"plain": 0.010, BUDGET.label(): 0.009}, 8 + 4)  # 11 % faster
    assert chooser.mode == BUDGET


def test_other_arms_start_afresh_and_the_same_arms_keep_what_was_measured():
    chooser = SpeculationChooser(probe=2, recheck=8)
    chooser.start(arms_for(BUDGET))
    drive(chooser, {"plain": 0.001, BUDGET.label(): 0.01, SMALL.label(): 0.015}, 6)
    assert chooser.mode is None
    chooser.start(arms_for(BUDGET))  # the next turn: kept
    assert chooser.mode is None and chooser.label().startswith("auto: off")
    chooser.start(arms_for(TreeBudget(4, 2, 4)))  # a smaller budget (after an out-of-memory): measured again
    assert chooser.label() == "auto" and chooser.queue


class Scripted(SpeculationChooser):
    """The real chooser's bookkeeping, with modes from a script (plain stretches longer than the backlog,
    switches at every step): the switch patterns timing alone would rarely produce."""

    def __init__(self, script):
        super().__init__()
        self.script, self.i = script, 0

    def next(self):
        pick = self.script[self.i % len(self.script)]
        self.i += 1
        return self.arms[pick]


def plain_reply(model, prompt, n):
    decoder = Decoder(model, None, 512)
    params = GenerationParams(max_new_tokens=n, speculate=False)
    return [t for s in decoder.generate(prompt, params, TreeBudget(), set()) for t in s.tokens]


@pytest.fixture(scope="module")
def llama():
    model = tiny_model("llama")
    return model, random_head(model)


def count_head_calls(head):
    calls = []
    original = head.forward
    head.forward = lambda *a, **k: calls.append(a[0].shape[1]) or original(*a, **k)
    return calls


@pytest.mark.parametrize("script", [[0, 1, 2], [0] * 70 + [1], [0, 0, 2, 1, 1]],
                         ids=["every-step", "backlog-full", "stretches"])
def test_switching_modes_stays_exact_and_the_drafter_holds_what_a_prefill_gives(llama, script):
    model, head = llama
    decoder = Decoder(model, head, 512)
    decoder.chooser = Scripted(script)
    prompt = [3, 1, 4, 1, 5]
    steps = list(decoder.generate(prompt, GenerationParams(max_new_tokens=110, speculate="auto"), BUDGET, set()))
    assert [t for s in steps for t in s.tokens] == plain_reply(model, prompt, 110)
    sizes = {s.stats.tree_size for s in steps if s.stats}
    assert 1 in sizes and sizes - {1}  # plain and speculative steps both ran
    # the acceptance histogram counts the speculative steps only (plain ones drafted nothing)
    assert sum(decoder.stats.accepted_hist) == sum(1 for s in steps if s.stats and s.stats.tree_size > 1)
    # the drafter's cache: each position read from its verified feature, as one prefill of the same
    # tokens writes it (plain stretches caught up in batches, speculative steps one path at a time)
    if decoder.drafter.behind:
        decoder.drafter.catch_up()
    held = decoder.drafter.stable
    assert held == decoder.cache.length
    fresh = Decoder(model, head, 512)
    for _ in fresh.read_prompt(decoder.cached_ids, 0, True, lambda logits: logits.argmax(-1)):
        pass
    assert fresh.drafter.stable >= held
    torch.testing.assert_close(decoder.drafter.kv.k[..., :held, :], fresh.drafter.kv.k[..., :held, :])
    torch.testing.assert_close(decoder.drafter.kv.v[..., :held, :], fresh.drafter.kv.v[..., :held, :])


def test_plain_steps_leave_the_head_alone_until_it_catches_up_in_one_forward(llama):
    model, head = llama
    decoder = Decoder(model, head, 512)
    decoder.chooser = Scripted([0] * (BACKLOG_ROWS + 10) + [1])
    calls = count_head_calls(head)
    try:
        steps = decoder.generate([3, 1, 4], GenerationParams(max_new_tokens=BACKLOG_ROWS + 8, speculate="auto"),
                                 BUDGET, set())
        next(steps)  # the prompt is read (the head reads it too) and the first token shown
        prefill = len(calls)
        for _ in range(BACKLOG_ROWS):  # plain steps, one token each
            next(steps)
        assert len(calls) == prefill  # no head forward in any of them
        list(steps)
    finally:
        del head.forward
    assert calls[prefill] == BACKLOG_ROWS and len(calls) == prefill + 1  # a full backlog: read in one forward


def test_a_next_turn_reuses_the_prefix_a_plain_stretch_left_behind(llama):
    model, head = llama
    decoder = Decoder(model, head, 512)
    decoder.chooser = Scripted([1] + [0] * 20)  # ends the turn on plain steps: the drafter is behind
    first = [t for s in decoder.generate([7, 8, 9], GenerationParams(max_new_tokens=12, speculate="auto"), BUDGET,
                                         set()) for t in s.tokens]
    assert decoder.drafter.behind > 0
    history = decoder.cached_ids[:]
    prompt = history + [5, 6]
    second = list(decoder.generate(prompt, GenerationParams(max_new_tokens=12, speculate="auto"), BUDGET, set()))
    assert decoder.stats.reused_tokens == len(history) - 1  # all but the last one (a prompt token is recomputed)
    assert first == plain_reply(model, [7, 8, 9], 12)
    assert [t for s in second for t in s.tokens] == plain_reply(model, prompt, 12)


def test_auto_compiles_one_graph_per_arm_and_no_more_over_many_steps(llama):
    torch._dynamo.reset()
    model, head = llama
    decoder = Decoder(model, head, 128)
    counter = CompileCounterWithBackend("eager")
    decoder.use(CompiledSteps(decoder, lambda fn: torch.compile(fn, backend=counter, fullgraph=True, dynamic=False)))
    decoder.chooser = Scripted([0, 1, 2, 0, 0])
    out = [t for s in decoder.generate([1, 2, 3], GenerationParams(max_new_tokens=40, speculate="auto"), BUDGET,
                                       set()) for t in s.tokens]
    assert out == plain_reply(model, [1, 2, 3], 40)
    assert counter.frame_count == 3  # the plain step that keeps features, the budget's tree, the lighter one
    torch._dynamo.reset()


def test_sampling_under_switching_modes_matches_the_target_distribution():
    """Plain steps, a catch-up and tree rejection sampling from the caught-up drafter, mixed: the 2nd and
    3rd tokens follow the target's joint distribution (the chi-square test of test_engine_sampling)."""
    from test_engine_sampling import PROMPT, V, chi2_pvalue, exact_joint, sampling_model

    model = sampling_model()
    params = GenerationParams(temperature=1.0, max_new_tokens=3, speculate="auto")
    joint = exact_joint(model, params)
    decoder = Decoder(model, random_head(model, seed=3), 64)
    decoder.chooser = Scripted([0, 1, 1, 0, 2])
    counts = torch.zeros(V, V)
    for seed in range(600):
        params.seed = seed
        out = [t for s in decoder.generate(PROMPT, params, TreeBudget(10, 3, 3), set()) for t in s.tokens]
        counts[out[1], out[2]] += 1
    assert chi2_pvalue(counts, joint) > 1e-3
