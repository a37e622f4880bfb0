"""How decode steps run (`--compile {auto,graphs,inductor,off}`): the whole step (draft -> verify ->
accept -> KV compaction -> drafter extend, engine/decode.py `Decoder._step`) eagerly, replayed as a CUDA
graph, or compiled by torch.compile.

- `graphs` (`GraphSteps`): each step shape is captured once with `torch.cuda.CUDAGraph` and replayed, so
  the ~1,400-1,900 kernel launches of an eager transformers step (15-25 us of host time each) become one
  replay, without a compiler: a graph is ready in about the time of one eager step. One graph per key
  (tree budget, plain or speculative, KV-window bucket, greedy or sampled, with or without a penalty),
  all on one memory pool; sampling values are device tensors (engine/sampling.py `SamplingValues`), so
  a new temperature replays the same graph. The pattern of SGLang's `CudaGraphRunner` and
  `EAGLEDraftCudaGraphRunner` (python/sglang/srt/model_executor/cuda_graph_runner.py,
  python/sglang/srt/speculative/eagle_draft_cuda_graph_runner.py) and vLLM's CUDA-graph capture: warm up
  on a side stream, capture on it into a shared pool, replay. Here the warm-up is the key's first step
  itself, run eagerly (its result is used), so capturing costs no step.
- `inductor` (`CompiledSteps`; `on` is the old name): torch.compile of the step, mode="reduce-overhead"
  on CUDA (inductor's kernels inside its own CUDA graphs), inductor's default on CPU. Its first start
  compiles for minutes; its caches go to the user cache dir so a second start reuses them.
- `auto` (the default): graphs on CUDA, eager on CPUs and MPS, where compiled steps did not beat eager
  decoding (BENCHMARKS.md). `off`: eager.
A step that cannot be captured or compiled falls back to eager decoding, said in one line: a faster
step is a speed-up, never a reason not to chat.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from eaglechat.engine.autospec import SpeculationChooser, arms_for
from eaglechat.engine.protocol import GenerationParams, GenerationStats, TreeBudget
from eaglechat.engine.sampling import SamplingValues, is_greedy
from eaglechat.errors import UsageError

COMPILE_CHOICES = ("auto", "graphs", "inductor", "on", "off")  # "on": inductor's old name
MODES = ("eager", "graphs", "inductor")  # what a setting resolves to


def resolve(setting: str, device_type: str) -> str:
    """The step runner a --compile setting asks for on this device: "eager", "graphs" or "inductor"."""
    if setting not in COMPILE_CHOICES:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_CHOICES)}, got {setting!r}")
    if setting == "auto":
        return "graphs" if device_type == "cuda" else "eager"
    if setting == "graphs" and device_type != "cuda":
        raise UsageError(f"--compile graphs needs a CUDA device; this model decodes on {device_type} "
                         "(--compile auto or off decode eagerly there, --compile inductor compiles)")
    return {"on": "inductor", "off": "eager"}.get(setting, setting)


def first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}"


class _Runner:
    """What the graph and compiled runners share: bucketed windows, the fall back to eager decoding."""

    static_windows = True
    mode = "eager"

    def __init__(self, decoder):
        self.decoder = decoder
        self.failure = ""  # why this runner gave way to eager decoding mid-chat, for the engine to say once

    def give_up(self, why: str) -> None:
        """Eager decoding from now on (the caches keep their entries: only the windows change)."""
        self.failure = f"{why}; decoding eagerly"
        self.decoder.use(None, keep_cache=True)

    def start_reply(self) -> None:
        pass

    def report(self, stats: GenerationStats) -> None:
        stats.steps = self.mode


# -- CUDA graphs, no compiler ------------------------------------------------------------------------
class Captured:
    """One captured step: `replay()` reruns its kernels; `output` is where the replay leaves the summary."""

    def __init__(self, graph, output: torch.Tensor):
        self.graph, self.output = graph, output

    def replay(self) -> None:
        self.graph.replay()


class CudaGraphs:
    """torch.cuda.CUDAGraph capture and replay: one side stream for warm-ups and captures, one memory
    pool shared by every graph (a step's temporaries are dead once its summary is read, so the graphs,
    never replayed at once, can share them)."""

    def __init__(self, device: torch.device):
        self.stream = torch.cuda.Stream(device)
        self.pool = torch.cuda.graph_pool_handle()

    def warm(self, step: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Run `step` eagerly on the side stream (lazy initialisation, e.g. cuBLAS workspaces, happens
        here, outside the capture); the current stream waits for it."""
        current = torch.cuda.current_stream()
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            out = step()
        current.wait_stream(self.stream)
        return out

    def capture(self, step: Callable[[], torch.Tensor], buffers: list[torch.Tensor]) -> Captured:
        """Record `step`'s kernels (none runs: the state is untouched); `buffers` are what it reads and
        writes in place (a replay uses them where they are)."""
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream()
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            # thread_local: another thread's CUDA calls (a UI, a server) do not invalidate the capture
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                out = step()
            except BaseException:
                try:
                    graph.capture_end()
                except RuntimeError:
                    pass  # the capture was already invalidated by what raised
                raise
            graph.capture_end()
        current.wait_stream(self.stream)
        return Captured(graph, out)


@dataclass
class GraphCounts:
    graphs: int = 0  # held now
    captures: int = 0
    capture_s: float = 0.0
    replays: int = 0


class GraphSteps(_Runner):
    """Decode steps as CUDA-graph replays, one graph per key, captured the first time a key is needed:
    that first step runs eagerly (the warm-up; its summary is the step's one read), then is captured,
    and every later step of the key is one replay plus the read. The graphs read the decoder's buffers
    (caches, positions, root, h_last, RNG state, the penalties' buffers, the sampling values) at the
    addresses they had when captured: a buffer that moves (a cache grown for a bigger tree) drops them
    all, to be captured again. A capture that fails makes the runner give way to eager decoding."""

    mode = "graphs"

    def __init__(self, decoder, backend=None):
        super().__init__(decoder)
        self.backend = backend or CudaGraphs(decoder.device)  # tests pass a fake (tests/fake_graphs.py)
        self.sampling = SamplingValues.on(decoder.device)
        self.graphs: dict[tuple, Captured] = {}
        self.addresses: tuple = ()
        self.total = GraphCounts()
        self.reply = GraphCounts()
        self.on_capture: Callable[[str, float], None] | None = None  # (what, seconds): e.g. the loader's report

    def buffers(self) -> list[torch.Tensor]:
        """Every tensor a step reads or writes in place across steps."""
        d = self.decoder
        drafter = d.drafter.buffers() if d.drafter is not None else []
        penalties = d.penalties.buffers() if d.penalties is not None else []
        values = [self.sampling.temperature, self.sampling.top_p, self.sampling.top_k, self.sampling.min_p]
        return d.cache.buffers() + [d.cache.slot_ids] + drafter + [d.root, d.rng.state] + penalties + values

    def key(self, budget: TreeBudget, params, speculate: bool, follow: bool) -> tuple:
        d = self.decoder
        tree = (budget.kind, budget.total_tokens, budget.depth, budget.draft_top_k) if speculate else ()
        draft_window = d.drafter.window if speculate else 0
        # a penalty's values are constants in its graph (engine/penalties.py): each setting is its own graph
        penalty = d.penalties.key() if d.penalties is not None else None
        return tree, speculate, follow, d.cache.window, draft_window, is_greedy(params), penalty

    def start_reply(self) -> None:
        addresses = tuple(t.data_ptr() for t in self.buffers())
        if addresses != self.addresses:  # a buffer moved (or the first reply): graphs read the old ones
            self.graphs.clear()
            self.addresses = addresses
        self.reply = GraphCounts()

    def run(self, budget: TreeBudget, params: GenerationParams, speculate: bool, follow: bool) -> list[int]:
        d = self.decoder
        values = self.sampling.load(params)
        key = self.key(budget, values, speculate, follow)
        captured = self.graphs.get(key)
        if captured is not None:
            captured.replay()
            self.total.replays += 1
            self.reply.replays += 1
            return d.target.read(captured.output)

        def step() -> torch.Tensor:
            return d._step(budget, values, speculate, follow)

        tokens = d.target.read(self.backend.warm(step))
        started = time.perf_counter()
        try:
            self.graphs[key] = self.backend.capture(step, self.buffers())
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - many kinds (an op that syncs, a kernel that cannot be captured)
            self.graphs.clear()
            self.give_up(f"capturing the decode step failed ({first_line(exc)})")
            return tokens
        seconds = time.perf_counter() - started
        for counts in (self.total, self.reply):
            counts.captures += 1
            counts.capture_s += seconds
        if self.on_capture is not None:
            self.on_capture(describe(key), seconds)
        return tokens

    def report(self, stats: GenerationStats) -> None:
        stats.steps = self.mode if self.decoder.runner is self else "eager"
        stats.graphs = len(self.graphs)
        stats.graph_captures, stats.capture_s = self.reply.captures, self.reply.capture_s
        stats.graph_replays = self.reply.replays


def describe(key: tuple) -> str:
    """A graph key in words: "EAGLE 16/4/4 greedy, window 128"."""
    tree, speculate, follow, window, _, greedy, penalty = key
    what = f"EAGLE {tree[1]}/{tree[2]}/{tree[3]}" if speculate else "plain (keeping features)" if follow else "plain"
    sampling = ("greedy" if greedy else "sampled") + (" with a penalty" if penalty else "")
    return f"{what} {sampling}, window {window}"


# -- torch.compile ---------------------------------------------------------------------------------
class CompiledSteps(_Runner):
    """Decode steps through `compiler` (torch.compile with fullgraph): one graph per tree budget, sampling
    setting and window bucket, built on first use. On CUDA each step begins with
    torch.compiler.cudagraph_mark_step_begin (its CUDA graphs may reuse the last step's memory) and the
    buffers a step mutates are marked static, so a replay uses them in place instead of copying them."""

    mode = "inductor"

    def __init__(self, decoder, compiler: Callable, step_begin: Callable[[], None] | None = None):
        super().__init__(decoder)
        self.step_begin = step_begin
        # graphs: one per budget, sampling setting and bucket (~log2 of the context each); dynamo's default
        # limit of 8 per function would send the ninth back to eager decoding
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
        self.step = compiler(decoder._step)

    def start_reply(self) -> None:
        d = self.decoder
        if d.device.type != "cuda":
            return
        drafter = d.drafter.buffers() if d.drafter is not None else []
        for buffer in d.cache.buffers() + drafter + [d.root, d.rng.state]:
            torch._dynamo.mark_static_address(buffer)

    def run(self, budget: TreeBudget, params: GenerationParams, speculate: bool, follow: bool) -> list[int]:
        """One step and its one read. A graph the compiler cannot build mid-chat (a new window bucket, a
        tree auto tries) fails before it runs, with the caches untouched: the step reruns eagerly, and
        every later one too (`failure` says why, once)."""
        d = self.decoder
        if self.step_begin is not None:
            self.step_begin()
        try:
            return d.target.read(self.step(budget, params, speculate, follow))
        except torch._dynamo.exc.TorchDynamoException as exc:
            self.give_up(f"compiling failed ({first_line(exc)})")
            d.open(budget, speculate)
            return d.run_step(budget, params, speculate, follow)

    def report(self, stats: GenerationStats) -> None:
        stats.steps = self.mode if self.decoder.runner is self else "eager"


def use_cache_dir(folder: Path) -> None:
    """Inductor's on-disk caches (FX graphs, kernels, autotuning) under `folder`, unless the user chose
    one with TORCHINDUCTOR_CACHE_DIR (inductor writes its default into the variable once it has looked,
    so the default counts as not chosen)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen is None or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        folder.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)


def step_compiler(device_type: str) -> Callable:
    """torch.compile as the decode step needs it: the whole step one graph, shapes never dynamic (each
    tree budget, plain decoding and window bucket get their own static graph)."""
    mode = "reduce-overhead" if device_type == "cuda" else None
    return lambda fn: torch.compile(fn, mode=mode, fullgraph=True, dynamic=False)


def runner_factory(mode: str, device_type: str) -> Callable | None:
    """decoder -> its step runner, for `mode` (None: eager). The engine keeps it to rebuild a runner for
    a rebuilt decoder (a smaller context after running out of memory)."""
    if mode == "graphs":
        return lambda decoder: GraphSteps(decoder, graph_backend(decoder.device))
    if mode == "inductor":
        step_begin = torch.compiler.cudagraph_mark_step_begin if device_type == "cuda" else None
        compiler = step_compiler(device_type)
        return lambda decoder: CompiledSteps(decoder, compiler, step_begin)
    return None


def graph_backend(device: torch.device):
    """What captures graphs on `device` (a seam: tests on a CPU put a fake graph here)."""
    return CudaGraphs(device)


# -- at load: the first graphs of each arm ---------------------------------------------------------------
def prepare_steps(engine, mode: str, cache_dir: Path | None,
                  report: Callable[[str], None] = lambda text: None) -> float:
    """Give `engine` its step runner and build the first graphs now: a short warm-up turn for speculative
    and for plain decoding takes one step of each arm (speculate="auto"'s trees, the plain step that
    keeps the drafter's features, plain decoding), each captured or compiled for the first window
    bucket. -> seconds it took. A model that cannot be captured or compiled is reported in one line and
    decodes eagerly."""
    device_type = torch.device(engine.info.device).type
    if mode == "inductor" and cache_dir is not None:
        use_cache_dir(cache_dir)
    engine.use_steps(runner_factory(mode, device_type), mode)
    decoder = engine.decoder
    runner = decoder.runner
    if mode == "graphs":
        runner.on_capture = lambda what, seconds: report(f"captured the {what} step as a CUDA graph in {seconds:.2f} s")
    prompt = engine.encode([{"role": "user", "content": "Hello"}])
    modes = (["auto"] if decoder.drafter is not None else []) + [False]
    arms = arms_for(engine.budget)
    verb = "capturing" if mode == "graphs" else "compiling"
    started = time.perf_counter()
    chooser, decoder.chooser = decoder.chooser, SpeculationChooser(probe=1)  # warm-up: one step per arm
    try:
        for i, speculate in enumerate(modes, start=1):
            what = "speculative and plain" if speculate else "plain"
            slow = "" if mode == "graphs" else "; the first start takes minutes"
            report(f"{verb} the {what} decode steps ({i}/{len(modes)}{slow})")
            params = GenerationParams(max_new_tokens=len(arms) * (engine.budget.depth + 1) + 1, speculate=speculate)
            for _ in decoder.generate(prompt, params, engine.budget, set()):
                pass
            decoder.reset()
        failure = runner.failure
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch.compile raises many kinds; eager decoding still works
        failure = f"{verb} failed ({first_line(exc)}); decoding eagerly"
    finally:
        decoder.chooser = chooser  # what the warm-up measured is not the machine's steady state
        if mode == "graphs":
            runner.on_capture = None  # later captures are counted in each reply's stats
    seconds = time.perf_counter() - started
    if failure:
        engine.use_steps(None, "eager")
        report(failure)
        return seconds
    if mode == "graphs":
        report(f"captured {len(runner.graphs)} decode-step graphs in {runner.total.capture_s:.1f} s "
               f"(warm-up {seconds:.1f} s)")
    else:
        report(f"compiled the decode steps in {seconds:.0f} s")
    return seconds
