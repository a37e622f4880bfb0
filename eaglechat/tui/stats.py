"""What the status bar says: pure functions of the engine info, the turn's numbers and a baseline.

Definitions (also on the help screen):
* tok/s  - new tokens / elapsed seconds of the turn (prefill included, as the user waits for it).
* tau    - the engine's one definition (engine/protocol.py): tokens produced by verify steps / target
           forwards in decode; the token from the prefill is not counted (plain decoding: 1.00). The
           live figure sums the per-step counts, so it ends where the final one is.
* accept - accepted draft tokens / (verify steps x tree depth): how much of the deepest possible
           accepted path the drafts reached on average.
* speedup - decode tok/s of this turn / the plain-decoding decode tok/s measured on this model and
           device in an earlier turn with speculation off (prefill excluded on both sides, as it
           does not depend on speculation). Never estimated: "—" until measured, and "—" for a
           turn too short to measure (under MIN_MEASURED_TOKENS tokens). A turn under speculation
           auto shows the engine's own measurement instead ("auto: on 16/4/4 1.4x": EAGLE's tokens/s over
           plain decoding's, both measured in the same turn, engine/autospec.py).
* ctx    - tokens of the conversation in the context / the context limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eaglechat import units
from eaglechat.engine.protocol import EngineInfo, GenerationStats, StepStats, TreeBudget
from eaglechat.fit.hardware import DTYPE_SHORT

MIN_MEASURED_TOKENS = 16  # a turn shorter than this measures start-up noise, not decoding speed


@dataclass
class TurnNumbers:
    """Running numbers of one turn (live while streaming, final after `Finished`)."""

    tokens: int = 0
    steps: int = 0  # verify steps (target forwards in decode) seen so far
    accepted: int = 0  # accepted draft tokens so far
    elapsed_s: float = 0.0
    speculate: bool | str = True  # "auto" is read as True (the head drafts) with `auto` set
    auto: bool = False  # speculate="auto": the engine chose plain or EAGLE step by step
    final: bool = False
    stop_reason: str = ""
    depth: int = 0  # tree depth, for the acceptance rate
    tree: dict = field(default_factory=dict)
    reported_tps: float = 0.0  # the engine's own figures from Finished, preferred when present
    reported_tau: float = 0.0
    reported_decode_tps: float = 0.0  # decode phase only: what speedups compare (prefill differs per prompt)
    decode_tokens: int = 0  # produced by verify steps (the engine's count; the prefill token excluded)
    prefill_done: int = 0  # prompt reading progress (new prompt tokens)
    prefill_total: int = 0
    prompt_tokens: int = 0  # the prompt in the context
    dropped_messages: int = 0  # earliest messages left out to fit the context
    ttft_s: float = 0.0  # a remote engine's time to first text (0: not measured)
    server_wide: bool = False  # a remote server's tau covers all its requests, not this one
    reported_accept: float = 0.0  # a remote server's accepted / drafted tokens, when it gives no step stats
    speculation: str = ""  # speculate="auto": what the engine measured and chose ("auto: off 0.7x")
    captured: str = ""  # CUDA graphs captured during the reply, and how long that took

    def __post_init__(self) -> None:
        if self.speculate == "auto":
            self.speculate, self.auto = True, True

    def add_step(self, step: StepStats | None, tokens: int) -> None:
        self.tokens += tokens
        if step is not None:
            self.steps += 1
            self.accepted += step.accepted
            # an engine that does not count per step: what the step showed
            self.decode_tokens += getattr(step, "decode_tokens", 0) or tokens

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.tokens

    @property
    def reading_prompt(self) -> bool:
        return not self.final and not self.tokens and self.prefill_total > 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def tau(self) -> float | None:
        return self.decode_tokens / self.steps if self.steps else None

    @property
    def measurable(self) -> bool:
        """Long enough for a speed comparison (a one-token cancelled turn once showed 0.04x)."""
        return self.tokens >= MIN_MEASURED_TOKENS

    @property
    def acceptance(self) -> float | None:
        if not self.speculate or not self.steps or self.depth <= 0:
            return None
        return min(1.0, self.accepted / (self.steps * self.depth))

    @classmethod
    def from_finished(cls, stats: GenerationStats, live: "TurnNumbers", stop_reason: str) -> "TurnNumbers":
        n = cls(
            tokens=stats.new_tokens or live.tokens,
            steps=stats.target_forwards or live.steps,
            accepted=live.accepted,
            elapsed_s=stats.elapsed_s or live.elapsed_s,
            speculate=bool(stats.speculate),
            auto=live.auto or bool(getattr(stats, "speculation", "")),
            final=True,
            stop_reason=stop_reason,
            depth=int((stats.tree or {}).get("depth") or live.depth or 0),
            tree=dict(stats.tree or live.tree),
            decode_tokens=getattr(stats, "decode_tokens", 0) or live.decode_tokens,
            prompt_tokens=getattr(stats, "prompt_tokens", 0) or live.prompt_tokens,
            dropped_messages=getattr(stats, "dropped_messages", 0) or live.dropped_messages,
            ttft_s=getattr(stats, "ttft_s", 0.0) or 0.0,
            server_wide=bool(getattr(stats, "server_wide", False)),
            speculation=getattr(stats, "speculation", "") or "",
            captured=(f"captured {stats.graph_captures} CUDA graph{'s' if stats.graph_captures > 1 else ''} in "
                      f"{stats.capture_s:.2f} s" if getattr(stats, "graph_captures", 0) else ""),
        )
        if not live.steps and stats.accepted_hist:  # no per-step stats were streamed
            n.accepted = stats.accepted_drafts
        n.reported_tps = stats.tokens_per_s
        n.reported_tau = stats.mean_accepted
        n.reported_decode_tps = getattr(stats, "decode_tokens_per_s", 0.0) or 0.0
        n.reported_accept = getattr(stats, "draft_acceptance_rate", 0.0) or 0.0
        return n

    def compare_tps(self) -> float:
        """The rate a speedup is computed from (and a baseline recorded as)."""
        return self.reported_decode_tps or self.final_tps()

    def final_tps(self) -> float:
        return self.reported_tps or self.tokens_per_s

    def final_tau(self) -> float | None:
        return self.reported_tau or self.tau


def short_dtype(dtype: str) -> str:
    return DTYPE_SHORT.get(dtype, dtype)


def fmt_memory(n: int) -> str:
    return units.fmt_bytes(n) if n > 0 else "mem ?"


def tree_label(info: EngineInfo | None, tree: dict | None = None) -> str:
    if tree:
        return f"tree {TreeBudget.from_dict(tree).label()}"
    return f"tree {info.tree.label()}" if info is not None else "tree —"


def speedup(tps: float, baseline: float | None) -> float | None:
    if not baseline or baseline <= 0 or tps <= 0:
        return None
    return tps / baseline


def context_gauge(info: EngineInfo, turn: TurnNumbers | None, context_tokens: int | None) -> str:
    used = turn.context_tokens if turn is not None and turn.prompt_tokens else context_tokens
    if not used or not info.max_context:
        return f"ctx —/{info.max_context}"
    return f"ctx {used}/{info.max_context}"


def speculation_switch(speculate: bool | str) -> str:
    """The chat's speculation switch (F5 cycles it: auto, on, off)."""
    return "spec auto" if speculate == "auto" else "spec on" if speculate else "spec off"


def status_parts(info: EngineInfo | None, turn: TurnNumbers | None, baseline: float | None,
                 speculate: bool | str, context_tokens: int | None = None,
                 thinking: bool | None = None) -> list[str]:
    """The status bar as a list of short fields (joined with ' · ' by the widget). `thinking`: the
    thinking switch of a model that has one (None: it has none, nothing is shown)."""
    if info is None:
        return ["no model loaded — ctrl+o to pick one"]
    parts: list[str] = []
    if turn is not None and turn.reading_prompt:
        pct = f" {turn.prefill_done / turn.prefill_total:.0%}" if turn.prefill_total else ""
        parts.append(f"reading prompt ({turn.prefill_total} tokens){pct}")
    elif turn is not None and (turn.tokens or turn.final):
        tps = turn.final_tps() if turn.final else turn.tokens_per_s
        tau = turn.final_tau() if turn.final else turn.tau
        acc = turn.acceptance
        parts.append(f"{tps:.1f} tok/s")
        wide = " (server-wide)" if turn.final and turn.server_wide else ""
        parts.append(f"τ {tau:.2f}{wide}" if tau else "τ —")
        if acc is not None:
            parts.append(f"accept {acc:.0%}")
        elif turn.final and turn.reported_accept:  # a remote server's accepted / drafted tokens
            parts.append(f"{turn.reported_accept:.0%} of drafts accepted{wide}")
        else:
            parts.append("accept —")
        if turn.final and turn.ttft_s:
            parts.append(f"first text after {turn.ttft_s:.2f} s")
        if turn.speculate and not turn.final:
            parts.append("speedup …")  # measured on the finished turn (decode rate vs baseline)
        elif turn.auto and turn.speculate:
            if not turn.speculation:  # an engine that measured nothing it could say
                parts.append("speedup —")
            # else the engine's own measurement (EAGLE over plain in this turn) is the spec field
        elif turn.auto:
            parts.append("plain decoding")  # no head: nothing to speculate with, and not a baseline turn
        elif turn.speculate and not turn.measurable:
            parts.append("speedup — (short reply)")
        elif turn.speculate:
            s = speedup(turn.compare_tps(), baseline)
            parts.append(f"speedup {s:.2f}×" if s else "speedup —")
        else:
            parts.append("plain decoding (baseline)")
    elif turn is not None and not turn.final:
        parts.append("starting…")
    else:
        parts.append("ready")
        parts.append(f"baseline {baseline:.1f} tok/s" if baseline else "speedup —")
    parts.append(context_gauge(info, turn, context_tokens))
    # an engine deciding for itself (speculate="auto") says what it measured, while the switch stays on
    # auto; otherwise the switch (F5 shows at once what the next reply will do)
    label = turn.speculation if turn is not None and speculate == "auto" else ""
    parts.append(label or speculation_switch(speculate))
    if thinking is not None:
        parts.append("think on" if thinking else "think off")
    parts.append(tree_label(info, turn.tree if turn else None))
    server = getattr(info, "server", "") or ""
    if server:  # memory and format are the server's business; say which server, and where
        parts.append(f"{info.device} ({server})")
        if info.endpoint:
            parts.append(info.endpoint.split("://")[-1].removesuffix("/v1"))
        return parts
    parts.append(info.device)
    parts.append(fmt_memory(info.memory_bytes))
    parts.append(f"quant {info.quant}" if info.quant not in ("", "none") else f"{short_dtype(info.dtype)}, no quant")
    steps = getattr(info, "steps", "eager")
    if steps != "eager":  # how decode steps run (--compile)
        parts.append({"graphs": "CUDA graphs", "inductor": "compiled steps"}.get(steps, steps))
    return parts


def meta_line(numbers: TurnNumbers, model: str) -> str:
    parts = [model] if model else []
    parts.append(f"{numbers.final_tps():.1f} tok/s")
    tau = numbers.final_tau()
    if numbers.speculate and tau:
        parts.append(f"τ {tau:.2f}" + (" (server-wide)" if numbers.server_wide else ""))
    elif not numbers.speculate:
        parts.append("plain decoding")
    if numbers.speculation:  # speculate="auto": what the engine chose, and what it measured
        parts.append(numbers.speculation)
    parts.append(f"{numbers.tokens} tokens")
    if numbers.ttft_s:
        parts.append(f"first text after {numbers.ttft_s:.2f} s")
    if numbers.stop_reason and numbers.stop_reason not in ("stop",):
        parts.append({"cancelled": "stopped", "length": "max tokens"}.get(numbers.stop_reason, numbers.stop_reason))
    if numbers.dropped_messages:
        parts.append(f"{numbers.dropped_messages} earlier messages outside the context")
    if numbers.captured:  # a new window bucket or tree: its step was captured during this reply
        parts.append(numbers.captured)
    return " · ".join(parts)
