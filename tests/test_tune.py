"""`eaglechat tune`: the pure choice model, and one quick end-to-end run on a tiny random pair."""

from __future__ import annotations

import json

import pytest

from eaglechat.bench.tune import Measurements, acceptance_tail, choose, pool_size, speculation_arms, tau_estimate
from eaglechat.engine.protocol import TreeBudget


def meas(verify_ms: dict, draft_ms: dict, hist: list[int], plain_ms: float, ref=TreeBudget(24, 4, 6), ref_step_ms=None):
    v = {n: t / 1e3 for n, t in verify_ms.items()}
    d = {k: t / 1e3 for k, t in draft_ms.items()}
    step = ref_step_ms / 1e3 if ref_step_ms else v[ref.total_tokens] + d[(ref.depth, ref.draft_top_k)]
    return Measurements(kv_length=256, repeats=3, verify_s=v, draft_s=d, plain_step_s=plain_ms / 1e3, ref_tree=ref,
                        ref_step_s=step, accepted_hist=hist, ref_tau=1.0)


def test_acceptance_tail_and_tau():
    assert acceptance_tail([50, 30, 20]) == [0.5, 0.2]
    assert acceptance_tail([]) == []
    ref = TreeBudget(24, 4, 6)
    # full reference tree: tau = 1 + mean accepted
    assert tau_estimate(24, 4, [50, 30, 20], ref) == pytest.approx(1 + 0.5 + 0.2)
    # shallower trees cannot accept deeper; narrower trees accept a little less
    hist = [10, 20, 30, 40]
    assert tau_estimate(24, 1, hist, ref) < tau_estimate(24, 3, hist, ref)
    assert tau_estimate(8, 3, hist, ref) < tau_estimate(24, 3, hist, ref)
    assert tau_estimate(1, 3, hist, ref) == pytest.approx(1 + 0.9 * (1 / 24) ** 0.3)


GRID = dict(depth_grid=[2, 3, 4], top_k_grid=[4, 6])


def test_flat_verify_cost_and_good_acceptance_pick_a_big_tree():
    m = meas({0: 10, 8: 10.2, 16: 10.4, 24: 10.6}, {(d, k): 0.5 * d for d in (2, 3, 4) for k in (4, 6)},
             hist=[10, 15, 20, 25, 30], plain_ms=10.5)
    c = choose(m, **GRID)
    assert c.speculate and c.predicted_speedup > 2
    assert (c.tree.total_tokens, c.tree.depth) == (24, 4)
    assert all(r.total_tokens <= pool_size(r.depth, r.top_k) for r in c.ranking)


def test_steep_verify_cost_prefers_small_trees():
    m = meas({0: 10, 4: 12, 8: 20, 16: 40, 24: 60}, {(d, k): 1.0 * d for d in (2, 3, 4) for k in (4, 6)},
             hist=[20, 30, 30, 20, 0], plain_ms=10.5)
    c = choose(m, **GRID)
    assert c.tree.total_tokens <= 8


def test_speculation_off_when_gain_under_threshold():
    m = meas({0: 10, 4: 30, 8: 45, 24: 90}, {(d, k): 5.0 * d for d in (2, 3, 4) for k in (4, 6)},
             hist=[90, 8, 2, 0, 0], plain_ms=10.5)
    c = choose(m, **GRID, min_gain=1.1)
    assert not c.speculate and c.predicted_speedup < 1.1
    assert c.predicted_tokens_per_s == pytest.approx(c.plain_tokens_per_s)


def test_overhead_from_the_reference_run_is_charged():
    base = dict(verify_ms={0: 10, 8: 11, 24: 12}, draft_ms={(d, k): 1.0 for d in (2, 3, 4) for k in (4, 6)},
                hist=[10, 10, 10, 10, 60], plain_ms=10.5)
    cheap = choose(meas(**base), **GRID)
    costly = choose(meas(**base, ref_step_ms=40.0), **GRID)
    assert costly.predicted_speedup < cheap.predicted_speedup


def test_the_speculation_record_rates_the_trees_auto_chooses_among():
    """Tune's figures for speculate="auto" (engine/autospec.py): for the chosen tree and its lighter one,
    the predicted tokens per step and step time over a plain step's."""
    m = meas({0: 10, 4: 14, 8: 18, 12: 22, 24: 34}, {(d, k): 2.0 * d for d in (2, 3, 4) for k in (4, 6)},
             hist=[20, 30, 30, 20, 0], plain_ms=10.0)
    arms = speculation_arms(m, TreeBudget(12, 3, 4))
    assert set(arms) == {"12/3/4", "6/2/4"}
    assert arms["12/3/4"]["tokens_per_step"] == pytest.approx(tau_estimate(12, 3, m.accepted_hist, m.ref_tree), abs=1e-4)
    assert arms["6/2/4"]["tokens_per_step"] == pytest.approx(tau_estimate(6, 2, m.accepted_hist, m.ref_tree), abs=1e-4)
    # a verify of 13 rows (22 ms) + a depth-3 draft (6 ms), no overhead (the reference step is just their sum),
    # over a 10 ms plain step; the lighter tree: 7 rows (16 ms, interpolated) + a depth-2 draft (4 ms)
    assert arms["12/3/4"]["cost"] == pytest.approx(2.8) and arms["6/2/4"]["cost"] == pytest.approx(2.0)
    assert set(speculation_arms(m, TreeBudget(30, 3, 4))) == {"15/2/4"}  # 31 rows: beyond what was measured


def test_tune_end_to_end_on_a_tiny_pair(tmp_path, monkeypatch, capsys):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_models import save_tiny_pair

    from eaglechat import threads
    from eaglechat.cli import main
    from eaglechat.fit import hardware
    from eaglechat.fit.profiles import resolve_profile

    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(threads, "load_average", lambda: 9.0)  # a busy machine: 9 runnable on 2 cores
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    base, head = save_tiny_pair(tmp_path)
    code = main(["tune", str(base), "--head", str(head), "--device", "cpu", "--quick", "--repeats", "1",
                 "--max-new-tokens", "6", "--json"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "eaglechat: warning: the machine is busy (load 9 on 2 cores)" in err
    d = json.loads(out)
    assert d["load"] == {"load1": 9.0, "cores": 2, "busy": True}
    assert d["device_kind"] == "cpu" and d["quant"] == "none"
    m = d["measured"]
    assert "0" in m["verify_ms"] and len(m["verify_ms"]) >= 3 and m["draft_ms"] and m["plain_step_ms"] > 0
    assert sum(m["accepted_hist"]) > 0
    c = d["choice"]
    # the choice follows from what was measured: the best-ranked candidate, its predicted gain over the
    # measured plain rate, speculation on exactly when that gain reaches the CPU profile's 1.1x
    best = c["ranking"][0]
    assert [r["tokens_per_s"] for r in c["ranking"]] == sorted((r["tokens_per_s"] for r in c["ranking"]), reverse=True)
    assert all(r["total_tokens"] <= pool_size(r["depth"], r["top_k"]) for r in c["ranking"])
    assert c["tree"] == TreeBudget(best["total_tokens"], best["depth"], best["top_k"]).to_dict()
    assert c["plain_tokens_per_s"] == pytest.approx(1e3 / m["plain_step_ms"], rel=1e-3)
    assert c["predicted_speedup"] == pytest.approx(best["tokens_per_s"] / c["plain_tokens_per_s"], rel=1e-3)
    assert c["speculate"] is (c["predicted_speedup"] >= 1.1)
    saved = json.loads(Path(d["file"]).read_text())
    assert saved["tree"] == c["tree"] and saved["speculate"] == c["speculate"]
    # the cached result now drives the profile for this (device, model, quantization)
    prof = resolve_profile(hardware.probe("cpu"), model=d["model"])
    # its tree; what it measured of plain vs EAGLE is kept, but the mode stays auto (measured again while decoding)
    assert prof.source == "tuned" and prof.tuned_speculate("none") == c["speculate"]
    assert prof.speculate_for("none") == "auto"
    assert vars(prof.tree_for("none"))["total_tokens"] == c["tree"]["total_tokens"]
    assert saved["load"]["busy"] is True
    # the engine built on that record says where its decision came from (the chat shows it)
    from eaglechat.loader import load_engine

    engine = load_engine(str(base), head=str(head), device="cpu")
    assert engine.info.tuned_under_load == "load 9 on 2 cores"
    assert engine.info.speculate_by_default == "auto" and engine.info.tuned_speculate == c["speculate"]
    # and speculate="auto" starts from the speculation record tune left beside it
    record = json.loads(Path(d["speculation_file"]).read_text())
    from eaglechat.engine.autospec import arms_for

    # the trees auto chooses among with the tree chosen here (and with the profile's, which the engine had)
    chosen = {arm.label() for arm in arms_for(TreeBudget.from_dict(c["tree"]))[1:]}
    assert set(record["arms"]) & chosen and record["load"]["busy"] is True
    assert engine.decoder.chooser.known == record["arms"]
