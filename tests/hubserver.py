"""A local stand-in for the Hugging Face Hub, enough of its HTTP API for the real huggingface_hub client.

Endpoints (what huggingface_hub 2.4 calls for model_info, get_hf_file_metadata, hf_hub_download and
list_repo_tree):
  GET  /api/models/{org}/{name}[/revision/{rev}][?blobs=true]   repo info: sha, gated, siblings
  GET  /api/models/{org}/{name}/tree/{rev}                      flat file listing
  HEAD /{org}/{name}/resolve/{rev}/{file}                       X-Repo-Commit, ETag (X-Linked-Etag for LFS), sizes
  GET  /{org}/{name}/resolve/{rev}/{file}                       body; honours `Range: bytes=N-` with a 206
  GET  /api/models/{org}/{name}/xet-read-token/{rev}            Xet connection info (X-Xet-Cas-Url, token)
  GET  /cas/reconstructions/{xet hash}                          a Xet file's bytes (the CAS stand-in)
Xet: a repo in `xet` announces its LFS files as Xet-backed, with the headers the real Hub sends and
huggingface_hub reads (X-Xet-Hash, and a `Link: <...xet-read-token...>; rel="xet-auth"`). hf-xet's own
transfer (a Rust client speaking the CAS protocol) is not run: `FakeHub.xet_get` stands in for
huggingface_hub.file_download.xet_get, the one edge a test replaces; it asks the token route and the
CAS stand-in above over HTTP, and reports progress through huggingface_hub's Xet progress reporter.
`xet_bodies` makes the CAS send other bytes (a corrupt reconstruction).
Subfolders: a file name with slashes (`compressed/config.json`) is served at its path, as on the Hub.
Faults on demand: `advertised` (metadata claims more bytes than the file has), `drop_once` (the
connection drops mid-body), `drop_every` (every answer hangs up after that many bytes: a bad link),
`refuse_range` (every Range answered 416), `ignore_range` (200 instead of 206), `etags` (a forged ETag),
`redirect_loop` (the CDN URL redirects to itself), `fail_once` (one error status, e.g. a 503 with Retry-After). Hostile answers: `any_revision` (any revision asked is
answered, `../../x` included), `commits` (the commit sha the model info names), `info_bodies` (the model
info's raw body: not JSON, a list), `redirects` (the CDN URL redirects to file://, ftp://, ...),
`extra_bytes` (the body streams that many bytes past the file, without a Content-Length; `sent` counts
what went out).
  LFS files (.safetensors, .bin) answer the resolve URL with a 302 to a "CDN" on another origin
  (http://localhost:PORT/cdn/..., the Hub being http://127.0.0.1:PORT), as the real Hub does; the CDN
  refuses any request that still carries an Authorization header (a leaked token).
Error answers carry the X-Error-Code header the client maps: RepoNotFound, RevisionNotFound,
EntryNotFound, GatedRepo (401 without a token, 403 with a token that is not approved).
Every request is logged (method, path, Range header) so tests can prove what moved.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".bin", ".pth", ".gguf")


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, bytes]
    commit: str
    gated: bool = False
    approved_tokens: set[str] = field(default_factory=set)

    def etag(self, name: str) -> str:
        data = self.files[name]
        if self.is_lfs(name):
            return hashlib.sha256(data).hexdigest()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

    @staticmethod
    def is_lfs(name: str) -> bool:
        return name.endswith(LFS_SUFFIXES)


class FakeHub:
    def __init__(self):
        self.repos: dict[str, FakeRepo] = {}
        self.log: list[tuple[str, str, str | None]] = []
        self.ignore_range = False  # answer Range requests with the whole file (some proxies do)
        self.refuse_range = False  # answer every Range request with 416 (a CDN whose object changed)
        self.advertised: dict[tuple[str, str], int] = {}  # (repo, file) -> size the metadata claims
        self.drop_once: dict[tuple[str, str], int] = {}  # (repo, file) -> bytes sent before the line drops
        self.drop_every: dict[tuple[str, str], int] = {}  # (repo, file) -> bytes per answer before each drop
        self.etags: dict[tuple[str, str], str] = {}  # (repo, file) -> the ETag the metadata claims
        self.redirect_loop: set[tuple[str, str]] = set()  # (repo, file) whose CDN URL redirects to itself
        self.any_revision = False  # answer every revision asked, as the repo's commit
        self.commits: dict[str, str] = {}  # repo -> the commit sha the model info names
        self.info_bodies: dict[str, bytes] = {}  # repo -> the model info's raw body
        self.redirects: dict[tuple[str, str], str] = {}  # (repo, file) -> where its CDN URL redirects
        self.extra_bytes: dict[tuple[str, str], int] = {}  # (repo, file) -> bytes streamed past the file
        self.sent: dict[tuple[str, str], int] = {}  # (repo, file) -> body bytes sent under extra_bytes
        self.fail_once: dict[tuple[str, str], int] = {}  # (repo, file) -> an error status its next GET gets
        self.xet: set[str] = set()  # repos whose LFS files are stored in Xet
        self.xet_bodies: dict[tuple[str, str], bytes] = {}  # (repo, file) -> what the CAS sends instead
        self.xet_calls: list[str] = []  # file names the xet_get stand-in fetched
        self.server: ThreadingHTTPServer | None = None

    # ----------------------------------------------------------------------------------- content
    def add_folder(self, repo_id: str, folder: Path, **kw) -> FakeRepo:
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}
        return self.add_repo(repo_id, files, **kw)

    def add_repo(self, repo_id: str, files: dict[str, bytes], *, gated: bool = False,
                 approved_tokens=(), commit: str | None = None) -> FakeRepo:
        commit = commit or hashlib.sha1(repo_id.encode() + b"".join(sorted(files.values()))).hexdigest()
        repo = FakeRepo(repo_id, dict(files), commit, gated, set(approved_tokens))
        self.repos[repo_id] = repo
        return repo

    def bytes_served(self, repo_id: str, filename: str) -> list[str | None]:
        """The Range headers of the GETs that fetched repo_id's `filename` (None = whole file)."""
        prefix = f"/cdn/{repo_id}/" if FakeRepo.is_lfs(filename) else f"/{repo_id}/resolve/"
        return [rng for method, path, rng in self.log
                if method == "GET" and path.startswith(prefix) and path.endswith("/" + filename)]

    @staticmethod
    def xet_hash(data: bytes) -> str:
        return hashlib.sha256(b"xet merkle " + data).hexdigest()  # not the sha256: a hash of its own

    def xet_file(self, xet_hash: str) -> tuple[FakeRepo, str] | None:
        for repo in self.repos.values():
            for name, data in repo.files.items():
                if repo.repo_id in self.xet and repo.is_lfs(name) and self.xet_hash(data) == xet_hash:
                    return repo, name
        return None

    def xet_get(self, *, incomplete_path, xet_file_data, headers, expected_size=None, displayed_filename=None,
                tqdm_class=None, _tqdm_bar=None):
        """Stands in for huggingface_hub.file_download.xet_get (hf-xet's transfer): the token route, then
        the file from the CAS stand-in, progress through huggingface_hub's own Xet progress reporter."""
        import logging
        from types import SimpleNamespace

        import httpx2
        from huggingface_hub.utils._xet_progress_reporting import XetDownloadProgressReporter

        auth = httpx2.get(xet_file_data.refresh_route, headers=headers)
        auth.raise_for_status()
        cas, token = auth.headers["X-Xet-Cas-Url"], auth.headers["X-Xet-Access-Token"]
        body = httpx2.get(f"{cas}/reconstructions/{xet_file_data.file_hash}", headers={"Authorization": f"Bearer {token}"})
        body.raise_for_status()
        self.xet_calls.append(displayed_filename)
        done = 0
        with XetDownloadProgressReporter(reconstruction_desc=f"{displayed_filename}: reconstructing file",
                                         total=expected_size, log_level=logging.WARNING, tqdm_class=tqdm_class) as bar, \
                open(incomplete_path, "wb") as f:
            for i in range(0, len(body.content), 50_000):
                piece = body.content[i:i + 50_000]
                f.write(piece)
                done += len(piece)
                bar.update_progress(SimpleNamespace(
                    total_bytes=expected_size, total_bytes_completed=done, total_bytes_completion_rate=None,
                    total_transfer_bytes_completed=done, total_transfer_bytes_completion_rate=None))

    # ------------------------------------------------------------------------------------ server
    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FakeHub":
        hub = self

        class Handler(_Handler):
            fake = hub

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


_API = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/(revision|tree)/([^/]+))?/?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_CDN = re.compile(r"^/cdn/([^/]+/[^/]+)/(.+)$")
_XET_TOKEN = re.compile(r"^/api/models/([^/]+/[^/]+)/xet-read-token/([^/]+)$")
_CAS = re.compile(r"^/cas/reconstructions/([0-9a-f]{64})$")


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub
    protocol_version = "HTTP/1.0"

    def log_message(self, *args):  # keep pytest output clean
        pass

    # ----------------------------------------------------------------------------------- helpers
    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head_only: bool = False):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head_only and body:
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass

    def _error(self, status: int, code: str, message: str, head_only=False):
        body = json.dumps({"error": message}).encode()
        self._send(status, body, {"X-Error-Code": code, "X-Error-Message": message,
                                  "Content-Type": "application/json"}, head_only)

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        return auth[7:] if auth.lower().startswith("bearer ") else None

    def _repo_rev(self, repo_id: str, rev: str | None, head_only=False):
        repo = self.fake.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found", head_only)
            return None
        if rev not in (None, "main", repo.commit) and not self.fake.any_revision:
            self._error(404, "RevisionNotFound", "Invalid rev id: " + rev, head_only)
            return None
        return repo

    # ---------------------------------------------------------------------------------- handlers
    def do_HEAD(self):
        self._handle(head_only=True)

    def do_GET(self):
        self._handle(head_only=False)

    def _handle(self, head_only: bool):
        path = unquote(urlparse(self.path).path)
        self.fake.log.append((self.command, path, self.headers.get("Range")))
        if m := _XET_TOKEN.match(path):
            return self._send(200, b"{}", {"X-Xet-Cas-Url": f"{self.fake.url}/cas", "X-Xet-Access-Token": "xet-token",
                                           "X-Xet-Token-Expiration": "4102444800", "Content-Type": "application/json"})
        if m := _CAS.match(path):
            return self._cas(m.group(1), head_only)
        if m := _API.match(path):
            repo = self._repo_rev(m.group(1), m.group(3), head_only)
            if repo is not None:
                self._api(repo, m.group(2), head_only)
            return
        if m := _CDN.match(path):
            repo = self.fake.repos.get(m.group(1))
            if self.headers.get("Authorization"):
                return self._send(400, b"token sent to the CDN", head_only=head_only)
            if repo is None or m.group(2) not in repo.files:
                return self._send(404, b"no such blob", head_only=head_only)
            if (repo.repo_id, m.group(2)) in self.fake.redirect_loop:
                return self._send(302, b"", {"Location": self.path}, head_only)
            if (where := self.fake.redirects.get((repo.repo_id, m.group(2)))) is not None:
                return self._send(302, b"", {"Location": where}, head_only)
            return self._body(repo, m.group(2), {"Content-Type": "application/octet-stream"}, head_only)
        if m := _RESOLVE.match(path):
            repo = self._repo_rev(m.group(1), m.group(2), head_only)
            if repo is not None:
                self._resolve(repo, m.group(3), head_only)
            return
        self._send(404, b"not found", head_only=head_only)

    def _cas(self, xet_hash: str, head_only: bool):
        found = self.fake.xet_file(xet_hash)
        if self.headers.get("Authorization") != "Bearer xet-token" or found is None:
            return self._send(401 if found else 404, b"no such reconstruction", head_only=head_only)
        repo, name = found
        body = self.fake.xet_bodies.get((repo.repo_id, name), repo.files[name])
        self._send(200, body, {"Content-Type": "application/octet-stream"}, head_only)

    def _api(self, repo: FakeRepo, kind: str | None, head_only: bool):
        if kind != "tree" and (raw := self.fake.info_bodies.get(repo.repo_id)) is not None:
            return self._send(200, raw, {"Content-Type": "application/json"}, head_only)
        if kind == "tree":
            body = [self._entry(repo, n) for n in sorted(repo.files)]
        else:
            body = {
                "id": repo.repo_id, "modelId": repo.repo_id, "sha": self.fake.commits.get(repo.repo_id, repo.commit),
                "private": False,
                "gated": "manual" if repo.gated else False, "disabled": False,
                "siblings": [
                    {"rfilename": n, "size": len(d), "blobId": FakeRepo.etag(repo, n) if not repo.is_lfs(n) else
                     hashlib.sha1(n.encode()).hexdigest(),
                     **({"lfs": {"size": len(d), "sha256": repo.etag(n), "pointerSize": 134}} if repo.is_lfs(n) else {})}
                    for n, d in sorted(repo.files.items())
                ],
            }
        self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head_only)

    @staticmethod
    def _entry(repo: FakeRepo, name: str) -> dict:
        d = repo.files[name]
        out = {"type": "file", "path": name, "size": len(d), "oid": hashlib.sha1(name.encode()).hexdigest()}
        if repo.is_lfs(name):
            out["lfs"] = {"oid": repo.etag(name), "size": len(d), "pointerSize": 134}
        return out

    def _resolve(self, repo: FakeRepo, filename: str, head_only: bool):
        if repo.gated:
            token = self._token()
            if token is None:
                return self._error(401, "GatedRepo", "Access to model is restricted. You must be authenticated.", head_only)
            if token not in repo.approved_tokens:
                return self._error(403, "GatedRepo", "Access to model is restricted and you are not in the authorized list.", head_only)
        if filename not in repo.files:
            return self._error(404, "EntryNotFound", "Entry not found", head_only)
        data = repo.files[filename]
        etag = self.fake.etags.get((repo.repo_id, filename), repo.etag(filename))
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if repo.is_lfs(filename):
            headers["X-Linked-Etag"] = f'"{etag}"'
            headers["X-Linked-Size"] = str(self.fake.advertised.get((repo.repo_id, filename), len(data)))
            port = self.server.server_address[1]
            headers["Location"] = f"http://localhost:{port}/cdn/{repo.repo_id}/{filename}?signature=abc"
            if repo.repo_id in self.fake.xet:  # as the Hub announces a Xet-backed file
                headers["X-Xet-Hash"] = self.fake.xet_hash(data)
                token = f"{self.fake.url}/api/models/{repo.repo_id}/xet-read-token/{repo.commit}"
                headers["Link"] = f'<{token}>; rel="xet-auth"'
            return self._send(302, b"", headers, head_only)
        self._body(repo, filename, headers, head_only)

    def _body(self, repo: FakeRepo, filename: str, headers: dict, head_only: bool):
        data = repo.files[filename]
        if not head_only and (status := self.fake.fail_once.pop((repo.repo_id, filename), None)) is not None:
            return self._send(status, b"busy", {"Retry-After": "0"})
        rng = None if self.fake.ignore_range else self.headers.get("Range")
        if rng and not head_only and self.fake.refuse_range:
            return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
        if not head_only and (cut := self.fake.drop_once.pop((repo.repo_id, filename), None)) is not None:
            # promise the whole file, send `cut` bytes, hang up: the client sees an incomplete body
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:cut])
            self.wfile.flush()
            self.close_connection = True
            return
        if not head_only and (extra := self.fake.extra_bytes.get((repo.repo_id, filename))) is not None:
            return self._stream_past(repo, filename, data, extra)
        start = 0
        if rng and not head_only and (m := re.match(r"bytes=(\d+)-(\d*)$", rng)):
            start = int(m.group(1))
        if not head_only and (cut := self.fake.drop_every.get((repo.repo_id, filename))) is not None \
                and len(data) - start > cut:
            # a link that drops every `cut` bytes: promise the rest, send `cut` of it, hang up
            rest = data[start:]
            self.send_response(206 if start else 200)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Content-Length", str(len(rest)))
            self.end_headers()
            self.wfile.write(rest[:cut])
            self.wfile.flush()
            self.close_connection = True
            return
        if rng and not head_only and (m := re.match(r"bytes=(\d+)-(\d*)$", rng)):
            start = int(m.group(1))
            end = int(m.group(2)) if m.group(2) else len(data) - 1
            if start >= len(data):
                return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            return self._send(206, data[start:end + 1], headers)
        headers["Content-Length"] = str(len(data))
        self._send(200, data, headers, head_only)

    def _stream_past(self, repo: FakeRepo, filename: str, data: bytes, extra: int):
        """The file, then `extra` more bytes, with no Content-Length (the body ends when the line closes)."""
        key = (repo.repo_id, filename)
        self.send_response(200)
        self.end_headers()
        self.close_connection = True
        self.fake.sent[key] = 0
        body, piece = data + b"\0" * min(extra, 1 << 20), b"\0" * (1 << 20)
        try:
            self.wfile.write(body)
            self.fake.sent[key] += len(body)
            while self.fake.sent[key] < len(data) + extra:
                self.wfile.write(piece)
                self.fake.sent[key] += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass
