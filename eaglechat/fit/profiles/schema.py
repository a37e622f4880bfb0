"""What a profile file may say: every key's type and range, checked per file before any merge, so an
error names the file and the key (`profile ~/.config/eaglechat/fit/profiles/x.yaml: priority must be an
integer, got 'high'`). A user file may hold only the keys it changes: absent keys are not checked
here; `Profile.validate` checks the merged result.

YAML itself reads `yes`/`no`/`on`/`off` unquoted as booleans; a quoted "no" is a string and is refused
(it must never read as true).
"""

from __future__ import annotations

import re

from eaglechat.engine.protocol import TreeBudget
from eaglechat.fit.hardware import DTYPE_ALIASES
from eaglechat.fit.hardware import DTYPES as DTYPE_NAMES
from eaglechat.fit.quantization import QUANTS
from eaglechat.validate import SchemaError
from eaglechat.validate import boolean as _boolean
from eaglechat.validate import integer as _integer
from eaglechat.validate import listing as _list
from eaglechat.validate import mapping as _mapping
from eaglechat.validate import number as _number
from eaglechat.validate import show as _show
from eaglechat.validate import text as _text

DTYPES = ("auto", *DTYPE_NAMES, *DTYPE_ALIASES)
DEVICES = ("cuda", "mps", "cpu")
MAX_CONTEXT = 1 << 22  # 4M tokens: far beyond any model, small enough to catch a typo
# a tree's keys: TreeBudget's; top_k is draft_top_k's name in files written before the rename
TREE_KEYS = (*TreeBudget.LIMITS, "kind", "top_k")


def check_tree_values(tree, key: str) -> None:
    """Integers in TreeBudget's limits and a tree its draft can offer (TreeBudget.problem)."""
    _mapping(tree, key, TREE_KEYS)
    if "top_k" in tree and "draft_top_k" in tree:
        raise SchemaError(f"{key}: give draft_top_k once (top_k is its earlier name)")
    spelled = {name: ("top_k" if name == "draft_top_k" and "top_k" in tree else name) for name in TreeBudget.LIMITS}
    missing = [name for name, field in spelled.items() if field not in tree]
    if missing:
        raise SchemaError(f"{key} needs total_tokens, depth and draft_top_k (missing {', '.join(missing)})")
    for name, high in TreeBudget.LIMITS.items():
        _integer(tree[spelled[name]], f"{key}.{spelled[name]}", 1, high)
    problem = TreeBudget.from_dict(tree).problem()
    if problem:
        raise SchemaError(f"{key}: {problem}")


def _quant_list(value, key: str) -> None:
    quants = _list(value, key)
    bad = [q for q in quants if q not in QUANTS]
    if bad or not quants:
        raise SchemaError(f"{key} must be a non-empty list from {', '.join(QUANTS)}, got {_show(value)}")


def _match(value, key: str) -> None:
    rule = _mapping(value, key, ("device", "min_total_gib", "max_total_gib", "name"))
    if "device" in rule and rule["device"] not in DEVICES:
        raise SchemaError(f"{key}.device must be one of {', '.join(DEVICES)}, got {_show(rule['device'])}")
    for bound in ("min_total_gib", "max_total_gib"):
        if bound in rule:
            _number(rule[bound], f"{key}.{bound}", 0)
    if "name" in rule:
        try:
            re.compile(_text(rule["name"], f"{key}.name"))
        except re.error as exc:
            raise SchemaError(f"{key}.name is not a valid regular expression ({exc})") from None


def _models(value, key: str) -> None:
    rows = _list(value, key)
    if not rows:
        raise SchemaError(f"{key} must list at least one row")
    for i, row in enumerate(rows):
        where = f"{key}[{i}]"
        _mapping(row, where, ("max_params_b", "quant", "max_context"))
        if row.get("max_params_b") is not None:
            _number(row["max_params_b"], f"{where}.max_params_b", 0, above=True)
        if "quant" in row:
            _quant_list(row["quant"], f"{where}.quant")
        if "max_context" in row:
            _integer(row["max_context"], f"{where}.max_context", 1, MAX_CONTEXT)


def _trees(value, key: str) -> None:
    for quant, tree in _mapping(value, key).items():
        if quant not in QUANTS:
            raise SchemaError(f"{key} key {_show(quant)} is not one of {', '.join(QUANTS)}")
        check_tree_values(tree, f"{key}.{quant}")


def _by_capability(value, key: str) -> None:
    for i, row in enumerate(_list(value, key)):
        where = f"{key}[{i}]"
        _mapping(row, where, ("min_cc", "tree"))
        cc = row.get("min_cc", 0)
        if isinstance(cc, bool) or not re.fullmatch(r"\d+(\.\d+)?", str(cc)):
            raise SchemaError(f"{where}.min_cc must be a compute capability like 8.0, got {_show(cc)}")
        _trees(row.get("tree", {}), f"{where}.tree")


def _large_vocab(value, key: str) -> None:
    rule = _mapping(value, key, ("min_vocab", "depth_delta"))
    if "min_vocab" in rule:
        _integer(rule["min_vocab"], f"{key}.min_vocab", 1)
    if "depth_delta" in rule:
        _integer(rule["depth_delta"], f"{key}.depth_delta", -TreeBudget.LIMITS["depth"], TreeBudget.LIMITS["depth"])


def _memory(value, key: str) -> None:
    rule = _mapping(value, key, ("share_eagle_embedding", "prefill_chunk"))
    if "share_eagle_embedding" in rule:
        _boolean(rule["share_eagle_embedding"], f"{key}.share_eagle_embedding")
    if "prefill_chunk" in rule:
        _integer(rule["prefill_chunk"], f"{key}.prefill_chunk", 1, MAX_CONTEXT)


def _calibrate(value, key: str) -> None:
    rule = _mapping(value, key, ("n_grid", "depth_grid", "top_k_grid", "repeats", "min_gain"))
    for grid, hi in (("n_grid", TreeBudget.LIMITS["total_tokens"]), ("depth_grid", TreeBudget.LIMITS["depth"]),
                     ("top_k_grid", TreeBudget.LIMITS["draft_top_k"])):
        if grid in rule:
            values = _list(rule[grid], f"{key}.{grid}")
            if not values:
                raise SchemaError(f"{key}.{grid} must not be empty")
            for i, v in enumerate(values):
                _integer(v, f"{key}.{grid}[{i}]", 1, hi)
    if "repeats" in rule:
        _integer(rule["repeats"], f"{key}.repeats", 1, 1000)
    if "min_gain" in rule:
        _number(rule["min_gain"], f"{key}.min_gain", 0, above=True)


def _name(value, key: str) -> None:
    if not _text(value, key).strip():
        raise SchemaError(f"{key} must not be empty")


def _dtype(value, key: str) -> None:
    if value not in DTYPES:
        raise SchemaError(f"{key} must be one of auto, float16, bfloat16, float32, got {_show(value)}")


def _speculate(value, key: str) -> None:
    if value != "auto" and not isinstance(value, bool):
        raise SchemaError(f"{key} must be true, false or auto, got {_show(value)}")


def _draft_vocab(value, key: str) -> None:
    if value != "auto":
        _integer(value, key, 0, 1 << 24)


CHECKS = {
    "name": _name,
    "description": _text,
    "match": _match,
    "priority": lambda v, k: _integer(v, k, -1000, 1000),
    "reserve_gib": lambda v, k: _number(v, k, 0, 4096),
    "dtype": _dtype,
    "double_quant": _boolean,
    "models": _models,
    "tree": _trees,
    "tree_by_capability": _by_capability,
    "large_vocab": _large_vocab,
    "speculate": _speculate,
    "memory": _memory,
    "calibrate": _calibrate,
    "draft_vocab": _draft_vocab,
}


def check_raw(raw) -> None:
    """Every key of one profile file (a mapping) has a value of the right type and range."""
    if not isinstance(raw, dict):
        raise SchemaError(f"must be a mapping of profile keys, got {_show(raw)}")
    unknown = sorted(str(k) for k in raw if k not in CHECKS)
    if unknown:
        raise SchemaError(f"unknown keys {unknown}")
    for key, value in raw.items():
        CHECKS[key](value, key)
