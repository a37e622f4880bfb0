"""`eaglechat bench MODEL`: EAGLE vs plain decoding (and transformers' generate() and prompt-lookup
decoding) on MT-bench, HumanEval or your JSONL: tokens/s, speedup, tau, acceptance by depth, exact match.

Runs are interleaved per prompt (plain, EAGLE, peers, then again) after a warm-up; figures are medians.
Ctrl-C prints (and writes) the results so far.

`eaglechat bench --costs MODEL_OR_MANIFEST` instead measures the parts of a decode step on this device
(plain step, verify of T tokens at several KV lengths, draft by depth and top_k), for real weights or a
random-weight model of a catalog shape (no download), and predicts tokens/s and speedup per tree budget.

`eaglechat bench --startup MODEL` times where `eaglechat run MODEL "Hi"` spends its start: fresh processes,
a line per phase (imports, load, first token, exit), medians over --rounds; --importtime adds the heaviest
imports. A fresh EAGLECHAT_HOME measures a cold start (the conversion included).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from eaglechat.commands.common import MAX_THREADS, add_model_flags, add_sampling_flags, add_tree_flags, int_at_least


def register(sub) -> None:
    p = sub.add_parser("bench", help="measure EAGLE against plain decoding on real prompts", description=__doc__)
    p.add_argument("model", help="catalog alias, or a local Hugging Face folder (then --head); with --costs also "
                                 "a manifest .yaml or a built-in shape (tinyllama-1.1b)")
    p.add_argument("--prompts", default="mt-bench", help="mt-bench (default), humaneval, or a FILE.jsonl")
    p.add_argument("--n", type=int, default=8, help="number of prompts, taken round-robin over categories (default 8)")
    add_sampling_flags(p, max_new_tokens=128, seed_default=0,
                       temperature_help="0 = greedy (default): exact match is checked")
    add_tree_flags(p, sizes=True)
    p.add_argument("--repeats", type=int, default=None,
                   help="interleaved timed runs per prompt and method (default 2; --costs: 3 CPU, 5 GPU)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds on the first prompt (default 1)")
    p.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True,
                   help="also time transformers' generate() and its prompt-lookup decoding (default on)")
    p.add_argument("--prompt-lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens for the peer")
    p.add_argument("--auto", action=argparse.BooleanOptionalAction, default=True,
                   help="also time speculate=auto, the chat's default: plain or a tree, whichever it measures "
                        "faster (default on)")
    p.add_argument("--threads", type=int_at_least(1, MAX_THREADS), help="torch CPU threads (default: torch's choice; recorded)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON ('-': stdout, the report goes to stderr)")
    p.add_argument("--plot", metavar="PATH", help="write a PNG plot")
    costs = p.add_argument_group("step costs (--costs)")
    costs.add_argument("--costs", action="store_true", help="measure step costs and predict tokens/s per tree budget")
    costs.add_argument("--formats", metavar="LIST",
                       help="comma-separated: fp32, fp16, bf16, int8, nf4 (default: --dtype/--quant, else the device's)")
    costs.add_argument("--random-weights", action="store_true",
                       help="random weights of the manifest's shape even when the model is pulled")
    costs.add_argument("--kv-lengths", metavar="LIST", help="KV cache lengths to time at (default 128,512 CPU; 128,1024,2048 GPU)")
    costs.add_argument("--depths", metavar="LIST", help="draft depths to time (default 2-5 CPU, 2-6 GPU)")
    costs.add_argument("--draft-top-ks", metavar="LIST", help="draft top_k values to time (default 4,8 CPU; 4,8,10 GPU)")
    costs.add_argument("--decode-steps", type=int, help="real decode steps for the per-step overhead (default 12 CPU, 24 GPU)")
    start = p.add_argument_group("start-up (--startup)")
    start.add_argument("--startup", action="store_true",
                       help="time the phases of `eaglechat run MODEL Hi --max-new-tokens 8` in fresh processes")
    start.add_argument("--rounds", type=int_at_least(1), default=3, help="fresh processes timed (default 3)")
    start.add_argument("--importtime", action="store_true",
                       help="also list the heaviest top-level imports of one run (python -X importtime)")
    add_model_flags(p)
    p.set_defaults(func=run)


def budgets(args) -> list:
    from eaglechat.engine.protocol import TreeBudget

    base = TreeBudget()
    out = []
    for n in args.total_tokens or [None]:
        b = TreeBudget(
            total_tokens=n if n is not None else base.total_tokens,
            depth=args.depth if args.depth is not None else base.depth,
            draft_top_k=args.draft_top_k if args.draft_top_k is not None else base.draft_top_k,
            kind=args.tree or base.kind,
        )
        out.append(b.check())
    return out


def check_args(args) -> None:
    from eaglechat.errors import UsageError

    if args.repeats < 1 or args.warmup < 0:
        raise UsageError("--repeats must be at least 1 and --warmup at least 0")
    if args.prompt_lookup_tokens < 1:
        raise UsageError("--prompt-lookup-tokens must be at least 1")
    if args.threads is not None and args.threads < 1:
        raise UsageError("--threads must be at least 1")


def run(args: argparse.Namespace) -> int:
    if args.plot:
        from eaglechat.bench.plot import require_matplotlib

        require_matplotlib()
    if args.costs:
        return run_costs(args)
    if args.startup:
        return run_startup(args)
    if args.repeats is None:
        args.repeats = 2
    import torch

    from eaglechat.bench import prompts as prompt_sets
    from eaglechat.bench import report, summary
    from eaglechat.bench.runner import Settings, run_bench, total_runs
    from eaglechat.errors import UsageError
    from eaglechat.loader import load_engine

    check_args(args)
    trees = budgets(args)
    prompts = prompt_sets.load_prompts(args.prompts, args.n)
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = load_engine(
        args.model, head=args.head, device=args.device, dtype=args.dtype, quant=args.quant, tree=trees[0],
        max_context=args.max_context, compile=args.compile,
    )
    if engine.decoder.drafter is None:
        raise UsageError(f"{args.model} has no EAGLE draft head to benchmark (pass --head for a local folder)")
    settings = Settings(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        seed=args.seed, repeats=args.repeats, warmup=args.warmup, trees=trees, peers=args.peers,
        lookup_tokens=args.prompt_lookup_tokens, auto=args.auto,
    )
    env = summary.environment(engine, torch.get_num_threads())

    from tqdm import tqdm

    bar = tqdm(total=total_runs(len(prompts), settings), desc="bench", unit="run", file=sys.stderr,
               disable=None, leave=False)

    done = [0]

    def tick(label: str) -> None:
        bar.set_postfix_str(label[:40], refresh=False)
        bar.update(1)
        done[0] += 1
        if bar.disable and done[0] % 5 == 0:  # not a terminal (a log file): a plain line now and then
            print(f"bench: {done[0]}/{bar.total} runs ({label})", file=sys.stderr, flush=True)

    try:
        results = run_bench(engine, prompts, settings, tick)
    finally:
        bar.close()
    doc = summary.build(results, settings, source=args.prompts, env=env, tokenizer=engine.tokenizer)
    text = report.render(doc)
    print(text, file=sys.stderr if args.json == "-" else sys.stdout, flush=True)
    if args.json:
        payload = json.dumps(doc, indent=1)
        if args.json == "-":
            print(payload)
        else:
            with open(args.json, "w", encoding="utf-8") as f:
                f.write(payload + "\n")
    if args.plot:
        if doc["overall"]["prompts"]:
            from eaglechat.bench.plot import plot

            plot(doc, args.plot)
        else:
            print("eaglechat: no prompt finished; no plot written", file=sys.stderr)
    return 130 if results.interrupted else 0


# ------------------------------------------------------------------------------------------- --startup

def startup_argv(args: argparse.Namespace) -> list[str]:
    """The `eaglechat run` a start-up round times: the model and the load flags this command was given."""
    argv = ["run", args.model, "Hi", "--max-new-tokens", "8", "--quant", args.quant, "--compile", args.compile]
    for flag, value in (("--head", args.head), ("--device", args.device), ("--dtype", args.dtype),
                        ("--max-context", args.max_context)):
        if value is not None:
            argv += [flag, str(value)]
    return argv


def run_startup(args: argparse.Namespace) -> int:
    from eaglechat.bench import startup

    doc = startup.run_startup(startup_argv(args), args.rounds, args.importtime,
                              tick=lambda label: print(f"bench --startup: {label}", file=sys.stderr, flush=True))
    print(startup.render(doc), file=sys.stderr if args.json == "-" else sys.stdout, flush=True)
    if args.json == "-":
        print(json.dumps(doc, indent=1))
    elif args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(json.dumps(doc, indent=1) + "\n")
    return 0


# ------------------------------------------------------------------------------------------- --costs


def int_list(text: str | None, flag: str, minimum: int = 1) -> list[int] | None:
    from eaglechat.errors import UsageError

    if text is None:
        return None
    try:
        values = [int(x) for x in text.replace(" ", ",").split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: give integers, comma-separated") from None
    if not values or min(values) < minimum:
        raise UsageError(f"{flag}: every value must be at least {minimum}")
    return sorted(set(values))


def cost_formats(args, device_kind: str) -> list[str]:
    """--formats, else the one format --dtype/--quant name, else the device's default."""
    if args.formats:
        return list(dict.fromkeys(f.strip() for f in args.formats.split(",") if f.strip()))
    quant = {"8bit": "int8", "4bit": "nf4"}.get(args.quant)
    if quant:
        return [quant]
    dtype = args.dtype or ("float32" if device_kind == "cpu" else "float16")
    from eaglechat.fit.hardware import DTYPE_SHORT

    return [DTYPE_SHORT[dtype]]


def run_costs(args: argparse.Namespace) -> int:
    """`bench --costs`: build or load each format in turn, time it, predict, write table/JSON/plot.
    The JSON is rewritten after every format, so a run cut short keeps what it finished."""
    from datetime import datetime, timezone

    import torch

    from eaglechat.bench import costs, costs_report, tune
    from eaglechat.errors import UsageError
    from eaglechat.fit import hardware

    if args.threads is not None and args.threads < 1:
        raise UsageError("--threads must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    target = costs.resolve_target(args.model, random_weights=args.random_weights, head=args.head)
    device = hardware.probe(args.device)
    if device.simulated:
        raise UsageError("--costs measures a real device")
    plan, context = cost_plan(args, target, device)
    formats = [(f, *costs.format_settings(f, device.kind)) for f in cost_formats(args, device.kind)]
    from eaglechat.engine.compile import resolve

    # what decoding will run: CUDA-graph replays where --compile resolves to them (auto on CUDA), else eager
    steps = "graphs" if resolve(getattr(args, "compile", "auto"), torch.device(device.torch_device).type) == "graphs" else "eager"
    doc = {
        "kind": "step-costs", "model": target.label, "source": target.source,
        "shape": dict(target.shape.__dict__) if target.shape is not None else None,
        "device": device.torch_device, "device_name": device.name, "threads": torch.get_num_threads(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "versions": tune.versions(),
        "plan": {k: v for k, v in plan.__dict__.items()}, "formats": [],
    }
    show = sys.stderr.isatty() or not args.json
    for fmt, dtype, quant in formats:
        print(f"eaglechat: {target.label} as {fmt} ({dtype}, quant {quant}) on {device.describe()}", file=sys.stderr)
        doc["formats"].append(measure_format(target, plan, device, fmt, dtype, quant, context, steps, show))
        _write_costs(doc, args)
    text = costs_report.render(doc)
    print(text, file=sys.stderr if args.json == "-" else sys.stdout, flush=True)
    if args.json == "-":
        print(json.dumps(doc, indent=1))
    if args.plot:
        costs_report.plot(doc, args.plot)
    return 0


def cost_plan(args: argparse.Namespace, target, device):
    """What `bench --costs` measures (the device's defaults, then the flags), and the context to allocate
    for it: (costs.Plan, context)."""
    from eaglechat.bench import costs
    from eaglechat.errors import UsageError

    max_context = args.max_context or (target.shape.max_context if target.shape is not None else 4096)
    plan = costs.Plan.for_device(device.kind, max_context)
    plan.kv_lengths = int_list(args.kv_lengths, "--kv-lengths") or plan.kv_lengths
    plan.depths = int_list(args.depths, "--depths") or plan.depths
    plan.top_ks = int_list(args.draft_top_ks, "--draft-top-ks") or plan.top_ks
    plan.repeats = args.repeats or plan.repeats
    plan.decode_steps = args.decode_steps or plan.decode_steps
    if plan.repeats < 1 or plan.decode_steps < 1:
        raise UsageError("--repeats and --decode-steps must be at least 1")
    need = max(plan.kv_lengths) + max(plan.rows) + plan.decode_steps * (max(plan.depths) + 2) + 8
    return plan, max(need, args.max_context or 0)


def measure_format(target, plan, device, fmt: str, dtype: str, quant: str, context: int, steps: str,
                   show: bool) -> dict:
    """One format of `bench --costs`: built (or loaded), timed, forecast (clamped as the loader would clamp
    the tree, and unclamped), then freed; its entry in the JSON."""
    import torch
    from tqdm import tqdm

    from eaglechat.bench import costs
    from eaglechat.bench.costmodel import predict

    bar = tqdm(total=1, desc=f"{fmt}: building", unit="", file=sys.stderr, leave=False, disable=not show)
    dec, vocab, prompts, stops, build_s = costs.build(
        target, device=device.torch_device, dtype=dtype, quant=quant, max_context=context,
        progress=lambda label: bar.set_postfix_str(label))
    bar.close()
    bar = tqdm(total=costs.total_ticks(plan, len(prompts)), desc=f"{fmt}: timing", unit="", file=sys.stderr,
               leave=False, disable=not show)

    def tick(label: str, n: int = 1) -> None:
        bar.set_postfix_str(label[:40], refresh=False)
        bar.update(n)

    t0 = time.perf_counter()
    try:
        measured = costs.measure(dec, plan, vocab=vocab, tick=tick, acceptance_prompts=prompts, stop_ids=stops,
                                 steps=steps)
    finally:
        bar.close()
    measure_s = time.perf_counter() - t0
    from eaglechat.fit.bnb_dispatch import verify_row_limit
    from eaglechat.fit.memory import ModelShape

    limit = verify_row_limit(device.kind, quant, target.shape or ModelShape.from_hf_config(dec.model.config),
                             device_index=device.index, dtype=getattr(torch, dtype))
    forecasts = costs.forecast(measured, plan, max_rows=limit.rows if limit else None,
                               clamp_reason=limit.reason if limit else "")
    unclamped = [predict(c, measured["tau"], budgets=plan.budgets, depth_grid=plan.depths, top_k_grid=plan.top_ks,
                         min_gain=plan.min_gain).best for c in measured["costs"]] if limit else []
    entry = {
        "format": fmt, "dtype": dtype, "quant": quant, "build_s": round(build_s, 2), "measure_s": round(measure_s, 2),
        "measured": {**{k: v for k, v in measured.items() if k not in ("costs", "tau")},
                     "costs": [c.to_dict() for c in measured["costs"]], "tau": measured["tau"].to_dict()},
        "forecast": [f.to_dict() for f in forecasts],
        "unclamped_best": [b.to_dict() if b else None for b in unclamped],
    }
    del dec
    costs.release(device.torch_device)
    return entry


def _write_costs(doc: dict, args) -> None:
    if args.json and args.json != "-":
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(json.dumps(doc, indent=1) + "\n")
