"""eaglechat on one CUDA device, in at most 8 minutes: every section, then one verdict table.

    python scripts/gpu_check.py [--out DIR] [--only a,b,c,d,e] [--budget-s 450]
    python scripts/gpu_check.py --rehearse [--only ...]   # the sections on this CPU, tiny random models

  a  the suite's CUDA-only tests (pytest -m cuda)
  b  greedy EAGLE == plain greedy on 10 prompts, fp32 / fp16 / bf16 / nf4: identical count, first divergence
  c  implicit host syncs per decode step under torch.cuda.set_sync_debug_mode (fp16, int8, nf4)
  d  compiled decode steps (CUDA graphs): graphs, recompiles, cudagraph skips, warm-up, speed vs eager
  e  eaglechat bench --costs, random Vicuna-7B and Llama-3.1-8B shapes, fp16 / int8 / nf4
  f  EAGLE vs plain tokens/s, eager (from b, fp16) and compiled (from d)

b, d and f use the default model when it is installed here (else a random SmolLM2-shaped model: exactness
still means something there, acceptance and speed-ups do not). Each section runs in its own subprocess
under its own time limit, so a crash or a hang in one (a graph capture error, a bitsandbytes fault) is
reported and the others still run; each prints one RESULT line, the table comes last (a remote run
often returns only the tail of its output). Without a CUDA device every section reports "no CUDA
device" and the table still prints (the check of the check); --rehearse runs the sections on the CPU
instead, on tiny models, to try the script itself. Nothing here is a measurement of a GPU until it has
run on one. scripts/gpu/README.md says how to get it onto a GPU machine without network.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a short Python function that checks whether a number is prime.",
    "Give me three tips for staying focused while studying.",
    "What is the capital of France, and what is it famous for?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "How do I make a cup of green tea?",
    "List five animals that live in the ocean.",
    "What is the difference between a list and a tuple in Python?",
    "Write a haiku about autumn leaves.",
    "Why do we need sleep?",
]
NAMES = {"a": "CUDA-only tests", "b": "greedy EAGLE == plain (fp32/fp16/bf16/nf4)", "c": "host syncs per step",
         "d": "compiled steps (CUDA graphs)", "e": "bench --costs 7B/8B shapes", "f": "EAGLE vs plain tok/s"}
# seconds on the GPU (guesses: no GPU has run this yet); a section gets at most what --budget-s leaves, so
# e, last, is the one cut short. d compiles four graphs at load (EAGLE, speculate="auto"'s lighter tree and
# its plain step, plain) where it compiled two
LIMITS = {"a": 60, "b": 110, "c": 45, "d": 180, "e": 130}
FORMATS = {"fp32": ("float32", "none"), "fp16": ("float16", "none"), "bf16": ("bfloat16", "none"),
           "int8": ("float16", "8bit"), "nf4": ("float16", "4bit")}
NO_CUDA = "no CUDA device"


def emit(section: str, status: str, summary: str, **data) -> None:
    print("RESULT " + json.dumps({"section": section, "status": status, "summary": summary, **data}), flush=True)


# ----------------------------------------------------------------------------------------- engines


def default_model_available() -> bool:
    try:
        from eaglechat.models import default_model

        return default_model.gguf_path().is_file()
    except Exception:  # noqa: BLE001 - any failure means: not installed here
        return False


class RandomEngine:
    """What the sections use of a LocalEngine (decoder, budget, encode, stop_ids) over a random model."""

    def __init__(self, decoder, budget, vocab):
        self.decoder, self.budget, self.stop_ids, self._vocab = decoder, budget, set(), vocab

    def encode(self, messages):
        text = messages[-1]["content"]
        return [(ord(c) * 7919 + i) % self._vocab for i, c in enumerate(text)][:48] or [1]


def engine_for(args, fmt: str, compile: bool = False):
    """-> (engine, label): the default model in `fmt`, or a random SmolLM2-shaped one (tiny when rehearsing)."""
    dtype, quant = FORMATS[fmt]
    if args.device == "cpu":
        dtype = "float32" if fmt in ("int8", "nf4") else dtype
    if default_model_available() and not args.rehearse:
        from eaglechat.engine.protocol import TreeBudget
        from eaglechat.loader import load_engine

        engine = load_engine("smollm2-135m-eagle2", device=args.device, dtype=dtype, quant=quant,
                             compile="on" if compile else "off", max_context=1024,
                             tree=TreeBudget(16, 4, 4) if args.device == "cpu" else None)
        return engine, "default model, shipped head"
    return random_engine(args, dtype, quant, compile), "random SmolLM2-shaped model, random head"


def random_engine(args, dtype: str, quant: str = "none", compile: bool = False) -> RandomEngine:
    import torch

    from eaglechat.bench.random_model import random_head, random_model
    from eaglechat.engine.decode import Decoder
    from eaglechat.engine.protocol import TreeBudget
    from eaglechat.fit.memory import ModelShape

    if args.rehearse:
        shape = ModelShape(params=0, num_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=32, vocab_size=512, max_context=512, tied_embeddings=False)
    else:  # SmolLM2-135M: 30 layers, 576 hidden, 9 heads / 3 KV heads, 49152 vocab
        shape = ModelShape(params=134_515_008, num_layers=30, hidden_size=576, intermediate_size=1536,
                           num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                           max_context=2048, tied_embeddings=True)
    model = random_model(shape, device=args.device, dtype=getattr(torch, dtype), quant=quant)
    decoder = Decoder(model, random_head(model), 512)
    if compile:
        from eaglechat.engine.compile import CompiledSteps, step_compiler

        if args.device.startswith("cuda"):
            decoder.use(CompiledSteps(decoder, step_compiler("cuda"), torch.compiler.cudagraph_mark_step_begin))
        else:  # the rehearsal: dynamo's graphs without a backend's code generation (seconds, not minutes)
            decoder.use(CompiledSteps(decoder, lambda fn: torch.compile(fn, backend="eager", fullgraph=True, dynamic=False)))
    return RandomEngine(decoder, TreeBudget(16, 4, 4), shape.vocab_size)


def decode(engine, prompt_ids, speculate: bool | str, n: int):
    """-> (tokens, per-step seconds, decode tokens/s, tau)."""
    from eaglechat.engine.protocol import GenerationParams

    decoder = engine.decoder
    decoder.reset()
    tokens, steps, started = [], [], None
    for step in decoder.generate(prompt_ids, GenerationParams(max_new_tokens=n, speculate=speculate),
                                 engine.budget, set(engine.stop_ids)):
        tokens += step.tokens
        if step.stats is None:
            started = time.perf_counter()
        else:
            steps.append(step.stats.step_s)
    synchronize()
    seconds = time.perf_counter() - started if started else 0.0
    return tokens, steps, (len(tokens) - 1) / seconds if seconds > 0 else 0.0, decoder.stats.mean_accepted


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


# ----------------------------------------------------------------------------------------- sections


def section_a(args):
    """The tests marked `cuda` (pyproject.toml), which skip everywhere else; only their files are collected
    (a GPU image may lack what other test files import)."""
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py") if "mark.cuda" in p.read_text())
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", "cuda", *files]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=max(10, args.limit - 5))
    Path(args.out, "a_pytest.log").write_text(p.stdout + p.stderr)
    lines = p.stdout.splitlines()
    tail = [line for line in lines if " passed" in line or " failed" in line or " error" in line]
    skipped = [line for line in lines if "SKIPPED" in line]
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))][:4]
    status = "PASS" if p.returncode == 0 and not skipped else "FAIL"
    emit("a", status, (tail[-1] if tail else f"pytest rc={p.returncode}") + (f"; {len(skipped)} skipped" if skipped else ""),
         failed=failed)


def section_b(args):
    n = 16 if args.rehearse else 48
    prompts = PROMPTS[:3] if args.rehearse else PROMPTS
    results, label = {}, ""
    for fmt in ("fp32", "fp16", "bf16", "nf4"):
        try:
            engine, label = engine_for(args, fmt)
            same, diverged, speed, taus = 0, [], {"plain": [], "eagle": []}, []
            for prompt in prompts:
                ids = engine.encode([{"role": "user", "content": prompt}])
                plain, _, plain_tps, _ = decode(engine, ids, False, n)
                eagle, _, eagle_tps, tau = decode(engine, ids, True, n)
                speed["plain"].append(plain_tps)
                speed["eagle"].append(eagle_tps)
                taus.append(tau)
                at = first_divergence(plain, eagle)
                same += at is None
                if at is not None:
                    diverged.append(at)
            results[fmt] = {"identical": same, "of": len(prompts), "first_divergence_at": diverged,
                            "plain_tok_s": round(statistics.median(speed["plain"]), 1),
                            "eagle_tok_s": round(statistics.median(speed["eagle"]), 1),
                            "tau": round(statistics.median(taus), 2)}
            del engine
        except Exception as exc:  # noqa: BLE001 - one format failing must not hide the others
            results[fmt] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
        release()
    fp32 = results.get("fp32", {})
    status = "PASS" if fp32.get("identical") == fp32.get("of") and not any("error" in r for r in results.values()) else "FAIL"
    summary = "; ".join(
        f"{f}: {r['identical']}/{r['of']} identical" + (f" (first divergence at {r['first_divergence_at']})"
                                                        if r["first_divergence_at"] else "")
        if "identical" in r else f"{f}: {r['error']}" for f, r in results.items())
    emit("b", status, f"{summary} [{label}, {n} tokens]", results=results)


def count_syncs(engine, speculate: bool, n: int = 24):
    """Implicit host syncs per decode step (the decoder's one read per step turns the mode off for itself)."""
    import warnings

    import torch

    from eaglechat.engine.protocol import GenerationParams

    decoder = engine.decoder
    decoder.reset()
    ids = engine.encode([{"role": "user", "content": PROMPTS[0]}])
    steps = decoder.generate(ids, GenerationParams(max_new_tokens=n, speculate=speculate), engine.budget, set())
    next(steps)  # the prefill and the first token read the device by design
    cuda = str(decoder.device).startswith("cuda")
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


def section_c(args):
    rows = {}
    for fmt in ("fp16", "int8", "nf4"):
        dtype, quant = FORMATS[fmt]
        try:
            engine = random_engine(args, "float32" if args.device == "cpu" else dtype, quant)
            for mode in ("plain", "eagle"):
                per_step, where = count_syncs(engine, mode == "eagle")
                rows[f"{fmt} {mode}"] = {"syncs_per_step": round(per_step, 2), "sites": where}
            del engine
        except Exception as exc:  # noqa: BLE001
            rows[fmt] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        release()
    clean = all(r.get("syncs_per_step") == 0 for r in rows.values())
    status = "PASS" if clean else "FAIL"
    emit("c", status, "; ".join(f"{k}: {r.get('syncs_per_step', r.get('error'))}" for k, r in rows.items()), rows=rows)


def section_d(args):
    import torch

    counters = torch._dynamo.utils.counters
    fmt = "fp32" if args.device == "cpu" else "fp16"
    try:
        started = time.perf_counter()
        counters.clear()
        compiled, label = engine_for(args, fmt, compile=True)
        info = getattr(compiled, "info", None)
        if info is not None and not info.compiled:
            emit("d", "FAIL", "the compiler refused the model: it decodes eagerly (see d.log)")
            return
        from eaglechat.engine.autospec import SpeculationChooser

        # load_engine warms up already; a random engine has not: every step speculate="auto" may take too
        chooser, compiled.decoder.chooser = compiled.decoder.chooser, SpeculationChooser(probe=1)
        for speculate in (True, "auto", False):
            decode(compiled, compiled.encode([{"role": "user", "content": "Hello"}]), speculate, 16)
        compiled.decoder.chooser = chooser
        warmup_s = time.perf_counter() - started
        graphs = counters["stats"]["unique_graphs"]
        eager, _ = engine_for(args, fmt)
        n = 16 if args.rehearse else 64
        steps = {k: [] for k in ("eager plain", "compiled plain", "eager eagle", "compiled eagle", "compiled auto")}
        speed = {k: [] for k in steps}
        same = 0
        prompts = PROMPTS[:2] if args.rehearse else PROMPTS[:5]
        for prompt in prompts:  # interleaved: eager, compiled, eager, compiled
            ids = eager.encode([{"role": "user", "content": prompt}])
            runs = {}
            for key, engine, speculate in (("eager plain", eager, False), ("compiled plain", compiled, False),
                                           ("eager eagle", eager, True), ("compiled eagle", compiled, True),
                                           ("compiled auto", compiled, "auto")):
                tokens, step_s, tps, _ = decode(engine, ids, speculate, n)
                runs[key] = tokens
                steps[key] += step_s[1:]
                speed[key].append(tps)
            same += (runs["compiled plain"] == runs["eager plain"]) + (runs["compiled eagle"] == runs["eager eagle"])
            same += runs["compiled auto"] == runs["eager plain"]
        recompiles = counters["stats"]["unique_graphs"] - graphs
        skips = counters["inductor"]["cudagraph_skips"]  # torch/_inductor/cudagraph_utils.py counts each skip
        step_ms = {k: round(statistics.median(v) * 1e3, 2) for k, v in steps.items() if v}
        tok_s = {k: round(statistics.median(v), 1) for k, v in speed.items() if v}
        ratio = {m: round(tok_s[f"compiled {m}"] / tok_s[f"eager {m}"], 2)
                 for m in ("plain", "eagle") if tok_s.get(f"eager {m}")}
        status = "PASS" if recompiles == 0 and not skips and same == 3 * len(prompts) else "WARN"
        emit("d", status, f"{fmt}: warm-up {warmup_s:.0f} s (load included), {graphs} graphs, {recompiles} recompiles "
             f"after warm-up, cudagraph skips {skips}; compiled/eager tok/s {ratio}; step ms {step_ms}; "
             f"compiled == eager tokens {same}/{3 * len(prompts)} (auto included); "
             f"{compiled.decoder.chooser.label()} [{label}]",
             step_ms=step_ms, tok_s=tok_s, label=label, recompiles=recompiles, warmup_s=round(warmup_s, 1),
             auto=compiled.decoder.chooser.label())
    except Exception as exc:  # noqa: BLE001
        Path(args.out, "d_traceback.txt").write_text(traceback.format_exc())
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        emit("d", "FAIL", f"{type(exc).__name__}: {first}")


def section_e(args):
    """`bench --costs` with random weights: the 7B/8B shapes of the catalog (a tiny one when rehearsing)."""
    if args.rehearse:
        import yaml

        manifest = Path(args.out, "tiny-check.yaml")
        spec = yaml.safe_load((REPO / "models" / "vicuna-7b-eagle2.yaml").read_text())
        spec["name"] = "tiny-check"
        spec["shape"] = {"params": 1000000, "num_layers": 2, "hidden_size": 128, "intermediate_size": 256,
                         "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 32, "vocab_size": 512,
                         "max_context": 512, "tied_embeddings": False}
        manifest.write_text(yaml.safe_dump(spec))
        targets = [str(manifest)]
        extra, formats = ["--kv-lengths", "64", "--depths", "2", "--draft-top-ks", "4", "--decode-steps", "3"], "fp32"
    else:
        targets = ["vicuna-7b-eagle2", "llama3.1-8b-instruct-eagle2"]
        extra = ["--kv-lengths", "128,1024", "--depths", "4,6", "--draft-top-ks", "8", "--decode-steps", "12"]
        formats = "fp16,int8,nf4"
    found, failed = [], []
    started = time.monotonic()
    for i, target in enumerate(targets):
        name = Path(target).stem
        out = Path(args.out, f"costs-{name}.json")
        left = args.limit - 5 - (time.monotonic() - started)
        cmd = [sys.executable, "-m", "eaglechat", "bench", target, "--costs", "--random-weights", "--device", args.device,
               "--formats", formats, "--json", str(out), *extra]
        try:
            p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=max(5, left / (len(targets) - i)))
        except subprocess.TimeoutExpired:
            failed.append(f"{name}: timed out")
            continue
        Path(args.out, f"e_{name}.log").write_text(" ".join(cmd) + "\n" + p.stdout + p.stderr)
        if p.returncode != 0:
            failed.append(f"{name}: rc={p.returncode} {(p.stderr.strip().splitlines() or [''])[-1][:160]}")
            continue
        lines = [line.strip() for line in (p.stdout + p.stderr).splitlines() if "tok/s" in line or "tokens/s" in line]
        found.append(f"{name}: " + " | ".join(line[:90] for line in lines[:3]))
    emit("e", "FAIL" if failed else "PASS", "; ".join(failed + found) or "no output")


SECTIONS = {"a": section_a, "b": section_b, "c": section_c, "d": section_d, "e": section_e}


# ----------------------------------------------------------------------------------------- the run


def machine_line(device: str) -> str:
    import platform

    import torch

    parts = [time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), f"torch {torch.__version__}"]
    if device.startswith("cuda"):
        parts.append(f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})")
    else:
        parts.append(f"{platform.machine()} CPU, {NO_CUDA}" if not torch.cuda.is_available() else "CPU")
    for package in ("transformers", "bitsandbytes"):
        try:
            import importlib.metadata as md

            parts.append(f"{package} {md.version(package)}")
        except Exception:  # noqa: BLE001
            parts.append(f"{package} missing")
    return ", ".join(parts)


def derived_f(results: dict) -> dict:
    parts = []
    fp16 = ((results.get("b") or {}).get("results") or {}).get("fp16") or {}
    if fp16.get("plain_tok_s"):
        parts.append(f"eager fp16: plain {fp16['plain_tok_s']} -> EAGLE {fp16['eagle_tok_s']} tok/s "
                     f"(x{fp16['eagle_tok_s'] / fp16['plain_tok_s']:.2f}, tau {fp16['tau']})")
    tok = (results.get("d") or {}).get("tok_s") or {}
    if tok.get("compiled plain"):
        parts.append(f"compiled: plain {tok['compiled plain']} -> EAGLE {tok.get('compiled eagle')} tok/s "
                     f"(eager {tok.get('eager plain')} -> {tok.get('eager eagle')})")
    if parts:
        return {"section": "f", "status": "INFO", "summary": "; ".join(parts)}
    reason = NO_CUDA if all(r.get("summary") == NO_CUDA for r in results.values()) else "needs b and d"
    return {"section": "f", "status": "SKIP", "summary": reason}


def run_all(args) -> int:
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = [s for s in args.only.split(",") if s in SECTIONS]
    has_cuda = torch.cuda.is_available() and args.device.startswith("cuda")
    results: dict[str, dict] = {}
    deadline = time.monotonic() + args.budget_s
    for s in wanted:
        if not has_cuda and not args.rehearse:
            results[s] = {"section": s, "status": "SKIP", "summary": NO_CUDA, "seconds": 0}
            continue
        left = deadline - time.monotonic()
        limit = int(min(LIMITS[s] * (3 if args.rehearse else 1), left))
        if limit < 15:
            results[s] = {"section": s, "status": "SKIP", "summary": "no time left in the budget", "seconds": 0}
            continue
        cmd = [sys.executable, __file__, "--section", s, "--device", args.device if has_cuda else "cpu",
               "--out", str(out), "--limit", str(limit)] + (["--rehearse"] if args.rehearse else [])
        started = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, cwd=REPO)
            text, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as exc:
            raw = exc.stdout or b""
            text, rc = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw), f"timeout after {limit} s"
        (out / f"{s}.log").write_text(text)
        found = [json.loads(line[7:]) for line in text.splitlines() if line.startswith("RESULT ")]
        last = [line for line in text.strip().splitlines() if line.strip()][-1:] or [""]
        results[s] = found[-1] if found else {"section": s, "status": "FAIL", "summary": f"rc={rc}: {last[0][:200]}"}
        results[s]["seconds"] = round(time.monotonic() - started)
        print(f"[{s}] {results[s]['status']} in {results[s]['seconds']} s: {results[s]['summary'][:300]}", flush=True)
    if "b" in wanted or "d" in wanted:
        results["f"] = derived_f(results)
    machine = machine_line(args.device if has_cuda else "cpu")
    (out / "verdict.json").write_text(json.dumps({"machine": machine, "rehearsal": args.rehearse, "sections": results},
                                                 indent=1))
    print(f"\n==== eaglechat GPU check{' (CPU rehearsal: not a GPU measurement)' if args.rehearse else ''} ====")
    print(machine)
    print(f"{'':2} {'check':42} {'status':6} {'s':>4}  detail")
    for s, r in results.items():
        print(f"{s:2} {NAMES[s]:42} {r['status']:6} {r.get('seconds', ''):>4}  {r['summary'][:400]}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/gpu_check.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cuda:N")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu_check_out"), help="folder for logs and verdict.json")
    ap.add_argument("--only", default="a,b,c,d,e", help="sections to run (default all)")
    ap.add_argument("--budget-s", type=int, default=450, help="seconds for all sections together (default 450)")
    ap.add_argument("--rehearse", action="store_true", help="run the sections on this CPU with tiny models")
    ap.add_argument("--section", help=argparse.SUPPRESS)
    ap.add_argument("--limit", type=int, default=120, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.section:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        try:
            SECTIONS[args.section](args)
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            emit(args.section, "FAIL", f"{type(exc).__name__}: {str(exc).strip()[:200]}")
        return 0
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
