"""Flags shared by the verbs that load a model (run, bench, tune, chat)."""

from __future__ import annotations

import argparse


def add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--head", help="EAGLE head folder (for a local base model folder)")
    p.add_argument("--quant", choices=["auto", "none", "8bit", "4bit"], default="auto",
                   help="bitsandbytes quantization (default: what the memory planner picks for this device)")
    p.add_argument("--device", help="cpu, cuda, cuda:1, mps (default: the GPU if there is one)")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], help="default: float32 on CPU, float16 on GPU")
    p.add_argument("--max-context", type=int, help="context window to allocate (tokens)")


def add_remote_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--remote", metavar="URL",
                   help="use an OpenAI-compatible server (eaglechat serve, vLLM, SGLang) instead of a local model")
    p.add_argument("--api-key", help="the server's API key (default: $EAGLECHAT_API_KEY)")


def api_key(args) -> str | None:
    import os

    return getattr(args, "api_key", None) or os.environ.get("EAGLECHAT_API_KEY") or None


def add_tree_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--total-tokens", type=int, help="draft tokens verified per step (tree size, root excluded)")
    p.add_argument("--depth", type=int, help="longest drafted path")
    p.add_argument("--draft-top-k", type=int, help="candidates expanded per tree level")
    p.add_argument("--tree", choices=["dynamic", "static"], help="EAGLE-2 dynamic tree (default) or EAGLE-1 static tree")


def tree_budget(args, default=None):
    """Flags over the given default (a profile's or tuned budget) over the built-in default."""
    from eaglechat.engine.protocol import TreeBudget
    from eaglechat.errors import UsageError

    base = default or TreeBudget()
    budget = TreeBudget(
        total_tokens=args.total_tokens if args.total_tokens is not None else base.total_tokens,
        depth=args.depth if args.depth is not None else base.depth,
        top_k=args.draft_top_k if args.draft_top_k is not None else base.top_k,
        kind=args.tree or base.kind,
    )
    if budget.total_tokens < 1 or budget.depth < 1 or budget.top_k < 1:
        raise UsageError("--total-tokens, --depth and --draft-top-k must be at least 1")
    return budget


def tree_overrides(args) -> dict:
    """Only the tree flags the user gave: they go on top of the profile's budget."""
    from eaglechat.errors import UsageError

    given = {"total_tokens": args.total_tokens, "depth": args.depth, "top_k": args.draft_top_k, "kind": args.tree}
    given = {k: v for k, v in given.items() if v is not None}
    if any(isinstance(v, int) and v < 1 for v in given.values()):
        raise UsageError("--total-tokens, --depth and --draft-top-k must be at least 1")
    return given
