"""The memory planner: which (quantization, context, draft tree) to load on a device, decided before
anything is loaded, from the byte estimates in memory.py and the device's profile (profiles/).

Every "does it fit / which format" question goes through `Planner`: `eaglechat plan`, `list` and
`show`, the chat's picker badges and the loader's `--quant auto`, so they cannot disagree.

Order: the profile's quantization preference for this model size (shipped GPU profiles: 16-bit, then
nf4, then LLM.int8, fastest first), reordered by measured speed where `eaglechat tune` measured several
formats on this device; first pass: the first format that fits at the profile's full context with
headroom; second pass: per format, halve the context down to 1k and accept a tight fit. Nothing fits
-> refuse and say what would (other formats, smaller contexts, the smallest GPU class where it fits).
The plan says why its format was picked (`Plan.reason`).
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglechat.engine.protocol import Speculate
from eaglechat.fit.memory import (
    CUDA_AFTER_CONTEXT_BYTES,
    FORMAT_BITS,
    MXFP4_BITS,
    PREFILL_CHUNK,
    Estimate,
    ModelShape,
    classify,
    estimate,
    format_for,
)
from eaglechat.fit.quantization import AUTO, QUANTS
from eaglechat.units import GiB

PLAN_SCHEMA = "eaglechat.plan/1"
GPU_CLASSES_GIB = (6, 8, 12, 16, 24, 32, 48, 80)


@dataclass
class Option:
    quant: str
    format: str
    context: int
    status: str  # fits | tight | wont_fit
    estimate: Estimate
    tree: dict
    speculate: Speculate  # AUTO: measured while decoding (the head is loaded: budgeted as on)

    @property
    def total(self) -> int:
        return self.estimate.total

    def to_dict(self) -> dict:
        return {
            "quant": self.quant,
            "format": self.format,
            "context": self.context,
            "status": self.status,
            "tree": dict(self.tree),
            "speculate": self.speculate.wire,
            "total_bytes": self.total,
            "total_gib": round(self.total / GiB, 2),
            "breakdown": self.estimate.to_dict(),
        }


@dataclass
class Plan:
    model: str
    device: dict
    profile: str
    dtype: str
    free_bytes: int
    reserve_bytes: int
    choice: Option | None
    considered: list
    alternatives: list
    notes: list
    reason: str = ""  # why this format: speed rank, what did not fit, or a measurement
    blocked: str = ""  # not a matter of memory: what was asked cannot load at all (the refusal line)

    @property
    def budget_bytes(self) -> int:
        return max(0, self.free_bytes - self.reserve_bytes)

    @property
    def status(self) -> str:
        return self.choice.status if self.choice else "wont_fit"

    @property
    def fits(self) -> bool:
        return self.choice is not None

    def refusal(self) -> str:
        """The one line shown when nothing fits."""
        if self.blocked:
            return self.blocked
        smallest = min(self.considered, key=lambda o: o.total) if self.considered else None
        line = f"{self.model or 'the model'} does not fit {self.device.get('name')}: {self.budget_bytes / GiB:.1f} GiB available"
        if smallest is not None:
            line += f"; the smallest option ({smallest.format}, context {smallest.context}) needs {smallest.total / GiB:.1f} GiB"
        if self.alternatives:
            line += "; would fit: " + "; ".join(a["hint"] for a in self.alternatives)
        else:
            line += "; nothing smaller would fit"
        return line

    def require(self) -> "Plan":
        """The plan itself when something fits; otherwise OutOfMemory with the refusal line."""
        if self.choice is None:
            from eaglechat.errors import OutOfMemory

            raise OutOfMemory(self.refusal())
        return self

    def to_dict(self) -> dict:
        return {
            "schema": PLAN_SCHEMA,
            "model": self.model,
            "device": self.device,
            "profile": self.profile,
            "dtype": self.dtype,
            "memory": {
                "free_bytes": self.free_bytes,
                "reserve_bytes": self.reserve_bytes,
                "budget_bytes": self.budget_bytes,
                "budget_gib": round(self.budget_bytes / GiB, 2),
            },
            "status": self.status,
            "choice": self.choice.to_dict() if self.choice else None,
            "considered": [o.to_dict() for o in self.considered],
            "alternatives": list(self.alternatives),
            "notes": list(self.notes),
            "reason": self.reason,
        }


def mxfp4_native(device) -> bool:
    """Whether transformers keeps an MXFP4 checkpoint (gpt-oss) in MXFP4 on `device`: its Mxfp4HfQuantizer
    does so only on CUDA with compute capability >= 7.5, Triton >= 3.4 and the `kernels` package (which
    fetches the triton_kernels MoE kernels); anywhere else it dequantizes every expert to bf16."""
    import importlib.util

    cc = tuple(device.compute_capability or (0, 0))
    if device.kind != "cuda" or cc < (7, 5):
        return False
    return all(importlib.util.find_spec(name) is not None for name in ("triton", "kernels"))


def expert_bits_for(shape: ModelShape, device, fmt: str = "") -> float | None:
    """Resident bits of the MoE experts as the load leaves them (None: the compute dtype): an MXFP4
    checkpoint as transformers keeps it; under --quant 4bit (`fmt` nf4/nf4-dq) nf4 per expert, the
    linears' format (fit/nf4_experts.py); under LLM.int8 the compute dtype."""
    if shape.checkpoint_quant == "mxfp4":
        return MXFP4_BITS if mxfp4_native(device) else 16.0
    if shape.is_moe and fmt in ("nf4", "nf4-dq"):
        return FORMAT_BITS[fmt]
    return None


def runtime_bytes_for(device) -> int | None:
    """A measured CUDA card already lost its context to the measurement (mem_get_info creates it)."""
    if device.kind == "cuda" and not getattr(device, "simulated", False):
        return CUDA_AFTER_CONTEXT_BYTES
    return None


def contexts_to_try(target: int, floor: int = 1024) -> list[int]:
    """target, target/2, ... down to `floor` (or target itself when it is already below)."""
    out, ctx = [], int(target)
    while True:
        out.append(ctx)
        if ctx // 2 < min(floor, target) or ctx <= floor:
            return out
        ctx //= 2


def requantize_refused(model: str, shape: ModelShape, quant: str, device, profile: str, dtype: str, reserve: int) -> Plan:
    """A pre-quantized checkpoint asked for bitsandbytes: refused (transformers' merge_quantization_configs
    raises a ValueError for a BitsAndBytesConfig on one)."""
    line = (f"{model or 'this model'} ships {shape.checkpoint_quant} weights: bitsandbytes cannot quantize them "
            f"again (--quant {quant}); use --quant none")
    return Plan(model=model, device=device.to_dict(), profile=profile, dtype=dtype, free_bytes=int(device.free_bytes),
                reserve_bytes=reserve, choice=None, considered=[], alternatives=[], notes=[line], blocked=line)


def first_fit(option, order: list[str], target: int, contexts: list[int]) -> Option | None:
    """The first format in `order` that fits at the target context; else, format by format, the largest
    context at which one is at least tight; None when nothing does."""
    fits = next((o for o in (option(q, target) for q in order) if o.status == "fits"), None)
    if fits is not None:
        return fits
    for q in order:
        found = next((o for o in (option(q, c) for c in contexts) if o.status != "wont_fit"), None)
        if found is not None:
            return found
    return None


def choice_notes(choice: Option, considered: list[Option], target: int, budget: int, prof) -> list[str]:
    """Why the choice is what it is: the formats before it that do not fit, a shorter context, a tight fit,
    speculation pinned off or measured slower by tune."""
    notes = []
    for o in considered:
        if o.quant == choice.quant:
            break
        if o.status == "wont_fit":
            notes.append(f"{o.format} won't fit: needs {o.total / GiB:.1f} GiB at context {choice.context}, "
                         f"{budget / GiB:.1f} available")
    if choice.context < target:
        notes.append(f"context reduced from {target} to {choice.context} to fit")
    if choice.status == "tight":
        notes.append("tight: under 8% headroom; other programs on this device can push it out of memory")
    if choice.speculate is Speculate.OFF:
        notes.append("speculation off: the profile sets speculate: false (plain decoding)")
    elif choice.speculate is Speculate.AUTO and prof.tuned_speculate(choice.quant) is False:
        notes.append("tune measured plain decoding faster here; speculation: auto measures both while "
                     "decoding and keeps the faster")
    return notes


def format_notes(shape: ModelShape, expert_bits: float | None, considered: list[Option]) -> list[str]:
    """What bitsandbytes and transformers do to an MoE's experts or an MXFP4 checkpoint here."""
    notes = []
    quants = {o.quant for o in considered}
    linears = "attention, the dense MLP beside the experts and the router" if shape.dense_mlp_beside_experts else "attention"
    if shape.is_moe and not shape.checkpoint_quant and "4bit" in quants:
        notes.append(f"MoE experts in nf4 under --quant 4bit, expert by expert, like the {linears} (bitsandbytes' "
                     "4-bit kernels; only the routed experts run); a step with them is not captured as a CUDA graph: "
                     "it decodes eagerly")
    if shape.is_moe and not shape.checkpoint_quant and "8bit" in quants:
        notes.append("MoE experts stay 16-bit under --quant 8bit (LLM.int8 has no kernel for transformers' fused 3D "
                     f"expert tensors): only the {linears} {'are' if shape.dense_mlp_beside_experts else 'is'} quantized")
    if shape.checkpoint_quant == "mxfp4":
        notes.append("MXFP4 experts kept as MXFP4 (CUDA cc >= 7.5, triton, kernels)" if expert_bits == MXFP4_BITS else
                     "MXFP4 experts dequantized to bf16 by transformers here (MXFP4 stays only on CUDA cc >= 7.5 "
                     "with triton and the `kernels` package installed)")
    return notes


def _mxfp4_kept(device, options: list[Option]) -> list[dict]:
    """The alternative of keeping MXFP4 experts (with the `kernels` package), where one of `options` fits."""
    kept = next((o for o in options if o.status != "wont_fit"), None)
    if kept is None:
        return []
    return [{"device": device.name, "quant": "none", "format": "mxfp4", "context": kept.context, "total_bytes": kept.total,
             "hint": f"pip install kernels (MXFP4 kept on CUDA cc >= 7.5: context {kept.context}, {kept.total / GiB:.1f} GiB)"}]


def plan_model(
    shape: ModelShape,
    device,
    profile=None,
    *,
    model: str = "",
    quant: str | None = None,
    context: int | None = None,
    tree=None,
    speculate: Speculate | bool | str | None = None,  # None: the profile's
    checkpoint_dtype: str | None = None,
    head_kind: str = "eagle2",
    draft_vocab: int | None = None,
    profiles: list | None = None,
    explain: bool = True,
) -> Plan:
    """Choose (quantization, context, tree) for `shape` on `device` (a hardware.DeviceInfo).
    `quant` / `context` / `tree` pin those choices (a pinned context is not reduced). Pure given
    `profile` (or `profiles`); otherwise the user's profile folder and tuned cache are read."""
    from eaglechat.fit.profiles import resolve_profile

    if quant == AUTO:
        quant = None
    if quant is not None and quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r} (none, 8bit, 4bit)")
    prof = profile or resolve_profile(device, shape, quant, model=model or None, profiles=profiles)
    dtype = prof.compute_dtype(device, checkpoint_dtype)
    reserve = int(float(prof.reserve_gib) * GiB)
    budget = max(0, int(device.free_bytes) - reserve)
    chunk = int(prof.memory.get("prefill_chunk", PREFILL_CHUNK))
    share = bool(prof.memory.get("share_eagle_embedding", True))
    notes: list[str] = []

    target = int(context) if context else prof.max_context(shape)
    if target > shape.max_context:
        notes.append(f"context {target} is more than the model's {shape.max_context}: using {shape.max_context}")
        target = shape.max_context
    if shape.checkpoint_quant and quant not in (None, "none"):
        return requantize_refused(model, shape, quant, device, prof.name, dtype, reserve)
    ctxs = [target] if context else contexts_to_try(target)
    order, measured = ([quant], {}) if quant else by_measured_speed(prof.quant_order(shape), prof.tuned)
    if shape.checkpoint_quant:  # a pre-quantized checkpoint loads as it is (or dequantized), never through bnb
        order, measured = ["none"], {}
    expert_bits = expert_bits_for(shape, device)  # an MXFP4 checkpoint's; --quant 4bit's: per option
    runtime = runtime_bytes_for(device)

    def option(q: str, ctx: int, bits: float | None = None) -> Option:
        budget_tree = tree if tree is not None else prof.tree_for(q, shape, device)
        spec = prof.speculate_for(q) if speculate is None else Speculate.of(speculate)
        fmt = format_for(q, dtype, prof.double_quant)
        bits = expert_bits_for(shape, device, fmt) if bits is None else bits
        est = estimate(
            shape, fmt, ctx, total_tokens=budget_tree.total_tokens, depth=budget_tree.depth, top_k=budget_tree.draft_top_k,
            dtype=dtype, device_kind=device.kind, share_embedding=share, head_kind=head_kind,
            draft_vocab=draft_vocab, prefill_chunk=chunk, speculate=bool(spec), expert_bits=bits,
            runtime_bytes=runtime,
        )
        t = budget_tree.to_dict()
        return Option(q, fmt, ctx, classify(est.total, budget), est, t, spec)

    choice = first_fit(option, order, target, ctxs)

    at = choice.context if choice else target  # every format is compared at the chosen context
    rest = [q for q in QUANTS if q not in order and not shape.checkpoint_quant]
    considered = [option(q, at) for q in order + (rest if quant is None else [])]
    if choice is not None:
        notes += choice_notes(choice, considered, target, budget, prof)
    notes += format_notes(shape, expert_bits, considered)
    reason = why(choice, considered, order, pinned=quant is not None, measured=measured, budget=budget,
                 device_kind=device.kind)

    alternatives: list[dict] = []
    if choice is None and explain:
        alternatives = _alternatives(shape, device, prof, quant, context, tree, dtype, budget, option, profiles, head_kind,
                                     draft_vocab, checkpoint_dtype)
        if shape.checkpoint_quant == "mxfp4" and expert_bits != MXFP4_BITS and device.kind == "cuda":
            alternatives[:0] = _mxfp4_kept(device, [option("none", c, MXFP4_BITS) for c in ctxs])
    return Plan(model=model, device=device.to_dict(), profile=prof.name, dtype=dtype, free_bytes=int(device.free_bytes),
                reserve_bytes=reserve, choice=choice, considered=considered, alternatives=alternatives, notes=notes,
                reason=reason)


# what each format costs per decode step on a GPU beyond its weight bytes (the speed half of the choice);
# the figures: one H200, Vicuna-7B shape, torch 2.11, bitsandbytes 0.50.2 (fp16 forward 22.7-25.4 ms)
SPEED_NOTE = {
    "none": "no dequantization, the fastest format (measured on an H200: LLM.int8 forwards cost 5-6x fp16's, "
            "an nf4 verify 1.4-1.8x a one-row nf4 step)",
    "4bit": "one fused dequantize-and-multiply kernel per Linear for one row (bitsandbytes); a verify of more "
            "rows dequantizes every weight: 44-61 ms for 8-128 rows against 31-34 ms for one on an H200 "
            "(Vicuna-7B shape), still faster than LLM.int8",
    "8bit": "LLM.int8: an int8 matmul and a 16-bit matmul of each row's outliers in every Linear, the slowest "
            "format: its forwards cost 117-167 ms on an H200 (Vicuna-7B shape), 5-6x fp16's 23-25 ms",
}


def by_measured_speed(order: list[str], tuned: dict) -> tuple[list[str], dict[str, float]]:
    """The profile's order, with the formats `eaglechat tune` measured on this device sorted by their
    predicted tokens/s (fastest first) in the slots they held; unmeasured formats keep their place."""
    speed = {}
    for q, record in (tuned or {}).items():
        rate = (record.get("choice") or {}).get("predicted_tokens_per_s")
        if q in order and isinstance(rate, (int, float)) and rate > 0:
            speed[q] = float(rate)
    if len(speed) < 2:
        return list(order), {}
    slots = [i for i, q in enumerate(order) if q in speed]
    ranked = sorted(speed, key=lambda q: -speed[q])
    out = list(order)
    for i, q in zip(slots, ranked):
        out[i] = q
    return out, speed


def why(choice, considered, order, *, pinned: bool, measured: dict, budget: int, device_kind: str = "cuda") -> str:
    """One sentence: why this format (and not a faster one)."""
    if choice is None:
        return ""
    fits = f"{choice.total / GiB:.1f} of {budget / GiB:.1f} GiB at context {choice.context}"
    if device_kind == "cuda":
        speed = SPEED_NOTE.get(choice.quant, "")
    else:  # CPU/MPS kernels rank differently (bitsandbytes' CPU nf4 wins at one token, loses on trees)
        speed = "the profile's first choice for this device" if choice.quant == order[0] else ""
    if pinned:
        return f"{choice.format}: asked for (--quant {choice.quant}); {speed}; {fits}"
    if measured and choice.quant in measured:
        rates = ", ".join(f"{q} {r:.1f}" for q, r in sorted(measured.items(), key=lambda kv: -kv[1]))
        head = f"{choice.format}: the fastest measured format that fits (eaglechat tune, predicted tok/s: {rates})"
    else:
        head = f"{choice.format}: {speed}" if speed else choice.format
    ahead = order[: order.index(choice.quant)] if choice.quant in order else []
    missed = [o for o in considered if o.quant in ahead]
    if missed:
        head += "; chosen because " + ", ".join(
            f"{o.format} needs {o.total / GiB:.1f} GiB" for o in missed) + f" ({budget / GiB:.1f} available)"
    return f"{head}; {fits}"


def _alternatives(shape, device, prof, quant, context, tree, dtype, budget, option, profiles, head_kind, draft_vocab,
                  checkpoint_dtype=None) -> list[dict]:
    """What would fit when nothing asked for does: other formats or smaller contexts on this device,
    then the smallest GPU class where the default plan fits."""
    out: list[dict] = []
    top = min(shape.max_context, context or prof.max_context(shape))
    for q in (["none"] if shape.checkpoint_quant else QUANTS):
        for ctx in contexts_to_try(top, floor=256):
            o = option(q, ctx)
            if o.status != "wont_fit":
                if q == quant and ctx == context:
                    break
                flags = ([f"--quant {q}"] if q != quant else []) + ([f"--max-context {ctx}"] if ctx != top or context else [])
                out.append({
                    "device": device.name, "quant": q, "format": o.format, "context": ctx,
                    "total_bytes": o.total, "hint": f"{' '.join(flags) or 'as asked'} ({o.format}, {o.total / GiB:.1f} GiB)",
                })
                break
    if device.kind == "cuda":
        from eaglechat.fit.hardware import fake_gpu

        for gib in GPU_CLASSES_GIB:
            if gib * GiB <= device.total_bytes:
                continue
            p = plan_model(shape, fake_gpu(str(gib)), model="", quant=quant, context=context, tree=tree,
                           checkpoint_dtype=checkpoint_dtype, head_kind=head_kind, draft_vocab=draft_vocab,
                           profiles=profiles, explain=False)
            if p.choice is not None:
                c = p.choice
                out.append({
                    "device": f"{gib} GB GPU", "quant": c.quant, "format": c.format, "context": c.context,
                    "total_bytes": c.total, "hint": f"{'an' if gib in (8, 80) else 'a'} {gib} GB GPU ({c.format}, context {c.context}, {c.total / GiB:.1f} GiB)",
                })
                break
    return out


class Planner:
    """Plans for one device (a hardware.DeviceInfo, real or simulated with fake_gpu)."""

    def __init__(self, device, *, profiles: list | None = None):
        self.device = device
        self.profiles = profiles  # None: the shipped profiles, the user's folder and the tuned cache

    @classmethod
    def here(cls, device: str | None = None, gpu: str | None = None) -> "Planner":
        """For `--device` on this machine, or for `--gpu` (a simulated card)."""
        from eaglechat.fit import hardware

        return cls(hardware.resolve(device, gpu))

    def plan(self, shape: ModelShape, *, model: str = "", quant: str | None = None, context: int | None = None,
             tree=None, speculate: Speculate | bool | str | None = None, checkpoint_dtype: str | None = None,
             head_kind: str = "eagle2", draft_vocab: int | None = None, explain: bool = True) -> Plan:
        """The plan for a model of this shape; `quant`/`context`/`tree` pin those choices."""
        if checkpoint_dtype == AUTO:
            checkpoint_dtype = None
        return plan_model(shape, self.device, model=model, quant=quant, context=context, tree=tree,
                          speculate=speculate, checkpoint_dtype=checkpoint_dtype, head_kind=head_kind or "eagle2",
                          draft_vocab=draft_vocab, profiles=self.profiles, explain=explain)

    def plan_for(self, manifest, *, quant: str | None = None, explain: bool = False) -> Plan | None:
        """The plan for a catalog model (quant None or "auto": the planner picks); None while its shape is
        unknown (base config not cached)."""
        if manifest.shape is None:
            return None
        return self.plan(manifest.shape, model=manifest.name, quant=quant, checkpoint_dtype=manifest.dtype,
                         head_kind=manifest.head_kind, draft_vocab=getattr(manifest, "draft_vocab", None),
                         explain=explain)
