"""What to load on this machine, decided once and before any weight is read.

    LoadRequest (what the user asked: flags, or the chat's settings)
  + ModelFacts  (what is known of the model without loading it: its shape, dtype, head kind)
  + DeviceInfo  (the machine: hardware.probe)
  -> choose() -> LoadPlan (device, dtype, quantization, context, draft tree, prefill chunk, the speculation
                           default, the draft vocabulary, and the notes the user is told)

The rules live where they always did (the memory planner: planner.py; per-hardware defaults: profiles/;
bitsandbytes' kernels: bnb_dispatch.py); this module applies them in one order. No model is loaded here,
so every decision is tested without one (tests/test_choose.py); the loader then loads what the plan says
(eaglechat/loader.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from eaglechat.engine.protocol import Speculate, TreeBudget
from eaglechat.errors import OutOfMemory, UsageError
from eaglechat.fit import hardware, profiles, speculation_records
from eaglechat.fit.bnb_dispatch import clamp_tree, int8_compute_dtype, verify_row_limit
from eaglechat.fit.memory import PREFILL_CHUNK, ModelShape
from eaglechat.fit.planner import Planner, expert_bits_for
from eaglechat.fit.quantization import AUTO, check_quant


@dataclass(frozen=True)
class LoadRequest:
    """What the user asked for; None (and "auto") leave the choice to this machine's profile and planner."""

    head: str | None = None  # an EAGLE head folder (for a local base folder; a catalog model names its own)
    device: str | None = None  # None or "auto": CUDA, then MPS, then the CPU
    dtype: str | None = None  # float32 | float16 | bfloat16; None: the profile's
    quant: str = "none"  # none | 8bit | 4bit | auto (the memory planner's choice)
    max_context: int | None = None
    tree: TreeBudget | None = None  # a whole draft tree in place of the profile's
    # single tree flags (--total-tokens, --depth, --draft-top-k, --tree) on top of the profile's or `tree`
    total_tokens: int | None = None
    depth: int | None = None
    draft_top_k: int | None = None
    tree_kind: str | None = None
    speculate: bool = True  # False: the draft head is not loaded at all
    compile: str = "off"  # auto | graphs | inductor (on) | off: how decode steps run (engine/compile.py)

    def tree_flags(self) -> dict:
        """The tree flags given, as TreeBudget fields."""
        given = {"total_tokens": self.total_tokens, "depth": self.depth, "draft_top_k": self.draft_top_k,
                 "kind": self.tree_kind}
        return {k: v for k, v in given.items() if v is not None}


@dataclass(frozen=True)
class ModelFacts:
    """What is known of a model before a byte of it loads (from its config.json and catalog entry)."""

    name: str  # the name profiles and tuned records are kept under
    shape: ModelShape | None = None  # None: a config the memory planner cannot read
    why_no_shape: str = ""
    checkpoint_dtype: str | None = None  # the dtype the checkpoint is stored in, where known
    head_kind: str | None = None  # eagle2 | eagle3, where known
    draft_vocab: int | None = None  # an EAGLE-3 head's reduced draft vocabulary


@dataclass(frozen=True)
class LoadPlan:
    device: str  # a torch device: cpu, cuda:0, mps
    device_kind: str  # cpu | cuda | mps
    dtype: str  # float32 | float16 | bfloat16
    quant: str  # none | 8bit | 4bit
    context: int | None  # None: the engine's default for the device, capped at the model's positions
    tree: TreeBudget
    prefill_chunk: int  # the chunk the memory planner budgeted the prefill's activations for
    speculate: Speculate  # the engine's default mode (AUTO: measured while decoding)
    draft_vocab: int | str  # draft-time vocabulary of a full-vocabulary head (models/draft_vocab.py)
    tuned_speculate: bool | None = None  # what `eaglechat tune` measured (None: the tree is not tune's)
    tuned_under_load: str = ""  # tune measured on a busy machine: "load 3.1 on 2 cores"
    # what this machine measured of the trees against plain decoding (fit/speculation_records.py): auto starts from it
    speculation: dict = field(default_factory=dict)
    notes: tuple[str, ...] = field(default=())  # what the user is told: a clamp, a planner decision

    def describe(self) -> str:
        return f"{self.device}, {self.dtype}, quant {self.quant}"


def choose(request: LoadRequest, facts: ModelFacts, machine: hardware.DeviceInfo) -> LoadPlan:
    """The plan for loading `facts`' model on `machine` as `request` asks. Planner and profile errors
    surface: an EaglechatError is one line, anything else a bug to see."""
    check_quant(request.quant, allow_auto=True)
    quant, context = request.quant, request.max_context
    if quant == AUTO:  # the memory planner's choice for this device (refuses when nothing fits)
        quant, planned_context = planned_quant(facts, machine)
        context = context or planned_context
    profile = profiles.resolve_profile(machine, facts.shape, quant, model=facts.name,
                                       checkpoint_dtype=facts.checkpoint_dtype)
    dtype = int8_compute_dtype(quant, machine.kind, request.dtype or profile.resolved["dtype"], request.dtype is not None)
    tree, notes = draft_tree(request, profile.resolved["tree"].get(quant), facts, machine, quant, dtype)
    if request.tree is None:  # the profile's tree, cut to what its draft can offer: said
        notes = profile.resolved.get("tree_notes", {}).get(quant, []) + notes
    if facts.shape is not None:
        check_fits_machine(facts.shape, quant, dtype, machine, facts.name)
    tuned = request.tree is None and quant in profile.tuned  # the tree came from `tune`
    return LoadPlan(
        device=machine.torch_device,
        device_kind=machine.kind,
        dtype=dtype,
        quant=quant,
        context=context,
        tree=tree,
        prefill_chunk=int(profile.memory.get("prefill_chunk", PREFILL_CHUNK)),
        speculate=profile.speculate_for(quant),
        draft_vocab=profile.draft_vocab,
        tuned_speculate=profile.tuned_speculate(quant) if request.tree is None else None,
        tuned_under_load=profiles.load_note(profile.tuned[quant].get("load")) if tuned else "",
        speculation=speculation_records.load(machine, facts.name, quant),
        notes=tuple(notes),
    )


def check_fits_machine(shape: ModelShape, quant: str, dtype: str, machine: hardware.DeviceInfo, name: str) -> None:
    """The weights the config asks for, alone, against all of the device's memory, before anything is
    allocated (the planner's finer fit is `plan`'s and `--quant auto`'s). A pre-quantized checkpoint's
    formats are the planner's to size."""
    from eaglechat.fit.memory import FORMAT_LABEL, format_for, weight_bytes
    from eaglechat.units import fmt_bytes, fmt_count

    if shape.checkpoint_quant:
        return
    fmt = format_for(quant, dtype)
    need = weight_bytes(shape, fmt, dtype_bytes=4 if dtype == "float32" else 2,
                        expert_bits=expert_bits_for(shape, machine, fmt))
    if need > machine.total_bytes:
        raise OutOfMemory(f"{name}'s config asks for {fmt_count(shape.params)} parameters, {fmt_bytes(need)} of "
                          f"weights in {FORMAT_LABEL[fmt]}, more than all {fmt_bytes(machine.total_bytes)} of "
                          f"{machine.name}; refusing to load it (see 'eaglechat plan {name}')")


def planned_quant(facts: ModelFacts, machine: hardware.DeviceInfo) -> tuple[str, int]:
    """--quant auto: (quantization, context) the memory planner picks for this model on this machine."""
    if facts.shape is None:
        raise UsageError(f"--quant auto cannot plan {facts.name}: {facts.why_no_shape}; pass --quant none, 8bit or 4bit")
    plan = Planner(machine).plan(facts.shape, model=facts.name, checkpoint_dtype=facts.checkpoint_dtype,
                                 head_kind=facts.head_kind, draft_vocab=facts.draft_vocab, explain=False).require()
    return plan.choice.quant, plan.choice.context


def draft_tree(request: LoadRequest, profile_tree: TreeBudget | None, facts: ModelFacts, machine: hardware.DeviceInfo,
               quant: str, dtype: str) -> tuple[TreeBudget, list[str]]:
    """The tree asked for (a whole one, or flags over the profile's), checked; a 4-bit base on CUDA verifies
    no more rows than bitsandbytes' fused kernel takes, unless the user set the size (said in a note)."""
    budget = request.tree or profile_tree or TreeBudget()
    flags = request.tree_flags()
    budget = replace(budget, **flags).check() if flags or request.tree is not None else budget
    if "total_tokens" in flags:  # a tree size the user asked for is theirs
        return budget, []
    limit = verify_row_limit(machine.kind, quant, facts.shape, device_index=machine.index,
                             dtype=hardware.torch_dtype(dtype) if quant == "4bit" and machine.kind == "cuda" else None)
    budget, note = clamp_tree(budget, limit)
    return budget, [note] if note else []
