# ruff: noqa: F811  (the fixtures come from test_hub; pytest passes them by name)
"""How one file comes down (eaglechat/models/hub_fetch.py), through huggingface_hub's public API against
the local Hub stand-in (tests/hubserver.py): the resumable HTTP path for plain files, hf_hub_download for
files the Hub announces in Xet storage, and the digest check on both."""

from __future__ import annotations

import pytest
from test_hub import _StopAfter, cli, fake_hub, tiny_folders  # noqa: F401  (fixtures)

from eaglechat.errors import Interrupted, WeightsError
from eaglechat.models import catalog, hub


@pytest.fixture
def no_private_download(monkeypatch):
    """huggingface_hub's private http_get must not be called, nor its chunk size rewritten."""
    from huggingface_hub import constants, file_download

    def refuse(*args, **kwargs):
        raise AssertionError("eaglechat called huggingface_hub.file_download.http_get")

    monkeypatch.setattr(file_download, "http_get", refuse)
    size = constants.DOWNLOAD_CHUNK_SIZE
    yield
    assert constants.DOWNLOAD_CHUNK_SIZE == size


@pytest.fixture
def xet(fake_hub, monkeypatch):
    """tiny/head-a in Xet storage; hf-xet's transfer replaced by the fake Hub's stand-in."""
    from huggingface_hub import file_download

    fake_hub.xet.add("tiny/head-a")
    monkeypatch.setattr(file_download, "xet_get", fake_hub.xet_get)
    return fake_hub


class Bytes(hub.Progress):
    def __init__(self):
        self.files: dict[str, int] = {}
        self.label = None
        self.lines: list[str] = []

    def status(self, message):
        self.lines.append(message)

    def file_start(self, label, total, initial):
        self.label = label
        self.files[label] = initial

    def file_advance(self, n):
        self.files[self.label] += n


def _partials(repo: str):
    return list((hub.cache_dir() / f"models--{repo.replace('/', '--')}" / "blobs").glob("*.incomplete"))


def test_resume_after_an_interrupted_transfer(fake_hub, tiny_folders, no_private_download):
    m = catalog.resolve("tiny-a")
    full = (tiny_folders["base"] / "model.safetensors").read_bytes()
    with pytest.raises(Interrupted, match="again to resume"):
        hub.pull(m, _StopAfter("model.safetensors", 100_000))
    (partial,) = _partials("tiny/base")
    kept = partial.stat().st_size
    assert 100_000 <= kept < len(full) and partial.read_bytes() == full[:kept]
    progress = Bytes()
    hub.pull(m, progress)  # a new run: only the rest is asked for, and the bar starts where the file stands
    assert fake_hub.bytes_served("tiny/base", "model.safetensors") == [None, f"bytes={kept}-"]
    assert progress.files["pulling base model.safetensors"] == len(full)
    base, _ = hub.local_paths(m)
    assert (base / "model.safetensors").read_bytes() == full and not _partials("tiny/base")


def test_a_checksum_mismatch_is_refused(fake_hub, no_private_download):
    repo = fake_hub.repos["tiny/head-a"]
    fake_hub.etags[("tiny/head-a", "model.safetensors")] = "0" * 64  # a sha256 the bytes do not have
    with pytest.raises(WeightsError, match="tiny/head-a/model.safetensors: digest mismatch"):
        hub.pull(catalog.resolve("tiny-a"))
    blobs = hub.cache_dir() / "models--tiny--head-a" / "blobs"
    assert not (blobs / ("0" * 64)).exists() and not _partials("tiny/head-a")
    assert hub.read_record("tiny-a") is None
    fake_hub.etags.clear()
    hub.pull(catalog.resolve("tiny-a"))
    _, head = hub.local_paths(catalog.resolve("tiny-a"))
    assert (head / "model.safetensors").read_bytes() == repo.files["model.safetensors"]


def test_a_partial_file_damaged_between_runs_is_refused(fake_hub, tiny_folders, no_private_download):
    """The resumed bytes are hashed with the kept ones: damage in the kept part is caught, not linked."""
    m = catalog.resolve("tiny-a")
    with pytest.raises(Interrupted):
        hub.pull(m, _StopAfter("model.safetensors", 100_000))
    (partial,) = _partials("tiny/base")
    data = bytearray(partial.read_bytes())
    data[10] ^= 0xFF
    partial.write_bytes(bytes(data))
    with pytest.raises(WeightsError, match="digest mismatch"):
        hub.pull(m)
    assert not _partials("tiny/base")
    hub.pull(m)  # and the next run starts over from zero
    assert fake_hub.bytes_served("tiny/base", "model.safetensors")[-1] is None
    base, _ = hub.local_paths(m)
    assert (base / "model.safetensors").read_bytes() == (tiny_folders["base"] / "model.safetensors").read_bytes()


def test_the_xet_path_is_used_when_the_hub_announces_it(xet, tiny_folders, no_private_download, capsys):
    progress = Bytes()
    hub.pull(catalog.resolve("tiny-a"), progress)
    assert xet.xet_calls == ["model.safetensors"]  # the head's weights; its config.json is a plain git file
    assert xet.bytes_served("tiny/head-a", "model.safetensors") == []  # not one byte over the CDN URL
    assert any(path.startswith("/cas/reconstructions/") for _, path, _ in xet.log)
    assert any("tiny/head-a@" in line and "1 from Xet storage" in line for line in progress.lines)
    size = (tiny_folders["head-a"] / "model.safetensors").stat().st_size
    assert progress.files["pulling head model.safetensors"] == size  # the Xet bytes reach eaglechat's bar
    _, head = hub.local_paths(catalog.resolve("tiny-a"))
    assert (head / "model.safetensors").read_bytes() == (tiny_folders["head-a"] / "model.safetensors").read_bytes()
    assert hub.read_record("tiny-a")["repos"][1]["files"][1]["etag"] == xet.repos["tiny/head-a"].etag("model.safetensors")
    assert cli("pull", "tiny-a") == 0  # cached: nothing moves the second time
    assert xet.xet_calls == ["model.safetensors"]


def test_a_xet_file_with_the_wrong_digest_is_refused_and_removed(xet, tiny_folders):
    good = xet.repos["tiny/head-a"].files["model.safetensors"]
    xet.xet_bodies[("tiny/head-a", "model.safetensors")] = good[:-4] + b"oops"  # right size, wrong bytes
    with pytest.raises(WeightsError, match="tiny/head-a/model.safetensors: digest mismatch"):
        hub.pull(catalog.resolve("tiny-a"))
    storage = hub.cache_dir() / "models--tiny--head-a"
    assert not (storage / "blobs" / xet.repos["tiny/head-a"].etag("model.safetensors")).exists()
    assert not list(storage.glob("snapshots/*/model.safetensors"))
    assert not [p for p in hub.cache_dir().rglob("*") if p.is_file() and p.read_bytes() == good[:-4] + b"oops"]
    xet.xet_bodies.clear()  # the next pull brings the right file
    hub.pull(catalog.resolve("tiny-a"))
    _, head = hub.local_paths(catalog.resolve("tiny-a"))
    assert (head / "model.safetensors").read_bytes() == good


def test_with_xet_turned_off_the_file_comes_over_resumable_http(xet, monkeypatch, no_private_download):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    hub.pull(catalog.resolve("tiny-a"))
    assert xet.xet_calls == [] and xet.bytes_served("tiny/head-a", "model.safetensors") == [None]


@pytest.mark.parametrize("error", ["RuntimeError", "XetAuthenticationError"])
def test_a_xet_failure_is_one_line(xet, monkeypatch, capsys, error):
    import hf_xet
    from huggingface_hub import file_download

    def broken(**kwargs):
        kind = RuntimeError if error == "RuntimeError" else hf_xet.XetAuthenticationError
        raise kind("Data processing error: CAS service error : Reqwest Error: timed out")

    monkeypatch.setattr(file_download, "xet_get", broken)
    assert cli("pull", "tiny-a") == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("eaglechat: error: the Xet download of tiny/head-a/model.safetensors failed (")
    assert "HF_HUB_DISABLE_XET=1" in line


def test_a_busy_answer_is_waited_out(fake_hub, tiny_folders, monkeypatch, no_private_download):
    """A 503 (or 429) is retried by huggingface_hub's own backoff, honouring its Retry-After."""
    from huggingface_hub.utils import _http

    monkeypatch.setattr(_http.time, "sleep", lambda s: None)
    fake_hub.fail_once[("tiny/base", "model.safetensors")] = 503
    hub.pull(catalog.resolve("tiny-a"))
    assert fake_hub.bytes_served("tiny/base", "model.safetensors") == [None, None]
    base, _ = hub.local_paths(catalog.resolve("tiny-a"))
    assert (base / "model.safetensors").read_bytes() == (tiny_folders["base"] / "model.safetensors").read_bytes()


def test_an_interrupted_xet_file_says_it_starts_again(xet):
    """No resume across runs for Xet through the public API: the message says so, and nothing is left
    behind that a rerun would mistake for progress."""
    with pytest.raises(Interrupted, match="a Xet download starts again from the beginning"):
        hub.pull(catalog.resolve("tiny-a"), _StopAfter("head model.safetensors", 1))
    assert not _partials("tiny/head-a")
    hub.pull(catalog.resolve("tiny-a"))
    assert xet.xet_calls == ["model.safetensors", "model.safetensors"]
