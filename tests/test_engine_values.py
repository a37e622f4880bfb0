"""The engine's value objects: one label, one dict form each way (unknown keys ignored, so an older or
newer peer interoperates), one list of stop reasons."""

import json

from eaglechat.engine.decode import cut
from eaglechat.engine.protocol import GenerationStats, StepStats, StopReason, TreeBudget


def test_tree_budget_label_and_round_trip_ignore_unknown_keys():
    budget = TreeBudget(60, 6, 10)
    assert budget.label() == "60/6/10"
    assert TreeBudget.from_dict(budget.to_dict()) == budget
    newer = {"total_tokens": "16", "depth": 4, "top_k": 4, "kind": "dynamic", "draft_vocab": 8192}
    assert TreeBudget.from_dict(newer) == TreeBudget(16, 4, 4)  # top_k: draft_top_k's earlier name
    assert TreeBudget.from_dict({**newer, "draft_top_k": 6, "top_k": None}) == TreeBudget(16, 4, 6)
    assert TreeBudget.from_dict({"depth": 3}) == TreeBudget(depth=3)


def test_step_stats_from_a_newer_or_older_server():
    step = StepStats(accepted=3, tree_size=17, step_s=0.01, decode_tokens=4)
    assert StepStats.from_dict(json.loads(json.dumps(step.to_dict()))) == step
    assert StepStats.from_dict({**step.to_dict(), "draft_ms": 1.5}) == step  # a field this client lacks
    assert StepStats.from_dict({"accepted": 1}) == StepStats(accepted=1, tree_size=1, step_s=0.0)


def test_generation_stats_steps_and_rates():
    stats = GenerationStats(prefill_s=1.0, tree=TreeBudget(8, 3, 4).to_dict())
    stats.add_step(StepStats(accepted=2, tree_size=9, step_s=0.1, decode_tokens=3), shown=3)
    stats.add_step(StepStats(accepted=0, tree_size=9, step_s=0.1, decode_tokens=1), shown=0)  # a stop token
    stats.finish(3.0)
    assert (stats.target_forwards, stats.new_tokens, stats.decode_tokens) == (2, 3, 4)
    assert stats.accepted_hist == [1, 0, 1] and stats.mean_accepted == 2.0
    assert stats.decode_tokens_per_s == 2.0 and stats.tokens_per_s == 1.0
    assert stats.budget.label() == "8/3/4" and GenerationStats().budget is None
    assert GenerationStats.from_dict({**stats.to_dict(), "unknown": 1}) == stats


def test_stop_reasons_are_the_words_on_the_wire():
    assert [r.value for r in StopReason] == ["stop", "length", "cancelled", "context", "oom"]
    assert json.dumps({"reason": StopReason.CONTEXT}) == '{"reason": "context"}' and StopReason.OOM == "oom"


def test_cut_at_a_stop_token_or_the_length_limit():
    assert cut([5, 6, 7], {6}, 10) == (1, StopReason.STOP)  # the stop token itself is not shown
    assert cut([5, 6, 7], set(), 2) == (2, StopReason.LENGTH)
    assert cut([5, 6, 7], set(), 10) == (3, None)


def test_draft_acceptance_rate_is_accepted_over_drafted_and_a_servers_figure_stays():
    stats = GenerationStats()
    stats.add_step(StepStats(accepted=3, tree_size=17, step_s=0.1, decode_tokens=4), 4)  # 16 drafted, 3 taken
    stats.add_step(StepStats(accepted=1, tree_size=17, step_s=0.1, decode_tokens=2), 2)
    stats.finish(1.0)
    assert stats.draft_tokens == 32 and stats.draft_acceptance_rate == 4 / 32
    plain = GenerationStats()
    plain.add_step(StepStats(accepted=0, tree_size=1, step_s=0.1, decode_tokens=1), 1)
    plain.finish(1.0)
    assert plain.draft_tokens == 0 and plain.draft_acceptance_rate == 0.0  # nothing drafted: not a 0 % rate
    remote = GenerationStats(draft_acceptance_rate=0.61)  # what the server reported
    remote.add_step(StepStats(accepted=1, tree_size=5, step_s=0.1, decode_tokens=2), 2)
    remote.finish(1.0)
    assert remote.draft_acceptance_rate == 0.61
