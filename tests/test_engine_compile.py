"""Compiled decode steps: one graph per step (draft + verify + accept + KV compaction + drafter extend),
no eager op between steps, one graph per window bucket built once and reused, windows within twice
what is cached, and compiled decoding exactly equal to plain greedy (sampling: to eager sampling).

The cheap "eager" backend traces the same graphs as inductor in seconds; one inductor test is slow."""

import pytest
import torch
from op_counter import StepOps
from tiny_models import random_head, tiny_model
from torch._dynamo.testing import CompileCounterWithBackend

from eaglechat.engine.cache import MIN_BUCKET
from eaglechat.engine.compile import CompiledSteps
from eaglechat.engine.decode import Decoder, draft_room, tree_size
from eaglechat.engine.protocol import GenerationParams, TreeBudget


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def llama():
    model = tiny_model("llama")
    return model, random_head(model)


def compiled(model, head, max_context, backend="eager"):
    counter = CompileCounterWithBackend(backend)
    decoder = Decoder(model, head, max_context, prefill_chunk=16)
    decoder.use(CompiledSteps(decoder, lambda fn: torch.compile(fn, backend=counter, fullgraph=True, dynamic=False)))
    return decoder, counter


def run(decoder, prompt, n, budget, speculate=True, **sampling):
    params = GenerationParams(max_new_tokens=n, speculate=speculate, **sampling)
    return [t for s in decoder.generate(prompt, params, budget, set()) for t in s.tokens]


def plain(model, prompt, n):
    return run(Decoder(model, None, 512), prompt, n, TreeBudget(), speculate=False)


# before this design: 4 compiled calls + 6 eager aten ops per greedy EAGLE step (8/3/4), 3 calls + 183 ops
# per sampled one, 2 calls + 9 ops per plain greedy step (the eager glue between the compiled pieces)
@pytest.mark.parametrize("speculate,temperature", [(True, 0.0), (True, 0.9), (False, 0.9)],
                         ids=["eagle-greedy", "eagle-sampling", "plain-sampling"])
def test_a_step_is_one_compiled_call_and_no_eager_op(llama, speculate, temperature):
    model, head = llama
    mode = StepOps()
    decoder = Decoder(model, head, 128, prefill_chunk=16)
    decoder.use(CompiledSteps(decoder, mode.compiler()))
    with mode:
        tokens = run(decoder, [1, 2, 3, 4], 16, TreeBudget(8, 3, 4), speculate, temperature=temperature, seed=3)
    steps = decoder.stats.target_forwards
    assert steps >= 8 and mode.calls == steps
    assert not mode.ops, mode.ops  # between the steps: the one summary read, no aten op
    eager = run(Decoder(model, head, 128), [1, 2, 3, 4], 16, TreeBudget(8, 3, 4), speculate, temperature=temperature,
                seed=3)
    assert tokens == eager  # the same random numbers compiled and eager (engine/rng.py)


def test_one_graph_per_bucket_over_hundreds_of_steps_and_two_conversations(llama):
    model, head = llama
    decoder, counter = compiled(model, head, 512)
    budget = TreeBudget(8, 3, 4)
    seen = []  # (cached slots, target window, drafter window) before each step
    open_step = decoder.open

    def record(*args):
        open_step(*args)
        seen.append((decoder.cache.length, decoder.cache.window, decoder.drafter.window))
    decoder.open = record

    first = [5 + i % 40 for i in range(20)]
    out = run(decoder, first, 300, budget)
    assert out == plain(model, first, 300) and decoder.stats.target_forwards >= 100
    buckets = {window for _, window, _ in seen}
    assert len(buckets) >= 3 and counter.frame_count == len(buckets)  # one graph per bucket, each built once
    for length, window, draft_window in seen:  # a step reads at most twice what it needs
        need = length + draft_room(budget)
        assert need <= window == draft_window <= max(MIN_BUCKET, 2 * need)
    graphs = counter.frame_count
    other = [40 + i % 30 for i in range(50)]  # a new conversation through the same buckets
    assert run(decoder, other, 120, budget) == plain(model, other, 120)
    assert counter.frame_count == graphs  # not one recompile


def test_plain_decoding_is_one_graph_per_bucket_too(llama):
    model, _ = llama
    decoder, counter = compiled(model, None, 512)
    assert run(decoder, [5, 6, 7], 100, TreeBudget(), speculate=False) == plain(model, [5, 6, 7], 100)
    assert decoder.stats.target_forwards == 99 and counter.frame_count == 2  # windows 64 and 128
    assert decoder.cache.window == 128 and tree_size(TreeBudget(), False) == 1


@pytest.mark.parametrize("family", ["qwen3", "ministral", "gpt_oss", "qwen3_5_text"])  # q/k norm; sliding window < reply; sinks; Gated DeltaNet
def test_compiled_greedy_eagle_equals_plain(family):
    model = tiny_model(family)
    decoder, counter = compiled(model, random_head(model), 256)
    for prompt in ([1, 2, 3, 4, 5], [9] * 17):
        assert run(decoder, prompt, 30, TreeBudget(16, 4, 4)) == plain(model, prompt, 30)
    assert counter.frame_count == 2  # windows 64 and 128 (17 + 30 tokens + the draft's 33 slots)


@pytest.mark.slow
def test_inductor_compiles_the_step_and_stays_exact(llama):
    model, head = llama
    decoder = Decoder(model, head, 128, prefill_chunk=8)
    decoder.use(CompiledSteps(decoder, lambda fn: torch.compile(fn, backend="inductor", fullgraph=True, dynamic=False)))
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    assert run(decoder, prompt, 40, TreeBudget(8, 3, 4)) == plain(model, prompt, 40)


def test_load_engine_compiles_with_progress_into_the_user_cache(tmp_path, monkeypatch):
    import os

    from tiny_models import save_tiny_pair
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from eaglechat.engine import compile as compiled_steps
    from eaglechat.engine.protocol import Finished
    from eaglechat.loader import load_engine

    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))
    # what a real start finds: inductor has already written its default into the variable
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    counter = CompileCounterWithBackend("eager")  # the loader's path, with a backend that compiles in seconds
    monkeypatch.setattr(compiled_steps, "step_compiler",
                        lambda device: lambda fn: torch.compile(fn, backend=counter, fullgraph=True, dynamic=False))
    base, head = save_tiny_pair(tmp_path, "llama")
    phases = []
    engine = load_engine(str(base), head=str(head), quant="none", tree=TreeBudget(8, 3, 4), compile="on",
                         progress=lambda phase, fraction=None: phases.append(phase))
    assert engine.info.compiled and engine.info.steps == "inductor" and engine.decoder.cache.static
    assert any(p.startswith("compiling the speculative and plain decode steps") for p in phases)
    assert any(p.startswith("compiling the plain decode steps") for p in phases)
    assert any(p.startswith("compiled the decode steps in") for p in phases)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path / "home"))
    # first bucket: the EAGLE step, speculate="auto"'s lighter tree and its plain step that keeps the
    # drafter's features, and the plain step without a head
    assert counter.frame_count == 4
    for speculate in (True, "auto", False):
        events = list(engine.generate([{"role": "user", "content": "Hello world!"}],
                                      GenerationParams(max_new_tokens=20, speculate=speculate)))
        assert isinstance(events[-1], Finished) and counter.frame_count == 4  # the warm-up built them
    off = load_engine(str(base), head=str(head), quant="none", compile="auto")  # auto on a CPU: eager
    assert not off.info.compiled and not off.decoder.cache.static


def test_a_model_the_compiler_cannot_take_decodes_eagerly(tmp_path, monkeypatch):
    from tiny_models import save_tiny_pair

    from eaglechat.engine import compile as compiled_steps
    from eaglechat.loader import load_engine

    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)

    def broken_backend(gm, example_inputs):
        raise RuntimeError("no kernel for this layer")

    monkeypatch.setattr(compiled_steps, "step_compiler",
                        lambda device: lambda fn: torch.compile(fn, backend=broken_backend, fullgraph=True))
    base, head = save_tiny_pair(tmp_path, "qwen2")
    phases = []
    engine = load_engine(str(base), head=str(head), quant="none", tree=TreeBudget(8, 3, 4), compile="on",
                         progress=lambda phase, fraction=None: phases.append(phase))
    assert not engine.info.compiled and not engine.decoder.cache.static
    assert any(p.startswith("compiling failed (") and p.endswith("decoding eagerly") for p in phases)
    prompt = engine.encode([{"role": "user", "content": "Hello world!"}])
    got = [t for s in engine.decoder.generate(prompt, GenerationParams(max_new_tokens=12), TreeBudget(8, 3, 4), set())
           for t in s.tokens]
    assert got == plain(engine.model, prompt, 12)


def test_a_window_bucket_the_compiler_cannot_build_mid_reply_continues_eagerly(tmp_path, monkeypatch):
    """The warm-up built the first bucket; the conversation then crosses 64 slots and the next graph fails
    to build: the step reruns eagerly with the caches as they were, the reply equals plain decoding's, and
    the reply's end says so once; later replies decode eagerly."""
    from tiny_models import save_tiny_pair

    from eaglechat.engine import compile as compiled_steps
    from eaglechat.engine.protocol import Finished
    from eaglechat.loader import load_engine

    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    built = []

    def backend(gm, example_inputs):
        if len(built) >= 4:  # the warm-up's four graphs, then nothing
            raise RuntimeError("no kernel for this window")
        built.append(gm)
        return gm.forward

    monkeypatch.setattr(compiled_steps, "step_compiler",
                        lambda device: lambda fn: torch.compile(fn, backend=backend, fullgraph=True, dynamic=False))
    base, head = save_tiny_pair(tmp_path, "llama")
    engine = load_engine(str(base), head=str(head), quant="none", tree=TreeBudget(8, 3, 4), compile="on")
    assert engine.info.compiled and len(built) == 4
    messages = [{"role": "user", "content": "Hello world!"}]
    prompt = engine.encode(messages)
    events = list(engine.generate(messages, GenerationParams(max_new_tokens=80)))
    final = events[-1]
    assert isinstance(final, Finished) and final.token_ids == plain(engine.model, prompt, 80)
    assert "compiling failed (BackendCompilerFailed" in final.message
    assert "decoding eagerly" in final.message
    assert not engine.info.compiled and engine.decoder.runner is None
    again = list(engine.generate(messages, GenerationParams(max_new_tokens=8)))[-1]
    assert again.token_ids == final.token_ids[:8] and "compiling" not in again.message
