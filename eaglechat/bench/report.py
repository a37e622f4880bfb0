"""The bench JSON document -> the plain-text report printed on stdout."""

from __future__ import annotations

from eaglechat.engine.protocol import TreeBudget


def _f(x, fmt: str = "{:.2f}", none: str = "-") -> str:
    return none if x is None else fmt.format(x)


def _rate(s: dict | None) -> str:
    if not s:
        return "-"
    return f"{s['median']:.1f} [{s['min']:.1f}-{s['max']:.1f}]"


def _match(m: dict | None) -> str:
    return "n/a" if m is None else f"{m['matched']}/{m['total']}"


def render(doc: dict) -> str:
    s = doc["settings"]
    trees = ", ".join(
        TreeBudget.from_dict(m['tree']).label() for m in doc["methods"] if "tree" in m
    )
    lines = [
        f"eaglechat bench: {doc['model']} on {doc['device']} ({doc['device_name']}, {doc['threads']} threads, "
        f"{doc['dtype']}, quant {doc['quant']})",
        f"prompts {doc['prompts_source']} x{doc['overall']['prompts']}, max_new_tokens {s['max_new_tokens']}, "
        f"temperature {s['temperature']}, repeats {s['repeats']} interleaved after {s['warmup']} warm-up; "
        f"tree total/depth/top_k {trees}",
    ]
    if doc["interrupted"]:
        lines.append("INTERRUPTED: results so far (complete prompts only in the overall figures)")
    lines.append("")
    names = [m["name"] for m in doc["methods"]]
    head = f"{'prompt':<22} {'tok':>4} " + " ".join(f"{n:>22}" for n in names) + "  exact  loop"
    lines += ["tokens/s median [min-max], speedup x, tau:", head]
    for p in doc["prompts"]:
        cells = []
        for n in names:
            b = p["methods"].get(n)
            if not b:
                cells.append(f"{'-':>22}")
                continue
            extra = f" {_f(b['speedup'])}x" if n != "plain" else ""
            extra += f" t{_f(b['tau'])}" if b.get("accepted_hist") is not None else ""
            cells.append(f"{_rate(b['tokens_per_s']) + extra:>22}")
        eagle = [p["methods"][n]["exact_match"] for n in names if (n.startswith("eagle-") or n == "auto")
                 and n in p["methods"]]
        exact = ",".join(_match(m) for m in eagle) or "-"
        label = f"{p['category'][:12]}/{p['id']}"[:22]
        lines.append(f"{label:<22} {p['prompt_tokens']:>4} " + " ".join(cells) + f"  {exact:>5}  {'yes' if p['looping'] else ''}")
    lines += ["", "overall (median over prompts of per-prompt medians):"]
    for n in names:
        o = doc["overall"]["methods"][n]
        line = f"  {n:<14} {_rate(o['tokens_per_s'])} tok/s (decode {_f((o['decode_tokens_per_s'] or {}).get('median'), '{:.1f}')})"
        if n != "plain":
            line += f"  speedup {_f(o['speedup'])}x (decode {_f(o['decode_speedup'])}x)"
            if o.get("cpu_speedup") is not None:
                line += f" (CPU time {_f(o['cpu_speedup'])}x)"
        if o.get("accepted_hist") is not None:
            line += f"  tau {_f(o['tau'])} (no looping: {_f(o['tau_no_looping'])})  exact {_match(o['exact_match'])}"
            acc = " ".join(f"d{a['depth']}:{a['reached']:.2f}" for a in o["acceptance_by_depth"])
            line += f"\n  {'':<14} P(accept >= depth) {acc}"
        elif n != "plain" and o.get("tau") is not None:
            line += f"  tokens/forward {_f(o['tau'])}  same tokens as plain {_match(o['exact_match'])}"
        step = o["step_ms"]
        line += f"\n  {'':<14} step ms p50 {_f(step['p50'], '{:.1f}')} p90 {_f(step['p90'], '{:.1f}')} max {_f(step['max'], '{:.1f}')}"
        lines.append(line)
    loop = doc["looping"]
    lines.append(f"looping replies: {loop['prompts']}/{loop['total']} ({loop['detector']})")
    if doc["by_category"]:
        lines += ["", "by category (speedup x / tau):"]
        for cat, c in doc["by_category"].items():
            cells = [f"{n} {_f(v['speedup'])}x/{_f(v['tau'])}" for n, v in c["methods"].items() if n != "plain"]
            lines.append(f"  {cat:<12} ({c['prompts']}) " + "  ".join(cells))
    lines.append(f"wall {doc['wall_s']:.0f} s; load average {doc.get('loadavg_start')} -> {doc.get('loadavg_end')}")
    return "\n".join(lines)


def markdown(doc: dict) -> str:
    """The overall and per-category figures as Markdown tables (for BENCHMARKS.md)."""
    names = [m["name"] for m in doc["methods"]]
    o = doc["overall"]["methods"]
    lines = [
        "| method | tokens/s median [p25-p75] (min-max) | decode tok/s | speedup (decode) | per-prompt speedup median (geomean) | tau (no looping) | tokens identical to plain | step ms p50 / p90 / max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in names:
        m = o[n]
        r = m["tokens_per_s"] or {}
        tree = f" ({TreeBudget.from_dict(m['tree']).label()})" if "tree" in m else ""
        spp = m.get("speedup_per_prompt") or {}
        tau = f"{_f(m['tau'])} ({_f(m['tau_no_looping'])})" if m.get("tau") is not None else "-"
        step = m["step_ms"]
        lines.append(
            f"| {n}{tree} | {_f(r.get('median'), '{:.2f}')} [{_f(r.get('p25'), '{:.2f}')}-{_f(r.get('p75'), '{:.2f}')}] "
            f"({_f(r.get('min'), '{:.2f}')}-{_f(r.get('max'), '{:.2f}')}) | "
            f"{_f((m['decode_tokens_per_s'] or {}).get('median'), '{:.2f}')} | {_f(m['speedup'])}x ({_f(m['decode_speedup'])}x) | "
            f"{_f(spp.get('median'))}x ({_f(spp.get('geomean'))}x) | {tau} | {_match(m['exact_match'])} | "
            f"{_f(step['p50'], '{:.0f}')} / {_f(step['p90'], '{:.0f}')} / {_f(step['max'], '{:.0f}')} |"
        )
    eagles = [n for n in names if n.startswith("eagle-")]
    for n in eagles:
        acc = o[n].get("acceptance_by_depth") or []
        lines.append("")
        lines.append(f"{n}: P(step accepts >= d drafts) " + ", ".join(f"d{a['depth']} {a['reached']:.2f}" for a in acc)
                     + "; conditional " + ", ".join(f"d{a['depth']} {_f(a['conditional'])}" for a in acc)
                     + f"; accepted-drafts histogram {o[n]['accepted_hist']}")
    if doc["by_category"]:
        lines += ["", "| category (prompts) | " + " | ".join(f"{n} speedup / tau" for n in names if n != "plain") + " |",
                  "|---|" + "---|" * (len(names) - 1)]
        for cat, c in doc["by_category"].items():
            cells = [f"{_f(c['methods'][n]['speedup'])}x / {_f(c['methods'][n]['tau'])}" for n in names if n != "plain"]
            lines.append(f"| {cat} ({c['prompts']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)
