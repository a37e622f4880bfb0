"""The composition root: a model name -> files -> device, profile and plan -> base model (transformers,
optional bitsandbytes) + tokenizer -> draft head -> LocalEngine.

A name is a catalog alias (pulled into the Hugging Face cache), the embedded default, or a local
Hugging Face folder (then `head` points at an EAGLE head folder; without one, plain decoding only).
Remote code is never enabled; pickled weights are never loaded (safetensors, or weights_only=True).
The engine package knows none of this: everything above it is wired together here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from eaglechat import lean_transformers, quiet, startup_gc
from eaglechat.engine.protocol import EngineInfo, Speculate, TreeBudget
from eaglechat.errors import EaglechatError, ModelNotFound, OutOfMemory, WeightsError
from eaglechat.fit import hardware
from eaglechat.fit.choose import LoadPlan, LoadRequest, ModelFacts, choose
from eaglechat.fit.quantization import quantization_config

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
    with lean_transformers.kept_out():  # transformers' imports without torch._dynamo (lean_transformers.py)
        return _load_base(base_dir, device=device, dtype=dtype, quant=quant)


def _load_base(base_dir: Path, *, device: str, dtype: torch.dtype, quant: str):
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
    with lean_transformers.kept_out():  # transformers' imports without torch._dynamo (lean_transformers.py)
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
    speculate_by_default: Speculate = Speculate.ON,
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
        # without a head there is nothing to speculate with; AUTO: the engine measures both while decoding
        speculate_by_default=Speculate.of(speculate_by_default) if head is not None else Speculate.OFF,
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


@dataclass(frozen=True)
class ResolvedModel:
    """A model name made into files on disk and what is known of it before loading (ModelFacts)."""

    name: str  # the engine's name for it: the catalog alias, else what the user typed
    base_dir: Path
    head_dir: Path | None
    facts: ModelFacts
    head_given: bool  # --head named the head folder (not the catalog)
    in_catalog: bool = False
    catalog_head_kind: str | None = None  # the head kind the catalog entry promises
    stop_tokens: tuple[str, ...] = ()
    template: str = "tokenizer"
    system: str | None = None
    sampling: dict = field(default_factory=dict)  # the model's own sampling defaults (models/sampling.py)
    sampling_source: str = ""


def resolve(model: str, request: LoadRequest, report: Progress) -> ResolvedModel:
    """The files of `model` (fetched or converted where needed) and the facts the plan is made from."""
    base_dir, head_dir, manifest = resolve_model(model, request.head, report)
    if manifest is None or manifest.template == "tokenizer":
        from eaglechat.engine.templates import warm

        warm()  # the chat template's render process (engine/templates.py) starts beside the load, not after it
    shape, why_not = model_shape(base_dir)
    head_kind, draft_vocab = planned_head(manifest, head_dir if request.head else None)
    profile_name = manifest.name if manifest else (base_dir.name if Path(model).expanduser().is_dir() else model)
    facts = ModelFacts(name=profile_name, shape=shape, why_no_shape=why_not or "", head_kind=head_kind,
                       draft_vocab=draft_vocab, checkpoint_dtype=manifest.dtype if manifest else None)
    sampling, source = model_sampling(model, base_dir, manifest)
    if manifest is None:
        return ResolvedModel(model, base_dir, head_dir, facts, head_given=bool(request.head), sampling=sampling,
                             sampling_source=source)
    return ResolvedModel(manifest.name, base_dir, head_dir, facts, head_given=bool(request.head), in_catalog=True,
                         catalog_head_kind=manifest.head_kind, stop_tokens=tuple(manifest.stop_tokens),
                         template=manifest.template, system=manifest.system, sampling=sampling, sampling_source=source)


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
    return (manifest.head_kind, manifest.draft_vocab) if manifest is not None else (None, None)


def load_parts(found: ResolvedModel, plan: LoadPlan, request: LoadRequest, report: Progress):
    """(base, tokenizer, draft head or None) as the plan says; the head only when speculation may use it."""
    report(f"loading {found.base_dir.name} ({plan.describe()})", 0.1)
    base, tokenizer = load_base(found.base_dir, device=plan.device, dtype=hardware.torch_dtype(plan.dtype), quant=plan.quant)
    if not request.speculate or found.head_dir is None:
        return base, tokenizer, None
    report(f"loading draft head {found.head_dir.name}", 0.8)
    if not found.head_dir.exists():
        raise WeightsError(f"draft head folder {found.head_dir} does not exist")
    from eaglechat.engine.heads import load_head

    head = load_head(found.head_dir, base, base_name=found.name if found.in_catalog else found.base_dir.name)
    wanted = found.catalog_head_kind  # load_head tells EAGLE-3 from EAGLE-1/2 by the keys
    if wanted and not found.head_given and wanted != head.kind:
        raise WeightsError(f"{found.name}: the catalog says an {wanted} head, but {found.head_dir.name} holds an {head.kind} head")
    from eaglechat import paths
    from eaglechat.engine.local import stop_token_ids
    from eaglechat.models import draft_vocab

    note = draft_vocab.apply(head, plan.draft_vocab, head_dir=found.head_dir, tokenizer=tokenizer,
                             stop_ids=stop_token_ids(tokenizer, base, list(found.stop_tokens)),
                             cache_dir=paths.cache_dir() / "draft-vocab")
    if note:
        report(note, 0.85)
    return base, tokenizer, head


def assemble(found: ResolvedModel, plan: LoadPlan, base, tokenizer, head):
    """The LocalEngine of the loaded parts, with what the plan knows of tune's measurements."""
    engine = assemble_engine(
        base, tokenizer, head, model=found.name, device=plan.device, dtype=hardware.torch_dtype(plan.dtype),
        tree=plan.tree, quant=plan.quant, max_context=plan.context, prefill_chunk=plan.prefill_chunk,
        head_path=str(found.head_dir) if head is not None else "", speculate_by_default=plan.speculate,
        stop_tokens=list(found.stop_tokens), template=found.template, system=found.system,
    )
    engine.info.sampling, engine.info.sampling_source = found.sampling, found.sampling_source
    # what `tune` measured of plain vs EAGLE decoding (None: not tuned); `run --verbose` mentions it. It does
    # not set the mode: under speculate="auto" the engine measures again while decoding
    engine.info.tuned_speculate = plan.tuned_speculate
    engine.info.tuned_under_load = plan.tuned_under_load
    engine.decoder.chooser.seed(plan.speculation)  # speculate="auto" starts from what this machine measured
    return engine


def prepare_steps(engine, steps: str, report: Progress) -> None:
    """CUDA graphs or torch.compile for the decode steps, as --compile resolved (engine/compile.py)."""
    if steps != "eager":
        from eaglechat import paths
        from eaglechat.engine import compile as step_runners

        step_runners.prepare_steps(engine, steps, paths.cache_dir() / "torch-compile", lambda text: report(text, None))


def eager_for_nf4_experts(engine, steps: str, report: Progress) -> str:
    """4-bit MoE experts pick their experts on the host (fit/nf4_experts.py): no graph or compile captures
    such a step, so it runs eagerly, said once instead of a failed capture."""
    from eaglechat.fit.nf4_experts import quantized_experts

    if steps == "eager" or not quantized_experts(engine.model):
        return steps
    report("4-bit MoE experts are chosen on the host: decode steps run eagerly (no CUDA graph or compile)", None)
    return "eager"


def load_engine(model: str, request: LoadRequest | None = None, *, progress: Progress | None = None, **asked):
    """Everything `eaglechat run`, `serve` and the chat need: resolved, planned, loaded, checked.

    `request`: what the user asked (commands/common.load_request builds it from the flags); `asked`:
    LoadRequest's fields by name, for a caller that sets a few. What is not asked, this machine's
    profile and memory planner choose (fit/choose.py)."""
    request = replace(request or LoadRequest(), **asked)
    report = progress or (lambda phase, fraction=None: None)
    report("resolving model", 0.0)
    found = resolve(model, request, report)  # an unknown name is refused here, before torch is imported
    from eaglechat.engine import compile as step_runners
    plan = choose(request, found.facts, hardware.probe(request.device))
    steps = step_runners.resolve(request.compile, plan.device_kind)  # before loading: a bad choice is said at once
    for note in plan.notes:
        report(note, 0.1)
    engine = assemble(found, plan, *load_parts(found, plan, request, report))
    prepare_steps(engine, eager_for_nf4_experts(engine, steps, report), report)
    startup_gc.settled()  # the loaded state is long-lived: later collections skip it (startup_gc.py)
    report("ready", 1.0)
    return engine
