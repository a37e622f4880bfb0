"""speculate="auto": the engine rates plain decoding and a few tree budgets, probed interleaved, by what
whole replies pay (tokens per step, pessimistic, over the step time relative to plain's in the same probe
round) and keeps the best, re-probing at geometric spacing; a speculation record seeds it. Its plain steps
are true plain steps (the head does not run) and the drafter catches up on their features before it
drafts again. Switching at any step keeps greedy decoding exact, and the drafter ends up holding what it
would hold had it read every position."""

import itertools
import json
import math
import statistics

import pytest
import torch
from tiny_models import random_head, tiny_model
from torch._dynamo.testing import CompileCounterWithBackend
from torch.utils._python_dispatch import TorchDispatchMode

from eaglechat.engine.autospec import SpeculationChooser, arms_for, lighter, pessimistic_mean
from eaglechat.engine.compile import CompiledSteps
from eaglechat.engine.decode import Decoder
from eaglechat.engine.draft import BACKLOG_ROWS
from eaglechat.engine.protocol import GenerationParams, TreeBudget
from eaglechat.fit import speculation_records
from eaglechat.fit.hardware import DeviceInfo

BUDGET = TreeBudget(8, 3, 4)
SMALL = lighter(BUDGET)


def name(mode):
    return "plain" if mode is None else mode.label()


def drive(chooser, seconds, tokens, steps, load=lambda i: 1.0):
    """Feed the chooser `steps` steps: a step of arm X emits tokens[X] tokens (a number, or a function of
    the step's index) in seconds[X] * load(i) seconds; -> the arms' names, in the order run."""
    names = []
    for i in range(steps):
        mode = chooser.next()
        label = name(mode)
        emitted = tokens.get(label, 1)
        chooser.record(mode, emitted(i) if callable(emitted) else emitted, seconds[label] * load(i))
        names.append(label)
    return names


def test_the_arms_are_plain_the_budget_and_a_lighter_tree():
    assert arms_for(TreeBudget(12, 3, 4)) == [None, TreeBudget(12, 3, 4), TreeBudget(6, 2, 4)]
    assert lighter(TreeBudget(60, 6, 10)) == TreeBudget(30, 5, 10)
    assert lighter(TreeBudget(4, 2, 2)) == TreeBudget(2, 2, 2)
    assert lighter(TreeBudget(3, 2, 2)) is None and lighter(TreeBudget(kind="static")) is None
    small = lighter(TreeBudget(40, 2, 4))  # the pool of a 2-level tree holds 4 + 16 candidates
    assert small.total_tokens <= small.pool_size


def test_the_estimate_is_the_mean_less_one_standard_error():
    assert pessimistic_mean([1]) is None and pessimistic_mean([]) is None
    assert pessimistic_mean([2, 2, 2]) == 2.0
    assert pessimistic_mean([1, 3]) == pytest.approx(2 - statistics.stdev([1, 3]) / math.sqrt(2))  # = 1
    steps = [1, 3, 1, 3] * 16  # more steps: the same mean, a smaller allowance
    assert pessimistic_mean([1, 3, 1, 3]) < pessimistic_mean(steps) < 2


def test_probe_rounds_rotate_the_order_and_the_best_rated_arm_is_kept():
    chooser = SpeculationChooser(probe=4)
    chooser.start(arms_for(BUDGET))
    seconds = {"plain": 0.01, BUDGET.label(): 0.015, SMALL.label(): 0.012}
    tokens = {BUDGET.label(): 3, SMALL.label(): 2}
    ran = drive(chooser, seconds, tokens, 12)
    order = ["plain", BUDGET.label(), SMALL.label()]
    assert ran == order + order[1:] + order[:1] + order[2:] + order[:2] + order  # A B C, B C A, C A B, A B C
    # 3 tokens in 1.5 plain steps' time: 2.0; 2 tokens in 1.2: 1.67
    assert chooser.rating(BUDGET) == pytest.approx(2.0) and chooser.rating(SMALL) == pytest.approx(2 / 1.2)
    assert chooser.mode == BUDGET and chooser.label() == f"auto: on {BUDGET.label()} 2.0x"


def test_a_step_is_compared_with_the_plain_step_of_its_own_round_so_load_bursts_cancel():
    """Each round runs under a different load (x1, x6, x1, x9): the tree's steps take twice a plain step
    in every round, so its cost is 2.0 exactly, where a median over the arms' own steps would compare a
    tree step timed in a burst with plain steps timed out of it."""
    chooser = SpeculationChooser(probe=4)
    chooser.start([None, BUDGET])
    bursts = [1, 6, 1, 9]
    drive(chooser, {"plain": 0.01, BUDGET.label(): 0.02}, {BUDGET.label(): 3}, 8, load=lambda i: bursts[i // 2])
    assert list(chooser.costs[1]) == pytest.approx([2.0] * 4)
    assert chooser.rating(BUDGET) == pytest.approx(1.5) and chooser.mode == BUDGET


def test_a_tree_must_beat_plain_by_more_than_its_noise():
    """Steps of 1 and 3 tokens (mean 2, standard error 0.58 over 4 steps): at 1.5 plain steps' time the
    mean says 1.33x, the pessimistic rating 0.95x: plain is kept; at 1.3 both say faster."""
    for cost, verdict in ((1.5, None), (1.3, BUDGET)):
        flip = itertools.cycle([1, 3])
        chooser = SpeculationChooser(probe=4)
        chooser.start([None, BUDGET])
        drive(chooser, {"plain": 0.01, BUDGET.label(): 0.01 * cost}, {BUDGET.label(): lambda i: next(flip)}, 8)
        assert list(chooser.tokens[1]) == [1, 3, 1, 3] and chooser.mode == verdict
        assert chooser.rating(BUDGET) == pytest.approx((2 - statistics.stdev([1, 3, 1, 3]) / 2) / cost)
    assert chooser.label() == f"auto: on {BUDGET.label()} 1.1x"


def test_re_probes_come_at_geometric_spacing_and_a_change_resets_it():
    chooser = SpeculationChooser(probe=4, reprobe=2, recheck=64, max_recheck=1024)
    chooser.start([None, BUDGET])
    seconds, tokens = {"plain": 0.01, BUDGET.label(): 0.03}, {BUDGET.label(): 2}  # plain wins: 2 tokens in 3x
    ran = drive(chooser, seconds, tokens, 8 + 64 + 4 + 128 + 4 + 256 + 4 + 512 + 4 + 1024 + 4 + 1024 + 4)
    trees = [i for i, label in enumerate(ran) if label != "plain"]
    probes = [trees[0]] + [b for a, b in zip(trees, trees[1:]) if b - a > 8]  # the first tree step of each probe
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == [8 + 64, 4 + 128, 4 + 256, 4 + 512, 4 + 1024, 4 + 1024]  # 64, 128 ... 1024, then 1024 again
    assert len(trees) == 4 + 6 * 2  # the first probe has 4 rounds, re-probes 2
    # the tree starts paying (a text it drafts well, a machine where verifying is cheap): once the probes'
    # steps outweigh the old ones the tree is taken, and the spacing starts over
    tokens[BUDGET.label()], seconds[BUDGET.label()] = 5, 0.01
    for _ in range(3 * (1024 + 4)):
        drive(chooser, seconds, tokens, 1)
        if chooser.mode == BUDGET:
            break
    assert chooser.mode == BUDGET and chooser.recheck == 64


def test_a_tree_the_probe_flattered_is_dropped_after_settle_steps():
    """The probe's four steps of a tree accepted 3 tokens each (the best of a few noisy means flatters
    the tree it picks); running, it emits 1 per step. Its rating falls below plain's within `settle`
    steps, and plain takes over then, not at the next probe 64 steps later."""
    chooser = SpeculationChooser(probe=4, recheck=64, settle=8)
    chooser.start([None, BUDGET])
    ran = drive(chooser, {"plain": 0.01, BUDGET.label(): 0.015}, {BUDGET.label(): lambda i: 3 if i < 8 else 1}, 32)
    assert ran[:8] == ["plain", BUDGET.label(), BUDGET.label(), "plain"] * 2
    assert ran[8:16] == [BUDGET.label()] * 8 and ran[16:] == ["plain"] * 16
    assert chooser.label().startswith("auto: off") and chooser.recheck == 64


def test_other_arms_start_afresh_and_the_same_arms_keep_what_was_measured():
    chooser = SpeculationChooser(probe=2)
    chooser.start(arms_for(BUDGET))
    drive(chooser, {"plain": 0.001, BUDGET.label(): 0.01, SMALL.label(): 0.015}, {}, 6)
    assert chooser.mode is None
    chooser.start(arms_for(BUDGET))  # the next turn: kept
    assert chooser.mode is None and chooser.label().startswith("auto: off")
    chooser.start(arms_for(TreeBudget(4, 2, 4)))  # a smaller budget (after an out-of-memory): measured again
    assert chooser.label() == "auto" and chooser.queue


def test_a_record_seeds_the_choice_and_the_first_probe_waits_and_then_rules():
    record = {BUDGET.label(): {"tokens_per_step": 1.9, "cost": 2.4}, SMALL.label(): {"tokens_per_step": 1.6, "cost": 1.7}}
    chooser = SpeculationChooser(probe=4, recheck=64)
    chooser.seed(record)
    chooser.start(arms_for(BUDGET))
    assert chooser.mode is None and not chooser.queue and chooser.label() == "auto: off 0.9x"  # 1.6 / 1.7
    seconds = {"plain": 0.01, BUDGET.label(): 0.012, SMALL.label(): 0.011}
    ran = drive(chooser, seconds, {BUDGET.label(): 3, SMALL.label(): 2}, 64 + 12)
    assert ran[:64] == ["plain"] * 64  # no probe before `recheck` steps
    assert len(set(ran[64:])) == 3  # then the full probe (no ratio of its own yet), and what it measured rules
    assert chooser.mode == BUDGET and chooser.rating(BUDGET) == pytest.approx(2.5)
    # a record that favours a tree starts on it; an empty one probes at once
    chooser.seed({SMALL.label(): {"tokens_per_step": 2.0, "cost": 1.25}})
    assert chooser.mode == SMALL and not chooser.queue
    chooser.seed({})
    assert chooser.label() == "auto" and chooser.queue


def machine():
    return DeviceInfo(kind="cpu", name="test CPU", total_bytes=8 << 30, free_bytes=8 << 30, cpu_cores=2)


def test_the_record_is_written_read_back_and_a_damaged_one_kept_not_overwritten(tmp_path):
    arms = {"12/3/4": {"tokens_per_step": 1.9, "cost": 2.4}}
    assert speculation_records.load(machine(), "smollm2-135m", "none", tmp_path) == {}
    path = speculation_records.save(machine(), "smollm2-135m", "none", arms, tmp_path, load={"load1": 0.5})
    assert speculation_records.load(machine(), "smollm2-135m", "none", tmp_path) == arms
    assert json.loads(path.read_text())["load"] == {"load1": 0.5}
    path.write_text('{"arms": {"12/3/4": {"tokens_per_step": 1.9', encoding="utf-8")  # half written
    assert speculation_records.load(machine(), "smollm2-135m", "none", tmp_path) == {}  # no record, no failure
    told = []
    speculation_records.save(machine(), "smollm2-135m", "none", arms, tmp_path, notice=told.append)
    kept = [p for p in tmp_path.iterdir() if ".unreadable-" in p.name]
    assert len(kept) == 1 and kept[0].read_text().startswith('{"arms": {"12/3/4": {"tokens') and str(kept[0]) in told[0]
    assert speculation_records.load(machine(), "smollm2-135m", "none", tmp_path) == arms


@pytest.mark.parametrize("arms", [[], {"12/3/4": 2}, {"12/3/4": {"tokens_per_step": 1.9}},
                                  {"12/3/4": {"tokens_per_step": 1.9, "cost": -1}},
                                  {"12/3/4": {"tokens_per_step": True, "cost": 2.0}}])
def test_a_record_that_makes_no_sense_is_refused_in_one_line(tmp_path, arms):
    with pytest.raises(speculation_records.RecordError, match="arms"):
        speculation_records.save(machine(), "m", "none", arms, tmp_path)
    path = speculation_records.record_path(machine(), "m", "none", tmp_path)
    path.write_text(json.dumps({"arms": arms}), encoding="utf-8")
    with pytest.raises(speculation_records.RecordError, match=str(path.name)):
        speculation_records.read(path)


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
    assert_drafter_holds_a_prefill(decoder, model, head)


def assert_drafter_holds_a_prefill(decoder, model, head):
    """After catching up, the drafter's KV equals what one prefill of the decoder's tokens writes."""
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


def test_eager_plain_steps_and_the_prompt_leave_the_head_alone_until_a_speculative_step(llama):
    """Eager: the prompt and a plain stretch longer than the compiled steps' backlog wait; the speculative
    step after them reads them all, in head forwards of at most a prefill chunk."""
    model, head = llama
    decoder = Decoder(model, head, 512, prefill_chunk=32)
    stretch = BACKLOG_ROWS + 10
    decoder.chooser = Scripted([0] * stretch + [1])
    calls = count_head_calls(head)
    prompt = [3, 1, 4]
    try:
        steps = decoder.generate(prompt, GenerationParams(max_new_tokens=stretch + 4, speculate="auto"), BUDGET, set())
        for _ in range(stretch + 1):  # the prompt and the first token, then the plain steps
            next(steps)
        assert calls == [] and decoder.drafter.behind == len(prompt) + stretch  # the head has not run at all
        next(steps)  # the speculative step
    finally:
        del head.forward
    assert calls[:3] == [32, 32, len(prompt) + stretch - 64]  # the catch-up, then the step drafts
    assert decoder.drafter.behind == 0 and decoder.drafter.stable == decoder.cache.length


def test_compiled_plain_steps_keep_features_in_the_backlog_and_a_full_one_is_read_in_one_forward(llama):
    model, head = llama
    decoder = Decoder(model, head, 512)
    decoder.use(CompiledSteps(decoder, lambda fn: torch.compile(fn, backend="eager", fullgraph=True, dynamic=False)))
    decoder.chooser = Scripted([0] * (BACKLOG_ROWS + 10) + [1])
    rows = []
    extend = decoder.drafter.extend
    decoder.drafter.extend = lambda features, *a, **k: rows.append(features.shape[0]) or extend(features, *a, **k)
    try:
        out = [t for s in decoder.generate([3, 1, 4], GenerationParams(max_new_tokens=BACKLOG_ROWS + 8, speculate="auto"),
                                           BUDGET, set()) for t in s.tokens]
    finally:
        del decoder.drafter.extend
        torch._dynamo.reset()
    assert rows == [3, BACKLOG_ROWS]  # the prompt at once, then a full backlog in one forward
    assert out == plain_reply(model, [3, 1, 4], BACKLOG_ROWS + 8)


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
    # what waited over both turns (the last turn's plain steps, the new prompt, this turn's) reads as a prefill
    assert_drafter_holds_a_prefill(decoder, model, head)


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


class StepOps(TorchDispatchMode):
    """The aten ops a generation runs after its prompt was read, in order."""

    def __init__(self):
        super().__init__()
        self.ops, self.on = [], False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.on:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def decode_ops(decoder, prompt, params):
    """The ops of the steps (what runs after the first token is shown), and the tokens."""
    counter = StepOps()
    with counter:
        steps = decoder.generate(prompt, params, BUDGET, set())
        tokens = list(next(steps).tokens)
        counter.on = True
        tokens += [t for s in steps for t in s.tokens]
    return counter.ops, tokens


def always_plain(model, head):
    decoder = Decoder(model, head, 512)
    decoder.chooser = Scripted([0])  # under auto: plain at every step
    return decoder


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "sampling"])
def test_an_eager_plain_step_under_auto_is_plain_decodings_step_op_for_op_with_the_same_reads(llama, sampling):
    """What auto's plain stretch costs the device and the host: exactly what plain decoding costs (the
    feature it keeps is a reference to the step's own output)."""
    from sync_counter import count_decode

    model, head = llama
    extra = dict(temperature=0.8, top_p=0.9, seed=5) if sampling else {}
    runs = {}
    for speculate in (False, "auto"):
        params = GenerationParams(max_new_tokens=24, speculate=speculate, **extra)
        ops, tokens = decode_ops(always_plain(model, head), [3, 1, 4, 1, 5], params)
        counter, _ = count_decode(always_plain(model, head), [3, 1, 4, 1, 5], params, BUDGET)
        runs[speculate] = ops, tokens, counter.where("reads", "decode"), counter.count("uploads", "decode")
    assert runs["auto"][1] == runs[False][1] and len(runs[False][1]) == 24
    assert runs["auto"][0] == runs[False][0]  # the same aten ops, in the same order
    assert runs["auto"][2:] == runs[False][2:]  # the same host reads (one per step), no uploads


def test_between_probes_the_drafter_does_no_work(llama):
    """The real chooser, seeded with a record that rates every tree under plain: it runs plain and probes
    after `recheck` steps. Until the probe, the head never runs (not for the prompt either); afterwards it
    runs only for speculative steps (the catch-up before one included)."""
    model, head = llama
    decoder = Decoder(model, head, 512)
    decoder.chooser = SpeculationChooser(recheck=40)
    decoder.chooser.seed({name(mode): {"tokens_per_step": 1.0, "cost": 3.0} for mode in arms_for(BUDGET)[1:]})
    calls = count_head_calls(head)
    per_step = []  # (tree size, head forwards since the previous step)
    try:
        seen = 0
        for step in decoder.generate([3, 1, 4, 1, 5], GenerationParams(max_new_tokens=90, speculate="auto"), BUDGET, set()):
            if step.stats is None:
                assert calls == []  # the prompt was read and the head did not run
                continue
            per_step.append((step.stats.tree_size, len(calls) - seen))
            seen = len(calls)
    finally:
        del head.forward
    assert all(size == 1 and not forwards for size, forwards in per_step[:40])  # the seeded choice: plain
    assert any(size > 1 for size, _ in per_step[40:])  # then the probe
    assert all(forwards == 0 for size, forwards in per_step if size == 1)  # a plain step never runs the head
