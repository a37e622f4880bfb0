"""Hostile and mistaken files end as one line on stderr naming the file and the key, a non-zero exit,
no traceback: user profiles (every key typed and ranged), head config.json files."""

from __future__ import annotations

import pytest

from eaglechat import cli, paths

DEFAULT = "smollm2-135m-eagle2"


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("eaglechat: error: ")
    return lines[0]


# (file text, what the line must say besides the file name)
BAD_PROFILES = [
    ("name: cpu\npriority: high\n", "priority must be an integer, got 'high'"),
    ("name: cpu\nreserve_gib: lots\n", "reserve_gib must be a number, got 'lots'"),
    ("name: cpu\nreserve_gib: .nan\n", "reserve_gib must be a number"),
    ("name: cpu\nreserve_gib: -1\n", "reserve_gib must be at least 0"),
    ("name: cpu\nmodels: [{quant: [none], max_context: -5}]\n", "models[0].max_context must be between 1"),
    ("name: cpu\nmodels: [{quant: [fp8]}]\n", "models[0].quant must be a non-empty list"),
    ("name: cpu\nmodels: []\n", "models must list at least one row"),
    ('name: cpu\nspeculate: "no"\n', "speculate must be true, false or auto, got 'no'"),
    ("name: cpu\nspeculate: 0\n", "speculate must be true, false or auto, got 0"),
    ("name: cpu\ndtype: float17\n", "dtype must be one of auto, float16, bfloat16, float32, got 'float17'"),
    ("name: cpu\ndouble_quant: maybe\n", "double_quant must be true or false"),
    ("name: cpu\ntree: {none: {total_tokens: 10000, depth: 3, top_k: 4}}\n", "tree.none.total_tokens must be between 1 and 1024"),
    ("name: cpu\ntree: {none: {total_tokens: 12, depth: 100, top_k: 4}}\n", "tree.none.depth must be between 1 and 16"),
    ("name: cpu\ntree: {none: {total_tokens: 60, depth: 3, top_k: 4}}\n", "more than a depth-3, top-4 draft can offer"),
    ("name: cpu\ntree: {none: {total_tokens: 8.5, depth: 3, top_k: 4}}\n", "tree.none.total_tokens must be an integer"),
    ("name: cpu\ntree: {none: {total_tokens: 8}}\n", "tree.none needs total_tokens, depth and draft_top_k"),
    ("name: cpu\ntree: {fp8: {total_tokens: 8, depth: 3, top_k: 4}}\n", "tree key 'fp8'"),
    ("name: cpu\ntree: [1, 2]\n", "tree must be a mapping"),
    ("name: cpu\nmatch: {device: gpu}\n", "match.device must be one of cuda, mps, cpu"),
    ("name: mine\nmatch: {device: cpu, name: '(['}\n", "match.name is not a valid regular expression"),
    ("name: cpu\nmemory: {prefill_chunk: 0}\n", "memory.prefill_chunk must be between 1"),
    ("name: cpu\ncalibrate: {min_gain: 0}\n", "calibrate.min_gain must be above 0"),
    ("name: cpu\ncalibrate: {n_grid: [4, two]}\n", "calibrate.n_grid[1] must be an integer"),
    ("name: cpu\nlarge_vocab: {min_vocab: many}\n", "large_vocab.min_vocab must be an integer"),
    ("name: cpu\nturbo: true\n", "unknown keys ['turbo']"),
    ("name: [unclosed\n", "cannot read profile"),
    ("- just\n- a list\n", "expected a mapping with a `name`"),
    ("name: ''\n", "name must not be empty"),
]


def _write_profile(text: str | bytes):
    folder = paths.user_profiles_dir()
    target = folder / "mine.yaml"
    target.write_bytes(text if isinstance(text, bytes) else text.encode())
    return target


@pytest.mark.parametrize("text, says", BAD_PROFILES, ids=[s for _, s in BAD_PROFILES])
@pytest.mark.parametrize("argv", [["plan", DEFAULT], ["show", DEFAULT, "--profile"]], ids=["plan", "show-profile"])
def test_a_broken_user_profile_is_one_line_naming_file_and_key(text, says, argv, capsys):
    target = _write_profile(text)
    assert cli.main(argv) != 0
    line = one_error_line(capsys)
    assert str(target) in line and says in line


def test_a_profile_that_is_not_utf8_is_one_line(capsys):
    target = _write_profile(b"name: cpu\ndescription: \xff\xfe\n")
    assert cli.main(["show", DEFAULT, "--profile", "--json"]) != 0
    line = one_error_line(capsys)
    assert str(target) in line and "cannot read profile" in line


def test_a_quoted_no_never_reads_as_true_and_unquoted_no_is_false(capsys):
    from eaglechat.fit import profiles

    _write_profile("name: cpu\nspeculate: no\n")  # YAML 1.1: a boolean
    prof = next(p for p in profiles.load_profiles() if p.name == "cpu")
    assert prof.speculate is False
    _write_profile('name: cpu\nspeculate: "no"\n')
    with pytest.raises(profiles.ProfileError, match="speculate must be true, false or auto"):
        profiles.load_profiles()


def test_good_user_profiles_still_load(capsys):
    _write_profile("name: cpu\npriority: 5\nreserve_gib: 1\nspeculate: false\ndtype: float32\n"
                   "models: [{quant: [none, 4bit], max_context: 2048}]\n"
                   "tree: {none: {total_tokens: 8, depth: 3, top_k: 4}}\n")
    assert cli.main(["show", DEFAULT, "--profile", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"priority": 5' in out and '"speculate": false' in out


# ------------------------------------------------------------------------------- head and base config.json


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tiny_models import save_tiny_pair

    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


def _variant(src, dst, text=None, **changes):
    import json
    import shutil

    shutil.copytree(src, dst)
    if text is None:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(changes)
        text = json.dumps(cfg)
    (dst / "config.json").write_text(text)
    return dst


BAD_HEAD_CONFIGS = [
    ({"hidden_size": "abc"}, None, "hidden_size must be an integer, got 'abc'"),
    ({}, "[1, 2, 3]", "must be a JSON object, got a list"),
    ({}, '"just text"', "must be a JSON object, got a str"),
    ({"num_attention_heads": 0}, None, "num_attention_heads must be between 1 and"),
    ({"num_attention_heads": -4}, None, "num_attention_heads must be between 1 and"),
    ({"hidden_size": None}, None, "hidden_size must be an integer, got None"),
    ({"hidden_size": 10**9}, None, "hidden_size must be between 1 and"),
    ({"rms_norm_eps": "x"}, None, "rms_norm_eps must be a number"),
    ({"rope_scaling": [1]}, None, "rope_scaling must be a mapping"),
    ({"draft_vocab_size": -3}, None, "draft_vocab_size must be between 0 and"),
    ({"num_attention_heads": 3}, None, "num_attention_heads 3 is not a multiple of num_key_value_heads"),
    ({"bias": "yes"}, None, "bias must be true or false"),
    ({}, "{nope", "cannot read"),
    ({}, "\udcff", "cannot read"),
]


@pytest.mark.parametrize("changes, text, says", BAD_HEAD_CONFIGS, ids=[s for *_, s in BAD_HEAD_CONFIGS])
def test_a_broken_head_config_is_one_line_naming_the_file(pair, tmp_path, changes, text, says, capsys):
    base, head = pair
    if text == "\udcff":
        bad = _variant(head, tmp_path / "head", text="")
        (bad / "config.json").write_bytes(b"\xff\xfe{}")
    else:
        bad = _variant(head, tmp_path / "head", text, **changes)
    assert cli.main(["run", str(base), "--head", str(bad), "Hello", "--max-new-tokens", "2"]) != 0
    line = one_error_line(capsys)
    assert str(bad / "config.json") in line and says in line


BAD_BASE_CONFIGS = [
    ({}, "[1, 2, 3]", "must be a JSON object, got a list"),
    ({"num_attention_heads": 0}, None, "num_attention_heads must be between 1 and"),
    ({"hidden_size": "abc"}, None, "hidden_size must be an integer, got 'abc'"),
    ({"vocab_size": -1}, None, "vocab_size must be between 1 and"),
    ({"model_type": 7}, None, "model_type must name a transformers architecture"),
    ({"model_type": "no-such-arch"}, None, "model type 'no-such-arch' is not known"),
    ({}, "{nope", "cannot read config"),
]


@pytest.mark.parametrize("changes, text, says", BAD_BASE_CONFIGS, ids=[s for *_, s in BAD_BASE_CONFIGS])
@pytest.mark.parametrize("verb", ["run", "plan"])
def test_a_broken_base_config_is_one_line_naming_the_file(pair, tmp_path, changes, text, says, verb, capsys):
    base, head = pair
    bad = _variant(base, tmp_path / "base", text, **changes)
    argv = ["run", str(bad), "--head", str(head), "Hello", "--max-new-tokens", "2"] if verb == "run" else ["plan", str(bad)]
    assert cli.main(argv) != 0
    line = one_error_line(capsys)
    assert str(bad / "config.json") in line and says in line


# ------------------------------------------------------------------- a model is all there or it is refused

# (config change, verb, what the one line says); the tiny pair's base has 3 layers of hidden 64
INCOMPLETE_BASES = [
    ({"num_hidden_layers": 4}, "run", "the checkpoint lacks weights the config needs: model.layers.3."),
    ({"num_hidden_layers": 2}, "run", "the checkpoint has weights the config's model does not use: model.layers.2."),
    ({"architectures": ["BertForMaskedLM"], "model_type": "bert"}, "run", "BertForMaskedLM is not a causal language model"),
    ({"num_hidden_layers": 4000, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32},
     "run", "parameters (4000 layers x hidden 4096 x intermediate"),
    ({"num_hidden_layers": 4000, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32},
     "plan", "but its safetensors headers hold"),
]


@pytest.mark.parametrize("changes, verb, says", INCOMPLETE_BASES, ids=[s[:40] for *_, s in INCOMPLETE_BASES])
def test_a_base_the_checkpoint_does_not_fill_is_refused_in_one_line(pair, tmp_path, changes, verb, says, capsys):
    base, head = pair
    bad = _variant(base, tmp_path / "base", **changes)
    argv = ["run", str(bad), "Hello", "--max-new-tokens", "2", "--quant", "none"] if verb == "run" else ["plan", str(bad)]
    assert cli.main(argv) != 0
    line = one_error_line(capsys)
    assert says in line
    if "lacks" in says or "does not use" in says:
        assert "(+" in line  # the first few keys, then how many more


@pytest.fixture
def nothing_allocated(monkeypatch):
    from transformers import AutoModelForCausalLM

    def refuse(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)


@pytest.mark.slow
@pytest.mark.parametrize("verb", ["plan", "run"])
def test_4000_layers_over_the_default_models_weights_are_refused_before_allocation(
        default_base, tmp_path, verb, nothing_allocated, capsys):
    import json

    folder = tmp_path / "claims"
    folder.mkdir()
    for f in default_base.iterdir():  # the real weights, a config that claims 4000 layers over them
        (folder / f.name).symlink_to(f)
    (folder / "config.json").unlink()
    config = json.loads((default_base / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 4000}))
    argv = ["plan", str(folder)] if verb == "plan" else ["run", str(folder), "hi", "--quant", "none", "--device", "cpu"]
    assert cli.main(argv) != 0
    line = one_error_line(capsys)
    assert "asks for 14.2 B parameters (4000 layers x hidden 576 x intermediate 1536, vocabulary 49152)" in line
    assert "but its safetensors headers hold 135 M" in line


def test_a_quantized_checkpoint_is_measured_at_one_bit_a_parameter(pair, tmp_path, capsys):
    """A quantized checkpoint packs parameters: its bytes, not its elements, bound the claim."""
    base, _ = pair
    bad = _variant(base, tmp_path / "base", num_hidden_layers=4000, hidden_size=4096, num_attention_heads=32,
                   num_key_value_heads=32, quantization_config={"quant_method": "bitsandbytes", "load_in_4bit": True})
    assert cli.main(["plan", str(bad)]) != 0
    assert "at one bit each; the config does not belong to these weights" in one_error_line(capsys)


def test_moe_experts_count_toward_the_claim(tmp_path):
    import json

    import numpy as np
    from safetensors.numpy import save_file

    from eaglechat.errors import WeightsError
    from eaglechat.models.folder import check_size_against_files

    save_file({"w": np.zeros((1000, 1000), dtype=np.float16)}, str(tmp_path / "model.safetensors"))  # 1 M elements
    dense = {"model_type": "qwen3_moe", "num_hidden_layers": 4, "hidden_size": 256, "intermediate_size": 512,
             "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000}
    moe = {**dense, "num_experts": 512, "num_experts_per_tok": 8, "moe_intermediate_size": 512}
    (tmp_path / "config.json").write_text(json.dumps(moe))
    with pytest.raises(WeightsError, match=r"asks for 80\d M parameters \(4 layers x hidden 256 x intermediate 512 "
                                             r"x 512 experts, vocabulary 1000\) but its safetensors headers hold 1 M"):
        check_size_against_files(moe, tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dense))
    check_size_against_files(dense, tmp_path)  # 2 M parameters: below the floor where a wrong config costs


def test_a_model_larger_than_the_machine_is_refused_before_allocation(pair, monkeypatch, nothing_allocated, capsys):
    from dataclasses import replace

    from eaglechat.fit import hardware

    probe = hardware.probe
    monkeypatch.setattr(hardware, "probe", lambda device=None: replace(probe(device), total_bytes=100_000))
    base, head = pair
    assert cli.main(["run", str(base), "--head", str(head), "hi", "--quant", "none", "--device", "cpu"]) != 0
    line = one_error_line(capsys)
    assert "'s config asks for 152 K parameters, 594 KiB of weights in float32, more than all 98 KiB of " in line


def test_a_gpt2_folder_runs_with_the_default_quant(tmp_path, capsys):
    import json

    from tiny_models import tiny_tokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = tiny_tokenizer()
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=len(tok), n_positions=128,
                               bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert cli.main(["run", str(tmp_path), "Hello", "--max-new-tokens", "3", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["token_ids"]) <= 3
    assert cli.main(["plan", str(tmp_path), "--json"]) == 0  # GPT-2 spells its sizes n_embd, n_layer, n_head
    assert json.loads(capsys.readouterr().out)
