"""One device-to-host read per decode step (greedy and sampling, plain and EAGLE), counted over a real
decode: the tree is built, reranked and verified on the device and the accepted tokens are read once."""

import pytest
import torch
from sync_counter import count_decode
from tiny_models import random_head, tiny_model

from eaglechat.engine.decode import Decoder
from eaglechat.engine.protocol import GenerationParams, TreeBudget

PROMPT = [5, 17, 33, 2, 9, 41, 8]
MODES = {
    "greedy": GenerationParams(max_new_tokens=40),
    "sampling": GenerationParams(max_new_tokens=40, temperature=0.8, top_p=0.9, top_k=20, seed=3),
}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("budget", [None, TreeBudget(8, 3, 4), TreeBudget(60, 5, 10), TreeBudget(kind="static")],
                         ids=["plain", "8-3-4", "60-5-10", "static"])
def test_one_host_read_per_decode_step(family, mode, budget):
    model = tiny_model(family)
    decoder = Decoder(model, random_head(model), 256, prefill_chunk=4)
    params = MODES[mode]
    params.speculate = budget is not None
    counter, tokens = count_decode(decoder, PROMPT, params, budget or TreeBudget())
    steps = decoder.stats.target_forwards
    assert len(tokens) == 40 and steps >= 5
    # one read per step, plus the first reply token once per turn (it is shown before any step)
    assert counter.count("reads", "decode") == steps + 1, counter.where("reads", "decode")
    assert counter.count("uploads", "decode") == 0, counter.where("uploads", "decode")


@pytest.mark.parametrize("family", ["gpt_oss", "qwen3_5_text"])  # MoE routing, sinks, recurrent state kept
@pytest.mark.parametrize("mode", sorted(MODES))
def test_one_host_read_per_decode_step_on_the_2026_architectures(family, mode):
    model = tiny_model(family)
    decoder = Decoder(model, random_head(model), 256, prefill_chunk=4)
    counter, tokens = count_decode(decoder, PROMPT, MODES[mode], TreeBudget(8, 3, 4))
    assert len(tokens) == 40
    assert counter.count("reads", "decode") == decoder.stats.target_forwards + 1, counter.where("reads", "decode")
    assert counter.count("uploads", "decode") == 0, counter.where("uploads", "decode")


@pytest.mark.parametrize("mode", sorted(MODES))
def test_auto_reads_once_per_step_and_uploads_only_when_the_drafter_catches_up(mode):
    """speculate="auto": plain and speculative steps each read once, and a catch-up after a plain stretch
    reads and uploads nothing (the features and the tokens after them wait on the device)."""
    from test_engine_autospec import Scripted

    model = tiny_model("llama")
    decoder = Decoder(model, random_head(model), 256, prefill_chunk=4)
    decoder.chooser = Scripted([0, 0, 0, 1, 2])
    catch_ups = []
    catch_up = decoder.drafter.catch_up
    decoder.drafter.catch_up = lambda: catch_ups.append(decoder.drafter.behind) or catch_up()
    params = GenerationParams(**{**MODES[mode].__dict__, "speculate": "auto"})
    counter, tokens = count_decode(decoder, PROMPT, params, TreeBudget(8, 3, 4))
    assert len(tokens) == 40 and catch_ups
    assert counter.count("reads", "decode") == decoder.stats.target_forwards + 1, counter.where("reads", "decode")
    assert counter.count("uploads", "decode") == 0, counter.where("uploads", "decode")


def test_the_counter_sees_what_the_old_loop_did():
    """Control: host-side tree bookkeeping (a .tolist() per step) is counted."""
    model = tiny_model("llama")
    decoder = Decoder(model, random_head(model), 256)
    step = decoder._step

    def step_with_a_host_read(*args):
        decoder.root.tolist()
        return step(*args)

    decoder._step = step_with_a_host_read
    counter, _ = count_decode(decoder, PROMPT, GenerationParams(max_new_tokens=20), TreeBudget(8, 3, 4))
    assert counter.count("reads", "decode") == 2 * decoder.stats.target_forwards + 1


def decode_without_implicit_syncs(decoder, params) -> list[int]:
    """Decode 40 tokens with CUDA's sync debug mode raising on any implicit sync after the prefill."""
    steps = decoder.generate(PROMPT, params, TreeBudget(16, 4, 4), set())
    tokens = list(next(steps).tokens)  # prefill: uploads the prompt and reads the first token
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in steps:
            tokens += step.tokens
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return tokens


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("family", ["qwen2", "gpt_oss", "qwen3_5_text"])
def test_decode_steps_never_sync_implicitly_on_cuda(mode, family):
    model = tiny_model(family).cuda()
    decoder = Decoder(model, random_head(model).cuda(), 256)
    assert len(decode_without_implicit_syncs(decoder, MODES[mode])) == 40


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_switches_and_catch_ups_never_sync_implicitly_on_cuda():
    from test_engine_autospec import Scripted

    model = tiny_model("llama").cuda()
    decoder = Decoder(model, random_head(model).cuda(), 256)
    decoder.chooser = Scripted([0, 0, 0, 1, 2])
    params = GenerationParams(**{**MODES["sampling"].__dict__, "speculate": "auto"})
    assert len(decode_without_implicit_syncs(decoder, params)) == 40
