# ruff: noqa: F811  (the fixtures come from test_hub; pytest passes them by name)
"""Models that sit in a folder of their repo (a drafter beside its base, as Qwen's FP8 repos ship one in
`compressed/`): `pull hf.co/ORG/REPO/sub/folder`, and `subfolder:` under base, head and heads.TAG in a
manifest, against the local Hub stand-in (tests/hubserver.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_hub import _manifest, cli, fake_hub, tiny_folders  # noqa: F401  (fixtures)

from eaglechat.models import catalog, hub, pairs

PAIR_NAME = "base=tiny/base@main,head=org/drafts/compressed@main"


def _files(folder: Path, prefix: str = "") -> dict[str, bytes]:
    return {prefix + p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.fixture
def drafts(fake_hub, tiny_folders):
    """org/drafts: a head in compressed/, another in other/, and a decoy model at the top."""
    files = {**_files(tiny_folders["head-a"], "compressed/"), **_files(tiny_folders["head-b"], "other/"),
             **_files(tiny_folders["head-b"]), "README.md": b"# drafts\n"}
    fake_hub.add_repo("org/drafts", files)
    return fake_hub


def _downloads(fake, repo: str) -> list[str]:
    """The files of `repo` whose bytes were fetched (from the resolve URL or the CDN it redirects to)."""
    out = []
    for method, path, _ in fake.log:
        if method == "GET" and path.startswith(f"/{repo}/resolve/"):
            out.append(path[len(f"/{repo}/resolve/"):].split("/", 1)[1])
        elif method == "GET" and path.startswith(f"/cdn/{repo}/"):
            out.append(path[len(f"/cdn/{repo}/"):])
    return sorted(set(out))  # an LFS file: the resolve URL, then the CDN it redirects to


def test_pull_of_a_head_in_a_subfolder(drafts, tiny_folders, capsys):
    assert cli("pull", "hf.co/tiny/base", "--head", "hf.co/org/drafts/compressed") == 0
    err = capsys.readouterr().err
    assert "head: org/drafts/compressed@" in err and f"pulled as '{PAIR_NAME}'" in err
    commit = drafts.repos["org/drafts"].commit
    assert _downloads(drafts, "org/drafts") == ["compressed/config.json", "compressed/model.safetensors"]
    m = pairs.pair("hf.co/tiny/base", "hf.co/org/drafts/compressed")
    assert m.name == PAIR_NAME and (m.head_repo, m.head_subfolder) == ("org/drafts", "compressed")
    _, head = hub.local_paths(m)
    assert head.name == "compressed" and head.parent.name == commit
    assert _files(head) == _files(tiny_folders["head-a"])
    assert hub.read_record(PAIR_NAME)["repos"][1]["subfolder"] == "compressed"
    from transformers import AutoModelForCausalLM

    from eaglechat.engine.heads import load_head

    load_head(head, AutoModelForCausalLM.from_pretrained(hub.local_paths(m)[0]))  # the head loads from there
    assert cli("list", "--json") == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[PAIR_NAME]["status"] == "pulled" and rows[PAIR_NAME]["head"] == "org/drafts/compressed@main"
    assert cli("rm", PAIR_NAME) == 0 and not hub.is_pulled(m)


def test_a_catalog_head_beside_its_base_in_one_repo(fake_hub, tiny_folders, capsys):
    files = {**_files(tiny_folders["base"]), **_files(tiny_folders["head-a"], "compressed/"),
             **_files(tiny_folders["head-b"], "older/")}
    fake_hub.add_repo("org/fp8", files)
    raw = _manifest("tiny-fp8", "org/fp8", "org/fp8", config=tiny_folders["config"])
    raw["head"]["subfolder"] = "compressed"
    raw["heads"] = {"older": {"repo": "org/fp8", "subfolder": "older", "why": "the first drafter"}}
    catalog_dir = Path(catalog.catalog_dirs()[0])
    (catalog_dir / "tiny-fp8.yaml").write_text(yaml.safe_dump(raw))
    assert cli("pull", "tiny-fp8") == 0 and cli("pull", "tiny-fp8:older") == 0
    base, head = hub.local_paths(catalog.resolve("tiny-fp8"))
    assert head == base / "compressed" and _files(head) == _files(tiny_folders["head-a"])
    assert "model.safetensors" in _files(base) and "pytorch_model.bin" not in _files(base)
    _, older = hub.local_paths(catalog.resolve("tiny-fp8:older"))
    assert older == base / "older" and _files(older) == _files(tiny_folders["head-b"])
    assert catalog.resolve("tiny-fp8").to_dict()["head"]["subfolder"] == "compressed"
    from eaglechat.models import launch  # a server takes no folder inside a repo: the recipe says so

    notes = launch.serve_recipe(catalog.resolve("tiny-fp8"), "vllm")["notes"]
    assert any(n.startswith("the head is the folder compressed/ of org/fp8: pull it") for n in notes)
    capsys.readouterr()
    assert cli("rm", "tiny-fp8") == 0  # the other alias still uses the one revision of the repo
    assert "kept org/fp8@" in capsys.readouterr().out and hub.is_pulled(catalog.resolve("tiny-fp8:older"))


@pytest.mark.parametrize("head, code, message", [
    ("hf.co/org/drafts/../escape", 2, "the subfolder '../escape' would leave the repo folder"),
    ("hf.co/org/drafts/a\\b", 2, "would leave the repo folder"),
    ("hf.co/org/drafts/nothing", 1, "org/drafts@main has no folder 'nothing'; check the name after org/drafts/"),
    ("hf.co/org/drafts/compressed/deeper", 1, "org/drafts@main has no folder 'compressed/deeper'"),
])
def test_a_bad_subfolder_is_one_line(drafts, capsys, head, code, message):
    assert cli("pull", "hf.co/tiny/base", "--head", head) == code
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert line.startswith("eaglechat: error: ") and message in line and "Traceback" not in err
    assert _downloads(drafts, "org/drafts") == []
    if code == 2:
        assert drafts.log == []  # refused before any request


def test_a_subfolder_without_a_model_is_one_line(drafts, capsys):
    drafts.repos["org/drafts"].files["notes/README.md"] = b"no model here"
    assert cli("pull", "hf.co/tiny/base", "--head", "hf.co/org/drafts/notes") == 1
    assert "org/drafts/notes@main has no config.json" in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("where", ["head", "base", "heads"])
def test_a_manifest_subfolder_that_leaves_the_repo_names_the_field(tmp_path, tiny_folders, where):
    raw = _manifest("tiny-bad", "org/fp8", "org/fp8", config=tiny_folders["config"])
    if where == "heads":
        raw["heads"] = {"alt": {"repo": "org/fp8", "subfolder": "a/../../x", "why": "w"}}
        field = "heads.alt.subfolder"
    else:
        raw[where]["subfolder"] = "a/../../x"
        field = f"{where}.subfolder"
    path = tmp_path / "tiny-bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(catalog.ManifestError, match=f"field '{field}': the subfolder 'a/../../x' would leave the repo folder"):
        catalog.load_manifest(path)


def test_free_form_names_take_a_subfolder():
    m = catalog.resolve("base=org/fp8@main,head=org/fp8/compressed@v2")
    assert (m.base_subfolder, m.head_repo, m.head_subfolder, m.head_revision) == ("", "org/fp8", "compressed", "v2")
    assert m.hub_parts() == [("base", "org/fp8", "main", ""), ("head", "org/fp8", "v2", "compressed")]
    assert pairs.hub_ref("https://huggingface.co/org/fp8/sub/folder:refs/pr/1", "--head") == "org/fp8/sub/folder@refs/pr/1"
