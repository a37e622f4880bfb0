"""Official EAGLE-1/2 head checkpoints load (.bin and .safetensors, with and without fc bias);
broken or mismatched ones fail with one clear line."""

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file
from tiny_models import random_head, save_tiny_pair, tiny_model

from eaglechat.engine.decode import Decoder
from eaglechat.engine.heads import load_head
from eaglechat.engine.heads.eagle2 import required_keys
from eaglechat.engine.protocol import GenerationParams, TreeBudget
from eaglechat.errors import WeightsError


def official_folder(tmp_path, model, *, bias, fmt, with_embedding=True, qwen=False):
    """Write a head the way SafeAILab/EAGLE ships it: official keys, LlamaConfig-style json."""
    head = random_head(model, bias=bias)
    state = dict(head.head_state_dict())
    if with_embedding:  # EAGLE-1 .bin checkpoints carry a copy of the embedding
        state["embed_tokens.weight"] = model.get_input_embeddings().weight.detach().clone()
    cfg = head.config.to_dict()
    if not bias:
        cfg["bias"] = False
    else:
        cfg.pop("bias")  # Vicuna / LLaMA-2 heads have no "bias" key: the default is True
    folder = tmp_path / f"head-{fmt}-{bias}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    if fmt == "bin":
        torch.save(state, folder / "pytorch_model.bin")
    else:
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    return folder, head


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
@pytest.mark.parametrize("bias", [True, False])
def test_official_format_heads_load_and_match(tmp_path, fmt, bias):
    model = tiny_model("llama")
    folder, original = official_folder(tmp_path, model, bias=bias, fmt=fmt)
    head = load_head(folder, model)
    assert (head.fc.bias is not None) == bias
    for key, value in original.head_state_dict().items():
        assert torch.equal(head.state_dict()[key], value), key
    assert head.embed_tokens is model.get_input_embeddings()  # shared, not copied
    prompt = [3, 4, 5, 6]
    plain = [t for s in Decoder(model, None, 128).generate(prompt, GenerationParams(max_new_tokens=16, speculate=False), TreeBudget(), set()) for t in s.tokens]
    eagle = [t for s in Decoder(model, head, 128).generate(prompt, GenerationParams(max_new_tokens=16), TreeBudget(8, 3, 4), set()) for t in s.tokens]
    assert eagle == plain


def test_qwen2_head_with_qkv_bias_loads(tmp_path):
    model = tiny_model("qwen2")
    folder, _ = official_folder(tmp_path, model, bias=True, fmt="safetensors")
    head = load_head(folder, model)
    assert head.layers[0].self_attn.q_proj.bias is not None
    assert "layers.0.self_attn.q_proj.bias" in required_keys(head.config)


def test_head_for_another_base_fails_with_one_clear_line(tmp_path):
    other = tiny_model("llama")
    other.config.hidden_size = 64
    folder, _ = official_folder(tmp_path, other, bias=True, fmt="safetensors")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["hidden_size"] = 128
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError, match="for another base: hidden size 128"):
        load_head(folder, tiny_model("llama"), base_name="tiny-llama")


def test_missing_key_and_wrong_shape_are_named(tmp_path):
    model = tiny_model("llama")
    folder, head = official_folder(tmp_path, model, bias=True, fmt="safetensors", with_embedding=False)
    state = dict(head.head_state_dict())
    del state["layers.0.mlp.up_proj.weight"]
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    with pytest.raises(WeightsError, match="lack layers.0.mlp.up_proj.weight"):
        load_head(folder, model)
    state = {k: v for k, v in head.head_state_dict().items() if not k.startswith("layers.0.mlp.")}
    state.update({"extra.a": torch.zeros(1), "extra.b": torch.zeros(1)})
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    with pytest.raises(WeightsError, match=r"lack layers.0.mlp.down_proj.weight, layers.0.mlp.gate_proj.weight, "
                                           r"layers.0.mlp.up_proj.weight$"):
        load_head(folder, model)
    state = {**head.head_state_dict(), **{f"extra.{i}": torch.zeros(1) for i in range(5)}}
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    with pytest.raises(WeightsError, match=r"unexpected keys extra.0, extra.1, extra.2 \(\+2 more\)"):
        load_head(folder, model)
    state = dict(head.head_state_dict())
    state["fc.weight"] = torch.zeros(64, 100)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    with pytest.raises(WeightsError, match="fc.weight has shape"):
        load_head(folder, model)


def run_cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "eaglechat", *args], capture_output=True, text=True, input=stdin, timeout=300)


def assert_one_line_error(result, needle):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("eaglechat: error:")]
    assert len(lines) == 1 and needle in lines[0], result.stderr


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


def run_in_process(capsys, *args):
    """cli.main in this process (no interpreter start-up): -> CompletedProcess(code, stdout, stderr)."""
    from eaglechat import cli

    capsys.readouterr()
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def test_cli_errors_are_one_line(pair, tmp_path, capsys):
    base, head = pair
    # corrupt head weights
    bad = tmp_path / "bad-head"
    bad.mkdir()
    (bad / "config.json").write_text((head / "config.json").read_text())
    (bad / "model.safetensors").write_bytes((head / "model.safetensors").read_bytes()[:300])
    assert_one_line_error(run_in_process(capsys, "run", str(base), "hi", "--head", str(bad)), "corrupt or truncated")
    # missing head weights
    (bad / "model.safetensors").unlink()
    assert_one_line_error(run_in_process(capsys, "run", str(base), "hi", "--head", str(bad)), "has no model.safetensors")
    # corrupt base weights
    broken = tmp_path / "broken-base"
    broken.mkdir()
    for f in base.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "model.safetensors").write_bytes(b"\x00" * 64)
    assert_one_line_error(run_in_process(capsys, "run", str(broken), "hi"), "cannot load the model")
    # prompt longer than the context, unknown folder
    assert_one_line_error(run_in_process(capsys, "run", str(base), "hello " * 200, "--max-context", "64"), "the context holds 64")
    assert_one_line_error(run_in_process(capsys, "run", "./no/such/folder", "hi"), "no such model folder")
    # and through a real process (stdin, the entry point): an empty prompt
    assert_one_line_error(run_cli("run", str(base), "-", stdin="   \n"), "empty prompt")


def test_cli_run_json_contract(pair):
    base, head = pair
    r = run_cli("run", str(base), "--head", str(head), "Hello world", "--json", "--max-new-tokens", "20", "--seed", "1",
                "--speculate", "on")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    stats = out["stats"]
    for key in ("new_tokens", "target_forwards", "mean_accepted", "tokens_per_s", "elapsed_s"):
        assert key in stats
    assert stats["new_tokens"] == len(out["token_ids"]) <= 20
    plain = json.loads(run_cli("run", str(base), "Hello world", "--json", "--max-new-tokens", "20", "--no-speculate").stdout)
    assert plain["token_ids"] == out["token_ids"] and plain["text"] == out["text"]
    assert plain["stats"]["mean_accepted"] == 1.0


def test_cli_run_notes_a_tuned_speculation_off(pair, tmp_path, monkeypatch):
    """`run --speculate on` speculates at every step even where `eaglechat tune` recorded plain decoding
    as faster (auto, the default, measures it while decoding), and --verbose says so."""
    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))
    from eaglechat.fit import hardware
    from eaglechat.fit.profiles import save_tuned

    base, head = pair
    args = ("run", str(base), "--head", str(head), "Hello world", "--json", "--max-new-tokens", "12", "--verbose",
            "--speculate", "on")
    before = run_cli(*args)
    assert json.loads(before.stdout)["stats"]["speculate"] is True and "tune" not in before.stderr
    save_tuned(hardware.probe("cpu"), base.name, "none",
               {"tree": {"total_tokens": 8, "depth": 3, "top_k": 4}, "speculate": False})
    after = run_cli(*args)
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout)["stats"]["speculate"] is True
    assert "measured plain decoding faster" in after.stderr
