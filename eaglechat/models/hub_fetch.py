"""One file of a pull into the Hugging Face cache, through huggingface_hub's public API.

Two ways, chosen per file from what the Hub announced for it (get_hf_file_metadata's `xet_file_data`):
  Xet      hf_hub_download (hf-xet fetches the chunks; a tqdm_class carries its progress to ours), then
           the sha256 of the blob against the LFS ETag (xet checks its own chunk hashes, not that digest).
  HTTP     a GET through huggingface_hub's http_stream_backoff (its shared session: proxies, headers,
           redirects, rate-limit waits) into blobs/<etag>.incomplete: a rerun continues it with a Range
           request; the bytes are hashed as they are written (sha256 for LFS files, git's blob sha1 for
           small ones), and the file moves to blobs/<etag> only when the digest is the ETag.
What huggingface_hub's public API does not give (so eaglechat keeps its own HTTP path for plain files):
  - no resume across runs: hf_hub_download (2.x) writes each try to a fresh uuid-named temporary file
    and deletes it when the download fails (https://github.com/huggingface/huggingface_hub/pull/4228;
    the request for resuming is https://github.com/huggingface/huggingface_hub/issues/4196), so an
    interrupted Xet file starts again from zero on the next run (hf-xet's chunk cache, when enabled,
    spares some of the bytes; HF_HUB_DISABLE_XET=1 moves such files to the resumable HTTP path, up to
    the Hub's 50 GB per-file limit for plain HTTP);
  - no digest check: it checks a downloaded file's size, not its sha256 (hence the check after it);
  - no cancel hook: Ctrl-C reaches hf-xet (huggingface_hub aborts its session), but a KeyboardInterrupt
    raised from a progress callback is not guaranteed to stop a Xet transfer, so the TUI's cancel stops
    a Xet file at the next file boundary at the latest.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from eaglechat import __version__
from eaglechat.errors import HubError, Interrupted, WeightsError
from eaglechat.models.hub_checks import SHA1, SHA256, cache_dir, inside
from eaglechat.models.hub_errors import dropped, mapped
from eaglechat.units import fmt_bytes

_CHUNK = 8 * 1024 * 1024  # reading a file back to hash it
# bytes are written in pieces of huggingface_hub's DOWNLOAD_CHUNK_SIZE, at most this: a piece in flight is
# lost when the connection drops, so a link that drops every few hundred KB still progresses
_RESUME_GRAIN = 64 * 1024
_TRIES = 5  # answers in a row that bring no new byte before a download gives up
_RETRY_STATUS = (408, 429, 500, 502, 503, 504)


def download(name: str, rp, fp, storage: Path, progress) -> None:
    """Bring `fp` (a FilePlan of RepoPlan `rp`) into the cache: Xet when the Hub announced it and hf-xet is
    usable, else the resumable HTTP GET."""
    if fp.xet and xet_usable():
        _download_xet(name, rp, fp, storage, progress)
    else:
        _download_http(name, rp, fp, storage, progress)


# ------------------------------------------------------------------------------------------------ Xet


def xet_usable() -> bool:
    """hf-xet installed and not turned off (HF_HUB_DISABLE_XET): when huggingface_hub would use it."""
    import importlib.util

    from huggingface_hub import constants

    return not constants.HF_HUB_DISABLE_XET and importlib.util.find_spec("hf_xet") is not None


def _download_xet(name: str, rp, fp, storage: Path, progress) -> None:
    """hf_hub_download writes blobs/<etag> and the snapshot link itself; the digest is checked after."""
    from huggingface_hub import hf_hub_download

    where = f"{rp.repo}/{fp.filename}"
    inside((storage / "snapshots" / rp.commit / fp.filename).parent, storage)
    progress.file_start(f"pulling {rp.role} {fp.filename}", fp.size, 0)
    try:
        with mapped(name, rp.repo, rp.revision, fp.filename), _quiet_hub_logs():
            try:
                local = hf_hub_download(
                    rp.repo, fp.filename, revision=rp.commit, cache_dir=str(cache_dir()),
                    library_name="eaglechat", library_version=__version__, tqdm_class=_bar_class(progress),
                )
            except (RuntimeError, OSError) as exc:  # hf-xet raises RuntimeError and two OSErrors of its own
                if isinstance(exc, OSError) and type(exc).__module__ != "hf_xet":
                    raise  # a full disk, huggingface_hub's size check: map_error says them
                raise HubError(f"the Xet download of {where} failed ({str(exc)[:200]}); run 'eaglechat pull "
                               f"{name}' again, or set HF_HUB_DISABLE_XET=1 to pull it over plain HTTP") from None
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted while pulling {fp.filename} (a Xet download starts again from the "
                          f"beginning); run 'eaglechat pull {name}' again") from None
    finally:
        progress.file_end()
    _check_blob(name, where, Path(local), fp, storage)


def _check_blob(name: str, where: str, local: Path, fp, storage: Path) -> None:
    """The size and the digest of a file hf_hub_download placed; a bad one is removed, link and blob."""
    blob = storage / "blobs" / fp.etag
    real = Path(os.path.realpath(local))
    size = real.stat().st_size
    problem = None
    if fp.size is not None and size != fp.size:
        problem = f"has {size} bytes, expected {fp.size}"
    elif not digest_ok(real, fp.etag):
        problem = "digest mismatch, the file must be downloaded again"
    if problem:  # the link, the blob, and the copy in huggingface_hub's shared Xet store it may point to
        for path in (local, blob, real):
            if path == real and not real.is_relative_to(Path(os.path.realpath(cache_dir()))):
                continue
            path.unlink(missing_ok=True)
        raise WeightsError(f"{where}: {problem}; run 'eaglechat pull {name}'")


def _bar_class(progress):
    """A class hf_hub_download takes as `tqdm_class`, forwarding bytes written to `progress`. It has
    `update_transfer`, so huggingface_hub's Xet reporter draws one bar (bytes on disk) instead of two."""

    class _Bar:
        def __init__(self, *args, total=None, initial=0, **kwargs):
            self.n, self.total = initial, total

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n=1):
            if n:
                self.n += n
                progress.file_advance(int(n))

        def update_transfer(self, n=1):  # network bytes (after dedup): the written bytes are what we show
            pass

        def set_postfix_str(self, *args, **kwargs):
            pass

        set_transfer_postfix_str = set_postfix_str
        refresh = close = set_postfix_str

    return _Bar


class _quiet_hub_logs:
    """huggingface_hub logs its retries and fallbacks as warnings; during our pull the progress bar and
    the one error line say it, so hold them back (`--debug` shows them: HF_HUB_VERBOSITY=debug)."""

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


# ----------------------------------------------------------------------------------------------- HTTP


class RangeRefused(Exception):
    """The server answered 416 to a request for the rest of a partial file."""


class _TooLong(Exception):
    """The Hub sent more bytes than it announced for a file."""


class _Short(Exception):
    """An answer ended cleanly before the announced size."""


def _download_http(name: str, rp, fp, storage: Path, progress) -> None:
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    blob = inside(storage / "blobs" / fp.etag, storage)
    partial = inside(blob.with_name(f"{fp.etag}.incomplete"), storage)
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock = inside(cache_dir() / ".locks" / storage.name / f"{fp.etag}.lock", cache_dir())
    lock.parent.mkdir(parents=True, exist_ok=True)
    # httpx drops the Authorization header when the Hub redirects to its CDN (another origin)
    headers = build_hf_headers(library_name="eaglechat", library_version=__version__)
    headers["Accept-Encoding"] = "identity"  # the bytes of the file, as its digest and size count them
    with WeakFileLock(str(lock)), _quiet_hub_logs():
        if blob.exists():
            return
        resume = partial.stat().st_size if partial.exists() else 0
        if fp.size is not None and resume > fp.size:
            partial.unlink()
            resume = 0
        while True:
            try:
                out = _fetch(name, rp, fp, partial, resume, headers, progress)
                break
            except RangeRefused:
                # the partial cannot be continued (the file changed or is shorter than advertised):
                # discard it and start over once; a refusal of a download from zero is a Hub error
                if resume == 0:
                    got = partial.stat().st_size if partial.exists() else 0
                    partial.unlink(missing_ok=True)
                    raise HubError(
                        f"{rp.repo}/{fp.filename} arrived truncated ({fmt_bytes(got)} of {fmt_bytes(fp.size)}) "
                        f"and the Hub has no more of it; run 'eaglechat pull {name}' again later"
                    ) from None
                progress.status(f"the Hub would not resume {fp.filename}; downloading it again from the start")
                partial.unlink(missing_ok=True)
                resume = 0
        ok = out.hasher.hexdigest() == fp.etag if out.hasher is not None else digest_ok(partial, fp.etag)
        if not ok:
            partial.unlink(missing_ok=True)
            raise WeightsError(f"{rp.repo}/{fp.filename}: digest mismatch, the file must be downloaded again; "
                               f"run 'eaglechat pull {name}'")
        os.replace(partial, blob)


def _fetch(name: str, rp, fp, partial: Path, resume: int, headers: dict, progress) -> HashingWriter:
    """Append the rest of one file (from byte `resume`) to `partial`, hashing as it arrives."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError

    where = f"{rp.repo}/{fp.filename}"
    hasher = new_hasher(fp.etag, fp.size)
    if hasher is not None and resume:
        hash_file(hasher, partial)
    progress.file_start(f"pulling {rp.role} {fp.filename}", fp.size, resume)
    try:
        with mapped(name, rp.repo, rp.revision, fp.filename), open(partial, "ab") as f:
            out = HashingWriter(f, hasher, fp.size, fp.etag)
            try:
                _stream(fp.url, out, headers, progress)
            except _TooLong:
                f.close()
                partial.unlink(missing_ok=True)  # more bytes than announced: nothing in it can be trusted
                raise HubError(f"the Hub sent more bytes than it announced for {where} (over {fp.size}); the "
                               f"download was discarded, run 'eaglechat pull {name}' again later") from None
            except _Short:
                raise HubError(f"{where} arrived truncated; run 'eaglechat pull {name}' again to resume") from None
            except HfHubHTTPError as exc:
                if exc.response is not None and exc.response.status_code == 416:
                    raise RangeRefused() from exc
                raise
            except (httpx2.NetworkError, httpx2.TimeoutException, httpx2.RemoteProtocolError) as exc:
                raise dropped(name, where, fp.size, resume, f.tell(), exc) from exc
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted while pulling {fp.filename}; run 'eaglechat pull {name}' again to resume") from None
    finally:
        progress.file_end()
    return out


def _stream(url: str, out: HashingWriter, headers: dict, progress) -> None:
    """GET the file from byte out.tell() on, through huggingface_hub's session and its backoff (429 and
    5xx answers wait and retry, honouring Retry-After); a connection that drops mid-body is resumed with a
    Range request until _TRIES answers in a row bring no new byte."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.utils import hf_raise_for_status, http_stream_backoff

    grain = max(1, min(constants.DOWNLOAD_CHUNK_SIZE, _RESUME_GRAIN))
    fruitless = 0
    while True:
        start = out.tell()
        asked = {**headers, "Range": f"bytes={start}-"} if start else dict(headers)
        try:
            # retry_on_exceptions=(): a drop inside the body is ours to resume (from the bytes kept)
            with http_stream_backoff("GET", url, headers=asked, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
                                     retry_on_exceptions=(), retry_on_status_codes=_RETRY_STATUS) as response:
                hf_raise_for_status(response)
                if start and response.status_code != 206:  # the Range was ignored: the whole file again
                    out.restart()
                    progress.file_advance(-start)
                for piece in response.iter_bytes(grain):
                    out.write(piece)
                    progress.file_advance(len(piece))
        except (httpx2.NetworkError, httpx2.TimeoutException, httpx2.RemoteProtocolError):
            fruitless = 0 if out.tell() > start else fruitless + 1
            if fruitless >= _TRIES:
                raise
            time.sleep(1)
            continue
        if out.size is not None and out.tell() < out.size:
            raise _Short()
        return


class HashingWriter:
    """The partial file as the download sees it: bytes are hashed as they are written, so verifying a
    13 GB file needs no second read. No byte past the announced size is written (a Hub could stream
    without end)."""

    def __init__(self, f, hasher, size: int | None = None, etag: str = ""):
        self.f, self.hasher, self.size, self.etag = f, hasher, size, etag

    def write(self, data) -> int:
        if self.size is not None and self.f.tell() + len(data) > self.size:
            raise _TooLong()
        if self.hasher is not None:
            self.hasher.update(data)
        return self.f.write(data)

    def tell(self) -> int:
        return self.f.tell()

    def restart(self) -> None:
        """Back to an empty file (the server sent the whole file to a request for the rest)."""
        self.f.seek(0)
        self.f.truncate()
        self.hasher = new_hasher(self.etag, self.size)


def new_hasher(etag: str, size: int | None):
    """sha256 for LFS files (etag = sha256), git's blob sha1 for small ones; None for other etags."""
    if SHA256.match(etag):
        return hashlib.sha256()
    if SHA1.match(etag) and size is not None:
        h = hashlib.sha1()
        h.update(b"blob %d\0" % size)
        return h
    return None


def hash_file(h, path: Path) -> None:
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)


def digest_ok(path: Path, etag: str) -> bool:
    h = new_hasher(etag, path.stat().st_size)
    if h is None:
        return True  # an ETag that is no digest we know: the size check still applies
    hash_file(h, path)
    return h.hexdigest() == etag
