"""Hardware profiles: which quantization, context and draft tree to use on a device class.

Three layers, later ones win:
  1. shipped   eaglechat/fit/profiles/*.yaml (cpu, mps, gpu-6gb ... gpu-80gb)
  2. user      paths.user_profiles_dir()/*.yaml; a file whose `name` matches a shipped profile is deep-
               merged onto it (so a two-line file can change one tree); a new name adds a profile
  3. tuned     paths.tuned_profiles_dir()/*.json written by `eaglechat tune`, per (device, model, quant):
               replaces that quantization's tree; what tune measured of plain vs EAGLE decoding is kept
               for `plan`/`show`, but does not switch speculation off: with `speculate: auto` (every
               shipped profile) the engine measures both while decoding, as the load changes

Loading reads files; matching and resolution are pure functions of (profiles, DeviceInfo, ModelShape).
`resolve_profile(device, shape, quant, model=...)` is what `plan`, `show --profile` and the engine call.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from eaglechat.engine.protocol import Speculate, TreeBudget
from eaglechat.errors import EaglechatError, UsageError
from eaglechat.fit.hardware import canon_dtype
from eaglechat.fit.profiles.schema import SchemaError, check_raw, check_tree_values
from eaglechat.fit.quantization import QUANTS
from eaglechat.units import GiB
from eaglechat.userfiles import UnreadableFile, read_json, read_yaml, write_json_keeping

SHIPPED_DIR = Path(__file__).resolve().parent
SOURCE_RANK = {"shipped": 0, "user": 1, "tuned": 2}


class ProfileError(EaglechatError):
    """A profile file that cannot be read or does not make sense."""


@dataclass
class Profile:
    name: str
    match: dict
    description: str = ""
    reserve_gib: float = 0.5
    dtype: str = "auto"
    double_quant: bool = True
    models: list[dict] = field(default_factory=lambda: [{"quant": list(QUANTS), "max_context": 4096}])
    tree: dict[str, dict] = field(default_factory=dict)
    tree_by_capability: list[dict] = field(default_factory=list)
    large_vocab: dict = field(default_factory=dict)
    speculate: bool | str = "auto"  # true/false pin the mode; auto: the engine measures it while decoding
    memory: dict = field(default_factory=dict)
    calibrate: dict = field(default_factory=dict)
    draft_vocab: int | str = "auto"  # draft-time vocabulary of full-vocabulary heads (eaglechat/models/draft_vocab.py)
    priority: int = 0
    source: str = "shipped"  # highest layer that contributed: shipped | user | tuned
    files: list[str] = field(default_factory=list)
    tuned: dict[str, dict] = field(default_factory=dict)  # quant -> tuned record applied
    resolved: dict = field(default_factory=dict)  # filled by resolve_profile when a shape is known

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, raw: dict, *, source: str = "shipped", files: list[str] | None = None) -> "Profile":
        if not isinstance(raw, dict):
            raise ProfileError(f"profile {files}: expected a mapping")
        known = set(cls.__dataclass_fields__) - {"source", "files", "tuned", "resolved"}
        unknown = set(raw) - known
        if unknown:
            raise ProfileError(f"profile {raw.get('name', files)}: unknown keys {sorted(unknown)}")
        if "name" not in raw or "match" not in raw:
            raise ProfileError(f"profile {files}: needs at least `name` and `match`")
        prof = cls(**copy.deepcopy(raw), source=source, files=list(files or []))
        prof.validate()
        return prof

    def validate(self) -> None:
        where = f"profile {self.name}"
        if self.match.get("device") not in ("cuda", "mps", "cpu"):
            raise ProfileError(f"{where}: match.device must be cuda, mps or cpu")
        for quant, tree in self.tree.items():
            if quant not in QUANTS:
                raise ProfileError(f"{where}: tree key {quant!r} is not one of {QUANTS}")
            check_tree(tree, where=f"{where} tree.{quant}")
        for row in self.models:
            bad = [q for q in row.get("quant", []) if q not in QUANTS]
            if bad or not row.get("quant"):
                raise ProfileError(f"{where}: models rows need quant from {QUANTS}, got {row.get('quant')}")

    # ------------------------------------------------------------------ per model
    def bucket(self, shape=None) -> dict:
        """The models row for a base model of this size (first row whose max_params_b covers it)."""
        size_b = shape.params / 1e9 if shape is not None else 0.0
        for row in self.models:
            if row.get("max_params_b") is None or size_b <= float(row["max_params_b"]):
                return row
        return self.models[-1]

    def quant_order(self, shape=None) -> list[str]:
        return list(self.bucket(shape).get("quant", QUANTS))

    def max_context(self, shape=None) -> int:
        ctx = int(self.bucket(shape).get("max_context", 4096))
        return min(ctx, shape.max_context) if shape is not None else ctx

    def tree_for(self, quant: str = "none", shape=None, device=None, notes: list[str] | None = None) -> TreeBudget:
        """Tree budget for this quantization: tuned > capability override > base table, then one
        less depth for large-vocabulary models (the 1 GiB lm_head per draft step: Llama-3's 128k vocabulary x 4096 x fp16).
        A tree the shallower draft can no longer fill is cut to its candidate pool, and `notes` gets a line saying so."""
        if quant in self.tuned:
            return TreeBudget.from_dict(self.tuned[quant]["tree"])
        base = (self.tree.get(quant) or self.tree.get("none") or TreeBudget().to_dict())
        cc = getattr(device, "compute_capability", None)
        if cc:
            for row in sorted(self.tree_by_capability, key=lambda r: float(r.get("min_cc", 0))):
                if tuple(cc) >= _cc_tuple(row.get("min_cc", 0)) and quant in row.get("tree", {}):
                    base = row["tree"][quant]
        tree = TreeBudget.from_dict(base)
        if shape is not None and self.large_vocab and shape.vocab_size >= int(self.large_vocab.get("min_vocab", 1 << 30)):
            tree = replace(tree, depth=max(2, tree.depth + int(self.large_vocab.get("depth_delta", 0))))
        if tree.total_tokens > tree.pool_size:
            if notes is not None:
                notes.append(f"profile {self.name}: tree {tree.total_tokens} -> {tree.pool_size} drafted tokens, all a "
                             f"depth-{tree.depth} draft offers (one level less for a large vocabulary)")
            tree = replace(tree, total_tokens=tree.pool_size)
        return tree

    def speculate_for(self, quant: str = "none") -> Speculate:
        """ON/OFF where a profile pins it (`speculate: false` in a user profile); else AUTO: the
        engine runs plain and EAGLE steps interleaved and keeps the faster (engine/autospec.py). A tuned
        record does not pin it: tune measured once, the engine measures again as the load changes."""
        return Speculate.of(self.speculate) if isinstance(self.speculate, bool) else Speculate.AUTO

    def tuned_speculate(self, quant: str = "none") -> bool | None:
        """What `eaglechat tune` measured for this quantization (True: EAGLE faster), None if not tuned."""
        record = self.tuned.get(quant) or {}
        return bool(record["speculate"]) if "speculate" in record else None

    def compute_dtype(self, device=None, checkpoint_dtype: str | None = None) -> str:
        """`dtype: auto` -> bfloat16 on CUDA cc >= 8.0 for bf16 checkpoints, else float16; CPU ->
        float32, the one format in which greedy EAGLE is token for token (bf16 on an AVX512-BF16 CPU
        flipped 14 of 20 default-model replies, scripts/quant_exactness.py): `dtype: bfloat16` in a user
        profile or `--dtype bfloat16` trades that for speed; MPS -> float16."""
        if self.dtype != "auto":
            return canon_dtype(self.dtype)
        kind = getattr(device, "kind", self.match.get("device", "cuda"))
        if kind == "cpu":
            return "float32"
        if kind == "mps":
            return "float16"
        ckpt = _checkpoint_dtype(checkpoint_dtype)
        return "bfloat16" if ckpt == "bfloat16" and getattr(device, "bf16", False) else "float16"

    def to_dict(self) -> dict:
        out = {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "files": self.files,
            "match": self.match,
            "priority": self.priority,
            "reserve_gib": self.reserve_gib,
            "dtype": self.dtype,
            "double_quant": self.double_quant,
            "models": self.models,
            "tree": self.tree,
            "tree_by_capability": self.tree_by_capability,
            "large_vocab": self.large_vocab,
            "speculate": self.speculate,
            "memory": self.memory,
            "calibrate": self.calibrate,
            "draft_vocab": self.draft_vocab,
            "tuned": self.tuned,
        }
        if self.resolved:
            trees = {q: t.to_dict() for q, t in (self.resolved.get("tree") or {}).items()}
            out["resolved"] = {**self.resolved, **({"tree": trees} if "tree" in self.resolved else {})}
        return copy.deepcopy(out)


def _cc_tuple(value) -> tuple[int, int]:
    major, _, minor = str(value).partition(".")
    return int(major or 0), int(minor or 0)


def _checkpoint_dtype(name: str | None) -> str:
    """A checkpoint's stored dtype ("auto", absent or exotic: float16, the GPU default)."""
    try:
        return canon_dtype(name) if name else "float16"
    except UsageError:
        return "float16"


def check_tree(tree: dict, *, where: str = "tree") -> None:
    """Integer total_tokens, depth, top_k in range; total_tokens <= the draft candidate pool
    top_k + (depth - 1) * top_k**2."""
    try:
        check_tree_values(tree, "tree")
    except SchemaError as exc:
        raise ProfileError(f"{where}: {exc}") from None


# ================================================================================ loading


def deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def read_dir(directory: Path) -> list[tuple[Path, dict]]:
    if directory is None or not Path(directory).is_dir():
        return []
    found = []
    for path in sorted(Path(directory).glob("*.y*ml")):
        try:
            raw = read_yaml(path)
        except UnreadableFile as exc:
            raise ProfileError(f"cannot read profile {exc}") from None
        except OSError as exc:
            raise ProfileError(f"cannot read profile {path}: {exc.strerror or exc}") from None
        if not isinstance(raw, dict) or "name" not in raw:
            raise ProfileError(f"profile {path}: expected a mapping with a `name`")
        try:  # each file on its own, so the error names the file that says it
            check_raw(raw)
        except SchemaError as exc:
            raise ProfileError(f"profile {path}: {exc}") from None
        found.append((path, respelled(raw)))
    return found


def respelled(raw: dict) -> dict:
    """A profile file's trees with `top_k` (draft_top_k's earlier name) spelled draft_top_k, so that a user
    file written before the rename merges onto the shipped trees key by key."""
    def trees(by_quant):
        return {q: {("draft_top_k" if k == "top_k" else k): v for k, v in tree.items()} for q, tree in by_quant.items()}

    out = dict(raw)
    if isinstance(out.get("tree"), dict):
        out["tree"] = trees(out["tree"])
    if isinstance(out.get("tree_by_capability"), list):
        out["tree_by_capability"] = [{**row, "tree": trees(row["tree"])} if isinstance(row.get("tree"), dict) else row
                                     for row in out["tree_by_capability"]]
    return out


def load_profiles(user_dir: Path | None | bool = None, shipped_dir: Path | None = None) -> list[Profile]:
    """Shipped profiles with the user's files merged over them. user_dir None -> the standard
    location (paths.user_profiles_dir()); False -> shipped only."""
    if user_dir is None:
        from eaglechat import paths

        user_dir = paths.user_profiles_dir()
    raws: dict[str, tuple[dict, str, list[str]]] = {}
    for path, raw in read_dir(shipped_dir or SHIPPED_DIR):
        raws[raw["name"]] = (raw, "shipped", [str(path)])
    for path, raw in read_dir(user_dir) if user_dir else []:
        name = raw["name"]
        if name in raws:
            base, _, files = raws[name]
            raws[name] = (deep_merge(base, raw), "user", [*files, str(path)])
        else:
            raws[name] = (raw, "user", [str(path)])
    return [Profile.from_dict(raw, source=src, files=files) for raw, src, files in raws.values()]


# ================================================================================ matching (pure)


def matches(profile: Profile, device) -> bool:
    rule = profile.match
    if rule.get("device") != device.kind:
        return False
    gib = device.total_bytes / GiB
    if "min_total_gib" in rule and gib < float(rule["min_total_gib"]):
        return False
    if "max_total_gib" in rule and gib >= float(rule["max_total_gib"]):
        return False
    if "name" in rule and not re.search(str(rule["name"]), device.name, re.IGNORECASE):
        return False
    return True


def match_profile(device, profiles: list[Profile]) -> Profile:
    """The profile for this device: among those whose rule matches, highest `priority`, then a
    user profile over a shipped one, then the narrowest memory range (a name rule counts as narrowest)."""
    candidates = [p for p in profiles if matches(p, device)]
    if not candidates:
        raise ProfileError(f"no profile matches {device.kind} device {device.name!r} ({device.total_bytes / GiB:.1f} GiB)")

    def width(p: Profile) -> float:
        if "name" in p.match:
            return -1.0
        lo, hi = float(p.match.get("min_total_gib", 0.0)), float(p.match.get("max_total_gib", 1e9))
        return hi - lo

    return sorted(candidates, key=lambda p: (-int(p.priority), -SOURCE_RANK.get(p.source, 0), width(p)))[0]


# ================================================================================ tuned results


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "x"


def tuned_key(device, model: str, quant: str) -> str:
    return f"{device.key}__{_slug(model)}__{quant}"


def tuned_path(device, model: str, quant: str, directory: Path | None = None) -> Path:
    if directory is None:
        from eaglechat import paths

        directory = paths.tuned_profiles_dir()
    return Path(directory) / f"{tuned_key(device, model, quant)}.json"


def _read_tuned(path: Path) -> dict:
    """A tuned record; ProfileError (one line, where it breaks) when it cannot be used."""
    try:
        record = read_json(path)
    except UnreadableFile as exc:
        raise ProfileError(str(exc)) from None
    if not isinstance(record, dict) or "tree" not in record:
        raise ProfileError(f"{path}: expected a tuned record (a mapping with a tree)")
    check_tree(record["tree"], where=str(path))
    return record


def load_tuned(device, model: str, quant: str, directory: Path | None = None) -> dict | None:
    path = tuned_path(device, model, quant, directory)
    if not path.is_file():
        return None
    try:
        record = _read_tuned(path)
    except (OSError, ProfileError):
        return None  # a broken record is ignored (the next tune sets it aside), never fatal
    record["file"] = str(path)
    return record


def _tell_stderr(line: str) -> None:
    import sys

    print(f"eaglechat: {line}", file=sys.stderr)


def save_tuned(device, model: str, quant: str, record: dict[str, Any], directory: Path | None = None,
               *, notice=_tell_stderr) -> Path:
    """Write the record; one that is there and cannot be read (edited by hand, half written) is renamed
    aside first, never written over, and `notice` is told where it went."""
    check_tree(record["tree"], where="tuned result")
    body = {"device": device.name, "device_key": device.key, "model": model, "quant": quant, **record}
    return write_json_keeping(tuned_path(device, model, quant, directory), body, _read_tuned, ProfileError, notice)


def load_note(load: dict | None) -> str:
    """'load 3.1 on 2 cores' for a measurement taken on a busy machine, else ''."""
    if not load or not load.get("busy"):
        return ""
    return f"load {load['load1']:g} on {load['cores']} cores"



# ================================================================================ resolution


def resolve_profile(
    device_info,
    shape=None,
    quant: str | None = None,
    *,
    model: str | None = None,
    checkpoint_dtype: str | None = None,
    profiles: list[Profile] | None = None,
    user_dir: Path | None | bool = None,
    tuned_dir: Path | None = None,
) -> Profile:
    """The effective profile for a device (and optionally a model): shipped < user < tuned.
    With a shape, `.resolved` holds what applies to that model (quant order, max context, dtype,
    tree per quantization); `.to_dict()` prints it all (`eaglechat show NAME --profile`)."""
    profs = profiles if profiles is not None else load_profiles(user_dir)
    prof = copy.deepcopy(match_profile(device_info, profs))
    if model:
        for q in QUANTS:
            record = load_tuned(device_info, model, q, tuned_dir)
            if record is not None:
                prof.tuned[q] = record
                prof.source = "tuned"
                prof.files.append(record["file"])
    quants = [quant] if quant and quant != "auto" else (prof.quant_order(shape) if shape is not None else list(QUANTS))
    notes = {q: [] for q in quants}
    prof.resolved = {
        "device": device_info.name,
        "quant_order": prof.quant_order(shape),
        "max_context": prof.max_context(shape),
        "dtype": prof.compute_dtype(device_info, checkpoint_dtype),
        "tree": {q: prof.tree_for(q, shape, device_info, notes[q]) for q in quants},  # TreeBudgets
        "tree_notes": {q: notes[q] for q in quants if notes[q]},  # a profile tree cut to fit its draft
        "speculate": {q: prof.speculate_for(q).wire for q in quants},
    }
    if model:
        prof.resolved["model"] = model
    return prof
