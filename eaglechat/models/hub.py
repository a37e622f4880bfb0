"""Hugging Face Hub pulls for catalog models: pre-flight, resumable download, verify, record, remove.

Weights live in the standard Hugging Face cache (HF_HOME / HF_HUB_CACHE; HF_TOKEN, HF_HUB_OFFLINE and
the other HF_* variables are honoured as huggingface_hub reads them), so transformers and the `hf`
CLI see the same files. eaglechat keeps only a small JSON record per pulled alias under
paths.pulls_dir(): which commit of which repo, which files. `rm` counts references through them.

Flow of `pull` (Ollama's, on the HF cache):
  resolving   model_info per repo -> commit sha, gated flag, file list; pick the files needed
  pre-flight  HEAD of every needed file (size, etag, and the gated/auth answer) before any byte moves;
              total and remaining bytes; free disk
  pulling     one file at a time, one progress bar each, into blobs/<etag>.incomplete
  verifying   sha256 (LFS files) or git blob sha1 (small files) against the etag, then the move into
              blobs/<etag>; huggingface_hub links snapshots/<commit>/<file>
  recording   pulls/<name>.json, then success
Ctrl-C keeps blobs/<etag>.incomplete. huggingface_hub >= 2 deletes its own partial files when a download
fails, so the resume is ours: a rerun continues with an HTTP Range request from the partial size.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from eaglechat import __version__, paths
from eaglechat.errors import EaglechatError, HubError, Interrupted, ModelNotFound, UsageError, WeightsError
from eaglechat.models.manifest import Manifest
from eaglechat.units import fmt_bytes

# files a transformers base model or an EAGLE head needs (top level of the repo only)
META_FILES = {
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
    "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja",
    "chat_template.json", "model.safetensors.index.json", "pytorch_model.bin.index.json",
}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_NAME_MAX = 255  # bytes in one file name (Linux, macOS, Windows)
_CHUNK = 8 * 1024 * 1024
# an ETag names a file under blobs/: hex digests (sha256, git sha1) and other plain tokens, never a path
_SAFE_ETAG = re.compile(r"^[A-Za-z0-9_-]{8,128}$")
# huggingface_hub writes a download in DOWNLOAD_CHUNK_SIZE pieces (10 MiB) and loses the piece in flight
# when the connection drops, so a link that drops more often never progresses; ours writes smaller ones
_RESUME_GRAIN = 64 * 1024


def _shown(text: str, limit: int = 60) -> str:
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def _leaves_folder(path: str) -> bool:
    """A relative path that would not stay inside its folder on every OS: parent steps, a backslash
    (a separator on Windows), an absolute or drive path, control characters."""
    return (not path or "\\" in path or path.startswith("/") or ":" in path
            or any(p in ("", ".", "..") for p in path.split("/")) or bool(re.search(r"[\x00-\x1f\x7f]", path)))


def check_filename(repo: str, name: str) -> None:
    """A repo file name must stay inside the repo folder on every OS, in names a file system takes."""
    if _leaves_folder(name):
        raise HubError(f"{repo} lists a file named {_shown(name)} that would leave the repo folder; refusing to pull it")
    if any(len(part.encode()) > _NAME_MAX for part in name.split("/")):
        raise HubError(f"{repo} lists a file named {_shown(name)}, longer than a file system allows "
                       f"({_NAME_MAX} bytes); refusing to pull it")


def check_revision(repo: str, revision: str) -> None:
    """A revision names refs/<revision> in the repo's cache folder: a 40-hex commit sha, or a branch or
    tag name (`main`, `v1.0`, `refs/pr/1`) that stays in that folder; git's rules forbid `..` too."""
    if _SHA1.match(revision):
        return
    if (_leaves_folder(revision) or ".." in revision or len(revision) > _NAME_MAX
            or re.search(r"[\s~^?*\[]", revision) or revision.endswith((".lock", "."))):
        raise UsageError(f"revision {_shown(revision)} of {repo} is neither a commit sha nor a branch or tag name; "
                         "refusing to use it")


def check_commit(repo: str, commit) -> str:
    if not isinstance(commit, str) or not _SHA1.match(commit):
        shown = _shown(commit) if isinstance(commit, str) else repr(commit)[:60]
        raise HubError(f"{repo}: the Hub named the commit {shown}, which is not a 40-hex commit sha; refusing to pull it")
    return commit


def _inside(path: Path, folder: Path) -> Path:
    """`path`, once resolved (`..` and links followed), under `folder` resolved: checked before
    anything is written there."""
    if not Path(os.path.realpath(path)).is_relative_to(Path(os.path.realpath(folder))):
        raise HubError(f"refusing to write {path}: it is not inside {folder}")
    return path


def check_etag(repo: str, name: str, etag: str) -> None:
    if not _SAFE_ETAG.match(etag):
        raise HubError(f"{repo}: the Hub sent an ETag for {name} that is not a plain digest ({etag[:80]!r}); refusing to pull it")


def needed_files(filenames: list[str]) -> list[str]:
    """Config, tokenizer and weight files; safetensors over .bin when a repo has both."""
    top = [f for f in filenames if "/" not in f]
    safetensors = [f for f in top if f.endswith(".safetensors") and not f.startswith("consolidated")]
    if safetensors:
        weights = safetensors
        meta = META_FILES - {"pytorch_model.bin.index.json"}
    else:
        weights = [f for f in top if re.fullmatch(r"pytorch_model(-\d+-of-\d+)?\.bin", f)]
        meta = META_FILES - {"model.safetensors.index.json"}
    return sorted(set(weights) | {f for f in top if f in meta})


# ------------------------------------------------------------------------------------------ environment


def cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser()


def is_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _storage(repo: str) -> Path:
    return _inside(cache_dir() / ("models--" + repo.replace("/", "--")), cache_dir())


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


# --------------------------------------------------------------------------------------------- progress


class Progress:
    """What pull reports. The CLI draws tqdm bars; the TUI can subclass this. Methods may raise
    KeyboardInterrupt (that is how a cancel button stops a pull; the partial file is kept)."""

    def status(self, message: str) -> None: ...

    def file_start(self, label: str, total: int | None, initial: int) -> None: ...

    def file_advance(self, n: int) -> None: ...

    def file_end(self) -> None: ...


def _bar_class(progress: Progress):
    """An object huggingface_hub.http_get accepts as `tqdm_class`, forwarding bytes to `progress`."""

    class _Bar:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n=1):
            if n:
                progress.file_advance(int(n))

        def close(self):
            pass

    return _Bar


# ------------------------------------------------------------------------------------------- pre-flight


@dataclass
class FilePlan:
    filename: str
    size: int | None
    etag: str
    url: str  # the resolve URL at the commit; the GET follows its redirect (fresh signed CDN URL per file)
    cached: bool  # snapshots/<commit>/<file> already there
    partial: int = 0  # bytes already in blobs/<etag>.incomplete

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
    from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url

    if manifest.is_embedded:
        raise UsageError(f"{manifest.name} ships with eaglechat; there is nothing to pull")
    if is_offline():
        raise HubError(
            f"{manifest.name} is not downloaded and the Hub is off (HF_HUB_OFFLINE=1); "
            f"run 'eaglechat pull {manifest.name}' when online"
        )
    api = HfApi(library_name="eaglechat", library_version=__version__)
    repos: list[RepoPlan] = []
    for _, repo, revision in manifest.hub_repos():
        check_revision(repo, revision)  # before any request: a Hub may answer any revision it is asked
    for role, repo, revision in manifest.hub_repos():
        with _mapped(manifest, repo, revision):
            info = _model_info(api, repo, revision)
            names = needed_files([s.rfilename for s in info.siblings or []])
            for name in names:
                check_filename(repo, name)
            if "config.json" not in names:
                raise HubError(f"{repo}@{revision} has no config.json; is it a transformers model?")
            commit = check_commit(repo, info.sha)
            plan = RepoPlan(role, repo, revision, commit, bool(info.gated))
            storage = _storage(repo)
            for name in names:
                url = hf_hub_url(repo, name, revision=commit)
                meta = get_hf_file_metadata(url, library_name="eaglechat", library_version=__version__)
                if not meta.etag:
                    raise HubError(f"{repo}: the Hub sent no ETag for {name}")
                check_etag(repo, name, meta.etag)
                if meta.commit_hash is not None and meta.commit_hash != commit:
                    raise HubError(f"{repo}: the Hub named two commits ({commit} in its model info, "
                                   f"{_shown(meta.commit_hash, 40)} for {name}); refusing to pull it")
                if meta.size is not None and (not isinstance(meta.size, int) or meta.size < 0):
                    raise HubError(f"{repo}: the Hub announced {meta.size!r} bytes for {name}; refusing to pull it")
                partial = storage / "blobs" / f"{meta.etag}.incomplete"
                plan.files.append(
                    FilePlan(
                        filename=name,
                        size=meta.size,
                        etag=meta.etag,
                        url=url,
                        cached=(storage / "snapshots" / commit / name).exists()
                        or (storage / "blobs" / meta.etag).exists(),
                        partial=partial.stat().st_size if partial.exists() else 0,
                    )
                )
            repos.append(plan)
    return PullPlan(manifest, repos, _free_bytes(cache_dir()))


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
        raise HubError(f"the Hub at {_endpoint()} answered something other than a model description for "
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
    if is_offline() and is_pulled(manifest):
        progress.status(f"{manifest.name} is already pulled (offline: not checking for updates)")
        return None
    progress.status(f"resolving {manifest.name}")
    plan = preflight(manifest)
    for rp in plan.repos:
        gated = ", gated: access granted" if rp.gated else ""
        progress.status(f"  {rp.role}: {rp.repo}@{rp.commit[:12]}  {len(rp.files)} files, {fmt_bytes(rp.total)}{gated}")
    progress.status(
        f"pre-flight: {fmt_bytes(plan.total)} in all, {fmt_bytes(plan.remaining)} to download, "
        f"{fmt_bytes(plan.free_bytes)} free"
    )
    check_disk(plan)
    if dry_run:
        return plan
    for rp in plan.repos:
        storage = _storage(rp.repo)
        for fp in rp.files:
            if not fp.cached:
                _download(manifest, rp, fp, storage, progress)
        progress.status(f"verifying {rp.role} ({rp.repo})")
        _link(manifest, rp, storage)
    progress.status("writing record")
    previous = read_record(manifest.name)
    write_record(plan)
    if previous:  # an update moved to new commits: drop the old ones nobody else uses (Ollama's "unused layers")
        now = {(rp.repo, rp.commit) for rp in plan.repos}
        stale = {(r["repo"], r["commit"]) for r in previous.get("repos", [])} - now
        stale -= set(_users(exclude=manifest.name))
        if stale:
            freed = _delete_revisions(stale)
            progress.status(f"removing unused revisions: {', '.join(f'{r}@{c[:12]}' for r, c in sorted(stale))} "
                            f"({fmt_bytes(freed)} freed)")
    progress.status("success")
    return plan


def _download(manifest: Manifest, rp: RepoPlan, fp: FilePlan, storage: Path, progress: Progress) -> None:
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    blob = _inside(storage / "blobs" / fp.etag, storage)
    partial = _inside(blob.with_name(f"{fp.etag}.incomplete"), storage)
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock = _inside(cache_dir() / ".locks" / storage.name / f"{fp.etag}.lock", cache_dir())
    lock.parent.mkdir(parents=True, exist_ok=True)
    # httpx drops the Authorization header when the Hub redirects to its CDN (another origin)
    headers = build_hf_headers(library_name="eaglechat", library_version=__version__)
    with WeakFileLock(str(lock)), _quiet_hub_logs():
        if blob.exists():
            return
        resume = partial.stat().st_size if partial.exists() else 0
        if fp.size is not None and resume > fp.size:
            partial.unlink()
            resume = 0
        while True:
            try:
                out = _fetch(manifest, rp, fp, partial, resume, headers, progress)
                break
            except HubError:
                if fp.size is not None and partial.exists() and partial.stat().st_size > fp.size:
                    partial.unlink()  # more bytes than announced: nothing in it can be trusted
                raise
            except _RangeRefused:
                # the partial cannot be continued (the file changed or is shorter than advertised):
                # discard it and start over once; a refusal of a download from zero is a Hub error
                if resume == 0:  # refused while huggingface_hub resumed a dropped connection itself
                    got = partial.stat().st_size if partial.exists() else 0
                    partial.unlink(missing_ok=True)
                    raise HubError(
                        f"{rp.repo}/{fp.filename} arrived truncated ({fmt_bytes(got)} of {fmt_bytes(fp.size)}) "
                        f"and the Hub has no more of it; run 'eaglechat pull {manifest.name}' again later"
                    ) from None
                progress.status(f"the Hub would not resume {fp.filename}; downloading it again from the start")
                partial.unlink(missing_ok=True)
                resume = 0
        if out.hasher is not None:
            ok = out.hasher.hexdigest() == fp.etag
        else:  # no running hash (odd etag, unknown size, or a rewind): read the file once
            ok = _digest_ok(partial, fp.etag)
        if not ok:
            partial.unlink(missing_ok=True)
            raise WeightsError(
                f"{rp.repo}/{fp.filename}: digest mismatch, the file must be downloaded again; "
                f"run 'eaglechat pull {manifest.name}'"
            )
        os.replace(partial, blob)


class _RangeRefused(Exception):
    """The server answered 416 to a request for the rest of a partial file."""


def _fetch(manifest: Manifest, rp: RepoPlan, fp: FilePlan, partial: Path, resume: int, headers: dict,
           progress: Progress) -> "_HashingWriter":
    """Append the rest of one file (from byte `resume`) to `partial`, hashing as it arrives."""
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.file_download import http_get

    hasher = _hasher(fp.etag, fp.size)
    if hasher is not None and resume:
        _hash_file(hasher, partial)
    import httpx2
    from huggingface_hub import constants

    progress.file_start(f"pulling {rp.role} {fp.filename}", fp.size, resume)
    grain = constants.DOWNLOAD_CHUNK_SIZE
    constants.DOWNLOAD_CHUNK_SIZE = min(grain, _RESUME_GRAIN)  # http_get reads it per call
    try:
        with _mapped(manifest, rp.repo, rp.revision, fp.filename), open(partial, "ab") as f:
            out = _HashingWriter(f, hasher, fp.size)
            try:
                http_get(
                    fp.url, out, resume_size=resume, headers=headers, expected_size=fp.size,
                    displayed_filename=fp.filename, tqdm_class=_bar_class(progress),
                )
            except _TooLong:
                f.close()
                partial.unlink(missing_ok=True)  # more bytes than announced: nothing in it can be trusted
                raise HubError(f"the Hub sent more bytes than it announced for {rp.repo}/{fp.filename} (over "
                               f"{fp.size}); the download was discarded, run 'eaglechat pull {manifest.name}' "
                               "again later") from None
            except HfHubHTTPError as exc:
                if exc.response is not None and exc.response.status_code == 416:
                    raise _RangeRefused() from exc
                raise
            except (httpx2.ConnectError, httpx2.TimeoutException, httpx2.RemoteProtocolError) as exc:
                # huggingface_hub resumed by itself until five tries in a row brought nothing new
                raise _dropped(manifest, rp, fp, resume, f.tell(), exc) from exc
    except KeyboardInterrupt:
        raise Interrupted(
            f"interrupted while pulling {fp.filename}; run 'eaglechat pull {manifest.name}' again to resume"
        ) from None
    finally:
        constants.DOWNLOAD_CHUNK_SIZE = grain
        progress.file_end()
    return out


def _dropped(manifest: Manifest, rp: RepoPlan, fp: FilePlan, start: int, kept: int, exc: Exception) -> HubError:
    """The truth about a download the connection kept dropping: what this run gained, what is kept."""
    of = f" of {fmt_bytes(fp.size)}" if fp.size is not None else ""
    where = f"{rp.repo}/{fp.filename}"
    if kept > start:
        return HubError(f"the connection dropped while pulling {where} ({type(exc).__name__}); {fmt_bytes(kept)}{of} "
                        f"are kept, run 'eaglechat pull {manifest.name}' again to resume")
    return HubError(f"the connection to {_endpoint()} dropped repeatedly while pulling {where} before any new byte "
                    f"arrived ({type(exc).__name__}; {fmt_bytes(kept)}{of} kept); check the connection and try again")


class _quiet_hub_logs:
    """huggingface_hub logs its own retries ("Trying to resume download...", "Max retries exceeded")
    as warnings; during our pull the progress bar and the one error line say it, so hold them back
    (`--debug` shows them: HF_HUB_VERBOSITY=debug is honoured by huggingface_hub itself)."""

    def __enter__(self):
        import logging

        self.logger = logging.getLogger("huggingface_hub")
        self.level = self.logger.level
        if self.logger.getEffectiveLevel() > logging.DEBUG:
            self.logger.setLevel(logging.ERROR)
        return self

    def __exit__(self, *exc):
        self.logger.setLevel(self.level)
        return False


def _hasher(etag: str, size: int | None):
    """sha256 for LFS files (etag = sha256), git's blob sha1 for small ones; None for other etags."""
    if _SHA256.match(etag):
        return hashlib.sha256()
    if _SHA1.match(etag) and size is not None:
        h = hashlib.sha1()
        h.update(b"blob %d\0" % size)
        return h
    return None


def _hash_file(h, path: Path) -> None:
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)


def _digest_ok(path: Path, etag: str) -> bool:
    h = _hasher(etag, path.stat().st_size)
    if h is None:
        return True  # e.g. a xet hash: the size check in _link still applies
    _hash_file(h, path)
    return h.hexdigest() == etag


class _TooLong(Exception):
    """The Hub sent more bytes than it announced for a file."""


class _HashingWriter:
    """The partial file as http_get sees it: bytes are hashed as they are written, so verifying a
    13 GB file needs no second read. A rewind (the server ignored the Range) drops the running hash.
    No byte past the announced size is written (a Hub could stream without end)."""

    def __init__(self, f, hasher, size: int | None = None):
        self.f, self.hasher, self.size = f, hasher, size

    def write(self, data) -> int:
        if self.size is not None and self.f.tell() + len(data) > self.size:
            raise _TooLong()
        if self.hasher is not None:
            self.hasher.update(data)
        return self.f.write(data)

    def tell(self) -> int:
        return self.f.tell()

    def seek(self, *args):
        self.hasher = None
        return self.f.seek(*args)

    def truncate(self, *args):
        self.hasher = None
        return self.f.truncate(*args)


def _link(manifest: Manifest, rp: RepoPlan, storage: Path) -> None:
    """Let huggingface_hub write snapshots/<commit>/<file> for blobs now in place; record refs/<rev>."""
    from huggingface_hub import hf_hub_download

    snapshot = storage / "snapshots" / check_commit(rp.repo, rp.commit)
    for fp in rp.files:
        _inside(snapshot / fp.filename, storage)
        with _mapped(manifest, rp.repo, rp.revision, fp.filename):
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
        ref = _inside(storage / "refs" / rp.revision, storage / "refs")
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp = ref.with_name(ref.name + ".eaglechat-tmp")
        tmp.write_text(rp.commit)
        os.replace(tmp, ref)


class _mapped:
    """Turns huggingface_hub / network / disk exceptions into one-line eaglechat errors."""

    def __init__(self, manifest: Manifest, repo: str, revision: str, filename: str | None = None):
        self.m, self.repo, self.rev, self.file = manifest, repo, revision, filename

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, (EaglechatError, KeyboardInterrupt)):
            return False
        mapped = map_error(exc, self.m.name, self.repo, self.rev, self.file)
        if mapped is None:
            return False
        raise mapped from exc


def map_error(exc: BaseException, name: str, repo: str, revision: str, filename: str | None = None):
    import httpx2
    from huggingface_hub import errors as e

    where = f"{repo}/{filename}" if filename else repo
    page = f"{_endpoint()}/{repo}"
    if isinstance(exc, e.GatedRepoError):
        if exc.response is not None and exc.response.status_code == 403:
            return HubError(
                f"{repo} is gated and your account is not on its authorised list yet (requests can take days; "
                f"see {page}). Try vicuna-7b-eagle2, which is not gated."
            )
        return HubError(f"{repo} is gated. Accept the licence at {page} then run 'hf auth login' (or set HF_TOKEN).")
    if isinstance(exc, e.RevisionNotFoundError):
        return HubError(f"revision {revision!r} of {repo} was not found on the Hub")
    if isinstance(exc, e.RepositoryNotFoundError):
        return HubError(f"repository {repo} was not found on the Hub (if it is private, run 'hf auth login')")
    if isinstance(exc, e.RemoteEntryNotFoundError):
        return HubError(f"{where} was not found at revision {revision!r}")
    if isinstance(exc, e.DisabledRepoError):
        return HubError(f"{repo} has been disabled on the Hub")
    if isinstance(exc, (e.OfflineModeIsEnabled, e.LocalEntryNotFoundError)):
        return HubError(f"{name} is not downloaded and the Hub is off (HF_HUB_OFFLINE=1); run 'eaglechat pull {name}' when online")
    if isinstance(exc, e.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        if status == 403:
            return HubError(f"the Hub refused access to {where} (403); check your token's permissions")
        if status == 401:
            return HubError(f"the Hub refused your token for {where} (401); run 'hf auth login' again")
        return HubError(f"the Hub answered {status} for {where}; try again later")
    if isinstance(exc, (httpx2.ConnectError, httpx2.TimeoutException, httpx2.RemoteProtocolError)):
        return HubError(
            f"cannot reach the Hub at {_endpoint()} ({type(exc).__name__}); check the connection and "
            f"run 'eaglechat pull {name}' again"
        )
    if isinstance(exc, httpx2.UnsupportedProtocol):  # a redirect to file://, ftp://, ...
        url = _request_url(exc)
        return HubError(f"the Hub's answer for {where} redirects to {_shown(url, 80)}, which is not an http(s) "
                        "address; refusing to follow it")
    if isinstance(exc, httpx2.TooManyRedirects):
        return HubError(f"the Hub's answer for {where} redirects in a loop ({exc}); try again later")
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return HubError(f"disk full while writing {where} under {cache_dir()}; free some space and run 'eaglechat pull {name}' again to resume")
    if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
        sizes = re.search(r"should be of size (\d+) but has size (\d+)", str(exc))
        if sizes and int(sizes.group(2)) > int(sizes.group(1)):
            return HubError(f"the Hub sent more bytes than it announced for {where} ({sizes.group(2)} instead of "
                            f"{sizes.group(1)}); the download was discarded, run 'eaglechat pull {name}' again later")
        return HubError(f"{where} arrived truncated; run 'eaglechat pull {name}' again to resume")
    return None


def _request_url(exc) -> str:
    try:
        return str(exc.request.url)
    except RuntimeError:  # an error raised before a request was built
        return str(exc)


# -------------------------------------------------------------------------------------------- records


def _record_path(name: str) -> Path:
    if re.fullmatch(r"[a-z0-9][a-z0-9_.\-]*", name):
        return paths.pulls_dir() / f"{name}.json"
    return paths.pulls_dir() / f"free-{hashlib.sha1(name.encode()).hexdigest()[:16]}.json"


def write_record(plan: PullPlan) -> Path:
    m = plan.manifest
    record = {
        "version": 1,
        "name": m.name,
        "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "manifest": m.to_dict(),
        "repos": [
            {
                "role": rp.role, "repo": rp.repo, "revision": rp.revision, "commit": rp.commit,
                "files": [{"name": f.filename, "size": f.size, "etag": f.etag} for f in rp.files],
            }
            for rp in plan.repos
        ],
    }
    path = _record_path(m.name)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def read_record(name: str) -> dict | None:
    path = _record_path(name)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("name") == name else None


def all_records() -> list[dict]:
    out = []
    for path in sorted(paths.pulls_dir().glob("*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


# ------------------------------------------------------------------------------------- local lookups


def _snapshot(repo: str, revision: str, files: list[str] | None) -> Path | None:
    """The complete snapshot folder for repo@revision in the HF cache, or None (no network)."""
    try:
        storage = _storage(repo)
        check_revision(repo, revision)
    except EaglechatError:
        return None
    commit = revision
    if not _SHA1.match(revision):
        ref = storage / "refs" / revision
        if not ref.is_file():
            return None
        commit = ref.read_text().strip()
        if not _SHA1.match(commit):
            return None
    folder = storage / "snapshots" / commit
    if not folder.is_dir():
        return None
    if files is None:  # no record (cached by another tool): config plus some weights will do
        weights = any(p.name.endswith((".safetensors", ".bin")) and p.exists() for p in folder.iterdir())
        return folder if weights and (folder / "config.json").exists() else None
    return folder if all((folder / f).exists() for f in files) else None


def _repo_parts(manifest: Manifest) -> list[tuple[str, str, str, list[str] | None]]:
    record = read_record(manifest.name)
    if record:
        return [(r["role"], r["repo"], r["commit"], [f["name"] for f in r["files"]]) for r in record["repos"]]
    return [(role, repo, rev, None) for role, repo, rev in manifest.hub_repos()]


def local_paths(manifest: Manifest) -> tuple[Path, Path]:
    """(base folder, head folder) on this machine, without network; ModelNotFound when not pulled."""
    if manifest.is_embedded:
        from eaglechat.models import default_model

        return Path(default_model.ensure_default_base()), Path(manifest.head_path)
    found = {}
    for role, repo, revision, files in _repo_parts(manifest):
        folder = _snapshot(repo, revision, files)
        if folder is None:
            raise ModelNotFound(f"model {manifest.name} is not pulled; run: eaglechat pull {manifest.name}")
        found[role] = folder
    return found["base"], found["head"]


def is_pulled(manifest: Manifest) -> bool:
    if manifest.is_embedded:
        return True
    try:
        local_paths(manifest)
        return True
    except ModelNotFound:
        return False


@dataclass
class ModelStatus:
    name: str
    state: str  # "pulled" | "partial" | "not pulled" | "embedded"
    size_bytes: int  # on disk now (blobs, partial downloads included)
    modified: float | None  # unix time of the pull (or newest file)


def _blob_sizes(folder: Path) -> dict[str, int]:
    out = {}
    for p in folder.rglob("*"):
        if p.is_file():
            real = os.path.realpath(p)
            out[real] = os.path.getsize(real)
    return out


def model_status(manifest: Manifest) -> ModelStatus:
    if manifest.is_embedded:
        from eaglechat.models import default_model

        sizes: dict[str, int] = {}
        for folder in (default_model.default_base_dir(), manifest.head_path):
            if folder and Path(folder).is_dir():
                sizes.update(_blob_sizes(Path(folder)))
        mtimes = [os.path.getmtime(p) for p in sizes]
        return ModelStatus(manifest.name, "embedded", sum(sizes.values()), max(mtimes) if mtimes else None)
    sizes, partial = {}, 0
    for _, repo, revision, files in _repo_parts(manifest):
        folder = _snapshot(repo, revision, files)
        if folder is not None:
            sizes.update(_blob_sizes(folder))
    for _, repo, _ in manifest.hub_repos():  # interrupted pulls (no record yet)
        partial += sum(p.stat().st_size for p in (_storage(repo) / "blobs").glob("*.incomplete"))
    record = read_record(manifest.name)
    pulled = is_pulled(manifest)
    state = "pulled" if pulled else ("partial" if sizes or partial else "not pulled")
    modified = None
    if record and pulled:
        modified = time.mktime(time.strptime(record["pulled_at"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    elif sizes:
        modified = max(os.path.getmtime(p) for p in sizes)
    return ModelStatus(manifest.name, state, sum(sizes.values()) + partial, modified)


# --------------------------------------------------------------------------------------------- remove


@dataclass
class RemoveResult:
    name: str
    freed_bytes: int
    deleted: list[str]  # repo@commit
    kept: list[tuple[str, list[str]]]  # (repo@commit, other aliases that use it)


def remove(name: str | Manifest) -> RemoveResult:
    """Delete the pulled revisions of one alias that no other pulled alias uses, and the partial
    downloads (blobs/*.incomplete) left in its repos by an interrupted pull; forget the record."""
    from eaglechat.models import catalog

    manifest = name if isinstance(name, Manifest) else catalog.resolve(name)
    if manifest.is_embedded:
        raise UsageError(f"{manifest.name} is the embedded default; there is nothing to remove")
    mine = {}
    for _, repo, revision, files in _repo_parts(manifest):
        folder = _snapshot(repo, revision, files)
        if folder is not None:
            mine[(repo, folder.name)] = files
    record = read_record(manifest.name)
    partials = _partial_downloads(manifest)
    if not mine and record is None and not partials:
        raise ModelNotFound(f"model {manifest.name} is not pulled")
    users = _users(exclude=manifest.name)
    doomed = [key for key in mine if key not in users]
    kept = [(f"{repo}@{commit[:12]}", users[(repo, commit)]) for repo, commit in mine if (repo, commit) in users]
    freed = _delete_revisions(doomed)
    for inc in partials:
        try:
            size = inc.stat().st_size
            inc.unlink()
        except FileNotFoundError:  # a pull finished or removed it meanwhile
            continue
        freed += size
    _record_path(manifest.name).unlink(missing_ok=True)
    return RemoveResult(manifest.name, freed, [f"{repo}@{commit[:12]}" for repo, commit in doomed], kept)


def _partial_downloads(manifest: Manifest) -> list[Path]:
    """blobs/*.incomplete in the alias's repos (what `list` counts as "partial"), except those a
    running pull is writing right now (their huggingface_hub lock is held)."""
    from filelock import FileLock, Timeout

    repos = {repo for _, repo, _ in manifest.hub_repos()}
    repos |= {r["repo"] for r in (read_record(manifest.name) or {}).get("repos", [])}
    out = []
    for repo in sorted(repos):
        storage = _storage(repo)
        for inc in sorted((storage / "blobs").glob("*.incomplete")):
            lock = cache_dir() / ".locks" / storage.name / (inc.name[: -len(".incomplete")] + ".lock")
            if lock.exists():
                try:
                    with FileLock(str(lock)).acquire(timeout=0):
                        pass
                except Timeout:
                    continue
            out.append(inc)
    return out


def _users(exclude: str) -> dict[tuple[str, str], list[str]]:
    """(repo, commit) -> the pulled aliases (other than `exclude`) whose records use it."""
    users: dict[tuple[str, str], list[str]] = {}
    for other in all_records():
        if other.get("name") == exclude:
            continue
        for r in other.get("repos", []):
            users.setdefault((r["repo"], r["commit"]), []).append(other["name"])
    return users


def _delete_revisions(keys) -> int:
    """Delete (repo, commit) revisions from the HF cache through huggingface_hub; bytes freed."""
    from huggingface_hub import scan_cache_dir

    keys = set(keys)
    if not keys:
        return 0
    info = scan_cache_dir(cache_dir())
    commits = [rev.commit_hash for r in info.repos for rev in r.revisions if (r.repo_id, rev.commit_hash) in keys]
    if not commits:
        return 0
    strategy = info.delete_revisions(*commits)
    strategy.execute()
    return strategy.expected_freed_size
