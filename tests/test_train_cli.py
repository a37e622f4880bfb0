"""`eaglechat train` end to end on a tiny base: real ShareGPT prompts, self-distillation, training of
either head kind with a reduced draft vocabulary, export, the held-out tau evaluation, and a decode of
the exported head that matches plain greedy decoding."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import FAMILIES, build_model, tiny_tokenizer
from transformers import AutoModelForCausalLM

from eaglechat.cli import main
from eaglechat.engine.decode import Decoder
from eaglechat.engine.heads import load_head
from eaglechat.engine.protocol import GenerationParams, TreeBudget


@pytest.fixture
def tiny_base(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))
    tok = tiny_tokenizer()
    config = FAMILIES["llama"]()
    config.num_hidden_layers = 6  # EAGLE-3 fuses the inputs of layers 2, N//2 and N-3
    config.vocab_size = max(len(tok), 320)
    config.eos_token_id, config.bos_token_id = tok.eos_token_id, tok.bos_token_id
    model = build_model(config, seed=0)
    base = tmp_path / "tiny-deep"
    model.save_pretrained(base)
    tok.save_pretrained(base)
    return base


def greedy(model, head, prompt, n=24):
    dec = Decoder(model, head, 256)
    params = GenerationParams(temperature=0.0, max_new_tokens=n, speculate=head is not None)
    return [t for s in dec.generate(prompt, params, TreeBudget(12, 4, 3), set()) for t in s.tokens]


@pytest.mark.parametrize("kind", ["eagle2", "eagle3"])
def test_train_cli_reduced_vocab_head(tmp_path, tiny_base, kind, capsys):
    work, out = tmp_path / "work", tmp_path / "head"
    extra = ["--ttt-steps", "2", "--skip-prompts", "3"] if kind == "eagle2" else []
    rc = main(["train", str(tiny_base), "--work", str(work), "--out", str(out), "--prompts", "8",
               "--max-new-tokens", "16", "--gen-batch-size", "8", "--epochs", "2", "--batch-size", "4",
               "--head-kind", kind, "--draft-vocab", "64", "--eval-prompts", "2", "--export-dtype", "float32",
               "--threads", "1", *extra])
    assert rc == 0
    assert f"head written to {out}" in capsys.readouterr().out
    if kind == "eagle2":
        _assert_distilled_features_are_the_bases(tiny_base, work)
        from eaglechat.train.data import sharegpt_prompts
        assert json.loads((work / "prompts.json").read_text()) == sharegpt_prompts(11)[3:]
        history = json.loads((work / "train.done").read_text())["history"]
        assert "acc1" in history[-1] and "acc2" not in history[-1]  # --ttt-steps 2
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 64
    assert ("Eagle3" in cfg["architectures"][0]) == (kind == "eagle3")
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["distill"]["replies"] == 8
    assert summary["train"]["draft_vocab_size"] == 64 and summary["eval"]["prompts"] == 2
    model = AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32).eval().requires_grad_(False)
    head = load_head(out, model)
    assert head.kind == kind and head.draft_to_target.numel() == 64
    prompt = [5, 40, 77, 120, 9]
    assert greedy(model, head, prompt) == greedy(model, None, prompt)
    # every stage is marked done: a second run trains nothing again and keeps the head
    before = (out / "model.safetensors").read_bytes()
    assert main(["train", str(tiny_base), "--work", str(work), "--out", str(out), "--prompts", "8",
                 "--max-new-tokens", "16", "--head-kind", kind, "--draft-vocab", "64", "--eval-prompts", "2",
                 "--threads", "1", *extra]) == 0
    assert (out / "model.safetensors").read_bytes() == before


def _assert_distilled_features_are_the_bases(base, work):
    """Features captured during generation equal a teacher-forced forward of prompt + reply (bf16)."""
    from eaglechat.train import store
    from eaglechat.train.features import extract

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    rows = [r for shard in store.shards(work / "distill") for r in store.load(shard)]
    assert rows and all("features" in r for r in rows)
    ref = extract(model, [list(r["prompt_ids"]) + list(r["reply_ids"]) for r in rows])
    for row, want in zip(rows, ref):
        assert row["features"].shape == want.shape
        assert torch.allclose(row["features"].float(), want.float(), rtol=2e-2, atol=2e-2)


def test_bad_init_head_fails_before_any_work(tmp_path, tiny_base, capsys):
    """--init-head is checked right after the base loads, not after hours of distillation."""
    work = tmp_path / "work"
    common = ["train", str(tiny_base), "--work", str(work), "--prompts", "8", "--max-new-tokens", "16",
              "--eval-prompts", "0", "--threads", "1"]
    assert main(common + ["--init-head", str(tmp_path / "no-such-head")]) != 0
    err = capsys.readouterr().err
    assert "no-such-head" in err and "Traceback" not in err
    assert not list((work / "distill").glob("*.pt"))
    assert main(common + ["--head-kind", "eagle3", "--init-head", str(tmp_path)]) != 0
    assert "EAGLE-3 training starts from a fresh head" in capsys.readouterr().err


@pytest.mark.parametrize("flags, says", [
    (["--prompts", "0"], "nothing to train on: --prompts 0 and --dataset-replies 0"),
    (["--prompts", "1"], "nothing to train on: --prompts 1"),
    (["--prompts", "-5"], "argument --prompts: must be at least 0, got -5"),
    (["--epochs", "0"], "argument --epochs: must be a finite number > 0, got 0"),
    (["--epochs", "nan"], "argument --epochs: must be a finite number > 0, got nan"),
    (["--lr=-1e-3"], "argument --lr: must be a finite number > 0"),
    (["--batch-size", "0"], "argument --batch-size: must be at least 1, got 0"),
    (["--gen-batch-size", "0"], "argument --gen-batch-size: must be at least 1"),
    (["--train-minutes", "-1"], "argument --train-minutes: must be a finite number >= 0"),
    (["--distill-minutes", "inf"], "argument --distill-minutes: must be a finite number >= 0"),
    (["--eval-prompts", "-1"], "argument --eval-prompts: must be at least 0"),
    (["--draft-vocab", "-3"], "argument --draft-vocab: must be at least 0"),
    (["--dataset-replies", "x"], "argument --dataset-replies: expected an integer, got 'x'"),
    (["--init-head", "NOWHERE"], "--init-head NOWHERE: not a head folder (no config.json)"),
    (["--head-kind", "eagle3", "--init-head", "NOWHERE"], "EAGLE-3 training starts from a fresh head"),
])
def test_train_flags_are_checked_before_anything_loads(tmp_path, capsys, flags, says):
    """A bad flag is one line and exit 2 before the base is even looked up (it does not exist here)."""
    code = main(["train", str(tmp_path / "no-such-base"), "--work", str(tmp_path / "work"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and says in err and err.count("\n") == 1, err
    assert not (tmp_path / "work").exists()


def test_train_out_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "head").write_text("mine")
    assert main(["train", str(tmp_path / "no-such-base"), "--out", str(tmp_path / "head")]) == 2
    assert "--out" in capsys.readouterr().err and (tmp_path / "head").read_text() == "mine"
