"""`pull hf.co/ORG/BASE --head hf.co/ORG/HEAD`: any base and head pair, through the real pull machinery and
the local Hub stand-in; `plan` and `show` then work on the pair from its cached config.json."""

from __future__ import annotations

import json

import torch
from test_hub import cli, fake_hub, tiny_folders  # noqa: F401  (fixtures)

from eaglechat import catalog
from eaglechat.cli import main

PAIR = ("hf.co/tiny/base", "--head", "hf.co/tiny/head-a")
NAME = "base=tiny/base@main,head=tiny/head-a@main"


def test_pull_plan_show_a_pair_not_in_the_catalog(fake_hub, capsys):  # noqa: F811
    assert cli("pull", *PAIR) == 0
    assert f"pulled as '{NAME}'" in capsys.readouterr().err
    m = catalog.pair("hf.co/tiny/base", "hf.co/tiny/head-a")
    assert m.name == NAME and m.shape is not None and m.head_kind == "eagle2" and m.dtype == "float32"

    assert cli("show", *PAIR, "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "pulled" and shown["shape"]["hidden_size"] == m.shape.hidden_size

    assert main(["plan", *PAIR, "--gpu", "8", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["model"] == NAME and plan["choice"] is not None

    assert cli("list", "--json") == 0
    assert any(r["name"] == NAME and r["status"] == "pulled" for r in json.loads(capsys.readouterr().out))


def test_pair_head_kind_and_draft_vocab_come_from_the_head_config(fake_hub, tmp_path, capsys):  # noqa: F811
    from safetensors.torch import save_file

    head = tmp_path / "eagle3-head"  # what a SpecForge EAGLE-3 head's config.json says about itself
    head.mkdir()
    (head / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 128, "vocab_size": 512, "draft_vocab_size": 64}))
    save_file({"fc.weight": torch.zeros(4, 4)}, head / "model.safetensors")
    fake_hub.add_folder("org/eagle3-head", head)
    assert cli("pull", "hf.co/tiny/base", "--head", "hf.co/org/eagle3-head") == 0
    m = catalog.pair("hf.co/tiny/base", "hf.co/org/eagle3-head")
    assert (m.head_kind, m.draft_vocab) == ("eagle3", 64)


def test_pair_not_pulled_says_how(capsys):
    assert main(["plan", "hf.co/org/never", "--head", "hf.co/org/pulled", "--gpu", "8"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "eaglechat pull hf.co/org/never --head hf.co/org/pulled" in err
    assert main(["pull", "hf.co/org/base-only"]) != 0
    assert "--head hf.co/ORG/HEAD" in capsys.readouterr().err
