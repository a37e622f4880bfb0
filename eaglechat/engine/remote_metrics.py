"""What a remote server says about speculation -> GenerationStats (tau, acceptance, per request or
server-wide). Shapes, as each project documents them:

- eaglechat serve: `metrics.eaglechat` (the engine's own GenerationStats) and
  `metrics.speculative_decoding` on the final usage chunk, per request.
- vLLM: `metrics.speculative_decoding` (`num_spec_steps`, `num_draft_tokens`, `num_accepted_draft_tokens`,
  `acceptance_histogram`, `mean_acceptance_length`, `draft_acceptance_rate`) on the final usage chunk when
  the server runs with `--per-request-spec-decode-metrics`; otherwise the Prometheus counters
  `vllm:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`, `..._num_accepted_tokens_total` read
  before and after the request: server-wide, since other clients' requests count too.
- SGLang: `meta_info` on a non-streaming choice when the request sets `return_meta_info` (SGLang refuses
  it with stream=true): tau = `completion_tokens` / `spec_verify_ct`, per request; for a streamed reply
  the Prometheus gauges `sglang:spec_accept_length` / `sglang:spec_accept_rate` (server-wide, recent
  requests, one series per rank: averaged).
"""

from __future__ import annotations

import re
from typing import Callable

from eaglechat.engine.protocol import GenerationStats

METRIC_LINE = re.compile(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)")
Metrics = dict[str, list[float]]


def parse_prometheus(text: str) -> dict[str, list[float]]:
    """'name' (or 'name[position]') -> its values, one per labelled series (per rank, per engine)."""
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        m = METRIC_LINE.match(line)
        if not m:
            continue
        name, labels, value = m.groups()
        pos = re.search(r'position="(\d+)"', labels or "")
        try:
            out.setdefault(f"{name}[{pos.group(1)}]" if pos else name, []).append(float(value))
        except ValueError:
            continue
    return out


def total(metrics: dict[str, list[float]], name: str) -> float:
    """A counter over all its series."""
    return sum(metrics.get(name, ()))


def mean(metrics: dict[str, list[float]], name: str) -> float:
    """A gauge averaged over its series (one per tensor/data-parallel rank)."""
    values = metrics.get(name, ())
    return sum(values) / len(values) if values else 0.0


def read_speculation(stats: GenerationStats, kind: str, *, metrics: dict, meta: dict, before: Metrics,
                     scrape: Callable[[], Metrics]) -> None:
    """Fill tau / acceptance from whatever this kind of server reported (per request where it can)."""
    spec = metrics.get("speculative_decoding")
    own = metrics.get("eaglechat") or {}
    if isinstance(spec, dict) and spec.get("num_spec_steps"):
        stats.speculate = True
        stats.target_forwards = int(spec["num_spec_steps"])
        stats.mean_accepted = float(spec.get("mean_acceptance_length") or 0.0)
        stats.draft_acceptance_rate = float(spec.get("draft_acceptance_rate") or 0.0)
        stats.accepted_hist = [int(n) for n in spec.get("acceptance_histogram") or []]
    if own:  # eaglechat's own figures: the engine's GenerationStats as the server saw them
        stats.target_forwards = int(own.get("target_forwards", stats.target_forwards))
        stats.mean_accepted = float(own.get("tau", stats.mean_accepted))
        stats.decode_tokens = int(own.get("decode_tokens", 0))
        stats.accepted_hist = [int(n) for n in own.get("accepted_hist") or stats.accepted_hist]
        stats.tree = own.get("tree") or {}
        stats.speculate = bool(own.get("speculate", stats.speculate))
        stats.speculation = str(own.get("speculation") or "")  # speculate="auto": what the server's engine chose
        stats.reused_tokens = int(own.get("reused_tokens", 0))
        stats.prompt_tokens = int(own.get("prompt_tokens", 0))
        stats.dropped_messages = int(own.get("dropped_messages", 0))
        return
    if stats.speculate:
        return
    if meta.get("spec_verify_ct"):  # SGLang, a whole reply with return_meta_info
        verify = int(meta["spec_verify_ct"])
        stats.speculate, stats.target_forwards = True, verify
        stats.mean_accepted = float(meta.get("completion_tokens", stats.new_tokens)) / verify
        if meta.get("spec_accept_rate") is not None:
            stats.draft_acceptance_rate = float(meta["spec_accept_rate"])
        return
    if kind == "vllm" and before:
        after = scrape()

        def grew(name):
            return total(after, f"vllm:{name}_total") - total(before, f"vllm:{name}_total")

        drafts, drafted = grew("spec_decode_num_drafts"), grew("spec_decode_num_draft_tokens")
        accepted = grew("spec_decode_num_accepted_tokens")
        if drafts > 0:
            stats.speculate, stats.server_wide = True, True
            stats.mean_accepted = 1 + accepted / drafts
            stats.draft_acceptance_rate = accepted / drafted if drafted else 0.0
    elif kind == "sglang":
        gauges = scrape()
        if mean(gauges, "sglang:spec_accept_length") > 0:
            stats.speculate, stats.server_wide = True, True
            stats.mean_accepted = mean(gauges, "sglang:spec_accept_length")
            stats.draft_acceptance_rate = mean(gauges, "sglang:spec_accept_rate")
