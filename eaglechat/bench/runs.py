"""One timed generation, as a `Run` record: the engine (plain or EAGLE) or a transformers peer.

Fairness rules every method follows here:
- the same prompt token ids (the engine's chat template) and the same `max_new_tokens`;
- the same stop tokens: the engine's stop set is passed to `generate()` as `eos_token_id`, and every
  method's output is cut before the first stop token (the stop token's forward is still timed, as
  the engine times it too); the first token (from the prefill) counts as a new token everywhere;
- a cold prompt: the engine's prefix-reuse cache is emptied before each run, so every run prefills the
  whole prompt (transformers' `generate()` always does);
- the same sampling settings; temperature 0 is greedy for all.

Counted per run: new tokens, decode tokens (emitted after the prefill), target forwards in decode,
wall time (prefill included) and prefill time, per-step seconds, and for EAGLE the accepted-drafts
histogram. For the peers, target forwards and step times come from a forward hook on the model
(the first forward is the prefill).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from eaglechat.engine.protocol import Finished, GenerationParams, Speculate, TextDelta, TreeBudget
from eaglechat.looping import is_looping, unique_ngram_ratio


@dataclass
class Method:
    name: str  # "plain", "eagle-16", "auto", "hf-generate", "prompt-lookup"
    kind: str  # "plain" | "eagle" | "auto" | "hf" | "lookup"
    tree: TreeBudget | None = None  # eagle and auto only
    lookup_tokens: int = 0  # prompt-lookup only

    @property
    def speculative(self) -> bool:
        """Decodes through the engine with its head (a fixed tree, or speculate="auto")."""
        return self.kind in ("eagle", "auto")

    @property
    def engine_loop(self) -> bool:
        """Decodes through eaglechat's own loop (plain or speculative), not a transformers peer."""
        return self.kind == "plain" or self.speculative

    def describe(self) -> dict:
        out: dict = {"name": self.name, "kind": self.kind}
        if self.tree is not None:
            out["tree"] = self.tree.to_dict()
        if self.kind == "lookup":
            out["prompt_lookup_num_tokens"] = self.lookup_tokens
        return out


@dataclass
class Run:
    method: str
    repeat: int
    token_ids: list[int]
    decode_tokens: int  # tokens emitted after the prefill's first token
    target_forwards: int  # base forwards in decode (prefill excluded)
    elapsed_s: float  # prefill + decode
    prefill_s: float
    stop_reason: str
    step_s: list[float] = field(default_factory=list)
    accepted_hist: list[int] = field(default_factory=list)  # eagle and auto only (auto: its speculative steps)
    cpu_s: float | None = None  # the process's CPU time over the run (engine runs): what the work cost, less
    # the waits a loaded machine adds to the wall clock (all threads: with --threads 1, the decoding's own)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        decode_s = self.elapsed_s - self.prefill_s
        return self.decode_tokens / decode_s if decode_s > 0 else 0.0

    @property
    def cpu_tokens_per_s(self) -> float | None:
        return self.new_tokens / self.cpu_s if self.cpu_s else None

    @property
    def tau(self) -> float | None:
        return self.decode_tokens / self.target_forwards if self.target_forwards else None

    def to_dict(self) -> dict:
        steps = sorted(self.step_s)
        return {
            "repeat": self.repeat,
            "new_tokens": self.new_tokens,
            "decode_tokens": self.decode_tokens,
            "target_forwards": self.target_forwards,
            "tau": _r(self.tau),
            "elapsed_s": _r(self.elapsed_s),
            "prefill_s": _r(self.prefill_s),
            "tokens_per_s": _r(self.tokens_per_s),
            "decode_tokens_per_s": _r(self.decode_tokens_per_s),
            "cpu_s": _r(self.cpu_s),
            "cpu_tokens_per_s": _r(self.cpu_tokens_per_s),
            "step_ms": {
                "p50": _r(statistics.median(steps) * 1e3) if steps else None,
                "p90": _r(steps[min(len(steps) - 1, int(0.9 * len(steps)))] * 1e3) if steps else None,
                "max": _r(steps[-1] * 1e3) if steps else None,
            },
            "accepted_hist": list(self.accepted_hist),
            "stop_reason": self.stop_reason,
            "unique_8gram_ratio": _r(unique_ngram_ratio(self.token_ids)),
            "looping": is_looping(self.token_ids),
        }


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


def fresh(engine) -> None:
    """Forget the engine's cached prefix, so the next run prefills the whole prompt."""
    engine.decoder.reset()


def params_for(settings, seed: int, speculate: Speculate) -> GenerationParams:
    return GenerationParams(
        temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
        max_new_tokens=settings.max_new_tokens, seed=seed, speculate=speculate,
    )


def engine_run(engine, method: Method, prompt_ids: list[int], settings, seed: int, repeat: int = 0) -> Run:
    """Plain decoding, EAGLE or speculate="auto" through the engine's own loop (LocalEngine.generate_ids)."""
    fresh(engine)
    if method.tree is not None:
        engine.info.tree = method.tree
    params = params_for(settings, seed, speculate={"eagle": Speculate.ON, "auto": Speculate.AUTO}.get(method.kind, Speculate.OFF))
    steps, decode_tokens, final = [], 0, None
    cpu = time.process_time()
    for event in engine.generate_ids(prompt_ids, params):
        if isinstance(event, TextDelta) and event.step is not None:
            steps.append(event.step.step_s)
            decode_tokens += len(event.token_ids)
        elif isinstance(event, Finished):
            final = event
    cpu = time.process_time() - cpu
    stats = final.stats
    return Run(
        method=method.name, repeat=repeat, token_ids=list(final.token_ids), decode_tokens=decode_tokens,
        target_forwards=stats.target_forwards, elapsed_s=stats.elapsed_s, prefill_s=stats.prefill_s,
        stop_reason=final.stop_reason, step_s=steps,
        accepted_hist=list(stats.accepted_hist) if method.speculative else [], cpu_s=cpu,
    )


class _ForwardClock:
    """Counts the model's forwards during generate() and stamps when each one ends."""

    def __init__(self, model, device: str):
        self.model, self.cuda = model, str(device).startswith("cuda")
        self.ends: list[float] = []

    def _hook(self, module, args, output):
        if self.cuda:
            torch.cuda.synchronize()
        self.ends.append(time.perf_counter())

    def __enter__(self):
        self.handle = self.model.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def peer_run(engine, method: Method, prompt_ids: list[int], settings, seed: int, repeat: int = 0) -> Run:
    """transformers' own `generate()` (greedy/sampling) or its prompt-lookup decoding, same prompt ids."""
    model, device = engine.model, engine.decoder.device
    stops = sorted(engine.stop_ids)
    sampling = settings.temperature > 0
    kwargs = dict(
        max_new_tokens=settings.max_new_tokens, min_new_tokens=0, do_sample=sampling, num_beams=1,
        eos_token_id=stops or None, pad_token_id=stops[0] if stops else 0, repetition_penalty=1.0,
        use_cache=True, return_dict_in_generate=False,
    )
    if sampling:
        kwargs.update(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k or 0)
    else:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    if method.kind == "lookup":
        kwargs["prompt_lookup_num_tokens"] = method.lookup_tokens
    ids = torch.tensor([prompt_ids], device=device)
    torch.manual_seed(seed)
    with torch.no_grad(), _ForwardClock(model, device) as clock:
        start = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
        if str(device).startswith("cuda"):
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    new = out[0, len(prompt_ids):].tolist()
    stop_reason = "length"
    for i, tok in enumerate(new):
        if tok in engine.stop_ids:
            new, stop_reason = new[:i], "stop"
            break
    new = new[: settings.max_new_tokens]
    ends = clock.ends
    prefill_s = ends[0] - start if ends else 0.0
    return Run(
        method=method.name, repeat=repeat, token_ids=new, decode_tokens=max(0, len(new) - 1),
        target_forwards=max(0, len(ends) - 1), elapsed_s=elapsed, prefill_s=prefill_s, stop_reason=stop_reason,
        step_s=[b - a for a, b in zip(ends, ends[1:])],
    )


def timed_run(engine, method: Method, prompt_ids: list[int], settings, seed: int, repeat: int = 0) -> Run:
    if method.engine_loop:
        return engine_run(engine, method, prompt_ids, settings, seed, repeat)
    return peer_run(engine, method, prompt_ids, settings, seed, repeat)
