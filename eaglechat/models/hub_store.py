"""What eaglechat keeps of a pull, and what it finds without the network: the pull records
(paths.pulls_dir()/<name>.json: which commit of which repo, which files, which subfolder), the snapshot
folders they name in the Hugging Face cache, the state `list` shows, and `rm`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from eaglechat import paths
from eaglechat.errors import EaglechatError, ModelNotFound, UsageError
from eaglechat.models.hub_checks import SHA1, cache_dir, check_revision, storage
from eaglechat.models.manifest import Manifest

# -------------------------------------------------------------------------------------------- records


def _record_path(name: str) -> Path:
    if re.fullmatch(r"[a-z0-9][a-z0-9_.\-]*", name):
        return paths.pulls_dir() / f"{name}.json"
    return paths.pulls_dir() / f"free-{hashlib.sha1(name.encode()).hexdigest()[:16]}.json"


def write_record(plan) -> Path:
    """pulls/<name>.json for a finished PullPlan (hub.py), written whole or not at all."""
    m = plan.manifest
    record = {
        "version": 1,
        "name": m.name,
        "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "manifest": m.to_dict(),
        "repos": [
            {
                "role": rp.role, "repo": rp.repo, "revision": rp.revision, "commit": rp.commit,
                "subfolder": rp.subfolder, "files": [{"name": f.filename, "size": f.size, "etag": f.etag} for f in rp.files],
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


def _snapshot(repo: str, revision: str, files: list[str] | None, subfolder: str = "") -> Path | None:
    """The complete snapshot folder for repo@revision in the HF cache, or None (no network)."""
    try:
        folder = storage(repo)
        check_revision(repo, revision)
    except EaglechatError:
        return None
    commit = revision
    if not SHA1.match(revision):
        ref = folder / "refs" / revision
        if not ref.is_file():
            return None
        commit = ref.read_text().strip()
        if not SHA1.match(commit):
            return None
    folder = folder / "snapshots" / commit
    if not folder.is_dir():
        return None
    if files is None:  # no record (cached by another tool): config plus some weights will do
        top = folder / subfolder if subfolder else folder
        weights = top.is_dir() and any(p.name.endswith((".safetensors", ".bin")) and p.exists() for p in top.iterdir())
        return folder if weights and (top / "config.json").exists() else None
    return folder if all((folder / f).exists() for f in files) else None


def _repo_parts(manifest: Manifest) -> list[tuple[str, str, str, list[str] | None, str]]:
    """(role, repo, revision or commit, files or None, subfolder) of each part, from the pull record
    when there is one, else from the manifest."""
    record = read_record(manifest.name)
    if record:
        return [(r["role"], r["repo"], r["commit"], [f["name"] for f in r["files"]], r.get("subfolder") or "")
                for r in record["repos"]]
    return [(role, repo, rev, None, sub) for role, repo, rev, sub in manifest.hub_parts()]


def local_paths(manifest: Manifest) -> tuple[Path, Path]:
    """(base folder, head folder) on this machine, without network; ModelNotFound when not pulled."""
    if manifest.is_embedded:
        from eaglechat.models import default_model

        return Path(default_model.ensure_default_base()), Path(manifest.head_path)
    found = {}
    for role, repo, revision, files, subfolder in _repo_parts(manifest):
        folder = _snapshot(repo, revision, files, subfolder)
        if folder is None:
            raise ModelNotFound(f"model {manifest.name} is not pulled; run: eaglechat pull {manifest.name}")
        found[role] = folder / subfolder if subfolder else folder
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
    for _, repo, revision, files, subfolder in _repo_parts(manifest):
        folder = _snapshot(repo, revision, files, subfolder)
        if folder is not None:
            sizes.update(_blob_sizes(folder / subfolder if subfolder else folder))
    for repo in {repo for _, repo, _ in manifest.hub_repos()}:  # interrupted pulls (no record yet)
        partial += sum(p.stat().st_size for p in (storage(repo) / "blobs").glob("*.incomplete"))
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
    for _, repo, revision, files, subfolder in _repo_parts(manifest):
        folder = _snapshot(repo, revision, files, subfolder)
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
        folder = storage(repo)
        for inc in sorted((folder / "blobs").glob("*.incomplete")):
            lock = cache_dir() / ".locks" / folder.name / (inc.name[: -len(".incomplete")] + ".lock")
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
