"""`eaglechat plan NAME [--gpu NAME_OR_GiB] [--device D] [--max-context N] [--quant Q] [--json]`

Prints what would be loaded (weight format, context, draft tree) and the memory it needs, before
anything is downloaded or loaded. When nothing fits: one line on stderr listing what would fit, and
exit code 3. Never a silent CPU fallback: a CPU plan is shown only when asked (`--device cpu`) or as
a suggestion.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eaglechat.commands.common import add_context_flag, add_device_flag, add_quant_flag, add_tree_flags
from eaglechat.fit.exactness import exactness
from eaglechat.units import GiB


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "plan",
        help="show the quantization, context and tree a model would get on this machine (loads nothing)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("model", metavar="NAME", help="catalog name, hf.co/ORG/BASE with --head, free form base=...,head=..., "
                   "or a local model folder")
    p.add_argument("--head", default=None, metavar="hf.co/ORG/HEAD", help="with hf.co/ORG/BASE: the EAGLE head of the pair")
    add_device_flag(p)
    p.add_argument("--gpu", default=None, metavar="NAME_OR_GiB", help="plan for another GPU: rtx3060, rtx4090, a100, or a size: 12")
    add_context_flag(p, "--max-context", "--context")
    add_quant_flag(p)
    add_tree_flags(p, kind=False)
    p.add_argument("--json", action="store_true", help="print the plan as JSON (schema eaglechat.plan/1)")
    p.set_defaults(func=run)




def model_shape(name: str, head: str | None = None):
    """(display name, ModelShape, checkpoint dtype, head kind, draft vocabulary) for a catalog name, a
    pulled hf.co pair or a model folder."""
    from eaglechat.errors import ModelNotFound
    from eaglechat.fit.memory import ModelShape, read_config_json

    folder = Path(name).expanduser()
    if folder.is_dir() and (folder / "config.json").is_file():
        from eaglechat.models.folder import check_base_folder

        check_base_folder(folder)  # the planner reads the JSON itself, but plans only what would load
        raw = read_config_json(folder / "config.json")
        try:
            shape = ModelShape.from_config_json(folder / "config.json")
        except (AttributeError, KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            from eaglechat.errors import WeightsError

            raise WeightsError(f"cannot plan {folder}: its config.json lacks what the planner needs ({exc})") from None
        return folder.name, shape, raw.get("torch_dtype") or raw.get("dtype"), "eagle2", None
    from eaglechat.models import catalog

    manifest = catalog.resolve_cli(name, head)
    if manifest.shape is None:
        again = f"{name} --head {head}" if head else name
        raise ModelNotFound(
            f"cannot plan {name}: the base model's config.json is not cached yet (run 'eaglechat pull {again}' first)"
        )
    return manifest.name, manifest.shape, manifest.dtype, manifest.head_kind, manifest.draft_vocab


def make_plan(shape, device, *, model="", quant=None, context=None, tree=None, checkpoint_dtype=None, head_kind="eagle2",
              draft_vocab=None, profiles=None):
    """The planner's plan plus, on a real GPU where nothing fits, whether the CPU would (a suggestion only)."""
    from eaglechat.fit.planner import Planner

    asked = dict(model=model, quant=quant, context=context, tree=tree, checkpoint_dtype=checkpoint_dtype, head_kind=head_kind,
                 draft_vocab=draft_vocab)
    plan = Planner(device, profiles=profiles).plan(shape, **asked)
    if plan.choice is None and device.kind != "cpu" and not device.simulated:
        from eaglechat.fit.hardware import probe_cpu

        cpu = Planner(probe_cpu(), profiles=profiles).plan(shape, **asked, explain=False)
        if cpu.choice is not None:
            c = cpu.choice
            plan.alternatives.append({
                "device": "cpu", "quant": c.quant, "format": c.format, "context": c.context, "total_bytes": c.total,
                "hint": f"--device cpu ({c.format}, {c.total / GiB:.1f} GiB of RAM; much slower)",
            })
    return plan


def _gib(n: int) -> str:
    return f"{n / GiB:6.2f}"


def speculation_mode(speculate) -> str:
    """What the chat and the server will do: the profile's speculate value in words."""
    if speculate == "auto":
        return "speculation: auto (measured while decoding)"
    return "speculation: on" if speculate else "speculation: off (plain decoding)"


def render(plan, shape=None) -> str:
    """The human-readable plan."""
    d = plan.device
    lines = []
    if shape is not None:
        lines.append(
            f"model    {plan.model}  ({shape.params / 1e9:.2f}B params, {shape.num_layers} layers, "
            f"vocab {shape.vocab_size}, max context {shape.max_context})"
        )
    dev = d["name"] + (" (simulated)" if d.get("simulated") else "")
    lines.append(f"device   {dev}: {d['total_bytes'] / GiB:.1f} GiB total, {plan.free_bytes / GiB:.1f} GiB free")
    lines.append(
        f"profile  {plan.profile}: reserve {plan.reserve_bytes / GiB:.1f} GiB -> {plan.budget_bytes / GiB:.1f} GiB available, dtype {plan.dtype}"
    )
    c = plan.choice
    if c is not None:
        from eaglechat.fit.memory import FORMAT_LABEL

        tree = c.tree
        spec = (f"tree {tree['total_tokens']} tokens, depth {tree['depth']}, draft_top_k {tree['draft_top_k']}, "
                f"{speculation_mode(c.speculate)}" if c.speculate else speculation_mode(c.speculate))
        lines.append(f"choice   --quant {c.quant} ({FORMAT_LABEL[c.format]}), context {c.context}, {spec}")
        if c.speculate:
            lines.append(f"exact    {exactness(c.format)}")
        if plan.reason:
            lines.append(f"why      {plan.reason}")
        b = c.estimate
        ctx_note = f"KV cache @ {c.context}"
        rows = [
            ("base weights", b.weights, c.format),
            ("draft head", b.head, "shares the base embedding" if b.head else "off"),
            (ctx_note, b.kv_cache, "base layers + 1 draft layer"),
            ("tree buffers", b.tree_buffers, ""),
            ("activation peak", b.activations, "prefill chunk or tree verify (T x vocab logits)"),
            ("fragmentation", b.fragmentation, "6 % of what is allocated and freed" + (
                "" if c.format in ("fp32", "fp16", "bf16") else " (+ weights quantized at load)")),
            ("runtime", b.runtime, ("CUDA context + cuBLAS" if d.get("simulated") else
                                    "cuBLAS, lazy kernels (the context is out of the free memory already)")
             if d["kind"] == "cuda" else "process"),
        ]
        lines.append("")
        lines.append("memory (GiB)")
        for label, n, note in rows:
            lines.append(f"  {label:<18}{_gib(n)}  {note}".rstrip())
        pct = 100 * c.total / plan.budget_bytes if plan.budget_bytes else 0
        lines.append(f"  {'total':<18}{_gib(c.total)}  of {plan.budget_bytes / GiB:.2f} available: {c.status} ({pct:.0f} %)")
    lines.append("")
    at = plan.considered[0].context if plan.considered else 0
    lines.append(f"considered (context {at})")
    for o in plan.considered:
        mark = "  <- chosen" if c is not None and o.quant == c.quant else ""
        status = "won't fit" if o.status == "wont_fit" else o.status
        lines.append(f"  {o.quant:<5} {o.format:<7}{_gib(o.total)} GiB  {status}{mark}")
    for note in plan.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from eaglechat.engine.protocol import TreeBudget
    from eaglechat.errors import OutOfMemory, UsageError
    from eaglechat.fit import hardware

    device = hardware.resolve(args.device, args.gpu)
    name, shape, ckpt_dtype, head_kind, draft_vocab = model_shape(args.model, args.head)
    if args.max_context is not None and args.max_context < 16:
        raise UsageError("--max-context must be at least 16 tokens")
    tree = None
    pins = (args.total_tokens, args.depth, args.draft_top_k)
    if any(v is not None for v in pins):
        from eaglechat.fit.profiles import resolve_profile

        quant = None if args.quant == "auto" else args.quant
        base = resolve_profile(device, shape, quant, model=name).tree_for(quant or "none", shape, device)
        tree = TreeBudget(*(v if v is not None else b for v, b in zip(pins, (base.total_tokens, base.depth, base.draft_top_k)))).check()
    plan = make_plan(
        shape, device, model=name, quant=None if args.quant == "auto" else args.quant,
        context=args.max_context, tree=tree, checkpoint_dtype=ckpt_dtype, head_kind=head_kind, draft_vocab=draft_vocab,
    )
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    elif plan.choice is not None:
        print(render(plan, shape))
    if plan.choice is None:
        raise OutOfMemory(plan.refusal())
    return 0
