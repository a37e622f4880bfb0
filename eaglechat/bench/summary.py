"""Results -> the JSON document `eaglechat bench --json` writes (schema "eaglechat.bench/1").

Definitions (the README's `eaglechat run --json` statistics; SafeAILab/EAGLE `eagle/evaluation/speed.py`):
  tokens/s      new tokens / wall time of the run, prefill included (EAGLE's evaluation/speed.py rate);
                decode tokens/s leaves the prefill out. Per prompt: median over the repeats, with
                min/max/p25/p75 as the spread. Overall: median over the prompts of the per-prompt medians
                (only prompts every method finished), with the same spread.
  speedup       method's tokens/s median / plain tokens/s median, on the same prompts and settings;
                `speedup` of the overall block is exactly the ratio of the two overall rates reported.
                `cpu_speedup`: the same with tokens per second of the process's CPU time (engine runs),
                which a loaded machine's waits leave out.
  tau           decode tokens / target forwards (decode only; plain = 1), pooled over runs;
                `tau_no_looping` pools only the prompts whose replies do not loop.
  acceptance    from the accepted-drafts histogram (steps that accepted 0, 1, 2, ... drafts):
                reached[d] = P(a step accepts >= d drafts), conditional[d] = reached[d] / reached[d-1].
  exact match   at temperature 0 only: a run's tokens equal the first plain run's tokens.
  looping       any engine reply to the prompt loops (eaglechat.looping.is_looping).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time

from eaglechat.bench.runner import Results, Settings
from eaglechat.bench.runs import Method, Run, _r
from eaglechat.looping import DESCRIPTION as LOOP_DETECTOR
from eaglechat.looping import is_looping

SCHEMA = "eaglechat.bench/1"


def spread(values: list[float]) -> dict | None:
    if not values:
        return None
    v = sorted(values)

    def q(p: float) -> float:  # linear interpolation, like numpy's default
        x = p * (len(v) - 1)
        lo, hi = math.floor(x), math.ceil(x)
        return v[lo] + (v[hi] - v[lo]) * (x - lo)

    return {"median": _r(statistics.median(v)), "min": _r(v[0]), "max": _r(v[-1]),
            "p25": _r(q(0.25)), "p75": _r(q(0.75)), "n": len(v)}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def merge_hist(hists: list[list[int]]) -> list[int]:
    out: list[int] = []
    for h in hists:
        out += [0] * (len(h) - len(out))
        for j, c in enumerate(h):
            out[j] += c
    return out


def acceptance_by_depth(hist: list[int], depth: int) -> list[dict]:
    steps = sum(hist)
    if not steps:
        return []
    out, prev = [], 1.0
    for d in range(1, max(depth, len(hist) - 1) + 1):
        reached = sum(hist[d:]) / steps
        out.append({"depth": d, "reached": _r(reached), "conditional": _r(reached / prev) if prev else None})
        prev = reached
    return out


def _pool(runs: list[Run], method: Method) -> dict:
    """Token/forward/step totals of a set of runs (any prompts)."""
    decode = sum(r.decode_tokens for r in runs)
    forwards = sum(r.target_forwards for r in runs)
    steps = sorted(s for r in runs for s in r.step_s)
    out = {
        "runs": len(runs),
        "new_tokens": sum(r.new_tokens for r in runs),
        "decode_tokens": decode,
        "target_forwards": forwards,
        "tau": _r(decode / forwards) if forwards else None,
        "step_ms": {
            "p50": _r(statistics.median(steps) * 1e3) if steps else None,
            "p90": _r(steps[min(len(steps) - 1, int(0.9 * len(steps)))] * 1e3) if steps else None,
            "max": _r(steps[-1] * 1e3) if steps else None,
        },
    }
    if method.speculative:
        hist = merge_hist([r.accepted_hist for r in runs])
        out["accepted_hist"] = hist
        out["acceptance_by_depth"] = acceptance_by_depth(hist, method.tree.depth if method.tree else 0)
    return out


def _matches(runs: list[Run], reference: list[int] | None) -> dict | None:
    if reference is None:
        return None
    return {"matched": sum(r.token_ids == reference for r in runs), "total": len(runs)}


def _prompt_block(pr, methods: list[Method], greedy: bool, tokenizer) -> dict:
    plain = pr.runs.get("plain") or []
    reference = plain[0].token_ids if greedy and plain else None
    engine_runs = [r for m in methods if m.engine_loop for r in pr.runs.get(m.name, [])]
    looping = any(is_looping(r.token_ids) for r in engine_runs)
    plain_rate = _median([r.tokens_per_s for r in plain])
    plain_decode = _median([r.decode_tokens_per_s for r in plain])
    plain_cpu = _median([r.cpu_tokens_per_s for r in plain if r.cpu_tokens_per_s])
    blocks = {}
    for m in methods:
        runs = pr.runs.get(m.name) or []
        if not runs:
            continue
        rate = _median([r.tokens_per_s for r in runs])
        decode_rate = _median([r.decode_tokens_per_s for r in runs])
        blocks[m.name] = {
            **_pool(runs, m),
            "tokens_per_s": spread([r.tokens_per_s for r in runs]),
            "decode_tokens_per_s": spread([r.decode_tokens_per_s for r in runs]),
            "speedup": _r(_ratio(rate, plain_rate)),
            "decode_speedup": _r(_ratio(decode_rate, plain_decode)),
            "cpu_tokens_per_s": spread([r.cpu_tokens_per_s for r in runs if r.cpu_tokens_per_s]),
            "cpu_speedup": _r(_ratio(_median([r.cpu_tokens_per_s for r in runs if r.cpu_tokens_per_s]), plain_cpu)),
            "exact_match": _matches(runs, reference),
            "runs_detail": [r.to_dict() for r in runs],
        }
    reply = ""
    if plain and tokenizer is not None:
        reply = tokenizer.decode(plain[0].token_ids, skip_special_tokens=True)
    return {
        "id": pr.prompt.id,
        "category": pr.prompt.category,
        "prompt": pr.prompt.text[:500],
        "prompt_tokens": len(pr.prompt_ids),
        "reply": reply[:2000],
        "looping": looping,
        "complete": all(len(pr.runs.get(m.name) or []) > 0 for m in methods),
        "methods": blocks,
    }


def _overall(prompt_blocks: list[dict], results: Results) -> dict:
    """Per method: the spread of per-prompt medians over the complete prompts, pooled taus."""
    complete = [b for b in prompt_blocks if b["complete"]]
    complete_ids = {(b["id"], b["category"]) for b in complete}
    runs_of = {m.name: [] for m in results.methods}
    clean_runs_of = {m.name: [] for m in results.methods}
    for pr, block in zip(results.prompts, prompt_blocks):
        if (block["id"], block["category"]) not in complete_ids:
            continue
        for m in results.methods:
            runs_of[m.name] += pr.runs[m.name]
            if not block["looping"]:
                clean_runs_of[m.name] += pr.runs[m.name]
    rates = {m.name: [b["methods"][m.name]["tokens_per_s"]["median"] for b in complete] for m in results.methods}
    decode_rates = {m.name: [b["methods"][m.name]["decode_tokens_per_s"]["median"] for b in complete]
                    for m in results.methods}
    plain_rate, plain_decode = _median(rates.get("plain", [])), _median(decode_rates.get("plain", []))
    cpu_rates = {m.name: [b["methods"][m.name]["cpu_tokens_per_s"]["median"] for b in complete
                          if b["methods"][m.name].get("cpu_tokens_per_s")] for m in results.methods}
    plain_cpu = _median(cpu_rates.get("plain", []))
    out = {}
    for m in results.methods:
        pooled = _pool(runs_of[m.name], m)
        clean = _pool(clean_runs_of[m.name], m)
        rate, decode_rate = _median(rates[m.name]), _median(decode_rates[m.name])
        per_prompt = [b["methods"][m.name]["speedup"] for b in complete if b["methods"][m.name]["speedup"]]
        matches = [b["methods"][m.name]["exact_match"] for b in complete]
        out[m.name] = {
            **m.describe(),
            **pooled,
            "tau_no_looping": clean["tau"],
            "tokens_per_s": spread(rates[m.name]),
            "decode_tokens_per_s": spread(decode_rates[m.name]),
            "speedup": _r(_ratio(rate, plain_rate)),
            "decode_speedup": _r(_ratio(decode_rate, plain_decode)),
            "cpu_speedup": _r(_ratio(_median(cpu_rates[m.name]), plain_cpu)),
            "speedup_per_prompt": {
                **(spread(per_prompt) or {}),
                "geomean": _r(math.exp(statistics.fmean(math.log(s) for s in per_prompt))) if per_prompt else None,
            },
            "exact_match": None if any(x is None for x in matches) or not matches else {
                "matched": sum(x["matched"] for x in matches), "total": sum(x["total"] for x in matches),
                "prompts_all_matched": sum(x["matched"] == x["total"] for x in matches),
            },
        }
    return {"prompts": len(complete), "methods": out}


def _by_category(prompt_blocks: list[dict], methods: list[Method]) -> dict:
    cats: dict[str, list[dict]] = {}
    for b in prompt_blocks:
        if b["complete"]:
            cats.setdefault(b["category"], []).append(b)
    out = {}
    for cat, blocks in cats.items():
        plain_rate = _median([b["methods"]["plain"]["tokens_per_s"]["median"] for b in blocks])
        per = {}
        for m in methods:
            rate = _median([b["methods"][m.name]["tokens_per_s"]["median"] for b in blocks])
            dec = sum(b["methods"][m.name]["decode_tokens"] for b in blocks)
            fwd = sum(b["methods"][m.name]["target_forwards"] for b in blocks)
            per[m.name] = {"tokens_per_s": _r(rate), "tau": _r(dec / fwd) if fwd else None,
                           "speedup": _r(_ratio(rate, plain_rate))}
        out[cat] = {"prompts": len(blocks), "methods": per}
    return out


def environment(engine, threads: int) -> dict:
    """Where and with what the numbers were measured."""
    import importlib.metadata as md

    import torch

    from eaglechat import __version__

    device = str(engine.info.device)
    name = platform.processor() or platform.machine()
    try:
        from eaglechat.fit import hardware

        name = hardware.probe(device).name
    except Exception:  # noqa: BLE001 - the probe is a nicety; the numbers do not depend on it
        pass
    versions = {"eaglechat": __version__, "torch": torch.__version__}
    try:
        versions["transformers"] = md.version("transformers")
    except md.PackageNotFoundError:
        pass
    return {
        "model": engine.info.model,
        "head": engine.info.head,
        "head_sha256": _head_digest(engine.info.head),
        "device": device,
        "device_name": name,
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "dtype": engine.info.dtype,
        "quant": engine.info.quant,
        "versions": versions,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_start": _loadavg(),
    }


def _head_digest(head: str) -> str | None:
    """First 16 hex digits of the head weights' sha256: which head (of a retrained series) was measured."""
    import hashlib
    from pathlib import Path

    files = sorted(Path(head).glob("*.safetensors")) + sorted(Path(head).glob("*.bin")) if head else []
    if not files:
        return None
    digest = hashlib.sha256()
    with open(files[0], "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def build(results: Results, settings: Settings, *, source: str, env: dict, tokenizer=None) -> dict:
    greedy = settings.temperature == 0
    prompt_blocks = [_prompt_block(pr, results.methods, greedy, tokenizer) for pr in results.prompts]
    complete = [b for b in prompt_blocks if b["complete"]]
    n_loop = sum(b["looping"] for b in complete)
    return {
        "schema": SCHEMA,
        **env,
        "loadavg_end": _loadavg(),
        "prompts_source": source,
        "settings": settings.to_dict(),
        "methods": [m.describe() for m in results.methods],
        "interrupted": results.interrupted,
        "wall_s": _r(results.wall_s, 2),
        "looping": {"prompts": n_loop, "total": len(complete), "fraction": _r(n_loop / len(complete)) if complete else None,
                    "detector": LOOP_DETECTOR},
        "overall": _overall(prompt_blocks, results),
        "by_category": _by_category(prompt_blocks, results.methods),
        "prompts": prompt_blocks,
    }
