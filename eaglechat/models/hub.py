"""Hugging Face Hub pulls for catalog models: pre-flight, download, verify, record, remove.

Weights live in the standard Hugging Face cache (HF_HOME / HF_HUB_CACHE; HF_TOKEN, HF_HUB_OFFLINE,
HF_HUB_DISABLE_XET and the other HF_* variables are honoured as huggingface_hub reads them), so
transformers and the `hf` CLI see the same files. eaglechat keeps only a small JSON record per pulled
alias under paths.pulls_dir(): which commit of which repo, which files (hub_store.py). `rm` counts
references through them. Every call into huggingface_hub is to its public API.

Flow of `pull` (Ollama's, on the HF cache):
  resolving   HfApi.model_info per repo -> commit sha, gated flag, file list; the files needed from the
              repo's top or from its subfolder (hf.co/ORG/REPO/sub/folder, or `subfolder:` in a manifest)
  pre-flight  get_hf_file_metadata of every needed file (size, ETag, Xet or not, and the gated/auth answer)
              before any byte moves; total and remaining bytes; free disk
  pulling     one file at a time, one progress bar each (hub_fetch.py: Xet through hf_hub_download,
              other files by a resumable GET into blobs/<etag>.incomplete)
  verifying   sha256 (LFS files) or git blob sha1 (small files) against the ETag; hf_hub_download links
              snapshots/<commit>/<file>
  recording   pulls/<name>.json, then success
What the Hub answers is checked before it names a path (hub_checks.py); Ctrl-C keeps a plain-HTTP
partial file for the next run (hub_fetch.py says what the public API lacks for Xet files).
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from eaglechat import __version__, paths  # noqa: F401  (paths: tests reach the pulls folder as hub.paths)
from eaglechat.errors import HubError, Interrupted, UsageError, WeightsError
from eaglechat.models.hub_checks import (  # noqa: F401  (hub.X is how the rest of eaglechat reaches them)
    META_FILES,
    cache_dir,
    check_commit,
    check_filename,
    check_metadata,
    check_revision,
    endpoint,
    inside,
    is_offline,
    needed_files,
    shown,
    storage,
)
from eaglechat.models.hub_errors import map_error, mapped
from eaglechat.models.hub_fetch import HashingWriter as _HashingWriter  # noqa: F401  (tests spy on its writes)
from eaglechat.models.hub_fetch import download, xet_usable
from eaglechat.models.hub_store import (  # noqa: F401
    ModelStatus,
    RemoveResult,
    _delete_revisions,
    _users,
    all_records,
    is_pulled,
    local_paths,
    model_status,
    read_record,
    remove,
    write_record,
)
from eaglechat.models.manifest import Manifest
from eaglechat.units import fmt_bytes

# --------------------------------------------------------------------------------------------- progress


class Progress:
    """What pull reports. The CLI draws tqdm bars; the TUI can subclass this. Methods may raise
    KeyboardInterrupt (that is how a cancel button stops a pull; a plain-HTTP partial file is kept)."""

    def status(self, message: str) -> None: ...

    def file_start(self, label: str, total: int | None, initial: int) -> None: ...

    def file_advance(self, n: int) -> None: ...

    def file_end(self) -> None: ...


# ------------------------------------------------------------------------------------------- pre-flight


@dataclass
class FilePlan:
    filename: str  # the path in the repo (with the subfolder)
    size: int | None
    etag: str
    url: str  # the resolve URL at the commit; the GET follows its redirect (fresh signed CDN URL per file)
    cached: bool  # snapshots/<commit>/<file> already there
    partial: int = 0  # bytes already in blobs/<etag>.incomplete
    xet: bool = False  # the Hub announced Xet storage for it (X-Xet-Hash)

    @property
    def remaining(self) -> int:
        if self.cached or self.size is None:
            return 0
        return max(self.size - self.partial, 0)


@dataclass
class RepoPlan:
    role: str  # base | head
    repo: str
    revision: str
    commit: str
    gated: bool
    files: list[FilePlan] = field(default_factory=list)
    subfolder: str = ""

    @property
    def total(self) -> int:
        return sum(f.size or 0 for f in self.files)


@dataclass
class PullPlan:
    manifest: Manifest
    repos: list[RepoPlan]
    free_bytes: int

    @property
    def total(self) -> int:
        return sum(r.total for r in self.repos)

    @property
    def remaining(self) -> int:
        return sum(f.remaining for r in self.repos for f in r.files)


def preflight(manifest: Manifest) -> PullPlan:
    """Everything a pull must know before any byte moves: commits, files, sizes, access, free disk."""
    from huggingface_hub import HfApi

    if manifest.is_embedded:
        raise UsageError(f"{manifest.name} ships with eaglechat; there is nothing to pull")
    if is_offline():
        raise HubError(
            f"{manifest.name} is not downloaded and the Hub is off (HF_HUB_OFFLINE=1); "
            f"run 'eaglechat pull {manifest.name}' when online"
        )
    api = HfApi(library_name="eaglechat", library_version=__version__)
    for _, repo, revision in manifest.hub_repos():
        check_revision(repo, revision)  # before any request: a Hub may answer any revision it is asked
    repos = []
    for role, repo, revision, subfolder in manifest.hub_parts():
        with mapped(manifest.name, repo, revision):
            repos.append(_plan_repo(api, role, repo, revision, subfolder))
    return PullPlan(manifest, repos, _free_bytes(cache_dir()))


def _plan_repo(api, role: str, repo: str, revision: str, subfolder: str) -> RepoPlan:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    info = _model_info(api, repo, revision)
    listed = [s.rfilename for s in info.siblings or []]
    names = needed_files(listed, subfolder)
    for name in names:
        check_filename(repo, name)
    config = f"{subfolder}/config.json" if subfolder else "config.json"
    if config not in names:
        if subfolder and not any(f.startswith(subfolder + "/") for f in listed):
            raise HubError(f"{repo}@{revision} has no folder {subfolder!r}; check the name after {repo}/")
        where = f"{repo}/{subfolder}" if subfolder else repo
        raise HubError(f"{where}@{revision} has no config.json; is it a transformers model?")
    commit = check_commit(repo, info.sha)
    plan = RepoPlan(role, repo, revision, commit, bool(info.gated), subfolder=subfolder)
    folder = storage(repo)
    for name in names:
        url = hf_hub_url(repo, name, revision=commit)
        meta = get_hf_file_metadata(url, library_name="eaglechat", library_version=__version__)
        check_metadata(repo, name, commit, meta)
        partial = folder / "blobs" / f"{meta.etag}.incomplete"
        plan.files.append(FilePlan(
            filename=name, size=meta.size, etag=meta.etag, url=url,
            cached=(folder / "snapshots" / commit / name).exists() or (folder / "blobs" / meta.etag).exists(),
            partial=partial.stat().st_size if partial.exists() else 0,
            xet=meta.xet_file_data is not None,
        ))
    return plan


def _model_info(api, repo: str, revision: str):
    """The Hub's model info, refused in one line when it is not a model description (not JSON, a list)."""
    try:
        info = api.model_info(repo, revision=revision, files_metadata=True)
        siblings = info.siblings or []
        if not all(isinstance(s.rfilename, str) for s in siblings):
            raise TypeError("a file name that is not a string")
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        if type(exc).__module__.startswith("huggingface_hub"):  # its own errors: map_error says them
            raise
        raise HubError(f"the Hub at {endpoint()} answered something other than a model description for "
                       f"{repo}@{revision} ({type(exc).__name__}); refusing to pull it") from None
    return info


def _free_bytes(folder: Path) -> int:
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def check_disk(plan: PullPlan, margin: int = 64 * 1024**2) -> None:
    if plan.remaining + margin > plan.free_bytes:
        raise HubError(
            f"not enough disk space for {plan.manifest.name}: it needs {fmt_bytes(plan.remaining)} more, "
            f"{fmt_bytes(plan.free_bytes)} free at {cache_dir()} (set HF_HUB_CACHE to use another disk)"
        )


# ------------------------------------------------------------------------------------------------- pull


def pull(manifest: Manifest, progress: Progress | None = None, *, dry_run: bool = False) -> PullPlan | None:
    """Download the base and the head of `manifest` into the HF cache and record the pull."""
    progress = progress or Progress()
    try:
        return _pull(manifest, progress, dry_run)
    except KeyboardInterrupt:  # between files or during the metadata calls: nothing partial to lose
        raise Interrupted(f"interrupted; run 'eaglechat pull {manifest.name}' again to resume") from None
    except OSError as exc:  # outside a download (links, refs, the pull record): say which disk
        if exc.errno != errno.ENOSPC:
            raise
        raise HubError(f"disk full while finishing the pull of {manifest.name} ({exc.filename or cache_dir()}); "
                       f"free some space and run 'eaglechat pull {manifest.name}' again") from None


def _pull(manifest: Manifest, progress: Progress, dry_run: bool) -> PullPlan | None:
    if manifest.is_embedded:
        return _embedded(manifest, progress, dry_run)
    if is_offline() and is_pulled(manifest):
        progress.status(f"{manifest.name} is already pulled (offline: not checking for updates)")
        return None
    progress.status(f"resolving {manifest.name}")
    plan = preflight(manifest)
    for rp in plan.repos:
        gated = ", gated: access granted" if rp.gated else ""
        where = f"{rp.repo}/{rp.subfolder}" if rp.subfolder else rp.repo
        xet = sum(f.xet for f in rp.files)
        via = f", {xet} from Xet storage" if xet and xet_usable() else ""
        progress.status(f"  {rp.role}: {where}@{rp.commit[:12]}  {len(rp.files)} files, {fmt_bytes(rp.total)}"
                        f"{via}{gated}")
    progress.status(
        f"pre-flight: {fmt_bytes(plan.total)} in all, {fmt_bytes(plan.remaining)} to download, "
        f"{fmt_bytes(plan.free_bytes)} free"
    )
    check_disk(plan)
    if dry_run:
        return plan
    for rp in plan.repos:
        folder = storage(rp.repo)
        for fp in rp.files:
            if not fp.cached:
                download(manifest.name, rp, fp, folder, progress)
        progress.status(f"verifying {rp.role} ({rp.repo})")
        _link(manifest, rp, folder)
    progress.status("writing record")
    previous = read_record(manifest.name)
    write_record(plan)
    if previous:  # an update moved to new commits: drop the old ones nobody else uses (Ollama's "unused layers")
        _drop_stale(manifest, plan, previous, progress)
    progress.status("success")
    return plan


def _embedded(manifest: Manifest, progress: Progress, dry_run: bool) -> None:
    from eaglechat.models import default_model

    if dry_run:  # say what a pull would do; the conversion writes ~538 MB, so only a real pull does it
        if default_model.is_converted():
            progress.status(f"{manifest.name} is embedded and already converted: nothing to do")
        else:
            progress.status(f"{manifest.name} is embedded: a pull would convert its base once "
                            f"(from {default_model.GGUF_NAME}) into {default_model.default_base_dir()}")
        return None
    default_model.ensure_default_base(progress=progress.status)
    progress.status(f"{manifest.name} is embedded: base converted, head at {manifest.head_path}")
    return None


def _drop_stale(manifest: Manifest, plan: PullPlan, previous: dict, progress: Progress) -> None:
    now = {(rp.repo, rp.commit) for rp in plan.repos}
    stale = {(r["repo"], r["commit"]) for r in previous.get("repos", [])} - now
    stale -= set(_users(exclude=manifest.name))
    if stale:
        freed = _delete_revisions(stale)
        progress.status(f"removing unused revisions: {', '.join(f'{r}@{c[:12]}' for r, c in sorted(stale))} "
                        f"({fmt_bytes(freed)} freed)")


def _link(manifest: Manifest, rp: RepoPlan, folder: Path) -> None:
    """Let huggingface_hub write snapshots/<commit>/<file> for blobs now in place; record refs/<rev>."""
    from huggingface_hub import hf_hub_download

    snapshot = folder / "snapshots" / check_commit(rp.repo, rp.commit)
    for fp in rp.files:
        # the folder the link goes in (the link itself may point into huggingface_hub's shared Xet store)
        inside((snapshot / fp.filename).parent, folder)
        with mapped(manifest.name, rp.repo, rp.revision, fp.filename):
            try:
                local = hf_hub_download(
                    rp.repo, fp.filename, revision=rp.commit, cache_dir=str(cache_dir()),
                    library_name="eaglechat", library_version=__version__,
                )
            except ValueError as exc:  # huggingface_hub's own refusal of a path outside the snapshot
                if type(exc).__module__.startswith("huggingface_hub"):
                    raise
                raise HubError(f"{rp.repo}/{fp.filename}: the Hub's answer would place it outside the cache "
                               f"({exc}); refusing to pull it") from None
        if fp.size is not None and os.path.getsize(local) != fp.size:
            raise WeightsError(f"{rp.repo}/{fp.filename} has {os.path.getsize(local)} bytes, expected {fp.size}")
    if rp.revision != rp.commit:
        check_revision(rp.repo, rp.revision)
        ref = inside(folder / "refs" / rp.revision, folder / "refs")
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp = ref.with_name(ref.name + ".eaglechat-tmp")
        tmp.write_text(rp.commit)
        os.replace(tmp, ref)


__all__ = [
    "FilePlan", "ModelStatus", "Progress", "PullPlan", "RemoveResult", "RepoPlan", "all_records", "cache_dir",
    "check_disk", "check_revision", "is_offline", "is_pulled", "local_paths", "map_error", "model_status",
    "needed_files", "preflight", "pull", "read_record", "remove", "write_record",
]
