"""`eaglechat bench` on a tiny random model pair: the JSON schema and its internal consistency, the plot,
the prompt sets, Ctrl-C. No timing thresholds (timings here are noise); tau and exact match are exact."""

from __future__ import annotations

import json
import statistics

import pytest

from eaglechat.bench import prompts as prompt_sets
from eaglechat.cli import main

REL = 2e-3  # the JSON rounds to 4 decimals


def close(a, b, rel=REL):
    return a == pytest.approx(b, rel=rel, abs=1e-3)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tiny_models import save_tiny_pair

    root = tmp_path_factory.mktemp("bench")
    base, head = save_tiny_pair(root)
    prompts = root / "prompts.jsonl"
    prompts.write_text(
        "\n".join(json.dumps(r) for r in [
            {"id": "a", "category": "greet", "turns": ["Hello world! Speculative decoding is exact."]},
            {"id": "b", "category": "fox", "turns": ["The quick brown fox jumps over the lazy dog."]},
            {"question_id": 7, "messages": [{"role": "user", "content": "caf\u00e9 eagle"}]},
        ]) + "\n"
    )
    return root, base, head, prompts


@pytest.fixture(scope="module")
def bench_doc(pair):
    root, base, head, prompts = pair
    out, png = root / "bench.json", root / "bench.png"
    rc = main([
        "bench", str(base), "--head", str(head), "--prompts", str(prompts), "--n", "3",
        "--max-new-tokens", "12", "--total-tokens", "4,8", "--depth", "3", "--repeats", "2",
        "--json", str(out), "--plot", str(png), "--threads", "1",
    ])
    assert rc == 0
    return json.loads(out.read_text()), png


def test_schema(bench_doc):
    doc, _ = bench_doc
    for key in ["schema", "model", "device", "device_name", "threads", "dtype", "quant", "versions", "date",
                "prompts_source", "settings", "methods", "interrupted", "looping", "overall", "by_category", "prompts"]:
        assert key in doc, key
    assert doc["schema"] == "eaglechat.bench/1"
    assert doc["interrupted"] is False
    names = [m["name"] for m in doc["methods"]]
    assert names == ["plain", "eagle-4", "eagle-8", "auto", "hf-generate", "prompt-lookup"]
    assert doc["methods"][3] == {"name": "auto", "kind": "auto",
                                 "tree": {"total_tokens": 4, "depth": 3, "draft_top_k": 4, "kind": "dynamic"}}
    assert doc["methods"][1]["tree"] == {"total_tokens": 4, "depth": 3, "draft_top_k": 4, "kind": "dynamic"}
    assert doc["settings"]["total_tokens"] == [4, 8] and doc["settings"]["repeats"] == 2
    assert len(doc["prompts"]) == 3 and doc["overall"]["prompts"] == 3
    assert {p["category"] for p in doc["prompts"]} == {"greet", "fox", "custom"}
    assert set(doc["by_category"]) == {"greet", "fox", "custom"}
    for p in doc["prompts"]:
        assert p["complete"] and p["prompt_tokens"] > 0
        for n in names:
            assert len(p["methods"][n]["runs_detail"]) == 2


def test_runs_are_consistent(bench_doc):
    doc, _ = bench_doc
    for p in doc["prompts"]:
        for name, block in p["methods"].items():
            runs = block["runs_detail"]
            for r in runs:
                assert 0 < r["new_tokens"] <= 12
                assert r["decode_tokens"] == r["new_tokens"] - 1
                # elapsed_s is rounded to 4 decimals: on a ~10 ms run that alone is up to 0.5 %
                assert close(r["tokens_per_s"], r["new_tokens"] / r["elapsed_s"], rel=REL + 1e-4 / r["elapsed_s"])
                if r["target_forwards"]:
                    assert close(r["tau"], r["decode_tokens"] / r["target_forwards"])
                if name.startswith("eagle-"):
                    hist = r["accepted_hist"]
                    assert sum(hist) == r["target_forwards"]
                    # each step emits accepted + 1 tokens, cut only at the end (stop or length)
                    assert r["decode_tokens"] <= sum((j + 1) * c for j, c in enumerate(hist))
                    assert len(hist) - 1 <= 3  # never deeper than --depth
                elif name == "auto":  # plain steps and speculative ones: the histogram counts the latter
                    assert sum(r["accepted_hist"]) <= r["target_forwards"] <= r["decode_tokens"]
                elif name == "plain":
                    assert r["target_forwards"] == r["decode_tokens"] and r["tau"] == 1.0
            # pooled over the prompt's runs
            assert block["decode_tokens"] == sum(r["decode_tokens"] for r in runs)
            assert block["target_forwards"] == sum(r["target_forwards"] for r in runs)
            assert close(block["tau"], block["decode_tokens"] / block["target_forwards"])
            assert close(block["tokens_per_s"]["median"], statistics.median(r["tokens_per_s"] for r in runs))
            plain = p["methods"]["plain"]["tokens_per_s"]["median"]
            assert close(block["speedup"], block["tokens_per_s"]["median"] / plain)


def overall_cpu(doc) -> float:
    return statistics.median(p["methods"]["plain"]["cpu_tokens_per_s"]["median"] for p in doc["prompts"])


def test_overall_is_consistent(bench_doc):
    doc, _ = bench_doc
    overall = doc["overall"]["methods"]
    plain_rate = overall["plain"]["tokens_per_s"]["median"]
    assert overall["plain"]["speedup"] == 1.0 and overall["plain"]["tau"] == 1.0
    for name, o in overall.items():
        per_prompt = [p["methods"][name]["tokens_per_s"]["median"] for p in doc["prompts"]]
        assert close(o["tokens_per_s"]["median"], statistics.median(per_prompt))
        assert close(o["speedup"], o["tokens_per_s"]["median"] / plain_rate)  # speedup = ratio of reported rates
        # the same ratio in the process's CPU time (engine runs record it; transformers' own do not)
        if name in ("plain", "auto") or name.startswith("eagle-"):
            cpu = [p["methods"][name]["cpu_tokens_per_s"]["median"] for p in doc["prompts"]]
            assert all(r["cpu_s"] > 0 for p in doc["prompts"] for r in p["methods"][name]["runs_detail"])
            assert close(o["cpu_speedup"], statistics.median(cpu) / overall_cpu(doc))
        else:
            assert o["cpu_speedup"] is None
        decode = sum(p["methods"][name]["decode_tokens"] for p in doc["prompts"])
        forwards = sum(p["methods"][name]["target_forwards"] for p in doc["prompts"])
        assert (o["decode_tokens"], o["target_forwards"]) == (decode, forwards)
        assert close(o["tau"], decode / forwards)  # tau = emitted decode tokens / target forwards
        if name.startswith("eagle-"):
            hist = o["accepted_hist"]
            assert sum(hist) == forwards
            acc = o["acceptance_by_depth"]
            assert [a["depth"] for a in acc][:3] == [1, 2, 3]
            assert close(acc[0]["reached"], 1 - hist[0] / sum(hist))
            assert all(a["reached"] >= b["reached"] for a, b in zip(acc, acc[1:]))
            if not doc["looping"]["prompts"]:
                assert o["tau_no_looping"] == o["tau"]
    for cat, c in doc["by_category"].items():
        for name, v in c["methods"].items():
            assert close(v["speedup"], v["tokens_per_s"] / c["methods"]["plain"]["tokens_per_s"])


def test_exact_match_at_temperature_zero(bench_doc):
    doc, _ = bench_doc
    for name in ["plain", "eagle-4", "eagle-8", "auto"]:
        m = doc["overall"]["methods"][name]["exact_match"]
        assert m["matched"] == m["total"] == 6, name
        for p in doc["prompts"]:
            assert p["methods"][name]["exact_match"] == {"matched": 2, "total": 2}


def test_plot_written(bench_doc):
    _, png = bench_doc
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_sampling_and_stdout_json(pair, capsys):
    root, base, head, prompts = pair
    rc = main(["bench", str(base), "--head", str(head), "--prompts", str(prompts), "--n", "1", "--max-new-tokens", "6",
               "--temperature", "0.8", "--top-k", "20", "--repeats", "1", "--warmup", "0", "--json", "-"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["settings"]["temperature"] == 0.8
    for o in doc["overall"]["methods"].values():
        assert o["exact_match"] is None  # not token-identical by design at T > 0, only equal in distribution
    assert doc["overall"]["methods"]["eagle-16"]["tree"]["total_tokens"] == 16  # the built-in default budget


def test_ctrl_c_keeps_results_so_far(pair):
    from eaglechat.bench import summary
    from eaglechat.bench.runner import Settings, run_bench
    from eaglechat.loader import load_engine

    root, base, head, prompts = pair
    engine = load_engine(str(base), head=str(head))
    settings = Settings(max_new_tokens=5, repeats=1, warmup=0, peers=False)
    calls = []

    def tick(label):
        calls.append(label)
        if len(calls) == 4:  # plain, eagle and auto of prompt 1, the first of prompt 2: then Ctrl-C
            raise KeyboardInterrupt

    results = run_bench(engine, prompt_sets.load_prompts(str(prompts)), settings, tick)
    assert results.interrupted
    # prompt 2's round starts one method on (A B C, B C A): no method always runs first
    assert [c.split()[-1] for c in calls] == ["plain", "eagle-16", "auto", "eagle-16"]
    doc = summary.build(results, settings, source="x", env=summary.environment(engine, 1))
    assert doc["interrupted"] and doc["overall"]["prompts"] == 1
    assert [p["complete"] for p in doc["prompts"]] == [True, False]
    assert doc["overall"]["methods"]["eagle-16"]["exact_match"]["matched"] == 1


def test_the_order_rotates_and_no_method_always_follows_the_same_one():
    from collections import Counter

    from eaglechat.bench.runner import rotated

    for n in (2, 3, 4):
        methods = list("ABCD"[:n])
        rounds = [rotated(methods, k) for k in range(2 * n)]
        assert all(sorted(r) == methods for r in rounds)
        assert Counter(r[0] for r in rounds) == {m: 2 for m in methods}  # first equally often
        pairs = Counter((a, b) for r in rounds for a, b in zip(r, r[1:]))
        if n == 3:  # a Williams square for three: each ordered pair of neighbours twice
            assert set(pairs.values()) == {2} and len(pairs) == 6
        assert all(len({a for a, b in pairs if b == m}) >= min(2, n - 1) for m in methods)  # no fixed neighbour


def test_prompt_sets():
    mt = prompt_sets.load_prompts("mt-bench", 8)
    assert len(mt) == 8 and len({p.category for p in mt}) == 8  # round-robin: one per category
    assert all(p.messages[0]["role"] == "user" and p.text for p in mt)
    he = prompt_sets.load_prompts("humaneval", 2)
    assert [p.id for p in he] == ["HumanEval/0", "HumanEval/1"] and "def " in he[0].text
    assert len(prompt_sets.load_prompts("mt-bench")) == 80


def test_prompt_file_errors(tmp_path):
    from eaglechat.errors import UsageError

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nothing": 1}\n')
    with pytest.raises(UsageError, match="no turns"):
        prompt_sets.load_prompts(str(bad))
    with pytest.raises(UsageError, match="existing .jsonl"):
        prompt_sets.load_prompts(str(tmp_path / "missing.jsonl"))
    bad.write_text("{not json\n")
    with pytest.raises(UsageError, match="not JSON"):
        prompt_sets.load_prompts(str(bad))


def test_cli_errors_are_one_line(pair, capsys):
    root, base, head, prompts = pair
    assert main(["bench", str(base), "--head", str(head), "--total-tokens", "8,x"]) == 2
    assert "--total-tokens" in capsys.readouterr().err
    assert main(["bench", str(base), "--prompts", str(root / "none.jsonl")]) == 2
    capsys.readouterr()


def test_plot_without_matplotlib_is_one_line_before_measuring(pair, capsys, monkeypatch):
    import importlib.util

    root, base, head, prompts = pair
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert main(["bench", str(base), "--head", str(head), "--plot", str(root / "p.png")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == "eaglechat: error: --plot needs matplotlib, which is optional: pip install 'eaglechat[plot]'"


def test_markdown_tables(bench_doc):
    from eaglechat.bench.report import markdown

    doc, _ = bench_doc
    md = markdown(doc)
    assert md.count("\n| ") >= 5 + 3  # one row per method, one per category
    assert "| eagle-8 (8/3/4) |" in md and "6/6" in md
