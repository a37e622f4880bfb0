"""A base and head pair that is not in the catalog, as a Manifest built from what is known without a download.

Spellings: the free form `base=ORG/REPO[@REV],head=ORG/REPO[@REV]` (`draft=` is a synonym of `head=`;
`kind=eagle3` marks an EAGLE-3 head; without it the kind is read from the head's config.json once it is
in the Hugging Face cache) and Ollama's `hf.co/ORG/REPO[:REV]` (`pull hf.co/ORG/BASE --head hf.co/ORG/HEAD`),
which `pair` turns into the free form: the name `run`, `chat`, `plan` and `rm` know the pair by. The shape,
dtype and the head's kind and draft vocabulary come from the cached config.json files once pulled.
"""

from __future__ import annotations

from eaglechat.errors import UsageError
from eaglechat.fit.memory import ModelShape
from eaglechat.models.manifest import DTYPES, HEAD_KINDS, REPO_RE, Manifest

_HF_PREFIXES = ("https://huggingface.co/", "http://huggingface.co/", "huggingface.co/", "hf.co/")


def hub_ref(text: str, role: str) -> str:
    """`hf.co/ORG/REPO[/sub/folder][:REV]` (Ollama's spelling), a huggingface.co URL or `ORG/REPO[@REV]`
    -> `ORG/REPO[/sub/folder]@REV`."""
    ref = (text or "").strip()
    for prefix in _HF_PREFIXES:
        if ref.lower().startswith(prefix):
            ref = ref[len(prefix):]
            break
    repo, sep, rev = ref.partition("@")
    if not sep:
        repo, _, rev = ref.partition(":")
    repo, sub = split_subfolder(repo, f"{role} {text!r}")
    if not REPO_RE.match(repo):
        raise UsageError(f"{role} {text!r}: expected hf.co/ORG/REPO[/SUBFOLDER][:REVISION]")
    check_repo_id(repo, f"{role} {text!r}")
    return f"{repo}{'/' + sub if sub else ''}@{rev or 'main'}"


def split_subfolder(path: str, where: str) -> tuple[str, str]:
    """`ORG/REPO/sub/folder` -> (`ORG/REPO`, `sub/folder`); a subfolder that would leave the repo is one line."""
    from eaglechat.models.hub_checks import subfolder_problem

    parts = path.strip().rstrip("/").split("/", 2)
    if len(parts) < 3:
        return path.strip().rstrip("/"), ""
    if problem := subfolder_problem(parts[2]):
        raise UsageError(f"{where}: {problem}")
    return "/".join(parts[:2]), parts[2]


def check_repo_id(repo: str, where: str) -> None:
    """The Hub's own rules for a repo id (no `--` or `..`, no `.git` ending, 96 characters at most), as
    huggingface_hub checks them: a name it would refuse is one line here, not its HFValidationError later."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as exc:
        raise UsageError(f"{where}: not a Hub repo id ({str(exc).split(':')[0].rstrip('.')})") from None


def pair(base: str, head: str, kind: str | None = None) -> Manifest:
    """`pull hf.co/ORG/BASE --head hf.co/ORG/HEAD`: any base and head pair, as the free form."""
    text = f"base={hub_ref(base, 'base')},head={hub_ref(head, '--head')}" + (f",kind={kind}" if kind else "")
    return parse_free_form(text)


def is_hub_name(name: str) -> bool:
    """A base named as a Hub repo (hf.co/ORG/REPO or a huggingface.co URL) rather than a catalog alias."""
    return (name or "").strip().lower().startswith(_HF_PREFIXES)


_FREE_KEYS = {"base": "base", "head": "head", "draft": "head", "kind": "kind"}


def parse_free_form(text: str) -> Manifest:
    parts: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        key = _FREE_KEYS.get(key.strip().lower())
        if not sep or key is None or not value.strip():
            raise UsageError(f"cannot read {text!r}: expected base=ORG/REPO[@REV],head=ORG/REPO[@REV]")
        parts[key] = value.strip()
    if "base" not in parts or "head" not in parts:
        raise UsageError(f"cannot read {text!r}: both base=ORG/REPO[@REV] and head=ORG/REPO[@REV] are needed")
    refs = {}
    for role in ("base", "head"):
        path, _, rev = parts[role].partition("@")
        repo, sub = split_subfolder(path, f"{role}={parts[role]!r}")
        if not REPO_RE.match(repo):
            raise UsageError(f"{role}={parts[role]!r}: {repo!r} is not a Hub repo id (ORG/NAME)")
        check_repo_id(repo, f"{role}={parts[role]!r}")
        refs[role] = (repo, rev or "main", sub)
    asked = parts.get("kind", "").lower()
    if asked and asked not in HEAD_KINDS:
        raise UsageError(f"kind={asked!r}: expected one of {', '.join(HEAD_KINDS)}")
    (base_repo, base_rev, base_sub), (head_repo, head_rev, head_sub) = refs["base"], refs["head"]
    base_path = f"{base_repo}/{base_sub}" if base_sub else base_repo
    head_path = f"{head_repo}/{head_sub}" if head_sub else head_repo
    name = f"base={base_path}@{base_rev},head={head_path}@{head_rev}" + (f",kind={asked}" if asked else "")
    base_cfg, head_cfg = _cached_config(base_repo, base_rev, base_sub), _cached_config(head_repo, head_rev, head_sub)
    kind, draft_vocab = head_kind_of(head_cfg)
    kind = asked or kind
    return Manifest.for_pair(name, base=refs["base"], head=refs["head"], kind=kind, dtype=_config_dtype(base_cfg),
                             shape=_shape_of(base_cfg), draft_vocab=draft_vocab)


def head_kind_of(cfg: dict | None) -> tuple[str, int | None]:
    """(head kind, reduced draft vocabulary) from a head's config.json: EAGLE-3 configs (EAGLE's own,
    SpecForge's LlamaForCausalLMEagle3, speculators' Eagle3Speculator) carry draft_vocab_size or say so."""
    if not cfg:
        return "eagle2", None
    arch = " ".join(str(a) for a in cfg.get("architectures") or [])
    eagle3 = ("draft_vocab_size" in cfg or "eagle_config" in cfg or "Eagle3" in arch
              or str(cfg.get("speculators_model_type", "")).lower() == "eagle3")
    if not eagle3:
        return "eagle2", None
    vocab = cfg.get("draft_vocab_size")
    full = cfg.get("vocab_size") or (cfg.get("transformer_layer_config") or {}).get("vocab_size")
    reduced = int(vocab) if isinstance(vocab, int) and vocab > 0 and vocab != full else None
    return "eagle3", reduced


def _cached_config(repo: str, revision: str, subfolder: str = "") -> dict | None:
    """A repo's config.json (a multimodal one's text_config merged in) when it is already in the HF cache."""
    try:
        from huggingface_hub import try_to_load_from_cache

        from eaglechat.fit.memory import read_config_json

        name = f"{subfolder}/config.json" if subfolder else "config.json"
        found = try_to_load_from_cache(repo, name, revision=revision)
        return read_config_json(found) if isinstance(found, str) else None
    except Exception:  # an unreadable or odd config only costs the planner its numbers
        return None


def _shape_of(cfg: dict | None) -> ModelShape | None:
    """ModelShape from a base's config.json (no network); None when absent or not a shape we can read."""
    if not cfg:
        return None
    from types import SimpleNamespace

    try:
        return ModelShape.from_hf_config(SimpleNamespace(**cfg))
    except (AttributeError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def _config_dtype(cfg: dict | None) -> str:
    dtype = str((cfg or {}).get("torch_dtype") or (cfg or {}).get("dtype") or "auto")
    return dtype if dtype in DTYPES else "auto"
