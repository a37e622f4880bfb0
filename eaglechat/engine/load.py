"""Loading: a model name -> base model (transformers, optional bitsandbytes) + tokenizer + head -> Engine.

A name is a catalog alias (pulled into the Hugging Face cache), the embedded default, or a local
Hugging Face folder (then `head` points at an EAGLE head folder; without one, plain decoding only).
Remote code is never enabled; pickled weights are never loaded (safetensors, or weights_only=True).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch

from eaglechat.engine.protocol import EngineInfo, TreeBudget
from eaglechat.errors import EaglechatError, ModelNotFound, OutOfMemory, UsageError, WeightsError

Progress = Callable[[str, "float | None"], None]
QUANTS = ("none", "8bit", "4bit")


def resolve_model(name: str, head: str | None = None, progress: Progress | None = None) -> tuple[Path, Path | None, object | None]:
    """-> (base folder, head folder or None, catalog manifest or None)."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFound(f"{path} is not a Hugging Face model folder (no config.json)")
        return path, Path(head).expanduser() if head else None, None
    from eaglechat import default_model

    if name == default_model.DEFAULT_ALIAS:
        base = default_model.ensure_default_base((lambda msg: progress(msg, None)) if progress else None)
        head_dir = Path(head).expanduser() if head else default_model.DEFAULT_HEAD_DIR
        return base, head_dir, None
    if name.startswith((".", "/", "~")):
        raise ModelNotFound(f"no such model folder: {name}")
    from eaglechat import catalog, hub

    manifest = catalog.resolve(name)
    base, head_dir = hub.local_paths(manifest)
    return base, Path(head).expanduser() if head else head_dir, manifest


def pick_device(device: str | None) -> str:
    if device:
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise UsageError(f"--device {device}: no CUDA device is available here")
        if device == "mps" and not torch.backends.mps.is_available():
            raise UsageError("--device mps: Apple MPS is not available here")
        return device
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def pick_dtype(dtype: str | None, device: str, manifest=None) -> torch.dtype:
    if dtype:
        try:
            return {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
                    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}[dtype]
        except KeyError:
            raise UsageError(f"unknown dtype {dtype!r} (float32, float16, bfloat16)") from None
    if device == "cpu":
        return torch.float32  # exact; bf16 is faster only on CPUs with native bf16
    wanted = getattr(manifest, "dtype", None)
    return torch.bfloat16 if wanted in ("bfloat16", "bf16") else torch.float16


def quantization_config(quant: str, dtype: torch.dtype):
    if quant not in QUANTS:
        raise UsageError(f"unknown quantization {quant!r} (auto, none, 8bit, 4bit)")
    if quant == "none":
        return None
    from transformers import BitsAndBytesConfig

    if quant == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype
    )


def load_base(base_dir: Path, *, device: str, dtype: torch.dtype, quant: str = "none"):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(base_dir, trust_remote_code=False)
    except Exception as exc:
        raise WeightsError(f"cannot load the tokenizer in {base_dir}: {_short(exc)}") from None
    qconfig = quantization_config(quant, dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            base_dir, dtype=dtype, attn_implementation="sdpa", trust_remote_code=False,
            quantization_config=qconfig, device_map=device if qconfig is not None else None,
        )
    except torch.OutOfMemoryError:
        raise OutOfMemory(f"out of memory loading {base_dir.name} on {device}; try --quant 4bit") from None
    except EaglechatError:
        raise
    except Exception as exc:
        raise WeightsError(f"cannot load the model in {base_dir}: {_short(exc)}") from None
    if qconfig is None:
        try:
            model = model.to(device)
        except torch.OutOfMemoryError:
            raise OutOfMemory(f"out of memory moving {base_dir.name} to {device}; try --quant 4bit") from None
    return model.eval().requires_grad_(False), tokenizer


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]


def machine_profile(device: str, base_dir: Path, quant: str, model_name: str):
    """The resolved machine profile for this model, or None when it cannot be resolved (never fatal:
    the built-in defaults apply)."""
    try:
        from transformers import AutoConfig

        from eaglechat import hardware, profiles
        from eaglechat.memory import ModelShape

        shape = ModelShape.from_hf_config(AutoConfig.from_pretrained(base_dir))
        return profiles.resolve_profile(hardware.probe(device), shape, quant, model=model_name)
    except EaglechatError:
        raise
    except Exception:
        return None


def planned_quant(device: str, base_dir: Path, model_name: str, manifest) -> tuple[str, int | None]:
    """(quantization, context) the planner picks for this model on this device; ("none", None) when
    the model cannot be planned (an unusual config). Nothing fitting is one clear OutOfMemory line."""
    try:
        from transformers import AutoConfig

        from eaglechat import hardware
        from eaglechat.memory import ModelShape, plan_model

        shape = ModelShape.from_hf_config(AutoConfig.from_pretrained(base_dir))
        plan = plan_model(shape, hardware.probe(device), model=model_name, explain=False,
                          checkpoint_dtype=getattr(manifest, "dtype", None),
                          head_kind=getattr(manifest, "head_kind", None) or "eagle2")
    except EaglechatError:
        raise
    except Exception:
        return "none", None
    plan.require()
    return plan.choice.quant, plan.choice.context


def profile_tree(profile, quant: str) -> TreeBudget | None:
    tree = (profile.resolved.get("tree") or {}).get(quant)
    if not tree:
        return None
    return TreeBudget(int(tree["total_tokens"]), int(tree["depth"]), int(tree["top_k"]))


def model_memory_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )


def load_engine(
    model: str,
    *,
    head: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    quant: str = "none",  # "auto": the memory planner's choice for this device
    tree: TreeBudget | None = None,
    max_context: int | None = None,
    progress: Progress | None = None,
    speculate: bool = True,
    tree_overrides: dict | None = None,
):
    """Everything `eaglechat run` and the chat need: resolved, loaded, checked.

    The tree budget is `tree` when given, else the machine profile's (tuned > user > shipped) for this
    model and quantization, with `tree_overrides` (the CLI's --total-tokens/--depth/--draft-top-k) on top.
    dtype: given, else the profile's compute dtype (bf16 on CPUs with native bf16, else fp32)."""
    from eaglechat.engine.head import load_head
    from eaglechat.engine.local import LocalEngine, stop_token_ids

    report = progress or (lambda phase, fraction=None: None)
    report("resolving model", 0.0)
    base_dir, head_dir, manifest = resolve_model(model, head, report)
    device = pick_device(device)
    name = getattr(manifest, "name", None) or (base_dir.name if Path(model).expanduser().is_dir() else model)
    if quant == "auto":  # the memory planner's choice for this device (refuses when nothing fits)
        quant, planned_context = planned_quant(device, base_dir, name, manifest)
        max_context = max_context or planned_context
    profile = machine_profile(device, base_dir, quant, name)
    if dtype is None and profile is not None:
        dtype = profile.resolved.get("dtype")
    torch_dtype = pick_dtype(dtype, device, manifest)
    budget = tree or (profile_tree(profile, quant) if profile is not None else None) or TreeBudget()
    if tree_overrides:
        budget = replace(budget, **tree_overrides)
    report(f"loading {base_dir.name} ({device}, {str(torch_dtype).removeprefix('torch.')}, quant {quant})", 0.1)
    base, tokenizer = load_base(base_dir, device=device, dtype=torch_dtype, quant=quant)
    draft_head = None
    if speculate and head_dir is not None:
        report(f"loading draft head {head_dir.name}", 0.8)
        if not head_dir.exists():
            raise WeightsError(f"draft head folder {head_dir} does not exist")
        draft_head = load_head(head_dir, base, base_name=getattr(manifest, "name", None) or base_dir.name)
        wanted = getattr(manifest, "head_kind", None)  # load_head tells EAGLE-3 from EAGLE-1/2 by the keys
        if wanted and head is None and wanted != draft_head.kind:
            raise WeightsError(f"{manifest.name}: the catalog says an {wanted} head, but {head_dir.name} holds an {draft_head.kind} head")
    limit = int(getattr(base.config, "max_position_embeddings", 2048) or 2048)
    context = min(max_context or (4096 if device == "cpu" else 8192), limit)
    info = EngineInfo(
        model=getattr(manifest, "name", None) or model,
        device=device,
        dtype=str(torch_dtype).removeprefix("torch."),
        quant=quant,
        tree=budget,
        max_context=context,
        # the chunk the memory planner budgeted the prefill's activations for
        prefill_chunk=int((getattr(profile, "memory", None) or {}).get("prefill_chunk", 512)),
        memory_bytes=model_memory_bytes(base) + (model_memory_bytes(draft_head) if draft_head else 0),
        head=str(head_dir) if draft_head is not None else "",
        speculate_by_default=draft_head is not None and (profile is None or profile.speculate_for(quant)),
    )
    extra_stops = list(getattr(manifest, "stop_tokens", None) or [])
    engine = LocalEngine(
        base, tokenizer, draft_head, info=info, stop_ids=stop_token_ids(tokenizer, base, extra_stops),
        template=getattr(manifest, "template", None) or "tokenizer", default_system=getattr(manifest, "system", None),
    )
    report("ready", 1.0)
    return engine
