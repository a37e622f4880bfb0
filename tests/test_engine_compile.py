"""Static shapes: the verify forward, the greedy finish and the drafter's steps compile with
torch.compile(fullgraph=True) once per tree budget and never recompile as the context grows; compiled
decoding stays exactly equal to plain greedy."""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from eaglechat.engine.decode import Decoder
from eaglechat.engine.protocol import GenerationParams, TreeBudget
from tiny_models import random_head, tiny_model


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled(model, head, max_context, backend="eager"):
    counter = CompileCounterWithBackend(backend)
    decoder = Decoder(model, head, max_context, prefill_chunk=16)
    decoder.compile_steps(lambda fn: torch.compile(fn, backend=counter, fullgraph=True))
    return decoder, counter


def run(decoder, prompt, n, budget, speculate=True):
    params = GenerationParams(max_new_tokens=n, speculate=speculate)
    return [t for s in decoder.generate(prompt, params, budget, set()) for t in s.tokens]


def plain(model, prompt, n):
    return run(Decoder(model, None, 512), prompt, n, TreeBudget(), speculate=False)


@pytest.mark.parametrize("budget", [TreeBudget(8, 3, 4), TreeBudget(kind="static")], ids=["dynamic", "static"])
def test_no_recompiles_over_hundreds_of_steps_of_growing_context(budget):
    model = tiny_model("qwen2")
    decoder, counter = compiled(model, random_head(model), 512, "aot_eager")
    first = list(range(3, 12))
    assert run(decoder, first, 4, budget) == plain(model, first, 4)
    graphs = counter.frame_count  # verify forward, greedy finish, draft extend, tree expansion
    assert graphs == 4
    # a longer conversation, then a new one: the context grows from a few tokens to ~480
    longer = first + [20, 21, 22, 23]
    out = run(decoder, longer, 200, budget)
    assert out == plain(model, longer, 200)
    assert decoder.stats.target_forwards >= 60
    other = [40 + i % 30 for i in range(50)]
    out = run(decoder, other, 250, budget)
    assert out == plain(model, other, 250)
    assert counter.frame_count == graphs  # not one recompile


def test_plain_decoding_compiles_once_too():
    model = tiny_model("llama")
    decoder, counter = compiled(model, None, 512)
    prompt = [5, 6, 7]
    assert run(decoder, prompt, 300, TreeBudget(), speculate=False) == plain(model, prompt, 300)
    assert decoder.stats.target_forwards == 299 and counter.frame_count == 2


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt_oss", "qwen3_5_text"])  # mistral: llama's code path
def test_compiled_greedy_eagle_equals_plain(family):
    model = tiny_model(family)
    decoder, counter = compiled(model, random_head(model), 256)
    for prompt in ([1, 2, 3, 4, 5], [9] * 17):
        assert run(decoder, prompt, 40, TreeBudget(16, 4, 4)) == plain(model, prompt, 40)
    assert counter.frame_count == 4


def test_compiled_sampling_is_reproducible_and_runs_the_same_graphs():
    model = tiny_model("llama")
    decoder, counter = compiled(model, random_head(model), 256)
    params = GenerationParams(max_new_tokens=30, temperature=0.9, top_p=0.95, seed=5)
    runs = [[t for s in decoder.generate([1, 2, 3], params, TreeBudget(8, 3, 4), set()) for t in s.tokens]
            for _ in range(2)]
    eager = Decoder(model, random_head(model), 256)
    expected = [t for s in eager.generate([1, 2, 3], params, TreeBudget(8, 3, 4), set()) for t in s.tokens]
    assert runs[0] == runs[1] == expected
    assert counter.frame_count == 3  # no greedy finish when sampling


def test_inductor_compiles_the_steps_and_stays_exact():
    model = tiny_model("llama")
    head = random_head(model)
    decoder = Decoder(model, head, 128, prefill_chunk=8)
    decoder.compile_steps(lambda fn: torch.compile(fn, backend="inductor", fullgraph=True))
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    assert run(decoder, prompt, 40, TreeBudget(8, 3, 4)) == plain(model, prompt, 40)


def test_compile_setting_per_device():
    from eaglechat.engine.compile import wanted

    # auto: nothing measured to gain yet (CPU compiled ran slower; CUDA graphs never ran on a GPU here)
    assert not wanted("auto", "cuda") and not wanted("auto", "cpu") and wanted("on", "cpu") and not wanted("off", "cuda")
    with pytest.raises(ValueError):
        wanted("yes", "cpu")


def test_load_engine_compiles_with_progress_into_the_user_cache(tmp_path, monkeypatch):
    from eaglechat.engine import compile as compiled_steps
    from eaglechat.loader import load_engine
    from tiny_models import save_tiny_pair

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

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
    assert engine.info.compiled and engine.decoder.cache.static
    assert any(p.startswith("compiling the speculative decode step") for p in phases)
    assert any(p.startswith("compiling the plain decode step") for p in phases)
    assert any(p.startswith("compiled the decode steps in") for p in phases)
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path / "home"))
    built = counter.frame_count  # EAGLE: 4 graphs, plain: 2 more shapes of the verify step
    assert built == 6
    from eaglechat.engine.protocol import Finished

    events = list(engine.generate([{"role": "user", "content": "Hello world!"}], GenerationParams(max_new_tokens=20)))
    assert isinstance(events[-1], Finished) and counter.frame_count == built  # the warm-up built them all
    off = load_engine(str(base), head=str(head), quant="none", compile="auto")  # auto on a CPU: eager
    assert not off.info.compiled and not off.decoder.cache.static


def test_a_model_the_compiler_cannot_take_decodes_eagerly(tmp_path, monkeypatch):
    from eaglechat.engine import compile as compiled_steps
    from eaglechat.loader import load_engine
    from tiny_models import save_tiny_pair

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
    assert any(p.startswith("compiling failed (") and "decoding without compiling" in p for p in phases)
    prompt = engine.encode([{"role": "user", "content": "Hello world!"}])
    got = [t for s in engine.decoder.generate(prompt, GenerationParams(max_new_tokens=12), TreeBudget(8, 3, 4), set())
           for t in s.tokens]
    assert got == plain(engine.model, prompt, 12)
