"""`eaglechat plan`: text, the --json schema, refusal as one line with exit code 3."""

from __future__ import annotations

import json

import pytest

from eaglechat.cli import main


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path))
    monkeypatch.delenv("EAGLECHAT_CATALOG", raising=False)
    return tmp_path


BREAKDOWN = {"weights", "head", "kv_cache", "tree_buffers", "activations", "fragmentation", "runtime", "total"}
OPTION = {"quant", "format", "context", "status", "tree", "speculate", "total_bytes", "total_gib", "breakdown"}


def run_plan(capsys, *argv):
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_json_schema(capsys):
    code, out, err = run_plan(capsys, "vicuna-7b-eagle2", "--gpu", "rtx3060", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert set(d) == {"schema", "model", "device", "profile", "dtype", "memory", "status", "choice", "considered", "alternatives", "notes", "reason"}
    assert d["schema"] == "eaglechat.plan/1" and d["model"] == "vicuna-7b-eagle2" and d["profile"] == "gpu-12gb"
    assert d["device"]["kind"] == "cuda" and d["device"]["simulated"] is True
    assert set(d["memory"]) == {"free_bytes", "reserve_bytes", "budget_bytes", "budget_gib"}
    assert d["status"] in ("fits", "tight")
    c = d["choice"]
    assert set(c) == OPTION and set(c["breakdown"]) == BREAKDOWN
    assert c["quant"] in ("8bit", "4bit") and c["format"] in ("int8", "nf4-dq")
    assert set(c["tree"]) == {"total_tokens", "depth", "draft_top_k", "kind"}
    assert c["breakdown"]["total"] == c["total_bytes"] == sum(v for k, v in c["breakdown"].items() if k != "total")
    assert c["total_bytes"] <= d["memory"]["budget_bytes"]
    assert [o["quant"] for o in d["considered"]][:1] == ["none"] and d["considered"][0]["status"] == "wont_fit"
    assert all(set(o) == OPTION for o in d["considered"])
    assert d["alternatives"] == [] and all(isinstance(n, str) for n in d["notes"])


def test_plan_text(capsys):
    code, out, _ = run_plan(capsys, "llama3.1-8b-instruct-eagle2", "--gpu", "24")
    assert code == 0
    assert "choice   --quant none (float16)" in out and "KV cache @ 16384" in out and "<- chosen" in out


def test_plan_cpu(capsys):
    code, out, _ = run_plan(capsys, "smollm2-135m-eagle2", "--device", "cpu", "--json")
    d = json.loads(out)
    assert code == 0 and d["profile"] == "cpu" and d["device"]["kind"] == "cpu"
    assert d["choice"]["breakdown"]["runtime"] > 0 and d["choice"]["context"] <= 8192


def test_plan_refuses_with_one_line(capsys):
    code, out, err = run_plan(capsys, "vicuna-13b-eagle2", "--gpu", "rtx2060")
    assert code == 3 and out == ""
    assert err.count("\n") == 1 and err.startswith("eaglechat: error: vicuna-13b-eagle2 does not fit")
    assert "would fit:" in err and "12 GB GPU" in err


def test_plan_pinned_quant_refusal_json(capsys):
    code, out, err = run_plan(capsys, "vicuna-7b-eagle2", "--gpu", "12", "--quant", "none", "--json")
    d = json.loads(out)
    assert code == 3 and d["choice"] is None and d["status"] == "wont_fit"
    assert {a["quant"] for a in d["alternatives"]} >= {"8bit", "4bit"}
    assert "--quant 8bit" in err


def test_plan_pins_context_and_tree(capsys):
    code, out, _ = run_plan(capsys, "vicuna-7b-eagle2", "--gpu", "24", "--context", "1024", "--total-tokens", "32", "--json")
    c = json.loads(out)["choice"]
    assert code == 0 and c["context"] == 1024 and c["tree"]["total_tokens"] == 32 and c["tree"]["depth"] == 6


def test_plan_local_folder(capsys, tmp_path):
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 1024, "torch_dtype": "float32",
    }))
    code, out, _ = run_plan(capsys, str(folder), "--gpu", "6", "--json")
    d = json.loads(out)
    assert code == 0 and d["model"] == "tiny" and d["choice"]["quant"] == "none" and d["choice"]["context"] == 1024


def test_plan_unknown_model(capsys):
    code, _, err = run_plan(capsys, "no-such-model-xyz")
    assert code != 0 and "unknown model" in err
