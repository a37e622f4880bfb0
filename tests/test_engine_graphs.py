"""Decode steps replayed as CUDA graphs (engine/compile.py `GraphSteps`): one graph per key captured the
first time the key is needed and replayed after, the summary read from one static output, the sampling
values as tensors (a new temperature replays the same graph), one host read per step, a capture that
fails giving way to eager decoding, and tokens equal to eager decoding's.

On a CPU the graphs are tests/fake_graphs.py's (the same contract: a capture leaves the state untouched,
a replay reruns exactly the captured ops); the cuda-marked tests capture real graphs."""

import pytest
import torch
from fake_graphs import FakeGraphs
from sync_counter import count_decode
from tiny_models import random_head, tiny_model

from eaglechat.engine.compile import GraphSteps, describe, resolve
from eaglechat.engine.decode import Decoder
from eaglechat.engine.protocol import GenerationParams, TreeBudget
from eaglechat.errors import UsageError

BUDGET = TreeBudget(8, 3, 4)


@pytest.fixture(scope="module")
def llama():
    model = tiny_model("llama")
    return model, random_head(model)


def graphed(model, head, max_context=512, backend=None):
    decoder = Decoder(model, head, max_context, prefill_chunk=16)
    runner = GraphSteps(decoder, backend or FakeGraphs())
    decoder.use(runner)
    return decoder, runner


def run(decoder, prompt, n, budget=BUDGET, speculate=True, **sampling):
    params = GenerationParams(max_new_tokens=n, speculate=speculate, **sampling)
    return [t for s in decoder.generate(prompt, params, budget, set()) for t in s.tokens]


def eager(model, head, prompt, n, budget=BUDGET, speculate=True, **sampling):
    return run(Decoder(model, head, 512), prompt, n, budget, speculate, **sampling)


def test_one_graph_per_key_captured_once_then_replayed_and_greedy_tokens_equal_eager(llama):
    model, head = llama
    decoder, runner = graphed(model, head)
    prompt = [5 + i % 40 for i in range(20)]
    assert run(decoder, prompt, 200) == eager(model, None, prompt, 200, speculate=False)
    stats, backend = decoder.stats, runner.backend
    keys = set(runner.graphs)
    assert len(keys) >= 2 and {key[3] for key in keys} >= {64, 128}  # window buckets
    assert stats.steps == "graphs" and stats.graphs == len(keys) == stats.graph_captures == backend.captures
    assert stats.graph_replays == backend.replays == stats.target_forwards - stats.graph_captures > 100
    assert stats.capture_s >= 0 and backend.warm_ups == backend.captures  # each key's first step ran eagerly
    other = [40 + i % 30 for i in range(50)]  # a new conversation through the same buckets: no capture
    assert run(decoder, other, 60) == eager(model, None, other, 60, speculate=False)
    assert decoder.stats.graph_captures == 0 and backend.captures == len(keys)


def test_the_summary_is_read_from_one_static_output_per_graph(llama):
    model, head = llama
    decoder, runner = graphed(model, head)
    read, outputs = decoder.target.read, []
    decoder.target.read = lambda summary: outputs.append(summary) or read(summary)
    run(decoder, [3, 1, 4, 1, 5], 40)
    captured = {id(c.output): c for c in runner.graphs.values()}
    replayed = [o for o in outputs if id(o) in captured]
    assert len(replayed) == decoder.stats.graph_replays > 5  # every replay read a captured output
    assert len({id(o) for o in replayed}) == len(captured)


def test_a_new_temperature_top_p_top_k_or_penalty_replays_the_same_graph_and_sampling_equals_eager(llama):
    model, head = llama
    decoder, runner = graphed(model, head)
    prompt = [7, 8, 9, 10]
    first = dict(temperature=0.8, top_p=0.9, top_k=20, seed=3)
    assert run(decoder, prompt, 40, **first) == eager(model, head, prompt, 40, **first)  # bit for bit
    captures = runner.backend.captures
    for second in (dict(temperature=1.3, seed=4), dict(temperature=0.5, top_k=3, min_p=0.1, seed=5)):
        assert run(decoder, prompt, 40, **second) == eager(model, head, prompt, 40, **second)
        assert runner.backend.captures == captures and decoder.stats.graph_replays > 5
    assert runner.sampling.temperature.item() == pytest.approx(0.5) and runner.sampling.top_k.item() == 3
    penalty = dict(temperature=0.7, repetition_penalty=1.3, seed=6)
    assert run(decoder, prompt, 40, **penalty) == eager(model, head, prompt, 40, **penalty)
    captures = runner.backend.captures  # a penalty is another graph (it reads `seen`); its value is not
    assert run(decoder, prompt, 40, **{**penalty, "repetition_penalty": 1.8}) == eager(
        model, head, prompt, 40, **{**penalty, "repetition_penalty": 1.8})
    assert runner.backend.captures == captures
    greedy = runner.backend.captures
    assert run(decoder, prompt, 40) == eager(model, None, prompt, 40, speculate=False)
    assert runner.backend.captures > greedy  # greedy and sampled steps are different graphs


@pytest.mark.parametrize("mode", ["greedy", "sampling"])
@pytest.mark.parametrize("speculate", [True, False, "auto"])
def test_one_host_read_per_step_and_no_upload(llama, mode, speculate):
    model, head = llama
    decoder, runner = graphed(model, head, 256)
    sampling = {} if mode == "greedy" else dict(temperature=0.8, top_p=0.9, seed=3)
    params = GenerationParams(max_new_tokens=40, speculate=speculate, **sampling)
    counter, tokens = count_decode(decoder, [5, 17, 33, 2, 9, 41, 8], params, BUDGET)
    assert len(tokens) == 40 and decoder.stats.graph_replays > 5
    # one read per step, plus the first reply token once per turn, captures and replays included
    assert counter.count("reads", "decode") == decoder.stats.target_forwards + 1, counter.where("reads", "decode")
    assert counter.count("uploads", "decode") == 0, counter.where("uploads", "decode")


def test_moved_buffers_drop_the_graphs_and_decoding_stays_exact(llama):
    model, head = llama
    decoder, runner = graphed(model, head, 256)
    prompt = [9, 8, 7, 6]
    run(decoder, prompt, 30)
    held = runner.backend.captures
    decoder.cache.reserve(decoder.cache.capacity + 64)  # the KV buffer moves (a bigger tree's room)
    assert run(decoder, prompt, 30) == eager(model, None, prompt, 30, speculate=False)
    assert decoder.stats.graph_captures == decoder.stats.graphs >= 1 and runner.backend.captures > held


def test_a_capture_that_fails_gives_way_to_eager_decoding_said_once(llama):
    model, head = llama
    decoder, runner = graphed(model, head, backend=FakeGraphs(fail=RuntimeError("operation not permitted when "
                                                                                "stream is capturing")))
    prompt = [2, 7, 1, 8, 2, 8]
    assert run(decoder, prompt, 30) == eager(model, None, prompt, 30, speculate=False)
    assert decoder.runner is None and not decoder.cache.static and not runner.graphs
    assert runner.failure == ("capturing the decode step failed (RuntimeError: operation not permitted when stream "
                              "is capturing); decoding eagerly")


def test_the_engine_says_a_failed_capture_once(tmp_path, monkeypatch):
    from tiny_models import save_tiny_pair

    from eaglechat.engine import compile as step_runners
    from eaglechat.engine.protocol import Finished
    from eaglechat.loader import load_engine

    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))
    base, head = save_tiny_pair(tmp_path, "llama")
    engine = load_engine(str(base), head=str(head), quant="none", tree=BUDGET)
    backend = FakeGraphs()
    engine.use_steps(lambda decoder: GraphSteps(decoder, backend), "graphs")
    assert engine.info.compiled and engine.info.steps == "graphs"
    backend.fail = RuntimeError("no capture for this kernel")  # the next key's capture fails mid-reply
    messages = [{"role": "user", "content": "Hello world!"}]
    final = list(engine.generate(messages, GenerationParams(max_new_tokens=20)))[-1]
    assert isinstance(final, Finished) and "capturing the decode step failed (RuntimeError: no capture" in final.message
    assert engine.info.steps == "eager" and not engine.info.compiled
    again = list(engine.generate(messages, GenerationParams(max_new_tokens=8)))[-1]
    assert again.token_ids == final.token_ids[:8] and "capturing" not in again.message
    assert step_runners.resolve("auto", "cpu") == "eager"


def test_load_captures_the_first_bucket_of_each_arm_and_says_so(tmp_path, monkeypatch):
    from tiny_models import save_tiny_pair

    from eaglechat.engine import compile as step_runners
    from eaglechat.engine.protocol import Finished
    from eaglechat.loader import load_engine

    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))
    backend = FakeGraphs()
    monkeypatch.setattr(step_runners, "graph_backend", lambda device: backend)
    monkeypatch.setattr(step_runners, "resolve", lambda setting, device_type: "graphs")  # as on CUDA
    base, head = save_tiny_pair(tmp_path, "llama")
    phases = []
    engine = load_engine(str(base), head=str(head), quant="none", tree=BUDGET, compile="auto",
                         progress=lambda phase, fraction=None: phases.append(phase))
    assert engine.info.steps == "graphs" and engine.decoder.cache.static
    assert "capturing the speculative and plain decode steps (1/2)" in phases
    assert any(p.startswith("captured the EAGLE 8/3/4 greedy, window 64 step as a CUDA graph in ") for p in phases)
    assert any(p.startswith("captured 4 decode-step graphs in ") for p in phases), phases
    # the EAGLE step, auto's lighter tree, auto's plain step that keeps features, plain decoding
    assert backend.captures == 4
    for speculate in (True, "auto", False):
        events = list(engine.generate([{"role": "user", "content": "Hello world!"}],
                                      GenerationParams(max_new_tokens=20, speculate=speculate)))
        assert isinstance(events[-1], Finished) and events[-1].stats.graph_captures == 0
        assert events[-1].stats.graph_replays > 0
    assert backend.captures == 4


def test_compile_settings_per_device():
    assert resolve("auto", "cuda") == "graphs" and resolve("auto", "cpu") == resolve("auto", "mps") == "eager"
    assert resolve("on", "cpu") == resolve("inductor", "cuda") == "inductor" and resolve("off", "cuda") == "eager"
    with pytest.raises(UsageError, match="--compile graphs needs a CUDA device"):
        resolve("graphs", "cpu")
    with pytest.raises(ValueError):
        resolve("yes", "cpu")
    key = (("dynamic", 16, 4, 4), True, False, 128, 128, True, False)
    assert describe(key) == "EAGLE 16/4/4 greedy, window 128"


# -- real capture (a GPU) ------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt_oss"])
@pytest.mark.parametrize("speculate", [True, False])
def test_real_graphs_replay_exactly_what_eager_decoding_does(family, speculate):
    model = tiny_model(family).cuda()
    head = random_head(model).cuda()
    decoder = Decoder(model, head, 512)
    runner = GraphSteps(decoder)
    decoder.use(runner)
    prompt = [5 + i % 40 for i in range(20)]
    reference = Decoder(model, head, 512)
    assert run(decoder, prompt, 120, speculate=speculate) == run(reference, prompt, 120, speculate=speculate)
    assert decoder.runner is runner and decoder.stats.graph_replays > 50
    sampled = dict(temperature=0.8, top_p=0.9, top_k=20, seed=11)
    assert run(decoder, prompt, 60, speculate=speculate, **sampled) == run(reference, prompt, 60, speculate=speculate,
                                                                           **sampled)
    captures = runner.total.captures
    run(decoder, prompt, 60, speculate=speculate, **{**sampled, "temperature": 1.2})
    assert runner.total.captures == captures  # the new temperature replayed the same graphs


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_replays_never_sync_implicitly():
    model = tiny_model("llama").cuda()
    decoder = Decoder(model, random_head(model).cuda(), 256)
    decoder.use(GraphSteps(decoder))
    run(decoder, [5, 17, 33, 2], 20)  # captures
    steps = decoder.generate([5, 17, 33, 2], GenerationParams(max_new_tokens=30), BUDGET, set())
    tokens = list(next(steps).tokens)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in steps:
            tokens += step.tokens
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len(tokens) == 30 and decoder.stats.graph_captures == 0


def test_the_chat_and_run_verbose_say_how_steps_ran_and_what_a_reply_captured():
    from eaglechat.commands.run import stats_line
    from eaglechat.engine.protocol import EngineInfo, GenerationStats
    from eaglechat.tui.stats import TurnNumbers, meta_line, status_parts

    stats = GenerationStats(new_tokens=40, target_forwards=20, steps="graphs", graphs=5, graph_captures=1,
                            capture_s=0.4, graph_replays=19)
    info = EngineInfo(model="m", device="cuda", steps="graphs")
    assert "CUDA graphs" in status_parts(info, None, None, True)
    assert "CUDA graphs" not in status_parts(EngineInfo(model="m"), None, None, True)
    line = meta_line(TurnNumbers.from_finished(stats, TurnNumbers(), "stop"), "m")
    assert line.endswith("captured 1 CUDA graph in 0.40 s")
    assert stats_line(stats, info).endswith("| CUDA graphs: 19 replays, 1 captured in 0.40 s (5 held)")
    stats.graph_captures = 0
    assert "captured" not in meta_line(TurnNumbers.from_finished(stats, TurnNumbers(), "stop"), "m")
