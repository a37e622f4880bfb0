"""Pulls through the real huggingface_hub client against a local Hub stand-in (tests/hubserver.py)."""

from __future__ import annotations

import argparse
import errno
import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from hubserver import FakeHub

from eaglechat.errors import EaglechatError, HubError, Interrupted, ModelNotFound
from eaglechat.fit import profiles
from eaglechat.models import catalog, hub, pairs
from eaglechat.units import fmt_bytes

GOOD_TOKEN = "hf_good_token"


# ------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory):
    """A tiny Llama base (safetensors and a .bin copy, extras to skip) and two EAGLE-1 heads."""
    from safetensors.torch import load_file
    from tiny_models import random_head, tiny_model

    from eaglechat.engine.heads import save_head

    root = tmp_path_factory.mktemp("tiny")
    model = tiny_model("llama")
    base = root / "base"
    model.save_pretrained(base)
    state = load_file(base / "model.safetensors")
    torch.save(state, base / "pytorch_model.bin")  # both formats: only safetensors must come down
    (base / "README.md").write_text("# tiny\n")
    (base / "original").mkdir()
    (base / "original" / "consolidated.pth").write_bytes(b"x" * 1000)
    head_a = root / "head-a"
    save_head(random_head(model, seed=1), head_a)
    head_b = root / "head-b"  # official EAGLE-1 style: pytorch_model.bin only
    save_head(random_head(model, seed=2), head_b)
    torch.save(load_file(head_b / "model.safetensors"), head_b / "pytorch_model.bin")
    (head_b / "model.safetensors").unlink()
    return {"base": base, "head-a": head_a, "head-b": head_b, "config": model.config}


def _manifest(name, base, head, *, gated=False, config=None):
    from eaglechat.fit.memory import ModelShape

    shape = ModelShape.from_hf_config(config)
    base_repo, _, base_rev = base.partition("@")
    return {
        "name": name, "description": "tiny test pair",
        "base": {"repo": base_repo, "revision": base_rev or "main"}, "head": {"repo": head, "revision": "main"},
        "head_kind": "eagle2", "template": "tokenizer", "stop_tokens": [], "dtype": "float32", "gated": gated,
        "license": "apache-2.0", "approx_size_gb": {"base": 0.001, "head": 0.001}, "shape": dict(shape.__dict__),
    }


@pytest.fixture
def fake_hub(tmp_path, monkeypatch, tiny_folders):
    from huggingface_hub import constants

    fake = FakeHub()
    fake.add_folder("tiny/base", tiny_folders["base"])
    fake.add_folder("tiny/head-a", tiny_folders["head-a"])
    fake.add_folder("tiny/head-b", tiny_folders["head-b"])
    fake.add_folder("gated/base", tiny_folders["base"], gated=True, approved_tokens={GOOD_TOKEN})
    fake.start()
    hf_home = tmp_path / "hf"
    for key, value in {
        "ENDPOINT": fake.url,
        "HUGGINGFACE_CO_URL_TEMPLATE": fake.url + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HUB_OFFLINE": False,
        "HF_HOME": str(hf_home),
        "HF_HUB_CACHE": str(hf_home / "hub"),
        "HF_TOKEN_PATH": str(hf_home / "token"),
        "HF_STORED_TOKENS_PATH": str(hf_home / "stored_tokens"),
    }.items():
        monkeypatch.setattr(constants, key, value)  # huggingface_hub reads these at import time
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "ec"))
    from eaglechat.commands import pull

    monkeypatch.setattr(pull.ConsoleProgress, "min_bar_bytes", 0)  # tiny files get their bars too
    cat = tmp_path / "catalog"
    cat.mkdir()
    cfg = tiny_folders["config"]
    manifests = [
        _manifest("tiny-a", "tiny/base", "tiny/head-a", config=cfg),
        _manifest("tiny-b", "tiny/base", "tiny/head-b", config=cfg),
        _manifest("tiny-gated", "gated/base", "tiny/head-a", gated=True, config=cfg),
        _manifest("tiny-missing", "tiny/nothing-here", "tiny/head-a", config=cfg),
        _manifest("tiny-badrev", "tiny/base@v9", "tiny/head-a", config=cfg),
    ]
    for m in manifests:
        (cat / f"{m['name']}.yaml").write_text(yaml.safe_dump(m))
    monkeypatch.setenv("EAGLECHAT_CATALOG", str(cat))
    yield fake
    fake.stop()


def cli(*argv) -> int:
    """The models verbs exactly as eaglechat.cli dispatches them (errors as one line, exit code)."""
    from eaglechat.commands import list as list_
    from eaglechat.commands import pull, rm, show

    parser = argparse.ArgumentParser(prog="eaglechat")
    sub = parser.add_subparsers(dest="command")
    for verb in (pull, list_, rm, show):
        verb.register(sub)
    args = parser.parse_args(list(argv))
    try:
        return args.func(args)
    except EaglechatError as exc:
        print(f"eaglechat: error: {exc}", file=__import__("sys").stderr)
        return exc.exit_code


def _downloads(fake: FakeHub) -> list[str]:
    return [path for method, path, _ in fake.log if method == "GET" and "/resolve/" in path]


# ---------------------------------------------------------------------------------------------- pulls


def test_full_pull(fake_hub, tiny_folders, capsys):
    assert cli("pull", "tiny-a") == 0
    err = capsys.readouterr().err
    for phase in ("resolving tiny-a", "pre-flight:", "to download", "pulling base model.safetensors",
                  "verifying base", "writing record", "success"):
        assert phase in err
    m = catalog.resolve("tiny-a")
    base, head = hub.local_paths(m)
    assert sorted(p.name for p in base.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    assert sorted(p.name for p in head.iterdir()) == ["config.json", "model.safetensors"]
    for name in ("config.json", "model.safetensors"):
        assert (base / name).read_bytes() == (tiny_folders["base"] / name).read_bytes()
        assert (head / name).read_bytes() == (tiny_folders["head-a"] / name).read_bytes()
    assert base.parent.parent.parent == hub.cache_dir()  # the standard HF cache layout
    assert (base.parent.parent / "refs" / "main").read_text() == base.name
    assert not any("pytorch_model.bin" in p or "README" in p or "original/" in p for p in _downloads(fake_hub))
    record = hub.read_record("tiny-a")
    assert [r["role"] for r in record["repos"]] == ["base", "head"]
    assert record["repos"][0]["commit"] == fake_hub.repos["tiny/base"].commit
    # the pulled pair loads: base through transformers, head through eaglechat's strict loader
    from transformers import AutoModelForCausalLM

    from eaglechat.engine.heads import load_head

    model = AutoModelForCausalLM.from_pretrained(base)
    load_head(head, model)


def test_second_pull_moves_no_bytes(fake_hub, capsys):
    assert cli("pull", "tiny-a") == 0
    before = len(_downloads(fake_hub))
    assert cli("pull", "tiny-a") == 0
    assert len(_downloads(fake_hub)) == before
    assert "0 B to download" in capsys.readouterr().err


def test_update_drops_the_old_revision(fake_hub, tiny_folders, capsys):
    assert cli("pull", "tiny-a") == 0
    old = fake_hub.repos["tiny/head-a"].commit
    files = dict(fake_hub.repos["tiny/head-a"].files)
    files["config.json"] = files["config.json"].replace(b"{", b'{"note": "v2", ', 1)
    fake_hub.add_repo("tiny/head-a", files, commit="b" * 40)  # main moved upstream
    capsys.readouterr()
    assert cli("pull", "tiny-a") == 0
    err = capsys.readouterr().err
    assert f"removing unused revisions: tiny/head-a@{old[:12]}" in err
    assert _snapshots("tiny/head-a") == ["b" * 40]
    assert len(_snapshots("tiny/base")) == 1
    _, head = hub.local_paths(catalog.resolve("tiny-a"))
    assert b'"note": "v2"' in (head / "config.json").read_bytes()


def test_bin_only_head_and_free_form(fake_hub, capsys):
    assert cli("pull", "base=tiny/base,head=tiny/head-b") == 0
    base, head = hub.local_paths(catalog.resolve("base=tiny/base@main,head=tiny/head-b"))
    assert sorted(p.name for p in head.iterdir()) == ["config.json", "pytorch_model.bin"]
    capsys.readouterr()
    assert cli("list", "--json") == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["base=tiny/base@main,head=tiny/head-b@main"]["status"] == "pulled"


def test_dry_run_moves_no_bytes(fake_hub, capsys):
    assert cli("pull", "tiny-a", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "tiny/base/model.safetensors" in out and "to download" in out
    assert _downloads(fake_hub) == []


class _StopAfter(hub.Progress):
    """Presses Ctrl-C once `limit` bytes of one file have arrived."""

    def __init__(self, filename, limit):
        self.filename, self.limit, self.seen, self.active = filename, limit, 0, False

    def file_start(self, label, total, initial):
        self.active = label.endswith(self.filename)

    def file_advance(self, n):
        if self.active:
            self.seen += n
            if self.seen >= self.limit:
                raise KeyboardInterrupt


def test_resume_after_interruption_mid_file(fake_hub, tiny_folders, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 16 * 1024)
    m = catalog.resolve("tiny-a")
    full = (tiny_folders["base"] / "model.safetensors").stat().st_size
    assert full > 64 * 1024
    with pytest.raises(Interrupted, match=r"run 'eaglechat pull tiny-a' again to resume"):
        hub.pull(m, _StopAfter("model.safetensors", 32 * 1024))
    partials = list((hub.cache_dir() / "models--tiny--base" / "blobs").glob("*.incomplete"))
    assert len(partials) == 1
    kept = partials[0].stat().st_size
    assert 0 < kept < full
    with pytest.raises(ModelNotFound):
        hub.local_paths(m)
    assert cli("list", "--json") == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["tiny-a"]["status"] == "partial"
    # the rerun asks only for the rest of the file
    assert cli("pull", "tiny-a") == 0
    assert fake_hub.bytes_served("tiny/base", "model.safetensors") == [None, f"bytes={kept}-"]
    base, _ = hub.local_paths(m)
    assert (base / "model.safetensors").read_bytes() == (tiny_folders["base"] / "model.safetensors").read_bytes()
    assert not list((hub.cache_dir() / "models--tiny--base" / "blobs").glob("*.incomplete"))


def test_resume_when_the_server_ignores_range(fake_hub, tiny_folders, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 16 * 1024)
    m = catalog.resolve("tiny-a")
    with pytest.raises(Interrupted):
        hub.pull(m, _StopAfter("model.safetensors", 32 * 1024))
    fake_hub.ignore_range = True  # the whole file comes again: the partial is rewound, then verified
    hub.pull(m)
    base, _ = hub.local_paths(m)
    assert (base / "model.safetensors").read_bytes() == (tiny_folders["base"] / "model.safetensors").read_bytes()


def test_interrupt_through_the_cli_is_one_line(fake_hub, monkeypatch, capsys):
    from eaglechat.commands import pull

    monkeypatch.setattr(pull.ConsoleProgress, "file_advance", lambda self, n: (_ for _ in ()).throw(KeyboardInterrupt))
    assert cli("pull", "tiny-a") == 130
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("eaglechat: error: interrupted while pulling")
    assert lines[-1].endswith("run 'eaglechat pull tiny-a' again to resume")


def test_corrupt_download_is_refused(fake_hub, tiny_folders):
    repo = fake_hub.repos["tiny/head-a"]
    good = repo.files["model.safetensors"]
    etag = repo.etag("model.safetensors")
    repo.files["model.safetensors"] = good[:-4] + b"oops"  # same size, wrong bytes
    repo.etag = lambda name, _orig=repo.etag: etag if name == "model.safetensors" else _orig(name)
    with pytest.raises(EaglechatError, match="digest mismatch"):
        hub.pull(catalog.resolve("tiny-a"))
    assert not (hub.cache_dir() / "models--tiny--head-a" / "blobs" / etag).exists()


# ---------------------------------------------------------------------------------------------- errors


def test_gated_without_login_is_401(fake_hub, capsys):
    assert cli("pull", "tiny-gated") == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("eaglechat: error: ")
    assert "gated/base is gated. Accept the licence at" in err and "hf auth login" in err
    assert _downloads(fake_hub) == []


def test_gated_not_approved_is_403(fake_hub, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_not_approved")
    assert cli("pull", "tiny-gated") == 1
    err = capsys.readouterr().err.strip()
    assert "not on its authorised list" in err and "vicuna-7b-eagle2" in err
    assert _downloads(fake_hub) == []


def test_gated_with_access_pulls(fake_hub, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    assert cli("pull", "tiny-gated") == 0
    assert "gated: access granted" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name, message",
    [
        ("tiny-missing", "repository tiny/nothing-here was not found on the Hub"),
        ("tiny-badrev", "revision 'v9' of tiny/base was not found on the Hub"),
        ("tiny-c", "unknown model 'tiny-c'; did you mean 'tiny-b' or 'tiny-a'"),
    ],
)
def test_not_found(fake_hub, capsys, name, message):
    assert cli("pull", name) != 0
    err = capsys.readouterr().err.strip().splitlines()[-1]  # status lines first, then the one error line
    assert err.startswith("eaglechat: error: ") and message in err


def test_unreachable_hub(fake_hub, capsys):
    fake_hub.stop()
    assert cli("pull", "tiny-a") == 1
    assert "cannot reach the Hub" in capsys.readouterr().err


def test_offline(fake_hub, monkeypatch, capsys):
    from huggingface_hub import constants

    assert cli("pull", "tiny-a") == 0
    fake_hub.stop()  # nothing may go over the network now
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    capsys.readouterr()
    assert cli("pull", "tiny-a") == 0
    assert "already pulled" in capsys.readouterr().err
    hub.local_paths(catalog.resolve("tiny-a"))
    assert cli("pull", "tiny-b") == 1
    assert "tiny-b is not downloaded and the Hub is off (HF_HUB_OFFLINE=1)" in capsys.readouterr().err
    with pytest.raises(ModelNotFound, match=r"^model tiny-b is not pulled; run: eaglechat pull tiny-b$"):
        hub.local_paths(catalog.resolve("tiny-b"))


def test_not_enough_disk_stops_before_bytes_move(fake_hub, monkeypatch, capsys):
    monkeypatch.setattr(hub, "_free_bytes", lambda folder: 1024)
    assert cli("pull", "tiny-a") == 1
    assert "not enough disk space for tiny-a" in capsys.readouterr().err
    assert _downloads(fake_hub) == []


def test_disk_full_while_writing_maps_to_one_line():
    err = hub.map_error(OSError(errno.ENOSPC, "No space left on device"), "tiny-a", "tiny/base", "main", "model.safetensors")
    assert isinstance(err, HubError)
    assert "disk full while writing tiny/base/model.safetensors" in str(err) and "again to resume" in str(err)


def test_needed_files():
    assert hub.needed_files(["config.json", "model.safetensors", "pytorch_model.bin", "README.md", "tokenizer.json"]) == [
        "config.json", "model.safetensors", "tokenizer.json"]
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json",
              "pytorch_model-00001-of-00002.bin", "pytorch_model.bin.index.json", "config.json", "original/params.json",
              "consolidated.safetensors"]
    assert hub.needed_files(shards) == ["config.json", *shards[:3]]
    assert hub.needed_files(["config.json", "pytorch_model.bin", "tokenizer.model", "flax_model.msgpack"]) == [
        "config.json", "pytorch_model.bin", "tokenizer.model"]


# ------------------------------------------------------------------------------------------ rm / list / show


def _snapshots(repo):
    folder = hub.cache_dir() / f"models--{repo.replace('/', '--')}" / "snapshots"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_rm_counts_references(fake_hub, tiny_folders, capsys):
    assert cli("pull", "tiny-a") == 0 and cli("pull", "tiny-b") == 0
    capsys.readouterr()
    assert cli("rm", "tiny-a") == 0
    out = capsys.readouterr().out
    head_size = sum(p.stat().st_size for p in tiny_folders["head-a"].iterdir())
    assert out.startswith(f"deleted 'tiny-a' ({fmt_bytes(head_size)} freed)")
    assert "kept tiny/base@" in out and "(used by tiny-b)" in out
    assert _snapshots("tiny/base") and not _snapshots("tiny/head-a")
    hub.local_paths(catalog.resolve("tiny-b"))  # still complete
    with pytest.raises(ModelNotFound):
        hub.local_paths(catalog.resolve("tiny-a"))
    assert cli("rm", "tiny-b") == 0
    out = capsys.readouterr().out
    freed = sum((tiny_folders["base"] / n).stat().st_size
                for n in ("config.json", "generation_config.json", "model.safetensors"))
    freed += sum(p.stat().st_size for p in tiny_folders["head-b"].iterdir())
    assert out.startswith(f"deleted 'tiny-b' ({fmt_bytes(freed)} freed)") and "kept" not in out
    assert not _snapshots("tiny/base") and not _snapshots("tiny/head-b")
    assert hub.all_records() == []
    assert cli("rm", "tiny-b") == 1
    assert "model tiny-b is not pulled" in capsys.readouterr().err


LIST_KEYS = {"name": str, "id": (str, type(None)), "status": str, "pulled": bool, "size_bytes": int,
             "approx_size_gb": float, "format": (str, type(None)), "modified": (str, type(None)),
             "base": str, "head": str, "head_kind": str, "gated": bool, "legacy": bool}


def test_list_json_schema(fake_hub, capsys):
    assert cli("pull", "tiny-a") == 0
    capsys.readouterr()
    assert cli("list", "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["tiny-a", "tiny-b", "tiny-badrev", "tiny-gated", "tiny-missing"]
    for row in rows:
        assert set(row) == set(LIST_KEYS)
        for key, kind in LIST_KEYS.items():
            assert isinstance(row[key], kind), (key, row[key])
        assert row["status"] in ("pulled", "partial", "not pulled", "embedded")
    a, b = rows[0], rows[1]
    assert a["pulled"] and a["status"] == "pulled" and a["size_bytes"] > 0 and a["modified"].endswith("Z")
    assert a["id"] == fake_hub.repos["tiny/base"].commit[:12]
    assert not b["pulled"] and b["status"] == "partial"  # shares the pulled base, lacks its head
    assert cli("list") == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["NAME", "ID", "SIZE", "STATUS", "FORMAT", "MODIFIED"]


def test_show_json_schema(fake_hub, capsys):
    assert cli("pull", "tiny-a") == 0
    capsys.readouterr()
    assert cli("show", "tiny-a", "--json") == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d) == {"name", "description", "source", "base", "head", "parameters", "context_length", "shape",
                      "template", "system", "stop_tokens", "dtype", "gated", "license", "approx_size_gb", "status",
                      "size_bytes", "profile", "format", "alternative_heads", "pinned", "legacy", "sources", "sampling"}
    assert set(d["base"]) == {"repo", "revision", "commit", "package", "path"}
    assert set(d["head"]) == {"repo", "revision", "commit", "kind", "path", "draft_vocab", "why"}
    assert d["base"]["commit"] == fake_hub.repos["tiny/base"].commit
    assert Path(d["head"]["path"]).is_dir() and d["head"]["kind"] == "eagle2"
    assert d["status"] == "pulled" and d["context_length"] == 512
    from transformers import AutoModelForCausalLM  # the count of the weights that came down
    assert d["parameters"] == AutoModelForCausalLM.from_pretrained(d["base"]["path"]).num_parameters()
    assert cli("show", "tiny-a") == 0
    text = capsys.readouterr().out
    for label in ("Model", "base", "head kind", "parameters", "context length", "template", "This machine", "profile", "License"):
        assert label in text


def test_show_and_list_of_the_shipped_catalog(monkeypatch, capsys):
    from eaglechat.fit import hardware

    monkeypatch.delenv("EAGLECHAT_CATALOG", raising=False)
    # this machine is a 12 GB card, whatever runs the test
    monkeypatch.setattr(hardware, "probe", lambda device=None: hardware.fake_gpu("12"))
    assert cli("show", "vicuna-7b-eagle2", "--json") == 0
    d = json.loads(capsys.readouterr().out)
    assert d["base"]["repo"] == "lmsys/vicuna-7b-v1.3" and d["status"] == "not pulled"
    # fp16 Vicuna-7B needs ~15.7 GiB at 2k context: the 12 GB class loads it as nf4 (faster than int8)
    assert d["profile"] == "gpu-12gb" and d["format"] == "nf4-dq"
    assert cli("show", "smollm2-135m-eagle2", "--json") == 0
    d = json.loads(capsys.readouterr().out)
    assert d["source"] == "embedded" and d["head"]["path"].endswith("models/smollm2-135m-eagle2")
    assert cli("rm", "smollm2-135m-eagle2") == 2
    assert cli("show", "vicuna-7b-eagle2", "--profile", "--json") == 0
    prof = json.loads(capsys.readouterr().out)
    shipped = yaml.safe_load((profiles.SHIPPED_DIR / "gpu-12gb.yaml").read_text())
    assert prof["name"] == "gpu-12gb" and prof["resolved"]["model"] == "vicuna-7b-eagle2"
    for quant, tree in shipped["tree"].items():  # a 32k vocabulary: no large-vocab depth cut
        assert prof["resolved"]["tree"][quant] == {**tree, "kind": "dynamic"}
    # the same verbs through the real entry point (`eaglechat list --json`)
    from eaglechat import cli as main_cli

    assert main_cli.main(["list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["smollm2-135m-eagle2"]["status"] == "embedded"
    assert rows["vicuna-7b-eagle2"]["status"] == "not pulled" and rows["vicuna-7b-eagle2"]["gated"] is False
    assert main_cli.main(["show", "vicuna7b-eagle2"]) == 1
    assert "did you mean 'vicuna-7b-eagle2'" in capsys.readouterr().err


def test_pulled_tiny_pair_runs(fake_hub, tmp_path, capsys):
    """A pulled pair goes through `eaglechat run` (the real entry point and engine), by alias."""
    import tiny_models
    from transformers import AutoConfig

    from eaglechat import cli as main_cli

    base_dir, head_dir = tiny_models.save_tiny_pair(tmp_path / "pair")
    fake_hub.add_folder("tiny/chat-base", base_dir)
    fake_hub.add_folder("tiny/chat-head", head_dir)
    manifest = _manifest("tiny-chat", "tiny/chat-base", "tiny/chat-head", config=AutoConfig.from_pretrained(base_dir))
    (Path(os.environ["EAGLECHAT_CATALOG"]) / "tiny-chat.yaml").write_text(yaml.safe_dump(manifest))
    assert main_cli.main(["pull", "tiny-chat"]) == 0
    capsys.readouterr()
    outs = []
    for extra in ([], ["--no-speculate"]):
        argv = ["run", "tiny-chat", "Hello", "--max-new-tokens", "8", "--temperature", "0", "--json", *extra]
        assert main_cli.main(argv) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0]["stats"]["new_tokens"] == len(outs[0]["token_ids"]) >= 1
    assert outs[0]["token_ids"] == outs[1]["token_ids"]  # greedy EAGLE emits what plain decoding emits


def test_progress_bars_can_be_disabled(fake_hub, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_PROGRESS_BARS", True)
    assert cli("pull", "tiny-a") == 0
    err = capsys.readouterr().err
    assert "pulling base model.safetensors (" in err and "▕" not in err


# ------------------------------------------------------------------- truncation, refused resumes, rm partial


def test_a_file_shorter_than_advertised_does_not_loop_on_416(fake_hub, tiny_folders, capsys):
    repo = fake_hub.repos["tiny/head-a"]
    good = repo.files["model.safetensors"]
    repo.files["model.safetensors"] = good[:-1000]  # the Hub has less than its metadata says
    fake_hub.advertised[("tiny/head-a", "model.safetensors")] = len(good)
    assert cli("pull", "tiny-a") == 1
    first = capsys.readouterr().err.strip().splitlines()[-1]
    assert "arrived truncated" in first
    assert cli("pull", "tiny-a") == 1  # the resume is refused (416): it starts over instead of failing on 416
    second = capsys.readouterr().err.strip().splitlines()
    assert "416" not in second[-1] and "arrived truncated" in second[-1]
    assert any("downloading it again from the start" in line for line in second)
    short = len(good) - 1000
    assert fake_hub.bytes_served("tiny/head-a", "model.safetensors") == [None, f"bytes={short}-", None]
    # once the Hub serves the whole file, the pull completes
    repo.files["model.safetensors"] = good
    fake_hub.advertised.clear()
    assert cli("pull", "tiny-a") == 0
    _, head = hub.local_paths(catalog.resolve("tiny-a"))
    assert (head / "model.safetensors").read_bytes() == good


def test_a_refused_resume_starts_from_zero(fake_hub, tiny_folders, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 16 * 1024)
    m = catalog.resolve("tiny-a")
    with pytest.raises(Interrupted):
        hub.pull(m, _StopAfter("model.safetensors", 32 * 1024))
    kept = next((hub.cache_dir() / "models--tiny--base" / "blobs").glob("*.incomplete")).stat().st_size
    fake_hub.refuse_range = True
    assert cli("pull", "tiny-a") == 0
    assert fake_hub.bytes_served("tiny/base", "model.safetensors") == [None, f"bytes={kept}-", None]
    base, _ = hub.local_paths(m)
    assert (base / "model.safetensors").read_bytes() == (tiny_folders["base"] / "model.safetensors").read_bytes()


def test_rm_reclaims_an_interrupted_pull(fake_hub, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 16 * 1024)
    with pytest.raises(Interrupted):
        hub.pull(catalog.resolve("tiny-a"), _StopAfter("model.safetensors", 32 * 1024))
    blobs = hub.cache_dir() / "models--tiny--base" / "blobs"
    (partial,) = blobs.glob("*.incomplete")
    size = partial.stat().st_size
    assert cli("list", "--json") == 0
    assert {r["name"]: r for r in json.loads(capsys.readouterr().out)}["tiny-a"]["status"] == "partial"
    assert cli("rm", "tiny-a") == 0
    assert capsys.readouterr().out.startswith(f"deleted 'tiny-a' ({fmt_bytes(size)} freed)")
    assert not list(blobs.glob("*.incomplete"))
    assert cli("list", "--json") == 0
    row = {r["name"]: r for r in json.loads(capsys.readouterr().out)}["tiny-a"]
    assert row["status"] == "not pulled" and row["size_bytes"] == 0
    assert cli("rm", "tiny-a") == 1
    assert "model tiny-a is not pulled" in capsys.readouterr().err


def test_huggingface_hub_retry_chatter_stays_quiet(fake_hub, tiny_folders, monkeypatch):
    """A dropped connection is resumed by huggingface_hub itself; its "Trying to resume download..."
    warning must not reach the user beside eaglechat's own bar and line."""
    import logging

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 4000)  # bytes before the drop reach the file
    _no_retry_pause(monkeypatch)

    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Collect(level=logging.WARNING)
    logging.getLogger("huggingface_hub").addHandler(handler)
    try:
        fake_hub.drop_once[("tiny/base", "model.safetensors")] = 20_000
        hub.pull(catalog.resolve("tiny-a"))
    finally:
        logging.getLogger("huggingface_hub").removeHandler(handler)
    served = fake_hub.bytes_served("tiny/base", "model.safetensors")
    assert served == [None, "bytes=20000-"]  # the drop happened and was resumed
    assert [r.getMessage() for r in records] == []
    base, _ = hub.local_paths(catalog.resolve("tiny-a"))
    assert (base / "model.safetensors").read_bytes() == (tiny_folders["base"] / "model.safetensors").read_bytes()


def test_dry_run_of_the_embedded_model_converts_nothing(monkeypatch, tmp_path, capsys):
    from eaglechat.models import default_model

    monkeypatch.delenv("EAGLECHAT_CATALOG", raising=False)
    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path))
    assert cli("pull", "smollm2-135m-eagle2", "--dry-run") == 0
    assert "would convert" in capsys.readouterr().err
    assert not default_model.default_base_dir().exists()


# ------------------------------------------------------------------- hostile listings, bad links, loops


@pytest.mark.parametrize("name", ["..\\..\\x.safetensors", "C:x.safetensors"])
def test_a_file_name_that_would_leave_the_repo_is_refused_before_download(fake_hub, capsys, name):
    fake_hub.repos["tiny/base"].files[name] = b"evil"
    assert cli("pull", "tiny-a") == 1
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert "would leave the repo folder" in line and repr(name) in line
    assert _downloads(fake_hub) == [] and not (hub.cache_dir() / "models--tiny--base" / "blobs").exists()


def test_an_etag_that_is_a_path_is_refused_before_download(fake_hub, capsys):
    fake_hub.etags[("tiny/base", "config.json")] = "../../../escape"
    assert cli("pull", "tiny-a") == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "ETag for config.json that is not a plain digest" in line
    assert _downloads(fake_hub) == []


def _no_retry_pause(monkeypatch):
    from huggingface_hub import file_download

    monkeypatch.setattr(file_download.time, "sleep", lambda s: None)  # its 1 s pause before each resume


def test_a_link_that_drops_every_100_kb_still_completes(fake_hub, tiny_folders, monkeypatch):
    _no_retry_pause(monkeypatch)
    full = (tiny_folders["base"] / "model.safetensors").read_bytes()
    fake_hub.drop_every[("tiny/base", "model.safetensors")] = 100_000
    assert len(full) > 300_000
    hub.pull(catalog.resolve("tiny-a"))
    served = fake_hub.bytes_served("tiny/base", "model.safetensors")
    assert len(served) > 3 and served[0] is None and all(r.startswith("bytes=") for r in served[1:])
    base, _ = hub.local_paths(catalog.resolve("tiny-a"))
    assert (base / "model.safetensors").read_bytes() == full


def test_a_link_too_bad_to_progress_says_so(fake_hub, monkeypatch, capsys):
    _no_retry_pause(monkeypatch)
    fake_hub.drop_every[("tiny/base", "model.safetensors")] = 1000  # less than one write
    assert cli("pull", "tiny-a") == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "dropped repeatedly while pulling tiny/base/model.safetensors before any new byte arrived" in line
    assert "resume" not in line


def test_more_bytes_than_announced_is_named_and_discarded(fake_hub, tiny_folders, capsys):
    size = (tiny_folders["head-a"] / "model.safetensors").stat().st_size
    fake_hub.advertised[("tiny/head-a", "model.safetensors")] = size - 1000
    assert cli("pull", "tiny-a") == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"sent more bytes than it announced for tiny/head-a/model.safetensors (over {size - 1000})" in line
    assert not list((hub.cache_dir() / "models--tiny--head-a" / "blobs").glob("*.incomplete"))


def test_a_redirect_loop_is_one_line(fake_hub, capsys):
    fake_hub.redirect_loop.add(("tiny/base", "model.safetensors"))
    assert cli("pull", "tiny-a") == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "tiny/base/model.safetensors redirects in a loop" in line


# ------------------------------------------------------------------- a hostile Hub: nothing outside the cache


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def _files_outside(root: Path, cache: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.resolve().is_relative_to(cache.resolve())
            and "escape" in p.name]


@pytest.mark.parametrize("rev", ["../../../../escape", "/tmp/eaglechat-escape", "a/../../escape", "..", "x\\..\\escape"])
def test_a_revision_that_leaves_the_cache_is_refused_before_any_request(fake_hub, tmp_path, capsys, rev):
    fake_hub.any_revision = True  # a Hub that answers it (the real one would not; a hostile one does)
    assert cli("pull", f"hf.co/tiny/base:{rev}", "--head", "hf.co/tiny/head-a") == 2
    line = _one_line(capsys)
    assert "is neither a commit sha nor a branch or tag name; refusing to use it" in line
    assert fake_hub.log == [] and _files_outside(tmp_path.parent, hub.cache_dir()) == []


def test_revisions_the_hub_uses_are_accepted():
    for rev in ("main", "v1.0", "refs/pr/1", "refs/convert/parquet", "a" * 40):
        hub.check_revision("o/r", rev)


def test_a_commit_sha_that_is_a_path_is_refused_before_download(fake_hub, tmp_path, capsys):
    fake_hub.commits["tiny/base"] = "../../../../escape"
    assert cli("pull", "tiny-a") == 1
    assert "the Hub named the commit '../../../../escape', which is not a 40-hex commit sha" in _one_line(capsys)
    assert _downloads(fake_hub) == [] and _files_outside(tmp_path.parent, hub.cache_dir()) == []


@pytest.mark.parametrize("where", ["file:///etc/passwd", "ftp://127.0.0.1/model.safetensors"])
def test_a_redirect_that_is_not_http_is_one_line(fake_hub, capsys, where):
    fake_hub.redirects[("tiny/base", "model.safetensors")] = where
    assert cli("pull", "tiny-a") == 1
    line = _one_line(capsys)
    scheme = where.split(":")[0]
    assert f"tiny/base/model.safetensors redirects to '{scheme}://" in line and "which is not an http(s) address" in line


@pytest.mark.parametrize("body", [b"<html>not json</html>", b"[1, 2, 3]", b'{"siblings": [{"rfilename": 7}]}'])
def test_a_model_info_that_is_not_a_model_description_is_one_line(fake_hub, capsys, body):
    fake_hub.info_bodies["tiny/base"] = body
    assert cli("pull", "tiny-a") == 1
    assert "answered something other than a model description for tiny/base@main" in _one_line(capsys)
    assert _downloads(fake_hub) == []


def test_a_file_name_longer_than_a_file_system_takes_is_one_line(fake_hub, capsys):
    name = "a" * 288 + ".safetensors"
    fake_hub.repos["tiny/base"].files[name] = b"x"
    assert cli("pull", "tiny-a") == 1
    line = _one_line(capsys)
    assert "longer than a file system allows (255 bytes); refusing to pull it" in line and len(line) < 300
    assert _downloads(fake_hub) == []


def test_a_stream_past_the_announced_size_stops_at_it(fake_hub, tiny_folders, monkeypatch, capsys):
    size = (tiny_folders["head-a"] / "model.safetensors").stat().st_size
    fake_hub.extra_bytes[("tiny/head-a", "model.safetensors")] = 300 << 20
    largest = []
    write = hub._HashingWriter.write

    def spy(self, data):
        written = write(self, data)
        largest.append(self.f.tell() - self.size)
        return written

    monkeypatch.setattr(hub._HashingWriter, "write", spy)
    assert cli("pull", "tiny-a") == 1
    assert f"sent more bytes than it announced for tiny/head-a/model.safetensors (over {size})" in _one_line(capsys)
    assert max(largest) <= 0  # not one byte past a file's announced size reached the disk
    assert fake_hub.sent[("tiny/head-a", "model.safetensors")] < size + (64 << 20)  # the client hung up early
    assert not list((hub.cache_dir() / "models--tiny--head-a" / "blobs").glob("*.incomplete"))


# ------------------------------------------------------------------- pairs not in the catalog (hf.co names)
# `pull hf.co/ORG/BASE --head hf.co/ORG/HEAD`: any base and head pair through the same machinery; `plan` and
# `show` then work on the pair from its cached config.json.

PAIR = ("hf.co/tiny/base", "--head", "hf.co/tiny/head-a")
NAME = "base=tiny/base@main,head=tiny/head-a@main"


def test_pull_plan_show_a_pair_not_in_the_catalog(fake_hub, capsys):
    from eaglechat.cli import main

    assert cli("pull", *PAIR) == 0
    assert f"pulled as '{NAME}'" in capsys.readouterr().err
    m = pairs.pair("hf.co/tiny/base", "hf.co/tiny/head-a")
    assert m.name == NAME and m.shape is not None and m.head_kind == "eagle2" and m.dtype == "float32"

    assert cli("show", *PAIR, "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "pulled" and shown["shape"]["hidden_size"] == m.shape.hidden_size

    assert main(["plan", *PAIR, "--gpu", "8", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["model"] == NAME and plan["choice"] is not None

    assert cli("list", "--json") == 0
    assert any(r["name"] == NAME and r["status"] == "pulled" for r in json.loads(capsys.readouterr().out))


def test_pair_head_kind_and_draft_vocab_come_from_the_head_config(fake_hub, tmp_path, capsys):
    from safetensors.torch import save_file

    head = tmp_path / "eagle3-head"  # what a SpecForge EAGLE-3 head's config.json says about itself
    head.mkdir()
    (head / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 128, "vocab_size": 512, "draft_vocab_size": 64}))
    save_file({"fc.weight": torch.zeros(4, 4)}, head / "model.safetensors")
    fake_hub.add_folder("org/eagle3-head", head)
    assert cli("pull", "hf.co/tiny/base", "--head", "hf.co/org/eagle3-head") == 0
    m = pairs.pair("hf.co/tiny/base", "hf.co/org/eagle3-head")
    assert (m.head_kind, m.draft_vocab) == ("eagle3", 64)


def test_pair_not_pulled_says_how(capsys):
    from eaglechat.cli import main

    assert main(["plan", "hf.co/org/never", "--head", "hf.co/org/pulled", "--gpu", "8"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "eaglechat pull hf.co/org/never --head hf.co/org/pulled" in err
    assert main(["pull", "hf.co/org/base-only"]) != 0
    assert "--head hf.co/ORG/HEAD" in capsys.readouterr().err


def test_a_disk_that_fills_up_during_a_pull_is_one_line(fake_hub, monkeypatch, capsys):
    real_write = hub._HashingWriter.write

    def write(self, data):
        if self.tell() > 100_000:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, data)

    monkeypatch.setattr(hub._HashingWriter, "write", write)
    assert cli("pull", "tiny-a") == 1
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith("eaglechat: error: disk full while writing tiny/base/model.safetensors under ")
    assert line.endswith("free some space and run 'eaglechat pull tiny-a' again to resume")


def test_a_disk_that_is_full_when_the_pull_is_recorded_is_one_line(fake_hub, monkeypatch, capsys):
    def full(plan):
        raise OSError(errno.ENOSPC, "No space left on device", str(hub.paths.pulls_dir() / "tiny-a.json"))

    monkeypatch.setattr(hub, "write_record", full)
    assert cli("pull", "tiny-a") == 1
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith("eaglechat: error: disk full while finishing the pull of tiny-a (")
