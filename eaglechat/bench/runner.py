"""The benchmark schedule: warm-up, then per prompt `repeats` interleaved rounds of every method.

    warm-up      every method once on the first prompt (untimed): allocator growth, kernels, caches
    per prompt   round 1: plain, eagle-N1, eagle-N2, ..., auto, hf-generate, prompt-lookup
                 round 2: the same methods, the order rotated by one    (A B C, B C A, C A B, then
                          reversed: C B A, A C B, B A C: every neighbour in front of every other)
Interleaving makes background load (on a shared VM: another tenant preempting a vCPU) hit every method
alike, and rotating the order gives no method the place that always runs first (after the prompt
switch, with cold caches) or right after the same neighbour; the summary then takes medians. Ctrl-C
stops the schedule: the runs finished so far are kept and `interrupted` is set, so the caller still
reports them.

`auto` is speculate="auto" (engine/autospec.py), the chat's and the server's default: its chooser keeps
what it measured from run to run, as it does from turn to turn in a chat, so its first runs (the
warm-up's included) pay for the first probe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from eaglechat.bench.prompts import Prompt
from eaglechat.bench.runs import Method, Run, timed_run
from eaglechat.engine.protocol import TreeBudget


@dataclass
class Settings:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    repeats: int = 2
    warmup: int = 1
    trees: list[TreeBudget] = field(default_factory=lambda: [TreeBudget()])
    peers: bool = True
    lookup_tokens: int = 10
    auto: bool = True

    def to_dict(self) -> dict:
        return {
            "max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "top_p": self.top_p,
            "top_k": self.top_k, "seed": self.seed, "repeats": self.repeats, "warmup": self.warmup,
            "total_tokens": [t.total_tokens for t in self.trees], "peers": self.peers,
            "prompt_lookup_num_tokens": self.lookup_tokens if self.peers else None, "auto": self.auto,
        }


@dataclass
class PromptResult:
    prompt: Prompt
    prompt_ids: list[int]
    runs: dict[str, list[Run]] = field(default_factory=dict)  # method name -> runs in repeat order


@dataclass
class Results:
    methods: list[Method]
    prompts: list[PromptResult] = field(default_factory=list)
    interrupted: bool = False
    wall_s: float = 0.0


def methods_for(settings: Settings) -> list[Method]:
    methods = [Method("plain", "plain")]
    methods += [Method(f"eagle-{t.total_tokens}", "eagle", tree=t) for t in settings.trees]
    if settings.auto:  # among plain, the first tree and a lighter one (engine/autospec.py)
        methods.append(Method("auto", "auto", tree=settings.trees[0]))
    if settings.peers:
        methods += [Method("hf-generate", "hf"), Method("prompt-lookup", "lookup", lookup_tokens=settings.lookup_tokens)]
    return methods


def rotated(methods: list[Method], k: int) -> list[Method]:
    """The k-th round's order: the methods rotated by k, and every other cycle of rotations reversed
    (A B C, B C A, C A B, C B A, A C B, B A C, ...): each method runs first equally often, and after each
    other method equally often (a rotation alone keeps the neighbours: C would always follow B, and pay
    for whatever B leaves behind)."""
    n = len(methods)
    order = methods[k % n:] + methods[:k % n]
    return order[::-1] if (k // n) % 2 else order


def total_runs(n_prompts: int, settings: Settings) -> int:
    per_round = len(methods_for(settings))
    return per_round * (settings.warmup + n_prompts * settings.repeats)


def run_bench(
    engine,
    prompts: list[Prompt],
    settings: Settings,
    tick: Callable[[str], None] | None = None,
) -> Results:
    """Runs the schedule; `tick(label)` after every run (the progress bar)."""
    import time

    tick = tick or (lambda label: None)
    methods = methods_for(settings)
    results = Results(methods)
    started = time.perf_counter()
    try:
        encoded = [(p, engine.encode(p.messages)) for p in prompts]
        for w in range(settings.warmup):
            for m in methods:
                timed_run(engine, m, encoded[0][1], settings, seed=settings.seed, repeat=-1 - w)
                tick(f"warm-up {m.name}")
        for i, (prompt, ids) in enumerate(encoded):
            result = PromptResult(prompt, ids, {m.name: [] for m in methods})
            results.prompts.append(result)
            for r in range(settings.repeats):
                seed = settings.seed + 1000 * r + i  # the same seed for every method in a round
                for m in rotated(methods, i * settings.repeats + r):
                    result.runs[m.name].append(timed_run(engine, m, ids, settings, seed=seed, repeat=r))
                    tick(f"{prompt.category} {prompt.id} {m.name}")
    except KeyboardInterrupt:
        results.interrupted = True
    finally:
        results.wall_s = time.perf_counter() - started
    return results
