"""eaglechat on one CUDA device in at most 5 minutes, installs included, every figure kept the moment it
is measured.

    python scripts/gpu_check.py [--out DIR] [--only d,e,b,c,f,a,m] [--budget-s 270]
    python scripts/gpu_check.py --rehearse [--only ...]   # the sections on this CPU, tiny random models

Sections, in the order they run (the figures a short loan most needs come first):
  d  captured steps (CUDA graphs) on the default model, fp16: capture seconds per graph, replay step ms for
     plain decoding and EAGLE at two trees, the eager step beside each, tokens identical
  e  a random-weight Llama-3.1-8B shape, bf16 and nf4: captured and eager step ms, plain and EAGLE at
     16/32/64 verify rows
  b  greedy EAGLE == plain greedy on the default model, fp16 / bf16 / nf4 (3 prompts, 32 tokens, the steps
     users get: CUDA graphs): identical count, first divergence
  c  implicit host syncs per decode step, eager and replayed (random SmolLM2 shape, fp16 / int8 / nf4)
  f  the default model end to end, fp16: plain, EAGLE and speculate="auto" tok/s, the real head's tau
  a  the suite's cuda-marked tests (pytest -m "cuda and not slow")
  m  (last, in what the budget leaves) a random-weight Qwen3-30B-A3B shape cut to 4 layers (128 experts, 8
     per token): eager step ms, plain and EAGLE at 16 verify rows, experts bf16 (transformers' grouped_mm)
     then nf4 per expert (eaglechat/fit/nf4_experts.py), nf4 EAGLE tokens vs nf4 plain

Output in --out (default $OUT): `measurements.jsonl`, one JSON line per figure, written and flushed when
it is measured; `<section>.log`, each section's own output, streamed as it runs; `verdict.json`; the
table last on stdout. Each section runs in its own process under its own limit (SIGINT, then kill), so
a timeout or a crash loses nothing already measured and the others still run. The limits come from an
H200 run (torch 2.11, eager Vicuna-7B step ~23 ms, Llama-3.1-8B ~27 ms, nf4 verify 44-61 ms; loading
and importing are most of each section); --budget-s caps them all together.

b, d and f use the default model when it is installed here (else a random SmolLM2-shaped model: exactness
still means something there, acceptance and speed-ups do not). Without a CUDA device every section
reports "no CUDA device" and the table still prints; --rehearse runs the sections on the CPU on tiny
models (the graphs there are tests/fake_graphs.py's stand-in) to try the script itself: it measures
nothing about a GPU. scripts/gpu/README.md says how to get it onto a GPU machine without network.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's eaglechat, whatever is installed
PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a short Python function that checks whether a number is prime.",
    "Give me three tips for staying focused while studying.",
]
ORDER = "debcfam"
NAMES = {"a": "CUDA-only tests", "b": "greedy EAGLE == plain (fp16/bf16/nf4)", "c": "host syncs per step",
         "d": "captured steps, default model", "e": "Llama-3.1-8B shape step ms", "f": "default model end to end",
         "m": "Qwen3-30B-A3B shape (4 layers), nf4 experts"}
# seconds per section on one H200: importing torch + transformers ~5 s and loading are most of each
LIMITS = {"d": 60, "e": 75, "m": 60, "b": 45, "c": 30, "f": 30, "a": 50}  # m: not yet run on a GPU
FORMATS = {"fp16": ("float16", "none"), "bf16": ("bfloat16", "none"), "int8": ("float16", "8bit"),
           "nf4": ("bfloat16", "4bit")}
TREES = {"16 rows": (15, 4, 4), "32 rows": (31, 5, 8), "64 rows": (63, 6, 10)}  # verify rows, root included
NO_CUDA = "no CUDA device"
MEASUREMENTS = "measurements.jsonl"


# ----------------------------------------------------------------------------------------- recording
class Recorder:
    """One JSON line per figure in OUT/measurements.jsonl, appended and flushed at once."""

    def __init__(self, out: Path, section: str):
        self.path, self.section, self.started = out / MEASUREMENTS, section, time.monotonic()
        self.count = 0  # figures recorded

    def __call__(self, what: str, value=None, unit: str = "", **context) -> None:
        line = {"section": self.section, "what": what, "value": value, "unit": unit,
                "t_s": round(time.monotonic() - self.started, 2), **context}
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
        self.count += what != "result"
        print(f"[{self.section}] {what}: {value}{' ' + unit if unit else ''} {context or ''}", flush=True)

    def result(self, status: str, summary: str, **data) -> None:
        self("result", status=status, summary=summary, **data)


def read_measurements(out: Path) -> list[dict]:
    path = out / MEASUREMENTS
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill
            pass
    return rows


# ----------------------------------------------------------------------------------------- engines
def default_model_available() -> bool:
    try:
        from eaglechat.models import default_model

        return default_model.gguf_path().is_file()
    except Exception:  # noqa: BLE001 - any failure means: not installed here
        return False


class RandomEngine:
    """What the sections use of a LocalEngine (model, head, decoder, budget, encode, stop_ids), random."""

    def __init__(self, decoder, budget, vocab):
        self.decoder, self.budget, self.stop_ids, self._vocab = decoder, budget, set(), vocab
        self.model, self.head = decoder.model, decoder.drafter.head

    def encode(self, messages):
        text = messages[-1]["content"]
        return [(ord(c) * 7919 + i) % self._vocab for i, c in enumerate(text)][:48] or [1]


def smollm2_shape(args):
    from eaglechat.fit.memory import ModelShape

    if args.rehearse:
        return ModelShape(params=0, num_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=32, vocab_size=512, max_context=512, tied_embeddings=False)
    # SmolLM2-135M: 30 layers, 576 hidden, 9 heads / 3 KV heads, 49152 vocab
    return ModelShape(params=134_515_008, num_layers=30, hidden_size=576, intermediate_size=1536,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                      max_context=2048, tied_embeddings=True)


def llama8b_shape(args):
    """models/llama3.1-8b-instruct-eagle2.yaml's shape (a tiny one when rehearsing)."""
    import yaml

    from eaglechat.fit.memory import ModelShape

    if args.rehearse:
        return smollm2_shape(args)
    spec = yaml.safe_load((REPO / "models" / "llama3.1-8b-instruct-eagle2.yaml").read_text())
    return ModelShape(**spec["shape"])


def dtype_for(args, fmt: str) -> tuple[str, str]:
    dtype, quant = FORMATS[fmt]
    return ("float32" if args.device == "cpu" else dtype), quant


def random_engine(args, fmt: str, shape=None, max_context: int = 512) -> RandomEngine:
    import torch

    from eaglechat.bench.random_model import random_head, random_model
    from eaglechat.engine.decode import Decoder
    from eaglechat.engine.protocol import TreeBudget

    shape = shape or smollm2_shape(args)
    dtype, quant = dtype_for(args, fmt)
    model = random_model(shape, device=args.device, dtype=getattr(torch, dtype), quant=quant)
    return RandomEngine(Decoder(model, random_head(model), max_context), TreeBudget(16, 4, 4), shape.vocab_size)


def default_engine(args, fmt: str, compile: str = "off"):
    """-> (engine, label): the default model in `fmt`, or a random SmolLM2-shaped one."""
    if default_model_available() and not args.rehearse:
        from eaglechat.loader import load_engine

        dtype, quant = dtype_for(args, fmt)
        engine = load_engine("smollm2-135m-eagle2", device=args.device, dtype=dtype, quant=quant, compile=compile,
                             max_context=1024)
        return engine, "default model, shipped head"
    return random_engine(args, fmt), "random SmolLM2-shaped model, random head"


def graph_backend(args):
    """What captures graphs: CUDA's, or in a rehearsal tests/fake_graphs.py's stand-in."""
    if not args.rehearse:
        return None
    sys.path.insert(0, str(REPO / "tests"))
    from fake_graphs import FakeGraphs

    return FakeGraphs()


def graphed(args, model, head, max_context: int, record=None):
    """A Decoder over `model` whose steps replay as CUDA graphs; each capture recorded."""
    from eaglechat.engine.compile import GraphSteps
    from eaglechat.engine.decode import Decoder

    decoder = Decoder(model, head, max_context)
    runner = GraphSteps(decoder, graph_backend(args))
    decoder.use(runner)
    if record is not None:
        runner.on_capture = lambda what, seconds: record("capture s", round(seconds, 4), "s", graph=what)
    return decoder


def decode(decoder, prompt_ids, speculate, n: int, budget, stop_ids=()):
    """-> (tokens, per-step seconds, decode tokens/s, tau)."""
    from eaglechat.engine.protocol import GenerationParams

    decoder.reset()
    tokens, steps, started = [], [], None
    for step in decoder.generate(prompt_ids, GenerationParams(max_new_tokens=n, speculate=speculate), budget,
                                 set(stop_ids)):
        tokens += step.tokens
        if step.stats is None:
            started = time.perf_counter()
        else:
            steps.append(step.stats.step_s)
    synchronize()
    seconds = time.perf_counter() - started if started else 0.0
    return tokens, steps, (len(tokens) - 1) / seconds if seconds > 0 else 0.0, decoder.stats.mean_accepted


def ms(steps: list[float]) -> float | None:
    return round(statistics.median(steps) * 1e3, 3) if steps else None


def first_divergence(a: list[int], b: list[int]) -> int | None:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def release() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def prompts_for(args) -> list[str]:
    return PROMPTS[:1] if args.rehearse else PROMPTS


def budget_of(rows: tuple[int, int, int]):
    from eaglechat.engine.protocol import TreeBudget

    return TreeBudget(*rows)


# ----------------------------------------------------------------------------------------- sections
def section_d(args, record):
    """Captured vs eager steps on the default model (fp16), over the same weights: two decoders."""
    started = time.perf_counter()
    engine, label = default_engine(args, "fp16")
    record("loaded", round(time.perf_counter() - started, 2), "s", model=label)
    eager = engine.decoder
    graphs = graphed(args, engine.model, engine.head, eager.max_context, record)
    n = 8 if args.rehearse else 48
    modes = {"plain": (False, budget_of((16, 4, 4))), "EAGLE 16/4/4": (True, budget_of((16, 4, 4))),
             "EAGLE 48/5/8": (True, budget_of((48, 5, 8)))}
    prompts = [engine.encode([{"role": "user", "content": p}]) for p in prompts_for(args)]
    same, total, figures = 0, 0, {}
    for mode, (speculate, budget) in modes.items():
        decode(graphs, prompts[0], speculate, n, budget)  # its captures (the first bucket or two)
        step = {"graphs": [], "eager": []}
        for ids in prompts:
            got_e, steps_e, _, _ = decode(eager, ids, speculate, n, budget)
            got_g, steps_g, _, _ = decode(graphs, ids, speculate, n, budget)
            step["eager"] += steps_e[1:]
            step["graphs"] += steps_g[1:] if not graphs.stats.graph_captures else []
            same += got_e == got_g
            total += 1
            record("tokens identical", got_e == got_g, mode=mode, first_divergence=first_divergence(got_e, got_g))
        figures[mode] = {k: ms(v) for k, v in step.items()}
        record("replay step ms", figures[mode]["graphs"], "ms", mode=mode)
        record("eager step ms", figures[mode]["eager"], "ms", mode=mode)
    runner = graphs.runner
    if runner is None:
        return record.result("FAIL", "the graph runner gave way to eager decoding (see d.log)")
    record("graphs held", len(runner.graphs), captures=runner.total.captures,
           capture_s=round(runner.total.capture_s, 3), replays=runner.total.replays)
    per_graph = runner.total.capture_s / max(1, runner.total.captures)
    status = "PASS" if same == total else "WARN"
    summary = (f"{runner.total.captures} graphs, {per_graph:.2f} s per capture; step ms replay/eager "
               + ", ".join(f"{m} {f['graphs']}/{f['eager']}" for m, f in figures.items())
               + f"; tokens identical {same}/{total} [{label}]")
    record.result(status, summary, step_ms=figures, capture_s_per_graph=round(per_graph, 4))


def section_e(args, record):
    """Step ms of a random-weight Llama-3.1-8B: plain and EAGLE at 16/32/64 verify rows, captured and eager."""
    import torch

    from eaglechat.bench.random_model import random_head, random_model
    from eaglechat.engine.decode import Decoder

    shape = llama8b_shape(args)
    steps_n, prompt_len = (2, 24) if args.rehearse else (12, 256)
    trees = dict(list(TREES.items())[:1]) if args.rehearse else TREES
    table = {}
    for fmt in ("bf16", "nf4"):
        try:
            dtype, quant = dtype_for(args, fmt)
            started = time.perf_counter()
            model = random_model(shape, device=args.device, dtype=getattr(torch, dtype), quant=quant)
            head = random_head(model)
            synchronize()
            record("built", round(time.perf_counter() - started, 2), "s", format=fmt)
            context = prompt_len + 64 + steps_n * 8
            decoders = {"graphs": graphed(args, model, head, context, lambda *a, **k: record(*a, format=fmt, **k)),
                        "eager": Decoder(model, head, context)}
            prompt = [(7919 * i) % shape.vocab_size for i in range(prompt_len)]
            for mode, rows in (("plain", None), *trees.items()):
                budget = budget_of(rows or (15, 4, 4))
                for kind, decoder in decoders.items():
                    decode(decoder, prompt, rows is not None, 2 if args.rehearse else 3, budget)  # first calls, captures
                    _, steps, _, _ = decode(decoder, prompt, rows is not None, steps_n + 1, budget)
                    table[f"{fmt} {mode} {kind}"] = ms(steps[1:])
                    record("step ms", table[f"{fmt} {mode} {kind}"], "ms", format=fmt, mode=mode, steps=kind)
            del model, head, decoders
        except Exception as exc:  # noqa: BLE001 - one format failing must not hide the other
            traceback.print_exc()
            record("error", f"{type(exc).__name__}: {str(exc)[:200]}", format=fmt)
        release()
    parts = []
    for fmt in ("bf16", "nf4"):
        plain = table.get(f"{fmt} plain graphs")
        if plain:
            rows = ", ".join(f"{m} {table.get(f'{fmt} {m} graphs')}" for m in trees)
            parts.append(f"{fmt}: plain {plain} ms ({1e3 / plain:.0f} tok/s) eager {table.get(f'{fmt} plain eager')}; "
                         f"EAGLE {rows} (eager 64 rows {table.get(f'{fmt} 64 rows eager')})")
    record.result("INFO" if parts else "FAIL", "; ".join(parts) or "nothing measured", step_ms=table)


def moe_model(args):
    """A random Qwen3-MoE with models/qwen3-30b-a3b-eagle3.yaml's shape, 4 layers (a tiny one rehearsing)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dims = dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_attention_heads=32,
                num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8, vocab_size=151936)
    if args.rehearse:
        dims = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=64, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2, vocab_size=512)
    config = AutoConfig.for_model("qwen3_moe", num_hidden_layers=2 if args.rehearse else 4,
                                  max_position_embeddings=4096, tie_word_embeddings=False, **dims)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval().requires_grad_(False), dims["vocab_size"]


def section_m(args, record):
    """Eager step ms of a 4-layer Qwen3-30B-A3B shape, experts bf16 then nf4 (only the routed experts run)."""
    from eaglechat.bench.random_model import random_head
    from eaglechat.engine.decode import Decoder
    from eaglechat.fit.nf4_experts import quantize_model_experts

    started = time.perf_counter()
    model, vocab = moe_model(args)
    head = random_head(model)
    synchronize()
    record("built", round(time.perf_counter() - started, 2), "s")
    steps_n, prompt = (2, list(range(3, 27))) if args.rehearse else (12, [(7919 * i) % vocab for i in range(256)])
    table, tokens = {}, {}
    for experts in ("bf16", "nf4"):
        if experts == "nf4":
            started = time.perf_counter()
            record("experts quantized", quantize_model_experts(model), "modules",
                   seconds=round(time.perf_counter() - started, 2))
            release()
        decoder = Decoder(model, head, len(prompt) + 64 + steps_n * 16)
        for mode, speculate in (("plain", False), ("EAGLE 16 rows", True)):
            budget = budget_of((15, 4, 4))
            decode(decoder, prompt, speculate, 3, budget)  # first calls
            got, steps, _, _ = decode(decoder, prompt, speculate, steps_n + 1, budget)
            tokens[(experts, mode)] = got
            table[f"{experts} {mode}"] = ms(steps[1:])
            record("eager step ms", table[f"{experts} {mode}"], "ms", experts=experts, mode=mode)
    same = tokens[("nf4", "plain")] == tokens[("nf4", "EAGLE 16 rows")][:len(tokens[("nf4", "plain")])]
    record("nf4 EAGLE tokens == nf4 plain", same)
    summary = "; ".join(f"{k} {v} ms" for k, v in table.items()) + f"; nf4 EAGLE == plain: {same} (eager steps)"
    record.result("INFO" if same else "WARN", summary, step_ms=table)


def section_b(args, record):
    n = 16 if args.rehearse else 32
    results, label = {}, ""
    for fmt in ("fp16", "bf16", "nf4"):
        try:
            engine, label = default_engine(args, fmt, compile="off" if args.rehearse else "auto")
            same, diverged = 0, []
            for prompt in prompts_for(args):
                ids = engine.encode([{"role": "user", "content": prompt}])
                plain = decode(engine.decoder, ids, False, n, engine.budget)[0]
                eagle = decode(engine.decoder, ids, True, n, engine.budget)[0]
                at = first_divergence(plain, eagle)
                same += at is None
                diverged += [] if at is None else [at]
            results[fmt] = {"identical": same, "of": len(prompts_for(args)), "first_divergence_at": diverged,
                            "steps": getattr(getattr(engine, "info", None), "steps", "eager")}
            record("identical", same, f"of {len(prompts_for(args))}", format=fmt, first_divergence_at=diverged,
                   steps=results[fmt]["steps"])
            del engine
        except Exception as exc:  # noqa: BLE001 - one format failing must not hide the others
            traceback.print_exc()
            results[fmt] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
            record("error", results[fmt]["error"], format=fmt)
        release()
    ok = all(r.get("identical") == r.get("of") for r in results.values())
    summary = "; ".join(f"{f}: {r['identical']}/{r['of']} identical ({r['steps']})"
                        + (f", first divergence at {r['first_divergence_at']}" if r["first_divergence_at"] else "")
                        if "identical" in r else f"{f}: {r['error']}" for f, r in results.items())
    record.result("PASS" if ok else "WARN", f"{summary} [{label}, {n} tokens]", results=results)


def count_syncs(decoder, ids, speculate: bool, budget, n: int = 24) -> tuple[float, dict]:
    """Implicit host syncs per decode step (the decoder's one read per step turns the mode off for itself)."""
    import warnings

    import torch

    from eaglechat.engine.protocol import GenerationParams

    decoder.reset()
    steps = decoder.generate(ids, GenerationParams(max_new_tokens=n, speculate=speculate), budget, set())
    next(steps)  # the prefill and the first token read the device by design
    cuda = decoder.device.type == "cuda"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in steps:
                pass
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    where: dict[str, int] = {}
    for w in syncs:
        key = f"{Path(w.filename).name}:{w.lineno}"
        where[key] = where.get(key, 0) + 1
    return len(syncs) / max(1, decoder.stats.target_forwards), dict(sorted(where.items(), key=lambda kv: -kv[1])[:5])


def section_c(args, record):
    rows, n = {}, 8 if args.rehearse else 24
    for fmt in ("fp16", "nf4") if args.rehearse else ("fp16", "int8", "nf4"):
        try:
            engine = random_engine(args, fmt)
            ids = engine.encode([{"role": "user", "content": PROMPTS[0]}])
            graphs = graphed(args, engine.model, engine.head, 512)
            for kind, decoder in (("eager", engine.decoder), ("graphs", graphs)):
                for mode in ("plain", "eagle"):
                    if kind == "graphs":
                        decode(decoder, ids, mode == "eagle", n, engine.budget)  # captures first
                    per_step, where = count_syncs(decoder, ids, mode == "eagle", engine.budget, n)
                    rows[f"{fmt} {mode} {kind}"] = per_step
                    record("syncs per step", round(per_step, 3), format=fmt, mode=mode, steps=kind, sites=where)
            del engine, graphs
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            rows[fmt] = f"{type(exc).__name__}: {str(exc)[:160]}"
            record("error", rows[fmt], format=fmt)
        release()
    clean = all(v == 0 for v in rows.values())
    record.result("PASS" if clean else "FAIL", "; ".join(f"{k}: {v if isinstance(v, str) else round(v, 2)}"
                                                          for k, v in rows.items()), rows=rows)


def section_f(args, record):
    engine, label = default_engine(args, "fp16", compile="off" if args.rehearse else "auto")
    n = 12 if args.rehearse else 128
    speed: dict[str, list] = {"plain": [], "EAGLE": [], "auto": []}
    taus: dict[str, list] = {"EAGLE": [], "auto": []}
    for prompt in prompts_for(args):
        ids = engine.encode([{"role": "user", "content": prompt}])
        for mode, speculate in (("plain", False), ("EAGLE", True), ("auto", "auto")):
            _, _, tps, tau = decode(engine.decoder, ids, speculate, n, engine.budget, getattr(engine, "stop_ids", ()))
            speed[mode].append(tps)
            if mode in taus:
                taus[mode].append(tau)
            record("tok/s", round(tps, 1), "tok/s", mode=mode, tau=round(tau, 2))
    tok = {m: round(statistics.median(v), 1) for m, v in speed.items()}
    tau = {m: round(statistics.median(v), 2) for m, v in taus.items()}
    steps = getattr(getattr(engine, "info", None), "steps", "eager")
    record.result("INFO", f"plain {tok['plain']}, EAGLE {tok['EAGLE']} (tau {tau['EAGLE']}), auto {tok['auto']} tok/s "
                          f"({engine.decoder.chooser.label() or 'auto'}) [{label}, {steps} steps, {n} tokens]",
                  tok_s=tok, tau=tau)


def section_a(args, record):
    """The tests marked `cuda` (pyproject.toml) and not slow, in this process; each outcome recorded as it
    is known. Only their files are collected (a GPU image may lack what other test files import)."""
    import pytest

    files = sorted(str(p) for p in (REPO / "tests").glob("test_*.py") if "mark.cuda" in p.read_text())
    outcomes: dict[str, int] = {}

    class Outcomes:
        def pytest_runtest_logreport(self, report):
            if report.when == "call" or report.outcome != "passed":
                outcomes[report.outcome] = outcomes.get(report.outcome, 0) + 1
                record("test", report.outcome, test=report.nodeid.split("::", 1)[-1], seconds=round(report.duration, 2))

    rc = pytest.main(["-q", "-rs", "-p", "no:cacheprovider", "-m", "cuda and not slow", *files], plugins=[Outcomes()])
    skipped = outcomes.get("skipped", 0)
    status = "PASS" if rc == 0 and not skipped else "INFO" if args.rehearse else "FAIL"  # a CPU skips them all
    record.result(status, ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())) + f" (pytest rc {int(rc)})")


SECTIONS = {"a": section_a, "b": section_b, "c": section_c, "d": section_d, "e": section_e, "f": section_f,
            "m": section_m}


# ----------------------------------------------------------------------------------------- the run
def machine_line(device: str) -> str:
    import importlib.metadata as md
    import platform

    import torch

    parts = [time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), f"torch {torch.__version__}"]
    if device.startswith("cuda"):
        parts.append(f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})")
    else:
        parts.append(f"{platform.machine()} CPU, {NO_CUDA}" if not torch.cuda.is_available() else "CPU")
    for package in ("transformers", "bitsandbytes"):
        try:
            parts.append(f"{package} {md.version(package)}")
        except Exception:  # noqa: BLE001
            parts.append(f"{package} missing")
    return ", ".join(parts)


def run_section(args, s: str, limit: int, out: Path) -> dict:
    """Section `s` in its own process, its output streamed to OUT/<s>.log; -> its result (from the
    measurements file: a section cut short keeps what it recorded)."""
    cmd = [sys.executable, __file__, "--section", s, "--device", args.device, "--out", str(out)]
    cmd += ["--rehearse"] if args.rehearse else []
    started = time.monotonic()
    with open(out / f"{s}.log", "w") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            rc = p.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGINT)  # Python prints where it was
            try:
                p.wait(timeout=3)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            rc = f"timeout after {limit} s"
    seconds = round(time.monotonic() - started)
    mine = [m for m in read_measurements(out) if m.get("section") == s]
    done = [m for m in mine if m["what"] == "result"]
    if done:
        return {**done[-1], "seconds": seconds}
    last = [m for m in mine if m["what"] != "result"][-1:]
    kept = f"; {len(mine)} figures kept, the last: {last[0]['what']} {last[0]['value']}" if last else ""
    return {"section": s, "status": "TIMEOUT" if isinstance(rc, str) else "FAIL",
            "summary": f"{rc if isinstance(rc, str) else f'rc={rc}'}{kept} (see {s}.log)", "seconds": seconds}


def run_all(args) -> int:
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MEASUREMENTS).unlink(missing_ok=True)
    wanted = [s for s in ORDER if s in args.only.split(",")]
    has_cuda = torch.cuda.is_available() and args.device.startswith("cuda")
    if not has_cuda and args.rehearse:
        args.device = "cpu"
    machine = machine_line(args.device if has_cuda else "cpu")
    Recorder(out, "check")("machine", machine, rehearsal=args.rehearse)
    results: dict[str, dict] = {}
    deadline = time.monotonic() + args.budget_s
    for s in wanted:
        if not has_cuda and not args.rehearse:
            results[s] = {"section": s, "status": "SKIP", "summary": NO_CUDA, "seconds": 0}
            continue
        limit = int(min(LIMITS[s] * (4 if args.rehearse else 1), deadline - time.monotonic()))
        if limit < 10:
            results[s] = {"section": s, "status": "SKIP", "summary": "no time left in the budget", "seconds": 0}
            continue
        results[s] = run_section(args, s, limit, out)
        print(f"[{s}] {results[s]['status']} in {results[s]['seconds']} s: {results[s]['summary'][:300]}", flush=True)
    (out / "verdict.json").write_text(json.dumps({"machine": machine, "rehearsal": args.rehearse, "sections": results},
                                                 indent=1))
    print(f"\n==== eaglechat GPU check{' (CPU rehearsal: not a GPU measurement)' if args.rehearse else ''} ====")
    print(machine)
    print(f"{'':2} {'check':38} {'status':7} {'s':>4}  detail")
    for s, r in results.items():
        print(f"{s:2} {NAMES[s]:38} {r['status']:7} {r.get('seconds', ''):>4}  {r['summary'][:500]}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/gpu_check.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cuda:N")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu_check_out"), help="folder for the figures and logs")
    ap.add_argument("--only", default=",".join(ORDER), help=f"sections to run (default all: {','.join(ORDER)})")
    ap.add_argument("--budget-s", type=int, default=270, help="seconds for all sections together (default 270)")
    ap.add_argument("--rehearse", action="store_true", help="run the sections on this CPU with tiny models")
    ap.add_argument("--section", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.section:
        record = Recorder(Path(args.out), args.section)
        try:
            SECTIONS[args.section](args, record)
        except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt too: the limit's SIGINT
            traceback.print_exc()
            timeout = isinstance(exc, KeyboardInterrupt)  # the limit's SIGINT
            what = "stopped at its limit" if timeout else f"{type(exc).__name__}: {str(exc).strip()[:200]}"
            record.result("TIMEOUT" if timeout else "FAIL",
                          f"{what}; {record.count} figures kept (see {args.section}.log)")
        return 0
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
