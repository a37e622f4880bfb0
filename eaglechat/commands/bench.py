"""`eaglechat bench MODEL`: EAGLE vs plain decoding (and transformers' generate() and prompt-lookup
decoding) on MT-bench, HumanEval or your JSONL: tokens/s, speedup, tau, acceptance by depth, exact match.

Runs are interleaved per prompt (plain, EAGLE, peers, then again) after a warm-up; figures are medians.
Ctrl-C prints (and writes) the results so far.
"""

from __future__ import annotations

import argparse
import json
import sys

from eaglechat.commands.common import add_model_flags


def register(sub) -> None:
    p = sub.add_parser("bench", help="measure EAGLE against plain decoding on real prompts", description=__doc__)
    p.add_argument("model", help="catalog alias, or a local Hugging Face folder (then --head)")
    p.add_argument("--prompts", default="mt-bench", help="mt-bench (default), humaneval, or a FILE.jsonl")
    p.add_argument("--n", type=int, default=8, help="number of prompts, taken round-robin over categories (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="per reply, every method alike (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default): exact match is checked")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--total-tokens", default=None, metavar="LIST",
                   help="tree size(s), comma-separated, e.g. 8,16,32 (default: the built-in budget's)")
    p.add_argument("--depth", type=int, help="longest drafted path")
    p.add_argument("--draft-top-k", type=int, help="candidates expanded per tree level")
    p.add_argument("--tree", choices=["dynamic", "static"], help="EAGLE-2 dynamic tree (default) or EAGLE-1 static")
    p.add_argument("--repeats", type=int, default=2, help="interleaved timed runs per prompt and method (default 2)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds on the first prompt (default 1)")
    p.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True,
                   help="also time transformers' generate() and its prompt-lookup decoding (default on)")
    p.add_argument("--prompt-lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens for the peer")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice; recorded)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON ('-': stdout, the report goes to stderr)")
    p.add_argument("--plot", metavar="PATH", help="write a PNG plot")
    add_model_flags(p)
    p.set_defaults(func=run)


def parse_sizes(text: str | None) -> list[int | None]:
    from eaglechat.errors import UsageError

    if text is None:
        return [None]
    try:
        sizes = [int(x) for x in text.replace(" ", ",").split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--total-tokens {text!r}: give integers, comma-separated (e.g. 8,16,32)") from None
    if not sizes or min(sizes) < 1:
        raise UsageError("--total-tokens: every size must be at least 1")
    return list(dict.fromkeys(sizes))


def budgets(args) -> list:
    from eaglechat.engine.protocol import TreeBudget
    from eaglechat.errors import UsageError

    base = TreeBudget()
    out = []
    for n in parse_sizes(args.total_tokens):
        b = TreeBudget(
            total_tokens=n if n is not None else base.total_tokens,
            depth=args.depth if args.depth is not None else base.depth,
            top_k=args.draft_top_k if args.draft_top_k is not None else base.top_k,
            kind=args.tree or base.kind,
        )
        if b.depth < 1 or b.top_k < 1:
            raise UsageError("--depth and --draft-top-k must be at least 1")
        out.append(b)
    return out


def check_args(args) -> None:
    from eaglechat.errors import UsageError

    if args.max_new_tokens < 1:
        raise UsageError("--max-new-tokens must be at least 1")
    if args.temperature < 0 or not 0 < args.top_p <= 1 or args.top_k < 0:
        raise UsageError("--temperature must be >= 0, --top-p in (0, 1], --top-k >= 0")
    if args.repeats < 1 or args.warmup < 0:
        raise UsageError("--repeats must be at least 1 and --warmup at least 0")
    if args.prompt_lookup_tokens < 1:
        raise UsageError("--prompt-lookup-tokens must be at least 1")
    if args.threads is not None and args.threads < 1:
        raise UsageError("--threads must be at least 1")


def run(args: argparse.Namespace) -> int:
    import torch

    from eaglechat.bench import prompts as prompt_sets
    from eaglechat.bench import report, summary
    from eaglechat.bench.runner import Settings, run_bench, total_runs
    from eaglechat.engine.load import load_engine
    from eaglechat.errors import UsageError

    check_args(args)
    trees = budgets(args)
    prompts = prompt_sets.load_prompts(args.prompts, args.n)
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = load_engine(
        args.model, head=args.head, device=args.device, dtype=args.dtype, quant=args.quant, tree=trees[0],
        max_context=args.max_context,
    )
    if engine.decoder.drafter is None:
        raise UsageError(f"{args.model} has no EAGLE draft head to benchmark (pass --head for a local folder)")
    settings = Settings(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        seed=args.seed, repeats=args.repeats, warmup=args.warmup, trees=trees, peers=args.peers,
        lookup_tokens=args.prompt_lookup_tokens,
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
