"""Exceptions of a pull (huggingface_hub's, the network's, the disk's) as one-line eaglechat errors that
name the repo, the file and what to do next."""

from __future__ import annotations

import errno
import re

from eaglechat.errors import EaglechatError, HubError
from eaglechat.models.hub_checks import cache_dir, endpoint, shown
from eaglechat.units import fmt_bytes


class mapped:
    """Turns huggingface_hub / network / disk exceptions into one-line eaglechat errors."""

    def __init__(self, name: str, repo: str, revision: str, filename: str | None = None):
        self.name, self.repo, self.rev, self.file = name, repo, revision, filename

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, (EaglechatError, KeyboardInterrupt)):
            return False
        found = map_error(exc, self.name, self.repo, self.rev, self.file)
        if found is None:
            return False
        raise found from exc


def map_error(exc: BaseException, name: str, repo: str, revision: str, filename: str | None = None):
    import httpx2
    from huggingface_hub import errors as e

    where = f"{repo}/{filename}" if filename else repo
    page = f"{endpoint()}/{repo}"
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
            f"cannot reach the Hub at {endpoint()} ({type(exc).__name__}); check the connection and "
            f"run 'eaglechat pull {name}' again"
        )
    if isinstance(exc, httpx2.UnsupportedProtocol):  # a redirect to file://, ftp://, ...
        url = _request_url(exc)
        return HubError(f"the Hub's answer for {where} redirects to {shown(url, 80)}, which is not an http(s) "
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


def dropped(name: str, where: str, size: int | None, start: int, kept: int, exc: Exception) -> HubError:
    """The truth about a download the connection kept dropping: what this run gained, what is kept."""
    of = f" of {fmt_bytes(size)}" if size is not None else ""
    if kept > start:
        return HubError(f"the connection dropped while pulling {where} ({type(exc).__name__}); {fmt_bytes(kept)}{of} "
                        f"are kept, run 'eaglechat pull {name}' again to resume")
    return HubError(f"the connection to {endpoint()} dropped repeatedly while pulling {where} before any new byte "
                    f"arrived ({type(exc).__name__}; {fmt_bytes(kept)}{of} kept); check the connection and try again")
