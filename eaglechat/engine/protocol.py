"""The one small protocol between the engine and everything that shows its output (CLI, TUI, bench).

`Engine.generate(messages, params, cancel)` yields events: optional `PrefillProgress` while the
prompt is read, then `TextDelta`s, then exactly one `Finished`, always last:

* the first `TextDelta` carries the one token sampled from the prefill (`step` None);
* every later one carries one verify step (`step` set), even a step whose only product was the stop
  token (its text is then empty); a last delta without tokens or step may carry text held back at
  the end (a character whose bytes never completed);
* tau has one definition: `GenerationStats.decode_tokens / target_forwards`, where decode_tokens
  counts what verify steps produced (accepted drafts + the bonus token; a stop token included, tokens
  cut by max_new_tokens not, the prefill token not). `StepStats.decode_tokens` is each step's share,
  so a live figure summed over steps equals the final one.
* Setting `cancel` stops generation after the current step (or prefill chunk); `Finished.stop_reason`
  is then "cancelled" and everything produced so far has already been yielded. `StopReason` lists
  every reason: "stop", "length", "cancelled", "context" and "oom".
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import ClassVar, Iterator, Protocol, Union

from eaglechat.errors import UsageError

PREFILL_CHUNK = 512  # prompt tokens per prefill forward unless the loader passes the planner's


def _known(cls, data: dict) -> dict:
    """The keys of `data` that are fields of dataclass `cls`: a newer peer's extra fields are ignored,
    so old servers and clients interoperate."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in (data or {}).items() if k in names}


class StopReason(StrEnum):
    """Why a reply ended (a str: JSON and stored conversations carry the bare word)."""

    STOP = "stop"  # a stop token (end of turn)
    LENGTH = "length"  # max_new_tokens reached
    CANCELLED = "cancelled"  # the caller set `cancel`
    CONTEXT = "context"  # the context limit was reached mid-reply
    OOM = "oom"  # out of memory mid-reply: what was emitted is kept, the next turn runs smaller


class Speculate(StrEnum):
    """Whether a reply drafts: ON (EAGLE draft trees), OFF (plain decoding, one token per target forward:
    the baseline) or AUTO (step by step, whichever this machine measures faster: engine/autospec.py; all
    three exact). Falsy only when OFF, as the True/False/"auto" it replaces."""

    ON = "on"
    OFF = "off"
    AUTO = "auto"

    def __bool__(self) -> bool:
        return self is not Speculate.OFF

    @classmethod
    def of(cls, value) -> "Speculate":
        """True, False, "auto" (profiles, the HTTP API) or on/off/auto -> a Speculate; else a ValueError."""
        if isinstance(value, bool):
            return cls.ON if value else cls.OFF
        return cls(str(value).strip().lower())

    @property
    def wire(self) -> bool | str:
        """As the HTTP API and the profile files spell it: true, false or "auto"."""
        return "auto" if self is Speculate.AUTO else self is Speculate.ON


@dataclass
class GenerationParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # 0 = off; else keep tokens with p >= min_p * max p (after top-k/top-p)
    repetition_penalty: float = 1.0  # 1 = off; else CTRL's penalty on the tokens already in the context
    repeat_last_n: int = -1  # the repetition penalty's window: -1 the whole context, N the last N tokens, 0 off
    presence_penalty: float = 0.0  # OpenAI's, over the generated tokens (engine/penalties.py)
    frequency_penalty: float = 0.0
    max_new_tokens: int = 512
    seed: int | None = None
    speculate: Speculate = Speculate.ON  # True/False/"auto" are read as ON/OFF/AUTO
    # a reasoning model's switch (Qwen3's `enable_thinking`, passed to its chat template when the template
    # reads it); None: the template's own default. A level ("low", "medium", "high") is also passed as
    # `reasoning_effort` to a template that reads it (gpt-oss) and means True to `enable_thinking`. The chat
    # sets it; the server's `think` (Ollama) and `reasoning_effort` (OpenAI) map onto it
    thinking: bool | str | None = None

    def __post_init__(self):
        self.speculate = Speculate.of(self.speculate)


class TreeError(UsageError):
    """A draft tree that cannot be drafted as asked: the message says why and what would do."""


@dataclass
class TreeBudget:
    """The draft tree of one EAGLE step: `total_tokens` drafted nodes verified (root excluded), grown at most
    `depth` levels deep, each expanded node offering its `draft_top_k` likeliest children (the tree's
    branching; the sampling top_k of GenerationParams is another thing). The limits and the check live
    here, for the flags, the profiles and every later rewrite alike."""

    total_tokens: int = 16
    depth: int = 4
    draft_top_k: int = 4
    kind: str = "dynamic"  # "dynamic" (EAGLE-2) or "static" (EAGLE-1 tree)

    # deeper trees cost a head forward per level for acceptance that never comes; the pool grows as
    # draft_top_k^2 per level (EAGLE-2 uses 10); 1024 drafted tokens is beyond any device's verify
    LIMITS: ClassVar[dict[str, int]] = {"total_tokens": 1024, "depth": 16, "draft_top_k": 32}
    KINDS: ClassVar[tuple[str, ...]] = ("dynamic", "static")

    @property
    def pool_size(self) -> int:
        return pool_size(self.depth, self.draft_top_k)

    def label(self) -> str:
        """"16/4/4": total_tokens/depth/draft_top_k, as every report prints a tree budget."""
        return f"{self.total_tokens}/{self.depth}/{self.draft_top_k}"

    def problem(self) -> str | None:
        """What makes this tree undraftable, in words; None when it is fine."""
        for name, high in self.LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                return f"{name} must be an integer in 1..{high}, got {value!r}"
        if self.kind not in self.KINDS:
            return f"kind must be one of {', '.join(self.KINDS)}, got {self.kind!r}"
        if self.kind == "dynamic" and self.total_tokens > self.pool_size:
            return (f"a tree of {self.total_tokens} tokens is more than a depth-{self.depth}, top-{self.draft_top_k} "
                    f"draft can offer ({self.pool_size} candidates = draft_top_k + (depth-1) * draft_top_k^2)")
        return None

    def check(self) -> "TreeBudget":
        """This tree, or a TreeError that says what is wrong and what would do: never a quietly smaller
        tree than asked (and the larger number reported)."""
        problem = self.problem()
        if problem and self.total_tokens > self.pool_size:
            problem += (f"; ask for --total-tokens {self.pool_size} or less, or raise --depth or --draft-top-k")
        if problem:
            raise TreeError(problem)
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TreeBudget":
        """From JSON, YAML or a record; unknown keys ignored, numbers given as strings accepted; `top_k`
        is read as draft_top_k (what records, profiles and servers before the rename wrote)."""
        data = dict(data or {})
        if "top_k" in data and "draft_top_k" not in data:
            data["draft_top_k"] = data.pop("top_k")
        known = _known(cls, data)
        for name in ("total_tokens", "depth", "draft_top_k"):
            if name in known:
                known[name] = int(known[name])
        return cls(**known)


def pool_size(depth: int, draft_top_k: int) -> int:
    """Candidates an EAGLE-2 dynamic draft offers for reranking (engine/draft.py): draft_top_k children of
    the root, then draft_top_k^2 per further level (draft_top_k expanded nodes x draft_top_k children):
    the most `total_tokens` can keep."""
    return draft_top_k + max(0, depth - 1) * draft_top_k * draft_top_k


@dataclass
class StepStats:
    accepted: int  # draft tokens accepted this step (the bonus token not counted)
    tree_size: int  # nodes verified, root included
    step_s: float
    decode_tokens: int = 0  # what this step adds to GenerationStats.decode_tokens (see the module doc)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "StepStats":
        """Unknown keys ignored, missing ones default (a step from an older or newer server)."""
        known = {"accepted": 0, "tree_size": 1, "step_s": 0.0, **_known(cls, data)}
        return cls(**known)


@dataclass
class TextDelta:
    text: str
    token_ids: list[int]
    drafted: list[bool]  # per token: True when it came from an accepted draft node
    step: StepStats | None = None
    # per token: the text it added ("".join(token_texts) == text; a character split over several
    # tokens belongs to the token that completed it), so drafts are coloured at exact boundaries
    token_texts: list[str] = field(default_factory=list)


@dataclass
class PrefillProgress:
    """The prompt is being read: `done` of `total` new prompt tokens (cached ones not counted)."""

    done: int
    total: int
    prompt_tokens: int = 0  # the whole prompt, cached prefix included
    dropped_messages: int = 0  # oldest messages left out because the context could not hold them


@dataclass
class GenerationStats:
    new_tokens: int = 0
    target_forwards: int = 0  # decode-phase base forwards (prefill excluded)
    decode_tokens: int = 0  # produced by verify steps (a final stop token included, length-cut ones not)
    mean_accepted: float = 0.0  # tau = decode_tokens / target_forwards (plain decoding: exactly 1)
    tokens_per_s: float = 0.0  # new_tokens / elapsed_s (prefill included)
    decode_tokens_per_s: float = 0.0  # decode phase only
    elapsed_s: float = 0.0  # prefill + decode
    prefill_s: float = 0.0
    prefill_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV came from the previous turn
    prompt_tokens: int = 0  # the prompt as sent (after dropping what the context cannot hold)
    dropped_messages: int = 0  # oldest messages left out of the prompt to fit the context
    speculate: bool = True
    speculation: str = ""  # speculate="auto": what the engine chose and why ("auto: off 0.7x")
    tree: dict = field(default_factory=dict)
    accepted_hist: list[int] = field(default_factory=list)  # speculative steps that accepted 0,1,2,... drafts
    draft_tokens: int = 0  # tree nodes below the root verified over the reply (vLLM's num_draft_tokens)
    # remote engines: what the client measured, and where the speculation figures come from
    ttft_s: float = 0.0  # request sent -> first text received (0: not measured)
    draft_acceptance_rate: float = 0.0  # accepted draft tokens / draft tokens (0: not reported)
    server_wide: bool = False  # tau and acceptance are the server's figures over all its requests
    # how this reply's steps ran (engine/compile.py): "eager", "graphs" or "inductor" ("": a remote engine);
    # with graphs: graphs held, and this reply's captures (their seconds) and replays
    steps: str = ""
    graphs: int = 0
    graph_captures: int = 0
    capture_s: float = 0.0
    graph_replays: int = 0

    def add_step(self, step: StepStats, shown: int) -> None:
        """One verify step: `shown` tokens emitted to the caller, `step.decode_tokens` produced."""
        self.target_forwards += 1
        self.new_tokens += shown
        self.decode_tokens += step.decode_tokens
        if step.tree_size > 1:  # a plain step (speculate="auto" mixes them in) drafted nothing
            while len(self.accepted_hist) <= step.accepted:
                self.accepted_hist.append(0)
            self.accepted_hist[step.accepted] += 1
        self.draft_tokens += max(step.tree_size - 1, 0)

    def finish(self, elapsed_s: float) -> None:
        """The rates, once the reply ended (`prefill_s` already set)."""
        self.elapsed_s = elapsed_s
        decode_s = elapsed_s - self.prefill_s
        self.mean_accepted = self.decode_tokens / self.target_forwards if self.target_forwards else 0.0
        self.tokens_per_s = self.new_tokens / elapsed_s if elapsed_s > 0 else 0.0
        self.decode_tokens_per_s = self.decode_tokens / decode_s if decode_s > 0 else 0.0
        if self.draft_tokens and not self.draft_acceptance_rate:  # a remote server's own figure stays
            self.draft_acceptance_rate = self.accepted_drafts / self.draft_tokens

    def steps_note(self) -> str:
        """How the steps ran, for a stats line: "CUDA graphs: 96 replays, 2 captured in 0.81 s (6 held)"."""
        if self.steps != "graphs":
            return {"inductor": "compiled steps (inductor)", "eager": "eager steps"}.get(self.steps, "")
        captured = f", {self.graph_captures} captured in {self.capture_s:.2f} s" if self.graph_captures else ""
        return f"CUDA graphs: {self.graph_replays} replays{captured} ({self.graphs} held)"

    @property
    def accepted_drafts(self) -> int:
        """Draft tokens accepted over the reply (bonus tokens not counted), from the histogram."""
        return sum(i * n for i, n in enumerate(self.accepted_hist))

    @property
    def budget(self) -> TreeBudget | None:
        """The tree budget the reply was decoded with (None: plain decoding)."""
        return TreeBudget.from_dict(self.tree) if self.tree else None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "GenerationStats":
        return cls(**_known(cls, data))


@dataclass
class Finished:
    text: str
    token_ids: list[int]
    stats: GenerationStats
    stop_reason: StopReason
    message: str = ""  # user-facing note, e.g. why the context limit ended the reply


Event = Union[PrefillProgress, TextDelta, Finished]


@dataclass
class EngineInfo:
    model: str
    device: str = "cpu"
    dtype: str = "float32"
    quant: str = "none"
    tree: TreeBudget = field(default_factory=TreeBudget)
    max_context: int = 2048
    prefill_chunk: int = PREFILL_CHUNK  # prompt tokens per prefill forward (the memory planner's chunk)
    steps: str = "eager"  # how decode steps run (--compile): "eager", "graphs" (CUDA graphs) or "inductor"
    memory_bytes: int = 0  # weights + caches held by the engine
    head: str = ""
    # AUTO (the engine measures plain and speculative decoding while it decodes and keeps the faster),
    # ON/OFF where a profile pins it (the head stays loaded, so it can be switched on); OFF without a head
    speculate_by_default: Speculate = Speculate.ON
    thinking_switch: bool = False  # the chat template reads `enable_thinking` (GenerationParams.thinking)
    # where that decision came from a `tune` measured on a busy machine: "load 3.1 on 2 cores"
    tuned_under_load: str = ""
    tuned_speculate: bool | None = None  # what `eaglechat tune` measured (True: EAGLE faster); None: not tuned
    # "" for a local engine; for a remote one the server kind ("eaglechat", "vllm", "sglang", "openai")
    server: str = ""
    endpoint: str = ""  # a remote engine's base URL (http://host:port/v1)
    # the model's own sampling defaults (temperature, top_p, top_k, repetition_penalty: those it states),
    # filled into what a user or client leaves unset by eaglechat.models.sampling.fill
    sampling: dict = field(default_factory=dict)
    sampling_source: str = ""  # "catalog", "generation_config.json", or "" (none: greedy)

    @property
    def compiled(self) -> bool:
        """Decode steps are captured or compiled (not eager)."""
        return self.steps != "eager"

    def __post_init__(self):
        self.speculate_by_default = Speculate.of(self.speculate_by_default)


class Engine(Protocol):
    info: EngineInfo

    def generate(
        self,
        messages: list[dict],
        params: GenerationParams,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]: ...
