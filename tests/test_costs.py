"""`eaglechat bench --costs`: the cost model on synthetic costs, bitsandbytes' 4-bit dispatch clamp with
patched GPU properties, and the harness end to end on a tiny random-weight shape on this CPU."""

from __future__ import annotations

import json
import types

import pytest
import torch

from eaglechat.bench.costmodel import MeasuredTau, PublishedTau, StepCosts, pool_size, predict

MS = 1e-3


def synthetic() -> StepCosts:
    return StepCosts(
        kv_length=512,
        verify_s={1: 10 * MS, 8: 11 * MS, 16: 14 * MS, 32: 26 * MS, 64: 60 * MS},
        draft_s={(2, 4): 2 * MS, (3, 4): 3 * MS, (4, 4): 4 * MS},
        overhead_s=1.5 * MS,
        plain_overhead_s=0.5 * MS,
    )


def test_tokens_per_s_is_tau_over_draft_plus_verify_plus_overhead():
    costs = synthetic()
    tau = lambda n, d, k: 1.0 + 0.25 * d + 0.01 * n  # noqa: E731  (any known curve)
    fc = predict(costs, tau, budgets=[7, 11, 15, 31], depth_grid=[2, 3, 4], top_k_grid=[4])
    plain = 1 / (10 * MS + 0.5 * MS)
    assert fc.plain_tokens_per_s == pytest.approx(plain)
    by = {(c.total_tokens, c.depth): c for c in fc.candidates}
    # N drafted tokens verify N + 1 rows: N = 7 -> the measured 8-row forward
    assert by[(7, 3)].tokens_per_s == pytest.approx((1.75 + 0.07) / (3 * MS + 11 * MS + 1.5 * MS))
    # 12 rows: linear between the 8- and 16-row measurements
    assert by[(11, 2)].verify_s == pytest.approx(12.5 * MS)
    assert by[(11, 2)].tokens_per_s == pytest.approx((1.5 + 0.11) / (2 * MS + 12.5 * MS + 1.5 * MS))
    assert by[(31, 4)].speedup == pytest.approx((2.0 + 0.31) / (4 * MS + 26 * MS + 1.5 * MS) / plain)
    # the pick is the argmax over every allowed candidate, and per_budget keeps each N's best depth
    best = max(fc.candidates, key=lambda c: c.tokens_per_s)
    assert (fc.best.total_tokens, fc.best.depth) == (best.total_tokens, best.depth) == (7, 4)
    assert [p.total_tokens for p in fc.per_budget] == [7, 11, 15, 31]
    assert all(p.depth == 4 for p in fc.per_budget)  # draft 1 ms per level buys 0.25 tokens: deeper wins


def test_unmeasured_rows_pool_limits_and_clamp_exclude_budgets():
    costs = synthetic()
    tau = lambda n, d, k: 2.0  # noqa: E731
    fc = predict(costs, tau, budgets=[4, 8, 16, 40, 63, 64, 100], depth_grid=[2, 3, 4], top_k_grid=[4])
    assert 64 not in [c.total_tokens for c in fc.candidates]  # 65 rows: never extrapolated
    assert all(c.total_tokens <= pool_size(c.depth, c.top_k) for c in fc.candidates)
    assert {(c.total_tokens, c.depth) for c in fc.candidates if c.total_tokens >= 40} == {(40, 4)}  # pools 20, 36, 52
    clamped = predict(costs, tau, budgets=[4, 8, 16, 63], depth_grid=[2, 3, 4], top_k_grid=[4], max_rows=9)
    assert {c.total_tokens for c in clamped.candidates} == {4, 8}
    assert clamped.to_dict()["max_rows"] == 9


def test_speculation_off_below_min_gain():
    costs = synthetic()
    fc = predict(costs, lambda n, d, k: 1.05, budgets=[4, 8], depth_grid=[2], top_k_grid=[4])
    assert not fc.speculate and fc.best.speedup < 1.1
    assert predict(costs, lambda n, d, k: 3.0, budgets=[8], depth_grid=[2], top_k_grid=[4]).speculate


def test_published_curve_is_anchored_at_eagle2_and_bounded():
    tau = PublishedTau()
    assert tau(60, 5) == pytest.approx(4.36)
    assert tau(40, 5) / tau(60, 5) < 1 and tau(16, 5) < tau(32, 5) < tau(60, 5)
    assert tau(60, 2) < tau(60, 3) < tau(60, 5) < tau(60, 6)
    assert tau(1, 6) <= 2.0 and tau(2, 1) <= 2.0  # never more than the deepest path can accept
    assert "published" in tau.source


def test_measured_curve_from_the_accepted_histogram():
    tau = MeasuredTau([50, 30, 20], ref_total_tokens=24, ref_depth=4)
    assert tau(24, 4) == pytest.approx(1 + 0.5 + 0.2)
    assert tau(24, 1) == pytest.approx(1.5)
    assert tau(1, 3) == pytest.approx(1 + 0.5 * (1 / 24) ** 0.3)
    assert "measured" in tau.source


# ---------------------------------------------------------------- bitsandbytes' 4-bit kernel dispatch

VICUNA = dict(params=6_738_415_616, num_layers=32, hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
              num_key_value_heads=32, head_dim=128, vocab_size=32000, max_context=2048)


def gpu(monkeypatch, name: str, sms: int, major: int, minor: int):
    """Patch what bitsandbytes' dispatch reads: torch.cuda.get_device_properties(i).{multi_processor_count,
    major, minor} (and gcnArchName on ROCm)."""
    props = types.SimpleNamespace(name=name, multi_processor_count=sms, major=major, minor=minor, gcnArchName="")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: props)


@pytest.mark.parametrize("name,sms,cc,rows", [
    ("RTX 3060", 28, (8, 6), 128),  # small GPU: the fused kernel holds to 128 rows
    ("RTX 3090", 82, (8, 6), 64),
    ("RTX 4090", 128, (8, 9), 8),  # 4096x4096 projections dequantize above 8 rows
    ("H100", 132, (9, 0), 5),  # HBM: dequant + cuBLAS above 5 rows (down_proj)
])
def test_fused_row_limit_follows_bitsandbytes_dispatch(monkeypatch, name, sms, cc, rows):
    from eaglechat.fit.bnb_dispatch import fused_row_limit, load_dispatch, verify_row_limit
    from eaglechat.fit.memory import ModelShape

    gpu(monkeypatch, name, sms, *cc)
    shape = ModelShape(**VICUNA)
    limit = fused_row_limit(shape)
    assert limit.rows == rows and name in limit.reason
    # the limit is exactly where bitsandbytes' own decision flips for some Linear of the model
    dispatch = load_dispatch()
    from eaglechat.fit.bnb_dispatch import quantized_linears

    fused = lambda m: all(dispatch.use_custom(0, torch.float16, m, n, k) for _, n, k in quantized_linears(shape))  # noqa: E731
    assert all(fused(m) for m in range(1, rows + 1)) and not fused(rows + 1)
    assert verify_row_limit("cuda", "4bit", shape).rows == rows
    assert verify_row_limit("cuda", "8bit", shape) is None and verify_row_limit("cpu", "4bit", shape) is None


# ---------------------------------------------------------------- the harness end to end


TINY_MANIFEST = """\
name: tiny-costs
description: a tiny shape for the cost harness test
source: hub
base: {repo: example/tiny-base, revision: main}
head: {repo: example/tiny-head, revision: main}
head_kind: eagle2
template: tokenizer
dtype: float32
gated: false
license: test
approx_size_gb: {base: 0.01, head: 0.01}
shape:
  params: 1000000
  num_layers: 2
  hidden_size: 128
  intermediate_size: 256
  num_attention_heads: 4
  num_key_value_heads: 2
  head_dim: 32
  vocab_size: 512
  max_context: 1024
  tied_embeddings: false
"""


def test_costs_harness_end_to_end_on_a_tiny_shape(tmp_path, monkeypatch, capsys):
    from eaglechat.cli import main

    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))
    manifest = tmp_path / "tiny-costs.yaml"
    manifest.write_text(TINY_MANIFEST)
    out, png = tmp_path / "costs.json", tmp_path / "costs.png"
    rc = main(["bench", "--costs", str(manifest), "--device", "cpu", "--formats", "fp32,nf4", "--kv-lengths", "32,64",
               "--depths", "2,3", "--draft-top-ks", "2,4", "--repeats", "1", "--decode-steps", "3",
               "--json", str(out), "--plot", str(png)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["model"] == "tiny-costs" and doc["shape"]["hidden_size"] == 128 and "random weights" in doc["source"]
    assert [f["format"] for f in doc["formats"]] == ["fp32", "nf4"]
    nf4 = doc["formats"][1]
    assert nf4["quant"] == "4bit"
    for f in doc["formats"]:
        costs = f["measured"]["costs"]
        assert [c["kv_length"] for c in costs] == [32, 64]
        assert all(list(c["verify_ms"]) == ["1", "8", "16", "32", "64", "128"] for c in costs)
        assert all(v > 0 for c in costs for v in [*c["verify_ms"].values(), *c["draft_ms"].values()])
        assert set(costs[0]["draft_ms"]) == {"2,2", "2,4", "3,2", "3,4"}
        assert f["measured"]["tau"]["kind"] == "published"  # a random head has no acceptance to measure
        for fc in f["forecast"]:
            best = fc["best"]
            assert best and best["tokens_per_s"] == max(p["tokens_per_s"] for p in fc["per_budget"])
            # the document's own numbers obey the model: tokens/s = tau / (draft + verify + overhead)
            for p in fc["per_budget"]:
                assert p["tokens_per_s"] == pytest.approx(p["tau"] / (p["step_ms"] / 1e3), rel=1e-3)
    printed = capsys.readouterr().out
    assert "predicted at L=64" in printed and "<- best" in printed
    assert png.stat().st_size > 10_000


def test_the_loader_clamp_lowers_profile_trees_and_int8_computes_in_fp16_on_gpus(monkeypatch):
    from eaglechat.engine.protocol import TreeBudget
    from eaglechat.fit.bnb_dispatch import clamp_tree, int8_compute_dtype, verify_row_limit
    from eaglechat.fit.memory import ModelShape

    gpu(monkeypatch, "RTX 4090", 128, 8, 9)
    limit = verify_row_limit("cuda", "4bit", ModelShape(**VICUNA))
    tree, note = clamp_tree(TreeBudget(24, 4, 8), limit)
    assert (tree.total_tokens, tree.depth, tree.draft_top_k) == (7, 4, 8) and "24 -> 7" in note  # 8 rows = 7 + root
    assert clamp_tree(TreeBudget(6, 3, 4), limit) == (TreeBudget(6, 3, 4), "")
    assert clamp_tree(TreeBudget(60, 5, 10), None) == (TreeBudget(60, 5, 10), "")
    assert int8_compute_dtype("8bit", "cuda", "bfloat16", dtype_given=False) == "float16"
    assert int8_compute_dtype("8bit", "cuda", "bfloat16", dtype_given=True) == "bfloat16"
    assert int8_compute_dtype("4bit", "cuda", "bfloat16", dtype_given=False) == "bfloat16"
    assert int8_compute_dtype("8bit", "cpu", "float32", dtype_given=False) == "float32"


def test_overhead_measured_at_two_trees_is_interpolated_by_rows():
    costs = synthetic()
    costs.overhead_by_rows = {9: 1 * MS, 61: 14 * MS}
    assert costs.overhead(9) == pytest.approx(1 * MS) and costs.overhead(61) == pytest.approx(14 * MS)
    assert costs.overhead(35) == pytest.approx(7.5 * MS)
    assert costs.overhead(2) == pytest.approx(1 * MS) and costs.overhead(129) == pytest.approx(14 * MS)
    fc = predict(costs, lambda n, d, k: 2.0, budgets=[8, 34], depth_grid=[4], top_k_grid=[4])
    by = {c.total_tokens: c for c in fc.candidates}
    assert by[34].step_s == pytest.approx(4 * MS + costs.verify(35) + 7.5 * MS)
    assert by[8].overhead_s == pytest.approx(1 * MS)


@pytest.mark.parametrize("steps", ["eager", "graphs"])
def test_every_decode_runs_once_untimed_before_it_is_timed_and_graphs_time_replays(steps):
    """A shape's first call is not timed (on a GPU it costs 2-10x a steady one); with graphs the forwards
    are timed as replays of their captured graphs and the decodes run through the graph runner."""
    from fake_graphs import FakeGraphs
    from tiny_models import random_head, tiny_model

    from eaglechat.bench.costs import Plan, measure
    from eaglechat.engine.decode import Decoder

    model = tiny_model("llama")
    dec = Decoder(model, random_head(model), 512)
    plan = Plan(kv_lengths=[32], rows=[1, 8], depths=[2], top_ks=[2], repeats=1, decode_steps=3)
    backend = FakeGraphs()
    decodes, generate = [], dec.generate

    def recorded(prompt, params, budget, *args, **kwargs):
        decodes.append((len(prompt), params.speculate, budget.total_tokens, params.max_new_tokens,
                        dec.runner is not None))
        return generate(prompt, params, budget, *args, **kwargs)

    dec.generate = recorded
    measured = measure(dec, plan, vocab=model.config.vocab_size, steps=steps, graph_backend=backend)
    stepping = [d for d in decodes if d[3] > 1]  # the prefill-only calls make one token
    assert len(stepping) == 6 and stepping[0::2] == stepping[1::2]  # each decode twice: warm, then timed
    assert all(d[4] == (steps == "graphs") for d in stepping)
    assert (measured["steps"], measured["steps_note"]) == (steps, "")
    assert measured["plain_step_ms"] > 0 and measured["eagle_step_ms"] > 0
    if steps == "graphs":  # each forward case (2 verify, 1 draft) and each decode's key (plain, the tree:
        # the small tree is the reference one on this grid) captured, then replayed
        assert backend.captures == 3 + 2 and backend.replays >= 2 * 3 + 6
    assert dec.runner is None and not dec.cache.static  # the decoder is handed back eager


def test_a_forward_that_cannot_be_captured_is_timed_eagerly_and_said():
    from fake_graphs import FakeGraphs
    from tiny_models import random_head, tiny_model

    from eaglechat.bench.costs import Plan, measure
    from eaglechat.engine.decode import Decoder

    model = tiny_model("llama")
    dec = Decoder(model, random_head(model), 512)
    plan = Plan(kv_lengths=[32], rows=[1, 8], depths=[2], top_ks=[2], repeats=1, decode_steps=3)
    measured = measure(dec, plan, vocab=model.config.vocab_size, steps="graphs",
                       graph_backend=FakeGraphs(fail=RuntimeError("not capturable")))
    assert measured["steps"] == "eager" and "RuntimeError: not capturable" in measured["steps_note"]
    assert all(v > 0 for v in measured["costs"][0].verify_s.values())


def test_a_4bit_tree_is_sized_by_the_measured_cost_of_leaving_the_fused_kernel(monkeypatch):
    """Past bitsandbytes' fused kernel a 4-bit verify costs 1.4x a one-row step at 8 rows and 1.8x at 128
    (one H200): a tree is clamped to the fused rows only where that keeps more tokens per one-row step."""
    from eaglechat.engine.protocol import TreeBudget
    from eaglechat.fit.bnb_dispatch import RowLimit, clamp_tree, off_fused_cost

    assert off_fused_cost(1) == 1.0 and off_fused_cost(8) == pytest.approx(1.4)
    assert off_fused_cost(68) == pytest.approx(1.6) and off_fused_cost(500) == pytest.approx(1.8)
    h200 = RowLimit(5, "leaves its fused kernel above 5 rows on H200")  # 4 drafted tokens fused
    kept, note = clamp_tree(TreeBudget(48, 4, 10), h200)
    assert kept == TreeBudget(48, 4, 10) and "kept past bitsandbytes' fused 4-bit kernel" in note and "~1.5x a one-row step" in note
    rtx4090 = RowLimit(8, "leaves its fused kernel above 8 rows on RTX 4090")
    clamped, note = clamp_tree(TreeBudget(32, 4, 8), rtx4090)
    assert clamped == TreeBudget(7, 4, 8) and note.startswith("tree 32 -> 7 drafted tokens")
    flat = lambda n, d, k: 3.0  # noqa: E731 - a head whose tau does not grow with the tree: clamp
    assert clamp_tree(TreeBudget(48, 4, 10), h200, tau=flat)[0].total_tokens == 4
