"""The one vocabulary of shared flags (in the spirit of the `hf` CLI's shared option types).

Every verb that takes a device, a dtype, a quantization, a context size, a draft tree or sampling
settings adds those flags from here, so they are spelled, defaulted and checked the same everywhere.
Values are checked as argparse reads them: a bad one is one line (`eaglechat: error: argument
--top-p: ...`) and exit code 2, before any model is loaded.
"""

from __future__ import annotations

import argparse
import math

from eaglechat.engine.protocol import TreeBudget
from eaglechat.fit.quantization import QUANT_CHOICES, QUANTS

MAX_THREADS = 1024  # torch.set_num_threads takes a C int; beyond any machine anyway


# ------------------------------------------------------------------------------------- value types


def _number(text: str, kind):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None


def int_at_least(low: int, high: int | None = None):
    """An argparse type: an integer in [low, high]."""

    def parse(text: str) -> int:
        value = _number(text, int)
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"must be at least {low}, got {value}" if high is None else f"must be {low}..{high}, got {value}"
            )
        return value

    parse.__name__ = "integer"
    return parse


def number_at_least(low: float, *, above: bool = False):
    """An argparse type: a finite number >= low (> low with above=True)."""

    def parse(text: str) -> float:
        value = _number(text, float)
        if not math.isfinite(value) or (value <= low if above else value < low):
            raise argparse.ArgumentTypeError(f"must be a finite number {'>' if above else '>='} {low:g}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


def temperature(text: str) -> float:
    value = _number(text, float)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (0 = greedy), got {text}")
    return value


def probability(text: str) -> float:
    """top-p: in (0, 1]."""
    value = _number(text, float)
    if not (0 < value <= 1):  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def penalty(text: str) -> float:
    """repetition penalty: in (0, 2] (1 = off), as the engine and the server take it."""
    value = _number(text, float)
    if not (0 < value <= 2):  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be in (0, 2] (1 = off), got {text}")
    return value


def seed(text: str) -> int:
    """0 .. 2^64 - 1: what torch.Generator.manual_seed takes (a larger one was a RuntimeError traceback)."""
    value = _number(text, int)
    if not 0 <= value <= 2**64 - 1:
        raise argparse.ArgumentTypeError(f"must be in 0..2^64-1, got {text}")
    return value


def device(text: str) -> str:
    """auto, cpu, cuda, cuda:N or mps: the spelling is checked here, presence when the model loads."""
    from eaglechat.errors import UsageError
    from eaglechat.fit import hardware

    value = text.strip().lower()
    if value in ("", "auto"):
        return "auto"
    try:
        hardware.parse_device(value)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None
    return value


def dtype(text: str) -> str:
    from eaglechat.errors import UsageError
    from eaglechat.fit import hardware

    try:
        return hardware.canon_dtype(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# ------------------------------------------------------------------------------------- flag groups


def add_device_flag(p: argparse.ArgumentParser, *, default: str | None = None) -> None:
    p.add_argument("--device", type=device, default=default, help="auto (default), cpu, cuda, cuda:N or mps")


def dtype_or_auto(text: str) -> str:
    return "auto" if text.strip().lower() == "auto" else dtype(text)


def add_dtype_flag(p: argparse.ArgumentParser, *, auto: bool = False, default: str | None = None, help: str | None = None) -> None:
    """--dtype float32|float16|bfloat16 (fp32, bf16, ... accepted), with "auto" where the verb has one."""
    p.add_argument("--dtype", type=dtype_or_auto if auto else dtype, default=default,
                   metavar="{auto,float32,float16,bfloat16}" if auto else "{float32,float16,bfloat16}",
                   help=help or "default: the profile's (float32 on most CPUs, float16/bfloat16 on GPUs)")


def add_quant_flag(p: argparse.ArgumentParser, *, auto: bool = True, default: str | None = None) -> None:
    """--quant with "auto" (the memory planner's pick, the default) or without (a pinned format)."""
    if auto:
        p.add_argument("--quant", choices=list(QUANT_CHOICES), default=default or "auto",
                       help="bitsandbytes quantization (default auto: what the memory planner picks for this device)")
    else:
        p.add_argument("--quant", choices=list(QUANTS), default=default or "none", help="bitsandbytes quantization")


def add_context_flag(p: argparse.ArgumentParser, *names: str) -> None:
    p.add_argument(*(names or ("--max-context",)), type=int_at_least(1), default=None,
                   help="context window to allocate (tokens)")


def add_compile_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--compile", choices=["auto", "graphs", "inductor", "on", "off"], default="auto",
                   help="how decode steps run. graphs: each step replayed as a CUDA graph, captured in about the "
                        "time of one step (CUDA only); inductor (or on): torch.compile, minutes on a first start, "
                        "kernels cached in the user cache dir; off: eager. auto (default): graphs on CUDA, "
                        "eager elsewhere")


def add_model_flags(p: argparse.ArgumentParser, *, quant_auto: bool = True) -> None:
    """--head, --quant, --device, --dtype, --max-context, --compile: what loading a model takes."""
    p.add_argument("--head", help="EAGLE head folder (for a local base model folder)")
    add_quant_flag(p, auto=quant_auto)
    add_device_flag(p)
    add_dtype_flag(p)
    add_context_flag(p)
    add_compile_flag(p)


def add_remote_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--remote", metavar="URL",
                   help="use an OpenAI-compatible server (eaglechat serve, vLLM, SGLang) instead of a local model")
    p.add_argument("--api-key", help="the server's API key (default: $EAGLECHAT_API_KEY)")


def api_key(args) -> str | None:
    import os

    return getattr(args, "api_key", None) or os.environ.get("EAGLECHAT_API_KEY") or None


def add_tree_flags(p: argparse.ArgumentParser, *, sizes: bool = False, kind: bool = True) -> None:
    """--total-tokens (one, or with sizes=True a comma-separated list), --depth, --draft-top-k, and
    --tree (dynamic or static) unless kind=False."""
    if sizes:
        p.add_argument("--total-tokens", type=total_tokens_list, default=None, metavar="LIST",
                       help="tree size(s), comma-separated, e.g. 8,16,32 (default: the built-in budget's)")
    else:
        p.add_argument("--total-tokens", type=int_at_least(1, TreeBudget.LIMITS["total_tokens"]),
                       help="draft tokens verified per step (tree size, root excluded)")
    p.add_argument("--depth", type=int_at_least(1, TreeBudget.LIMITS["depth"]), help="longest drafted path")
    p.add_argument("--draft-top-k", type=int_at_least(1, TreeBudget.LIMITS["draft_top_k"]),
                   help="children each expanded tree node offers (the tree's branching)")
    if kind:
        p.add_argument("--tree", choices=list(TreeBudget.KINDS), help="EAGLE-2 dynamic tree (default) or EAGLE-1 static tree")


def add_sampling_flags(p: argparse.ArgumentParser, *, max_new_tokens: int = 256, seed_default: int | None = None,
                       temperature_help: str = "0 = greedy (default)", model_defaults: bool = False) -> None:
    """--temperature, --top-p, --top-k (and with model_defaults=True --repetition-penalty), --seed,
    --max-new-tokens. model_defaults=True: the sampling flags default to None, i.e. the model's own
    (sampling_defaults.fill over sampling_given(args)); otherwise greedy, as bench measures."""
    if model_defaults:
        own = " (default: the model's own, else {})"
        p.add_argument("--temperature", type=temperature, default=None,
                       help="0 = greedy, and none of the model's sampling defaults" + own.format("0"))
        p.add_argument("--top-p", type=probability, default=None, help="nucleus sampling mass, in (0, 1]" + own.format("1: off"))
        p.add_argument("--top-k", type=int_at_least(0), default=None, help="sample among the k most likely tokens" + own.format("0: off"))
        p.add_argument("--repetition-penalty", type=penalty, default=None,
                       help="CTRL's penalty on tokens already in the context, in (0, 2]" + own.format("1: off"))
    else:
        p.add_argument("--temperature", type=temperature, default=0.0, help=temperature_help)
        p.add_argument("--top-p", type=probability, default=1.0, help="nucleus sampling mass, in (0, 1] (default 1: off)")
        p.add_argument("--top-k", type=int_at_least(0), default=0, help="sample among the k most likely tokens (0: off)")
    p.add_argument("--seed", type=seed, default=seed_default)
    p.add_argument("--max-new-tokens", type=int_at_least(1), default=max_new_tokens,
                   help=f"cap on the reply (default {max_new_tokens})")


def sampling_given(args) -> dict:
    """The sampling flags the user gave (add_sampling_flags with model_defaults=True), by GenerationParams field."""
    names = ("temperature", "top_p", "top_k", "repetition_penalty")
    return {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}


def total_tokens_list(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.replace(" ", ",").split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give integers, comma-separated (e.g. 8,16,32)") from None
    high = TreeBudget.LIMITS["total_tokens"]
    if not sizes or min(sizes) < 1 or max(sizes) > high:
        raise argparse.ArgumentTypeError(f"every size must be 1..{high}")
    return list(dict.fromkeys(sizes))


# ------------------------------------------------------------------------------------- what to load


def load_request(args, **fixed):
    """What loading a model takes from the flags this verb has (add_model_flags, add_tree_flags,
    --no-speculate), as the one typed LoadRequest the loader plans from; `fixed`: fields the verb sets
    itself. The tree flags given go on top of the profile's budget (checked against the draft candidate
    pool: TreeBudget.check)."""
    from eaglechat.fit.choose import LoadRequest

    flags = {"head": "head", "device": "device", "dtype": "dtype", "quant": "quant", "max_context": "max_context",
             "compile": "compile", "total_tokens": "total_tokens", "depth": "depth", "draft_top_k": "draft_top_k",
             "tree_kind": "tree"}
    given = {name: getattr(args, flag) for name, flag in flags.items() if getattr(args, flag, None) is not None}
    if getattr(args, "no_speculate", False):
        given["speculate"] = False
    return LoadRequest(**{**given, **fixed})


def resident_options(args, *, speculate: bool):
    """The request a verb's flags make, as eaglechat/resident.py compares it with a running server's (run,
    serve); `speculate`: whether the draft head is (to be) loaded."""
    return load_request(args, speculate=speculate)
