"""What a pull accepts from a Hub before it writes anything: revisions, commit shas, file and subfolder
names, ETags, and where in the Hugging Face cache a file may land.

A Hub (or whatever answers at HF_ENDPOINT) is not trusted to name paths: a revision, a commit, a file
name or an ETag becomes part of a path under the cache, so each is checked to stay inside it, in names
every file system takes, before the first byte is written.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from eaglechat.errors import HubError, UsageError

# files a transformers base model or an EAGLE head needs (top level of the repo, or of its subfolder)
META_FILES = {
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
    "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja",
    "chat_template.json", "model.safetensors.index.json", "pytorch_model.bin.index.json",
}
SHA256 = re.compile(r"^[0-9a-f]{64}$")
SHA1 = re.compile(r"^[0-9a-f]{40}$")
NAME_MAX = 255  # bytes in one file name (Linux, macOS, Windows)
# an ETag names a file under blobs/: hex digests (sha256, git sha1) and other plain tokens, never a path
_SAFE_ETAG = re.compile(r"^[A-Za-z0-9_-]{8,128}$")


def shown(text: str, limit: int = 60) -> str:
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def leaves_folder(path: str) -> bool:
    """A relative path that would not stay inside its folder on every OS: parent steps, a backslash
    (a separator on Windows), an absolute or drive path, control characters."""
    return (not path or "\\" in path or path.startswith("/") or ":" in path
            or any(p in ("", ".", "..") for p in path.split("/")) or bool(re.search(r"[\x00-\x1f\x7f]", path)))


def subfolder_problem(subfolder: str) -> str | None:
    """Why `subfolder` (a folder inside a repo: `sub/folder`) cannot be used, or None."""
    if leaves_folder(subfolder):
        return (f"the subfolder {shown(subfolder)} would leave the repo folder "
                "(no '..', '.', empty parts, backslashes, ':' or a leading '/')")
    if any(len(part.encode()) > NAME_MAX for part in subfolder.split("/")):
        return f"the subfolder {shown(subfolder)} has a part longer than a file system allows ({NAME_MAX} bytes)"
    return None


def check_filename(repo: str, name: str) -> None:
    """A repo file name must stay inside the repo folder on every OS, in names a file system takes."""
    if leaves_folder(name):
        raise HubError(f"{repo} lists a file named {shown(name)} that would leave the repo folder; refusing to pull it")
    if any(len(part.encode()) > NAME_MAX for part in name.split("/")):
        raise HubError(f"{repo} lists a file named {shown(name)}, longer than a file system allows "
                       f"({NAME_MAX} bytes); refusing to pull it")


def check_revision(repo: str, revision: str) -> None:
    """A revision names refs/<revision> in the repo's cache folder: a 40-hex commit sha, or a branch or
    tag name (`main`, `v1.0`, `refs/pr/1`) that stays in that folder; git's rules forbid `..` too."""
    if SHA1.match(revision):
        return
    if (leaves_folder(revision) or ".." in revision or len(revision) > NAME_MAX
            or re.search(r"[\s~^?*\[]", revision) or revision.endswith((".lock", "."))):
        raise UsageError(f"revision {shown(revision)} of {repo} is neither a commit sha nor a branch or tag name; "
                         "refusing to use it")


def check_commit(repo: str, commit) -> str:
    if not isinstance(commit, str) or not SHA1.match(commit):
        text = shown(commit) if isinstance(commit, str) else repr(commit)[:60]
        raise HubError(f"{repo}: the Hub named the commit {text}, which is not a 40-hex commit sha; refusing to pull it")
    return commit


def check_etag(repo: str, name: str, etag: str) -> None:
    if not _SAFE_ETAG.match(etag):
        raise HubError(f"{repo}: the Hub sent an ETag for {name} that is not a plain digest ({etag[:80]!r}); refusing to pull it")


def check_metadata(repo: str, name: str, commit: str, meta) -> None:
    """huggingface_hub's HfFileMetadata for one file, as the pull will use it: a plain ETag, the
    commit the model info named, a size that is a count of bytes."""
    if not meta.etag:
        raise HubError(f"{repo}: the Hub sent no ETag for {name}")
    check_etag(repo, name, meta.etag)
    if meta.commit_hash is not None and meta.commit_hash != commit:
        raise HubError(f"{repo}: the Hub named two commits ({commit} in its model info, "
                       f"{shown(meta.commit_hash, 40)} for {name}); refusing to pull it")
    if meta.size is not None and (not isinstance(meta.size, int) or meta.size < 0):
        raise HubError(f"{repo}: the Hub announced {meta.size!r} bytes for {name}; refusing to pull it")


def inside(path: Path, folder: Path) -> Path:
    """`path`, once resolved (`..` and links followed), under `folder` resolved: checked before
    anything is written there."""
    if not Path(os.path.realpath(path)).is_relative_to(Path(os.path.realpath(folder))):
        raise HubError(f"refusing to write {path}: it is not inside {folder}")
    return path


def needed_files(filenames: list[str], subfolder: str = "") -> list[str]:
    """Config, tokenizer and weight files at the top of the repo (or of `subfolder`, returned with its
    prefix); safetensors over .bin when a repo has both."""
    prefix = f"{subfolder.strip('/')}/" if subfolder else ""
    top = [f[len(prefix):] for f in filenames if f.startswith(prefix) and "/" not in f[len(prefix):]]
    safetensors = [f for f in top if f.endswith(".safetensors") and not f.startswith("consolidated")]
    if safetensors:
        weights = safetensors
        meta = META_FILES - {"pytorch_model.bin.index.json"}
    else:
        weights = [f for f in top if re.fullmatch(r"pytorch_model(-\d+-of-\d+)?\.bin", f)]
        meta = META_FILES - {"model.safetensors.index.json"}
    return sorted(prefix + f for f in set(weights) | {f for f in top if f in meta})


# ------------------------------------------------------------------------------------------ environment


def cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser()


def is_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def storage(repo: str) -> Path:
    """The repo's folder in the HF cache (models--ORG--NAME)."""
    return inside(cache_dir() / ("models--" + repo.replace("/", "--")), cache_dir())


def endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT
