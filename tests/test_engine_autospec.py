"""speculate="auto": the engine measures both modes interleaved and keeps the faster, re-checking as load
changes; switching between them at any step keeps greedy decoding exact."""

import torch
from tiny_models import random_head, tiny_model

from eaglechat.engine.autospec import SpeculationChooser
from eaglechat.engine.decode import Decoder
from eaglechat.engine.protocol import GenerationParams, TreeBudget


def drive(chooser, seconds_per_token, steps):
    """Feed the chooser steps whose speed per mode comes from seconds_per_token[mode]; -> modes run."""
    modes = []
    for _ in range(steps):
        mode = chooser.next()
        tokens = 3 if mode else 1
        chooser.record(mode, tokens, tokens * seconds_per_token[mode])
        modes.append(mode)
    return modes


def test_probes_both_interleaved_then_keeps_the_faster_and_rechecks_when_load_changes():
    chooser = SpeculationChooser(probe=4, recheck=20)
    modes = drive(chooser, {True: 0.01, False: 0.02}, 8)
    assert modes == [True, False] * 4  # A B A B
    assert chooser.choice is True and chooser.label() == "auto: on 2.0x"
    assert drive(chooser, {True: 0.01, False: 0.02}, 20) == [True] * 20
    # speculation becomes slower (another program takes the CPU): the next probe notices it
    later = drive(chooser, {True: 0.05, False: 0.02}, 60)
    assert False in later[:6] and later.count(False) >= 50 and chooser.label().startswith("auto: off")


def test_switching_modes_step_by_step_stays_exact():
    model = tiny_model("llama")
    decoder = Decoder(model, random_head(model), 256)
    decoder.chooser = SpeculationChooser(probe=2, recheck=3)  # switches every few steps
    prompt = [3, 1, 4, 1, 5]
    steps = list(decoder.generate(prompt, GenerationParams(max_new_tokens=50, speculate="auto"), TreeBudget(8, 3, 4),
                                  set()))
    plain = Decoder(model, None, 256)
    expected = [t for s in plain.generate(prompt, GenerationParams(max_new_tokens=50, speculate=False), TreeBudget(),
                                          set()) for t in s.tokens]
    assert [t for s in steps for t in s.tokens] == expected
    sizes = {s.stats.tree_size for s in steps if s.stats}
    assert sizes == {1, 9} and decoder.stats.speculation.startswith("auto")  # both modes ran
    # the drafter followed every position, plain steps included
    assert decoder.drafter.stable == decoder.cache.length


def test_auto_compiles_to_one_graph_per_mode():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    model = tiny_model("llama")
    decoder = Decoder(model, random_head(model), 128)
    counter = CompileCounterWithBackend("eager")
    decoder.compile_steps(lambda fn: torch.compile(fn, backend=counter, fullgraph=True, dynamic=False))
    decoder.chooser = SpeculationChooser(probe=2, recheck=3)
    params = GenerationParams(max_new_tokens=12, speculate="auto")
    out = [t for s in decoder.generate([1, 2, 3], params, TreeBudget(8, 3, 4), set()) for t in s.tokens]
    plain = Decoder(model, None, 128)
    assert out == [t for s in plain.generate([1, 2, 3], GenerationParams(max_new_tokens=12, speculate=False),
                                             TreeBudget(), set()) for t in s.tokens]
    assert counter.frame_count == 2  # the speculative step and the plain step that feeds the drafter
    torch._dynamo.reset()
