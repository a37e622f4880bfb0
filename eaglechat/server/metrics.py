"""What speculation did, per request and server-wide, in the shapes vLLM uses.

Per request: `metrics.speculative_decoding` on the non-streaming response and on the final usage chunk,
with vLLM's field names (`num_spec_steps`, `num_draft_tokens`, `num_accepted_draft_tokens`,
`acceptance_histogram`, `mean_acceptance_length`, `draft_acceptance_rate`; vLLM's
`--per-request-spec-decode-metrics`), plus eaglechat's own figures under `metrics.eaglechat`.

Server-wide: Prometheus text at /metrics; the speculative counters are named after vLLM's
`vllm:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`, `..._num_accepted_tokens_total` and
`..._num_accepted_tokens_per_pos_total{position="i"}` with the `eaglechat:` prefix, so dashboards built
for vLLM read them unchanged. A draft here is one verify step over a tree: its draft tokens are the
tree's nodes below the root, and position i counts the steps whose accepted path reached depth i+1.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from eaglechat.engine.protocol import GenerationStats, StepStats


@dataclass
class RequestTally:
    """Built from the TextDelta step stats as they stream by; the Finished stats complete it."""

    tree_total: int = 0  # the engine's tree budget (nodes below the root), for steps that emitted nothing
    seen_steps: int = 0
    seen_draft_tokens: int = 0
    seen_hist: list[int] = field(default_factory=list)

    def add(self, step: StepStats | None) -> None:
        if step is None or step.tree_size <= 1:  # the prefill token, or plain decoding
            return
        self.seen_steps += 1
        self.seen_draft_tokens += step.tree_size - 1
        while len(self.seen_hist) <= step.accepted:
            self.seen_hist.append(0)
        self.seen_hist[step.accepted] += 1

    def speculative_decoding(self, stats: GenerationStats) -> dict | None:
        """vLLM's per-request shape; None when the request decoded plainly (speculate="auto" with a head
        counts as speculative: its plain steps draft nothing)."""
        if not stats.speculate:
            return None
        # the engine's histogram counts every verify step, also one whose tokens were all cut by a stop
        hist = list(stats.accepted_hist) or list(self.seen_hist)
        steps = sum(hist)
        accepted = sum(i * c for i, c in enumerate(hist))
        # the engine's own count when it keeps one (every verify step, plain ones under speculate=auto
        # counting none); else what streamed by, with the budget for steps that emitted nothing
        draft_tokens = stats.draft_tokens or self.seen_draft_tokens + max(0, steps - self.seen_steps) * self.tree_total
        depth = int((stats.tree or {}).get("depth", 0))
        hist += [0] * max(0, depth + 1 - len(hist))
        return {
            "num_spec_steps": steps,
            "num_draft_tokens": draft_tokens,
            "num_accepted_draft_tokens": accepted,
            "acceptance_histogram": hist,
            "num_accepted_tokens_per_pos": [sum(hist[i + 1:]) for i in range(len(hist) - 1)],
            "mean_acceptance_length": 1 + accepted / steps if steps else 0.0,
            "draft_acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
        }


def eaglechat_metrics(stats: GenerationStats) -> dict:
    return {
        "tau": stats.mean_accepted,
        "tokens_per_s": stats.tokens_per_s,
        "decode_tokens_per_s": stats.decode_tokens_per_s,
        "elapsed_s": stats.elapsed_s,
        "prefill_s": stats.prefill_s,
        "prefill_tokens": stats.prefill_tokens,
        "reused_tokens": stats.reused_tokens,
        "target_forwards": stats.target_forwards,
        "decode_tokens": stats.decode_tokens,
        "new_tokens": stats.new_tokens,
        "prompt_tokens": stats.prompt_tokens,
        "dropped_messages": stats.dropped_messages,
        "accepted_hist": list(stats.accepted_hist),
        "speculate": bool(stats.speculate),  # the head drafted (also under speculate="auto")
        "speculation": stats.speculation,  # speculate="auto": what the engine chose ("auto: on 16/4/4 1.4x")
        "tree": stats.tree,
    }


class ServerMetrics:
    """Counters since the server started; rendered as Prometheus text exposition (version 0.0.4)."""

    def __init__(self, model: str):
        self.model = model
        self._lock = threading.Lock()
        self.counters: dict[str, float] = {
            "prompt_tokens": 0, "generation_tokens": 0, "spec_decode_num_drafts": 0,
            "spec_decode_num_draft_tokens": 0, "spec_decode_num_accepted_tokens": 0,
        }
        self.per_pos: list[int] = []
        self.finished: dict[str, int] = {}  # by finish reason: stop, length, cancelled, error
        self.rejected: dict[str, int] = {}  # by status code: 400, 401, 429, ...
        self.running = 0
        self.waiting = 0
        self.write_timeouts = 0  # streams cancelled because their client stopped reading

    def observe(self, reason: str, prompt_tokens: int = 0, completion_tokens: int = 0, spec: dict | None = None) -> None:
        with self._lock:
            self.finished[reason] = self.finished.get(reason, 0) + 1
            self.counters["prompt_tokens"] += prompt_tokens
            self.counters["generation_tokens"] += completion_tokens
            if spec:
                self.counters["spec_decode_num_drafts"] += spec["num_spec_steps"]
                self.counters["spec_decode_num_draft_tokens"] += spec["num_draft_tokens"]
                self.counters["spec_decode_num_accepted_tokens"] += spec["num_accepted_draft_tokens"]
                per_pos = spec["num_accepted_tokens_per_pos"]
                self.per_pos += [0] * max(0, len(per_pos) - len(self.per_pos))
                for i, n in enumerate(per_pos):
                    self.per_pos[i] += n

    def reject(self, status: int) -> None:
        with self._lock:
            key = str(status)
            self.rejected[key] = self.rejected.get(key, 0) + 1

    def render(self) -> str:
        label = f'model_name="{self.model}"'
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP eaglechat:{name} {help_}")
            lines.append(f"# TYPE eaglechat:{name} {kind}")
            suffix = "_total" if kind == "counter" else ""
            for labels, value in samples:
                lines.append(f"eaglechat:{name}{suffix}{{{labels}}} {value:g}")

        with self._lock:
            metric("num_requests_running", "gauge", "Requests being decoded (at most 1).", [(label, self.running)])
            metric("num_requests_waiting", "gauge", "Requests queued behind the running one.", [(label, self.waiting)])
            metric("request_success", "counter", "Finished requests by finish reason.",
                   [(f'{label},finished_reason="{k}"', v) for k, v in sorted(self.finished.items())])
            metric("request_rejected", "counter", "Requests refused before decoding, by HTTP status.",
                   [(f'{label},status="{k}"', v) for k, v in sorted(self.rejected.items())])
            metric("stream_write_timeouts", "counter", "Streams cancelled because the client stopped reading.",
                   [(label, self.write_timeouts)])
            metric("prompt_tokens", "counter", "Prompt tokens of finished requests.",
                   [(label, self.counters["prompt_tokens"])])
            metric("generation_tokens", "counter", "Generated tokens.", [(label, self.counters["generation_tokens"])])
            metric("spec_decode_num_drafts", "counter", "Verify steps over a draft tree.",
                   [(label, self.counters["spec_decode_num_drafts"])])
            metric("spec_decode_num_draft_tokens", "counter", "Draft tokens verified (tree nodes below the root).",
                   [(label, self.counters["spec_decode_num_draft_tokens"])])
            metric("spec_decode_num_accepted_tokens", "counter", "Draft tokens accepted.",
                   [(label, self.counters["spec_decode_num_accepted_tokens"])])
            metric("spec_decode_num_accepted_tokens_per_pos", "counter",
                   "Verify steps whose accepted path reached depth position+1.",
                   [(f'{label},position="{i}"', n) for i, n in enumerate(self.per_pos)])
        return "\n".join(lines) + "\n"
