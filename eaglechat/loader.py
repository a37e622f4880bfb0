"""The composition root: a model name -> files -> device, profile and plan -> base model (transformers,
optional bitsandbytes) + tokenizer -> draft head -> LocalEngine.

A name is a catalog alias (pulled into the Hugging Face cache), the embedded default, or a local
Hugging Face folder (then `head` points at an EAGLE head folder; without one, plain decoding only).
Remote code is never enabled; pickled weights are never loaded (safetensors, or weights_only=True).
The engine package knows none of this: everything above it is wired together here.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from eaglechat import lean_transformers, quiet
from eaglechat.engine.protocol import EngineInfo, TreeBudget
from eaglechat.errors import EaglechatError, ModelNotFound, OutOfMemory, UsageError, WeightsError
from eaglechat.fit import hardware
from eaglechat.fit.bnb_dispatch import clamp_tree, int8_compute_dtype, verify_row_limit
from eaglechat.fit.quantization import AUTO, check_quant, quantization_config

if TYPE_CHECKING:
    import torch

# torch (and transformers) are imported inside the functions that use them, after the model's name is
# resolved: a misspelt name is one line in a fraction of a second, not after ~2 s of imports
Progress = Callable[[str, "float | None"], None]


def resolve_model(name: str, head: str | None = None, progress: Progress | None = None) -> tuple[Path, Path | None, object | None]:
    """-> (base folder, head folder or None, catalog manifest or None)."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFound(f"{path} is not a Hugging Face model folder (no config.json)")
        return path, Path(head).expanduser() if head else None, None
    from eaglechat.models import default_model

    if name == default_model.DEFAULT_ALIAS:
        base = default_model.ensure_default_base((lambda msg: progress(msg, None)) if progress else None)
        head_dir = Path(head).expanduser() if head else default_model.DEFAULT_HEAD_DIR
        return base, head_dir, None
    if name.startswith((".", "/", "~")):
        raise ModelNotFound(f"no such model folder: {name}")
    from eaglechat.models import catalog, hub

    manifest = catalog.resolve(name)
    base, head_dir = hub.local_paths(manifest)
    return base, Path(head).expanduser() if head else head_dir, manifest


def pick_dtype(dtype: str | None, device: str, manifest=None) -> torch.dtype:
    """`--dtype` when given; else float32 on the CPU (exact), the catalog's bf16 or float16 on a GPU."""
    import torch

    if dtype:
        return hardware.torch_dtype(dtype)
    if device == "cpu":
        return torch.float32  # exact; bf16 is faster only on CPUs with native bf16
    wanted = getattr(manifest, "dtype", None)
    return torch.bfloat16 if wanted in ("bfloat16", "bf16") else torch.float16


def attention_implementation(config) -> str:
    """"sdpa", or "eager" for model classes transformers refuses sdpa for (gpt-oss: attention sinks). The
    decoder then moves eager and GQA models to its own tree attention (engine/attention.py): eager
    attention would take the tree's bool mask as numbers."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        return "sdpa"  # from_pretrained names what it cannot load
    return "sdpa" if getattr(model_class, "_supports_sdpa", False) else "eager"


def load_base(base_dir: Path, *, device: str, dtype: torch.dtype, quant: str = "none"):
    """(model, tokenizer) from a Hugging Face folder on `device` (a torch device string), optionally
    quantized with bitsandbytes; every failure is one EaglechatError line."""
    lean_transformers.prepare()
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from eaglechat.engine.recurrent import layer_kinds
    from eaglechat.models.folder import check_base_folder

    check_base_folder(base_dir)  # a JSON object of a built-in model type: no code of the folder's own runs
    import torch

    quiet.progress_bars()
    try:
        tokenizer = AutoTokenizer.from_pretrained(base_dir, trust_remote_code=False)
    except Exception as exc:
        raise WeightsError(f"cannot load the tokenizer in {base_dir}: {_short(exc)}") from None
    qconfig = quantization_config(quant, dtype)
    try:
        config = AutoConfig.from_pretrained(base_dir, trust_remote_code=False)
        layer_kinds(config)  # an architecture the engine would refuse is refused before any weight loads
        with _loading_report_held_back():
            model, info = AutoModelForCausalLM.from_pretrained(
                base_dir, dtype=dtype, attn_implementation=attention_implementation(config), trust_remote_code=False,
                quantization_config=qconfig, device_map=device if qconfig is not None else None,
                output_loading_info=True,
            )
    except torch.OutOfMemoryError:
        raise OutOfMemory(f"out of memory loading {base_dir.name} on {device}; try --quant 4bit") from None
    except EaglechatError:
        raise
    except Exception as exc:
        raise WeightsError(f"cannot load the model in {base_dir}: {_short(exc)}") from None
    check_loading_info(info, base_dir)
    model = text_part(model)
    if qconfig is None:
        try:
            model = model.to(device)
        except torch.OutOfMemoryError:
            raise OutOfMemory(f"out of memory moving {base_dir.name} to {device}; try --quant 4bit") from None
    return model.eval().requires_grad_(False), tokenizer


def text_part(model):
    """The language model of a vision-language checkpoint, as a plain causal LM on the same modules.
    transformers loads gemma-3-*-it or Ministral 3 as ...ForConditionalGeneration (vision tower, projector,
    language model); eaglechat decodes text, and for text alone the language model with the checkpoint's
    lm_head computes exactly what the whole model does. The vision modules are dropped."""
    import torch
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    text_config = getattr(model.config, "text_config", None)
    language = getattr(getattr(model, "model", None), "language_model", None)
    text_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(text_config), None) if text_config is not None else None
    if language is None or text_class is None or getattr(text_class, "base_model_prefix", None) != "model":
        return model
    with torch.device("meta"):  # a skeleton: its modules are replaced by the loaded ones
        text = text_class(text_config)
    text.model, text.lm_head = language, model.get_output_embeddings()
    return text


def check_loading_info(info: dict, base_dir: Path) -> None:
    """A model is all there or it is refused: weights the checkpoint does not provide would be random
    (transformers "newly initializes" them), weights it has that the model does not use mean the
    config describes another model, and a shape mismatch is both."""
    for key, what in (("missing_keys", "lacks weights the config needs"),
                      ("mismatched_keys", "has weights of another shape than the config says"),
                      ("unexpected_keys", "has weights the config's model does not use")):
        keys = sorted(str(k[0] if isinstance(k, (tuple, list)) else k) for k in (info or {}).get(key) or ())
        if keys:
            more = f" (+{len(keys) - 3} more)" if len(keys) > 3 else ""
            raise WeightsError(f"{base_dir}: the checkpoint {what}: {', '.join(keys[:3])}{more}; "
                               "eaglechat never runs a model with random or ignored weights")


class _loading_report_held_back:
    """transformers prints its table of missing/unexpected keys on every load; check_loading_info
    turns it into one line (`--verbose` keeps the table)."""

    def __enter__(self):
        from transformers.utils import logging as hf_logging

        self.level = hf_logging.get_verbosity()
        if not quiet._state["verbose"]:
            hf_logging.set_verbosity_error()
        return self

    def __exit__(self, *exc):
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity(self.level)
        return False


def _short(exc: Exception) -> str:
    """A library's message as one line: its lines joined (tokenizers' reasons follow a line ending in a colon)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 500 else text[:497] + "..."


def model_shape(base_dir: Path):
    """(ModelShape, None) of the base in `base_dir`, or (None, why) for a config the planner cannot read
    (an unusual architecture); a config that cannot be read at all is a WeightsError."""
    lean_transformers.prepare()
    from transformers import AutoConfig

    from eaglechat.fit.memory import ModelShape
    from eaglechat.models.folder import check_base_folder

    check_base_folder(base_dir)
    try:
        config = AutoConfig.from_pretrained(base_dir, trust_remote_code=False)
    except Exception as exc:
        raise WeightsError(f"cannot read the config in {base_dir}: {_short(exc)}") from None
    config = getattr(config, "text_config", None) or config  # multimodal configs nest the language model
    if getattr(config, "intermediate_size", None) is None and getattr(config, "hidden_size", None):
        from types import SimpleNamespace

        # GPT-2-style configs name the MLP width n_inner (None: 4 x hidden)
        inner = getattr(config, "n_inner", None) or 4 * int(config.hidden_size)
        config = SimpleNamespace(**{**config.to_dict(), "hidden_size": config.hidden_size,
                                    "num_hidden_layers": config.num_hidden_layers,
                                    "num_attention_heads": config.num_attention_heads,
                                    "max_position_embeddings": getattr(config, "max_position_embeddings", 2048),
                                    "intermediate_size": inner})
    try:
        return ModelShape.from_hf_config(config), None
    except (AttributeError, KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        return None, f"its config lacks what the memory planner needs ({_short(exc)})"


def check_fits_machine(shape, quant: str, dtype: torch.dtype, machine, name: str) -> None:
    """The weights the config asks for, alone, against all of the device's memory, before anything is
    allocated (the planner's finer fit is `plan`'s and `--quant auto`'s). A pre-quantized checkpoint's
    formats are the planner's to size."""
    from eaglechat.fit.memory import FORMAT_LABEL, format_for, weight_bytes
    from eaglechat.units import fmt_bytes, fmt_count

    if shape.checkpoint_quant:
        return
    fmt = format_for(quant, str(dtype).removeprefix("torch."))
    need = weight_bytes(shape, fmt, dtype_bytes=dtype.itemsize)
    if need > machine.total_bytes:
        raise OutOfMemory(f"{name}'s config asks for {fmt_count(shape.params)} parameters, {fmt_bytes(need)} of "
                          f"weights in {FORMAT_LABEL[fmt]}, more than all {fmt_bytes(machine.total_bytes)} of "
                          f"{machine.name}; refusing to load it (see 'eaglechat plan {name}')")


def planned_head(manifest, head_dir: Path | None) -> tuple[str | None, int | None]:
    """(head kind, reduced draft vocabulary) the planner sizes: a head folder given by path says so in its
    own config.json; otherwise the catalog manifest's."""
    if head_dir is not None and (head_dir / "config.json").is_file():
        from eaglechat.fit.memory import read_config_json
        from eaglechat.models.pairs import head_kind_of

        try:
            return head_kind_of(read_config_json(head_dir / "config.json"))
        except (OSError, ValueError, AttributeError):  # the head loader reports a broken config itself
            pass
    return getattr(manifest, "head_kind", None), getattr(manifest, "draft_vocab", None)


def module_bytes(module) -> int:
    """Bytes of a module's parameters and buffers as they sit in memory (quantized ones included)."""
    return sum(p.numel() * p.element_size() for p in module.parameters()) + sum(
        b.numel() * b.element_size() for b in module.buffers()
    )


def assemble_engine(
    base,
    tokenizer,
    head=None,
    *,
    model: str,
    device: str | None = None,
    dtype: torch.dtype | None = None,
    tree: TreeBudget | None = None,
    quant: str = "none",
    max_context: int | None = None,
    prefill_chunk: int | None = None,
    head_path: str = "",
    speculate_by_default: bool | str = True,
    stop_tokens: list[str] | tuple = (),
    template: str = "tokenizer",
    system: str | None = None,
):
    """A LocalEngine over an already loaded base (+ head): device and dtype as loaded (default: read
    off the base's parameters), the context capped at the base's positions (default 4096 on a CPU, 8192 on a GPU), stop ids from the
    tokenizer and config. The one place an EngineInfo is built from loaded parts."""
    from eaglechat.engine.local import LocalEngine, stop_token_ids

    param = next(base.parameters())
    device = device or str(param.device)
    dtype = dtype or param.dtype
    limit = int(getattr(base.config, "max_position_embeddings", 2048) or 2048)
    context = min(max_context or (4096 if device == "cpu" else 8192), limit)
    info = EngineInfo(
        model=model,
        device=device,
        dtype=str(dtype).removeprefix("torch."),
        quant=quant,
        tree=tree or TreeBudget(),
        max_context=context,
        # the chunk the memory planner budgeted the prefill's activations for
        prefill_chunk=int(prefill_chunk or EngineInfo.prefill_chunk),
        memory_bytes=module_bytes(base) + (module_bytes(head) if head is not None else 0),
        head=head_path if head is not None else "",
        # without a head there is nothing to speculate with; "auto": the engine measures both while decoding
        speculate_by_default=(speculate_by_default if speculate_by_default == "auto" else bool(speculate_by_default))
        if head is not None else False,
    )
    return LocalEngine(
        base, tokenizer, head, info=info, stop_ids=stop_token_ids(tokenizer, base, list(stop_tokens)),
        template=template, default_system=system,
    )


def model_sampling(model: str, base_dir: Path, manifest) -> tuple[dict, str]:
    """The model's own sampling defaults (models/sampling.py, for_model); the embedded default model's
    come from its catalog manifest, which resolve_model does not hand back."""
    from eaglechat.models import default_model
    from eaglechat.models import sampling as sampling_defaults

    if manifest is None and model == default_model.DEFAULT_ALIAS:
        from eaglechat.models import catalog

        try:
            manifest = catalog.resolve(model)
        except EaglechatError:  # a catalog path without it (tests): the folder's own file, if any
            manifest = None
    return sampling_defaults.for_model(base_dir, manifest)


def check_tree(budget: TreeBudget) -> TreeBudget:
    """A dynamic tree keeps at most the draft's candidate pool: say so, instead of quietly verifying a
    smaller tree than asked (and reporting the larger number)."""
    if budget.kind != "static" and budget.total_tokens > budget.pool_size:
        raise UsageError(
            f"a tree of {budget.total_tokens} tokens is more than a depth-{budget.depth}, top-{budget.top_k} draft can "
            f"offer ({budget.pool_size} candidates = top_k + (depth-1) * top_k^2); ask for --total-tokens "
            f"{budget.pool_size} or less, or raise --depth or --draft-top-k"
        )
    return budget


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
    compile: str = "off",  # how decode steps run: "auto", "graphs", "inductor" ("on"), "off" (engine/compile.py)
):
    """Everything `eaglechat run` and the chat need: resolved, loaded, checked.

    device: None or "auto" picks CUDA, then MPS, then the CPU (hardware.probe). The tree budget is
    `tree` when given, else the machine profile's (tuned > user > shipped) for this model and
    quantization, with `tree_overrides` (the CLI's --total-tokens/--depth/--draft-top-k) on top.
    dtype: given, else the profile's compute dtype (float32 on the CPU, 16-bit on a GPU).
    Planner and profile errors surface: an EaglechatError is one line, anything else a bug to see."""
    from eaglechat.fit import profiles
    from eaglechat.fit.memory import PREFILL_CHUNK
    from eaglechat.fit.planner import Planner

    check_quant(quant, allow_auto=True)
    report = progress or (lambda phase, fraction=None: None)
    report("resolving model", 0.0)
    base_dir, head_dir, manifest = resolve_model(model, head, report)
    import torch

    from eaglechat.engine.heads import load_head

    machine = hardware.probe(device)
    name = getattr(manifest, "name", None) or (base_dir.name if Path(model).expanduser().is_dir() else model)
    shape, why_not = model_shape(base_dir)
    if quant == AUTO:  # the memory planner's choice for this device (refuses when nothing fits)
        if shape is None:
            raise UsageError(f"--quant auto cannot plan {name}: {why_not}; pass --quant none, 8bit or 4bit")
        head_kind, draft_vocab = planned_head(manifest, head_dir if head else None)
        plan = Planner(machine).plan(shape, model=name, checkpoint_dtype=getattr(manifest, "dtype", None),
                                     head_kind=head_kind, draft_vocab=draft_vocab, explain=False).require()
        quant = plan.choice.quant
        max_context = max_context or plan.choice.context
    profile = profiles.resolve_profile(machine, shape, quant, model=name)
    dtype_given = dtype is not None
    if dtype is None:
        dtype = profile.resolved.get("dtype")
    torch_device = machine.torch_device
    from eaglechat.engine import compile as step_runners

    steps = step_runners.resolve(compile, torch.device(torch_device).type)  # before loading: a bad choice is said at once
    torch_dtype = int8_compute_dtype(quant, machine.kind, pick_dtype(dtype, torch_device, manifest), dtype_given)
    budget = tree or (profile.resolved.get("tree") or {}).get(quant) or TreeBudget()
    if tree_overrides:
        budget = check_tree(replace(budget, **tree_overrides))
    elif tree is not None:
        check_tree(tree)
    if "total_tokens" not in (tree_overrides or {}):  # a tree size the user asked for is theirs
        limit = verify_row_limit(machine.kind, quant, shape, device_index=machine.index, dtype=torch_dtype)
        budget, note = clamp_tree(budget, limit)
        if note:
            report(note, 0.1)
    if shape is not None:
        check_fits_machine(shape, quant, torch_dtype, machine, name)
    report(f"loading {base_dir.name} ({torch_device}, {str(torch_dtype).removeprefix('torch.')}, quant {quant})", 0.1)
    base, tokenizer = load_base(base_dir, device=torch_device, dtype=torch_dtype, quant=quant)
    draft_head = None
    if speculate and head_dir is not None:
        report(f"loading draft head {head_dir.name}", 0.8)
        if not head_dir.exists():
            raise WeightsError(f"draft head folder {head_dir} does not exist")
        draft_head = load_head(head_dir, base, base_name=getattr(manifest, "name", None) or base_dir.name)
        wanted = getattr(manifest, "head_kind", None)  # load_head tells EAGLE-3 from EAGLE-1/2 by the keys
        if wanted and head is None and wanted != draft_head.kind:
            raise WeightsError(f"{manifest.name}: the catalog says an {wanted} head, but {head_dir.name} holds an {draft_head.kind} head")
        from eaglechat import paths
        from eaglechat.engine.local import stop_token_ids
        from eaglechat.models import draft_vocab

        note = draft_vocab.apply(draft_head, profile.draft_vocab, head_dir=head_dir, tokenizer=tokenizer,
                                 stop_ids=stop_token_ids(tokenizer, base, list(getattr(manifest, "stop_tokens", None) or [])),
                                 cache_dir=paths.cache_dir() / "draft-vocab")
        if note:
            report(note, 0.85)
    engine = assemble_engine(
        base, tokenizer, draft_head,
        model=getattr(manifest, "name", None) or model,
        device=torch_device,
        dtype=torch_dtype,
        tree=budget,
        quant=quant,
        max_context=max_context,
        prefill_chunk=int(profile.memory.get("prefill_chunk", PREFILL_CHUNK)),
        head_path=str(head_dir) if draft_head is not None else "",
        speculate_by_default=profile.speculate_for(quant),
        stop_tokens=list(getattr(manifest, "stop_tokens", None) or []),
        template=getattr(manifest, "template", None) or "tokenizer",
        system=getattr(manifest, "system", None),
    )
    engine.info.sampling, engine.info.sampling_source = model_sampling(model, base_dir, manifest)
    # what `tune` measured of plain vs EAGLE decoding (None: not tuned); `run --verbose` mentions it. It does
    # not set the mode: under speculate="auto" the engine measures again while decoding
    engine.info.tuned_speculate = profile.tuned_speculate(quant) if tree is None else None
    if tree is None and quant in profile.tuned:  # the tree came from `tune`
        engine.info.tuned_under_load = profiles.load_note(profile.tuned[quant].get("load"))
    if steps != "eager":
        from eaglechat import paths

        step_runners.prepare_steps(engine, steps, paths.cache_dir() / "torch-compile", lambda text: report(text, None))
    report("ready", 1.0)
    return engine
