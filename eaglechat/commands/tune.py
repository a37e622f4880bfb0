"""`eaglechat tune NAME`: measure verify and draft times on this machine, pick the tree, cache it.

The result is stored per (device, model, quantization) under the tuned-profiles folder and then
overrides the shipped and user profiles for that combination (`eaglechat show NAME --profile`,
`eaglechat plan NAME`). When the predicted gain over plain decoding is under 1.1x the record says so;
it no longer turns speculation off: with `speculate: auto` (every shipped profile) the engine measures
plain and speculative decoding again while it decodes, as the load changes.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import closing
from pathlib import Path

from eaglechat.commands.common import (
    MAX_THREADS,
    add_device_flag,
    add_dtype_flag,
    add_quant_flag,
    int_at_least,
    load_request,
)
from eaglechat.engine.protocol import TreeBudget


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tune",
        help="measure this machine and pick the fastest draft tree for a model (cached)",
        description=__doc__.split("\n\n")[1],
    )
    p.add_argument("model", metavar="NAME", help="catalog name or a local model folder (then --head)")
    p.add_argument("--head", default=None, help="EAGLE head folder (for a local base model folder)")
    add_quant_flag(p, auto=False)
    add_device_flag(p)
    add_dtype_flag(p)
    p.add_argument("--repeats", type=int_at_least(1), default=None, help="timed repeats per measurement (median); default: profile")
    p.add_argument("--kv-length", type=int_at_least(1), default=None, help="KV cache length for the timings (default 512 GPU, 256 CPU)")
    p.add_argument("--max-new-tokens", type=int_at_least(2), default=None,
                   help="tokens per prompt in the acceptance runs (default 24 CPU, 64 GPU)")
    p.add_argument("--threads", type=int_at_least(1, MAX_THREADS), default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--quick", action="store_true", help="a smaller grid and fewer prompts (seconds, less exact)")
    p.add_argument("--check", action="store_true", help="then measure the chosen tree against plain decoding (interleaved)")
    p.add_argument("--dry-run", action="store_true", help="measure and print, do not save")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


class Bar:
    """A tqdm progress bar on stderr (silent when stderr is not a terminal and --json is on)."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="tuning", unit="", file=sys.stderr, leave=False)

    def __call__(self, label: str, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(label, refresh=False)
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _grid(profile, quick: bool) -> tuple[list[int], list[int], list[int], int]:
    cal = profile.calibrate or {}
    n_grid = [int(n) for n in cal.get("n_grid", [1, 4, 8, 12, 16, 24]) if int(n) > 0]
    depth_grid = [int(d) for d in cal.get("depth_grid", [2, 3, 4])]
    top_k_grid = [int(k) for k in cal.get("top_k_grid", [4, 6])]
    repeats = int(cal.get("repeats", 3))
    if quick:
        n_grid = sorted({n_grid[0], *n_grid[1::2], n_grid[-1]})
        depth_grid = sorted({depth_grid[0], depth_grid[-1]})
        top_k_grid = top_k_grid[:1]
        repeats = min(repeats, 3)
    return n_grid, depth_grid, top_k_grid, repeats


def render(result: dict) -> str:
    m, c = result["measured"], result["choice"]
    lines = [
        f"tuned {result['model']} on {result['device']} ({result['device_kind']}, {result['dtype']}, quant {result['quant']})"
        f" at KV length {m['kv_length']}, median of {m['repeats']}",
        "verify time per tree size N (ms):  " + "  ".join(f"N={n}: {v:.1f}" for n, v in m["verify_ms"].items()),
        "draft time per (depth, top_k) (ms): " + "  ".join(f"{k}: {v:.1f}" for k, v in m["draft_ms"].items()),
        f"plain decoding step {m['plain_step_ms']:.1f} ms -> {c['plain_tokens_per_s']:.1f} tok/s",
        f"reference tree {TreeBudget.from_dict(m['ref_tree']).label()}: "
        f"tau {m['ref_tau']:.2f}, step {m['ref_step_ms']:.1f} ms, accepted per step {m['accepted_hist']}",
        "best candidates (N/depth/top_k: tau, step ms, tok/s):",
    ]
    for r in c["ranking"][:5]:
        lines.append(
            f"  {TreeBudget.from_dict(r).label()}: tau {r['tau']:.2f}, {r['step_ms']:.1f} ms, {r['tokens_per_s']:.1f} tok/s"
        )
    if result.get("clamp") and result["clamp"]["max_rows"] is not None:
        lines.append(f"clamp: at most {result['clamp']['max_rows']} verified rows ({result['clamp']['reason']})")
    t = c["tree"]
    if c["speculate"]:
        lines.append(f"choice: tree {TreeBudget.from_dict(t).label()}, predicted {c['predicted_speedup']:.2f}x over plain")
    else:
        lines.append(f"choice: tree {TreeBudget.from_dict(t).label()}; tune measured plain decoding faster (predicted gain "
                     f"{c['predicted_speedup']:.2f}x < {result['min_gain']:.2f}x); with speculate: auto (the default) the "
                     "engine measures both again while decoding and keeps the faster")
    if result.get("check"):
        k = result["check"]
        lines.append(
            f"check: plain {k['plain_tokens_per_s']:.1f} tok/s, EAGLE {k['eagle_tokens_per_s']:.1f} tok/s -> "
            f"measured {k['measured_speedup']:.2f}x (tau {k['mean_accepted']:.2f})"
        )
    if result.get("load") and result["load"].get("busy"):
        lines.append(f"measured on a busy machine (load {result['load']['load1']:g} on {result['load']['cores']} cores)")
    if result.get("file"):
        lines.append(f"saved {result['file']}")
    if result.get("speculation_file"):
        lines.append(f"saved {result['speculation_file']} (where speculate=auto starts)")
    return "\n".join(lines)


def _refuse_if_it_cannot_fit(args, device) -> None:
    """Plan before loading: a model that cannot fit is refused in one line, not with a raw OOM."""
    from eaglechat.commands.plan import make_plan, model_shape
    from eaglechat.errors import EaglechatError

    try:
        name, shape, ckpt_dtype, head_kind, draft_vocab = model_shape(args.model)
    except EaglechatError:
        return  # the loader reports unknown or unpulled models itself
    plan = make_plan(shape, device, model=name, quant=args.quant, context=1024,
                     checkpoint_dtype=ckpt_dtype if ckpt_dtype != "auto" else None, head_kind=head_kind,
                     draft_vocab=draft_vocab)
    plan.require()


def _before_loading(args, device, load: dict, show: bool) -> None:
    """An unknown model is refused in its one line before any status line; a busy machine is warned of."""
    from eaglechat.fit.profiles import load_note
    from eaglechat.loader import resolve_model

    resolve_model(args.model, args.head)
    if load_note(load):
        print(f"eaglechat: warning: the machine is busy ({load_note(load)}): timings taken now are slower and "
              "noisier than this machine is, and may favour plain decoding or a smaller tree; the result records the load "
              "(rerun 'eaglechat tune' when the machine is idle)", file=sys.stderr)
    if show:
        print(f"eaglechat: loading {args.model} for tuning ({device.describe()})", file=sys.stderr)


def tuned_record(result: dict, speculate: bool) -> dict:
    """What is saved of a tune `result` (fit/profiles.py save_tuned): the choice, and what it was measured on."""
    return {
        "tree": result["choice"]["tree"],
        "speculate": speculate,
        "predicted_speedup": result["choice"]["predicted_speedup"],
        **{k: result[k] for k in ("dtype", "profile", "measured", "created", "versions", "load")},
        "choice": result["choice"],
        **({"check": result["check"]} if "check" in result else {}),
    }


def save_speculation(arms: dict, device, model: str, quant: str, result: dict) -> str:
    """The speculation record (fit/speculation_records.py) that speculate="auto" starts a fresh chat from
    instead of probing at once: `arms` rates the trees it would choose among with the tree chosen here, or
    with the one the engine had before (a tree given on the command line). -> its path ('' for none)."""
    from eaglechat.fit import speculation_records

    if not arms:
        return ""
    return str(speculation_records.save(device, model, quant, arms, load=result["load"], created=result["created"],
                                        notice=lambda line: print(f"eaglechat: {line}", file=sys.stderr)))


def run(args: argparse.Namespace) -> int:
    from datetime import datetime, timezone

    from eaglechat.bench import tune
    from eaglechat.errors import UsageError
    from eaglechat.fit import hardware
    from eaglechat.fit.profiles import resolve_profile, save_tuned
    from eaglechat.loader import load_engine

    device = hardware.probe(args.device)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    profile = resolve_profile(device, None, args.quant)
    n_grid, depth_grid, top_k_grid, repeats = _grid(profile, args.quick)
    repeats = args.repeats or repeats
    min_gain = float((profile.calibrate or {}).get("min_gain", 1.1))
    kv_length = args.kv_length or (256 if device.kind == "cpu" else 512)
    cpu = device.kind == "cpu"
    prompts = tune.PROMPTS[: 1 if args.quick else (2 if cpu else 4)]
    max_new = args.max_new_tokens or (16 if args.quick else (24 if cpu else 64))
    if max_new < 2:
        raise UsageError("--max-new-tokens must be at least 2")
    show = not args.json or sys.stderr.isatty()

    _refuse_if_it_cannot_fit(args, device)
    load = tune.machine_load()  # before our own work adds to it
    _before_loading(args, device, load, show)
    engine = load_engine(args.model, load_request(args, device=device.torch_device,
                                                  max_context=max(kv_length + max(n_grid) + 64, 1024)))
    # the name load_engine looks the record up by (a local folder: its name, as for the profiles)
    folder = Path(args.model).expanduser()
    model = folder.name if folder.is_dir() else engine.info.model
    n_cases = len({0, *n_grid}) + len(depth_grid) * len(top_k_grid)
    with closing(Bar(2 * len(prompts) * max_new + repeats * n_cases, show)) as bar:
        m = tune.measure(engine, n_grid=n_grid, depth_grid=depth_grid, top_k_grid=top_k_grid, repeats=repeats,
                         kv_length=kv_length, max_new_tokens=max_new, prompts=prompts, progress=bar)
    from eaglechat.fit.bnb_dispatch import verify_row_limit
    from eaglechat.fit.memory import ModelShape

    # a 4-bit base on CUDA: never a tree that pushes the verify off bitsandbytes' fused kernel
    limit = verify_row_limit(device.kind, args.quant, ModelShape.from_hf_config(engine.model.config),
                             device_index=device.index, dtype=engine.model.dtype)
    choice = tune.choose(m, depth_grid=depth_grid, top_k_grid=top_k_grid, min_gain=min_gain,
                         max_rows=limit.rows if limit else None)
    result = {
        "model": model,
        "device": device.name,
        "device_kind": device.kind,
        "dtype": engine.info.dtype,
        "quant": args.quant,
        "profile": profile.name,
        "min_gain": min_gain,
        "measured": m.to_dict(),
        "choice": choice.to_dict(),
        "clamp": {"max_rows": limit.rows, "reason": limit.reason} if limit else None,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": tune.versions(),
        "load": load,
    }
    if args.check:
        result["check"] = tune.check(engine, choice.tree, prompts=prompts, max_new_tokens=max_new)
    if not args.dry_run:
        result["file"] = str(save_tuned(device, model, args.quant, tuned_record(result, choice.speculate)))
        saved = save_speculation(tune.speculation_arms(m, choice.tree, engine.budget), device, model, args.quant, result)
        if saved:
            result["speculation_file"] = saved
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0
