"""`eaglechat show NAME --serve vllm|sglang`: the launch command carries the tree budget over correctly
(SGLang counts the root in --speculative-num-draft-tokens; vLLM drafts a chain of `depth` tokens)."""

from __future__ import annotations

import json

import pytest

from eaglechat import cli
from eaglechat.engine.protocol import TreeBudget
from eaglechat.errors import UsageError
from eaglechat.models.launch import launch_command, launch_notes


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_sglang_maps_depth_top_k_and_counts_the_root():
    argv = launch_command("sglang", base="org/base", head="org/head", head_kind="eagle2",
                          tree=TreeBudget(total_tokens=60, depth=5, draft_top_k=8), tp=4)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    assert flag(argv, "--speculative-algorithm") == "EAGLE"
    assert flag(argv, "--speculative-num-steps") == "5"
    assert flag(argv, "--speculative-eagle-topk") == "8"
    assert flag(argv, "--speculative-num-draft-tokens") == "61"  # 60 drafted nodes + the root
    assert flag(argv, "--tp") == "4" and flag(argv, "--speculative-draft-model-path") == "org/head"
    assert "--enable-metrics" in argv  # eaglechat --remote reads sglang:spec_accept_length there
    eagle3 = launch_command("sglang", base="b", head="h", head_kind="eagle3", tree=TreeBudget(16, 4, 4))
    assert flag(eagle3, "--speculative-algorithm") == "EAGLE3"


def test_vllm_gets_a_chain_of_depth_tokens():
    argv = launch_command("vllm", base="org/base", head="org/head", head_kind="eagle3",
                          tree=TreeBudget(total_tokens=60, depth=5, draft_top_k=8), tp=2)
    assert argv[:3] == ["vllm", "serve", "org/base"]
    assert json.loads(flag(argv, "--speculative-config")) == {"method": "eagle3", "model": "org/head",
                                                              "num_speculative_tokens": 5}
    assert flag(argv, "--tensor-parallel-size") == "2"
    notes = launch_notes("vllm", tree=TreeBudget(60, 5, 8), head_kind="eagle3", template="tokenizer",
                         reduced_vocab=0, port=8000)
    assert any("total_tokens 60, draft_top_k 8" in n and "no vLLM equivalent" in n for n in notes)


def test_bad_server_or_tp():
    with pytest.raises(UsageError):
        launch_command("tgi", base="b", head="h", head_kind="eagle2", tree=TreeBudget())
    with pytest.raises(UsageError):
        launch_command("vllm", base="b", head="h", head_kind="eagle2", tree=TreeBudget(), tp=0)


def test_show_serve_on_the_catalog(capsys):
    assert cli.main(["show", "llama3.1-8b-instruct-eagle3", "--serve", "sglang", "--tp", "2", "--json"]) == 0
    recipe = json.loads(capsys.readouterr().out)
    argv, tree = recipe["argv"], recipe["tree"]
    assert flag(argv, "--model-path") == "meta-llama/Llama-3.1-8B-Instruct"
    assert flag(argv, "--speculative-draft-model-path") == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert int(flag(argv, "--speculative-num-draft-tokens")) == tree["total_tokens"] + 1
    assert int(flag(argv, "--speculative-num-steps")) == tree["depth"]
    # the default model's embedded head has a reduced draft vocabulary: the notes say what becomes of it
    assert cli.main(["show", "smollm2-135m-eagle2", "--serve", "vllm"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("vllm serve HuggingFaceTB/SmolLM2-135M-Instruct")
    assert "reduced draft vocabulary (8192 tokens" in out and '"num_speculative_tokens"' in out


@pytest.mark.parametrize("server", ["sglang", "vllm"])
def test_export_head_for_a_server_drops_the_reduction_and_keeps_the_weights(tmp_path, server):
    """The shipped default head has a reduced draft vocabulary (eaglechat's d2t extension), which neither
    server's EAGLE-1/2 loader reads: the export is the same weights over the full vocabulary, and for SGLang
    the reduction comes back as FR-Spec's token map."""
    from safetensors.torch import load_file

    from eaglechat.models import default_model
    from eaglechat.models.launch import export_head_for_server

    src = default_model.DEFAULT_HEAD_DIR
    out = tmp_path / "head"
    token_map = export_head_for_server(src, out, server)
    config, original = json.loads((out / "config.json").read_text()), json.loads((src / "config.json").read_text())
    assert "draft_vocab_size" not in config and original["draft_vocab_size"] == 8192
    assert {k: v for k, v in original.items() if k != "draft_vocab_size"} == config
    weights, source = load_file(str(out / "model.safetensors")), load_file(str(src / "model.safetensors"))
    assert set(source) - set(weights) == {"d2t"} and all(weights[k].equal(source[k]) for k in weights)
    if server == "vllm":
        assert token_map is None and not (out / "token_map.pt").exists()
        return
    import torch

    hot = torch.load(token_map, weights_only=True)  # exactly how SGLang's load_token_map reads it
    assert hot.dtype == torch.int64 and hot.tolist() == (torch.arange(8192) + source["d2t"]).tolist()
    assert hot.unique().numel() == 8192 and int(hot.max()) < original["vocab_size"]


def test_show_serve_export_head_points_the_command_at_the_copy(tmp_path, capsys):
    out = tmp_path / "served-head"
    assert cli.main(["show", "smollm2-135m-eagle2", "--serve", "sglang", "--export-head", str(out), "--json"]) == 0
    recipe = json.loads(capsys.readouterr().out)
    assert flag(recipe["argv"], "--speculative-draft-model-path") == str(out.resolve())
    assert flag(recipe["argv"], "--speculative-token-map") == str((out / "token_map.pt").resolve())
    assert any("exported as a full-vocabulary head" in n for n in recipe["notes"])
    # nothing is overwritten; --export-head alone is a usage error
    assert cli.main(["show", "smollm2-135m-eagle2", "--serve", "sglang", "--export-head", str(out)]) != 0
    assert "empty folder" in capsys.readouterr().err
    assert cli.main(["show", "smollm2-135m-eagle2", "--export-head", str(tmp_path / "x")]) != 0


@pytest.mark.slow
def test_exported_head_loads_as_a_full_vocabulary_head(tmp_path, default_base):
    from transformers import AutoModelForCausalLM

    from eaglechat.engine.heads import load_head
    from eaglechat.models import default_model
    from eaglechat.models.launch import export_head_for_server

    export_head_for_server(default_model.DEFAULT_HEAD_DIR, tmp_path / "head", "vllm")
    base = AutoModelForCausalLM.from_pretrained(default_base, trust_remote_code=False)
    head = load_head(tmp_path / "head", base)
    assert head.draft_to_target is None  # drafts over the whole vocabulary
