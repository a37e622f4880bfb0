"""The `bench --costs` JSON document -> text tables (stdout) and one PNG (matplotlib, Agg backend).

Panels: verify time by rows T at each KV length; draft time by depth per top_k; predicted speedup
over plain decoding per tree budget (the pick marked), one line per format.
"""

from __future__ import annotations

from pathlib import Path

from eaglechat.bench.plot import save_figure
from eaglechat.engine.protocol import TreeBudget


def primary(fmt: dict) -> dict:
    """The forecast the tables lead with: the middle KV length."""
    fc = fmt["forecast"]
    return fc[len(fc) // 2]


def render(doc: dict) -> str:
    lines = [
        f"step costs: {doc['model']} ({doc['source']}) on {doc['device_name']} [{doc['device']}], "
        f"{doc['threads']} threads, {doc['date'][:16]}Z",
    ]
    for f in doc["formats"]:
        m = f["measured"]
        costs = m["costs"]
        lines.append("")
        lines.append(f"== {f['format']} (dtype {f['dtype']}, quant {f['quant']}): built in {f['build_s']:.1f} s, "
                     f"measured in {f['measure_s']:.1f} s, median of {doc['plan']['repeats']}, "
                     + ("steps and forwards as CUDA-graph replays" if m.get("steps") == "graphs" else "eager steps")
                     + (f" ({m['steps_note']})" if m.get("steps_note") else ""))
        lengths = [c["kv_length"] for c in costs]
        lines.append("verify ms   " + "".join(f"{'L=' + str(L):>11}" for L in lengths))
        for t in costs[0]["verify_ms"]:
            lines.append(f"  T={t:<8} " + "".join(f"{c['verify_ms'][t]:11.2f}" for c in costs))
        c0 = costs[0]
        lines.append(f"draft ms at L={c0['kv_length']} (depth,top_k): "
                     + "  ".join(f"{k}: {v:.2f}" for k, v in c0["draft_ms"].items()))
        tree = lambda t: TreeBudget.from_dict(t).label()  # noqa: E731
        small = f", {tree(m['small_tree'])} {m['small_step_ms']:.2f} ms" if m.get("small_tree") else ""
        by_rows = c0.get("overhead_ms_by_rows") or {"": c0["overhead_ms"]}
        lines.append(f"real steps at L~{m['decode_kv_length']}: plain {m['plain_step_ms']:.2f} ms, EAGLE "
                     f"{tree(m['ref_tree'])} {m['eagle_step_ms']:.2f} ms{small} -> overhead "
                     + ", ".join(f"{v:.2f} ms" + (f" at T={t}" if t else "") for t, v in by_rows.items())
                     + f" per step (plain {c0['plain_overhead_ms']:.2f})")
        fc = primary(f)
        lines.append(f"tau: {fc['tau_source']}")
        if fc["max_rows"]:
            lines.append(f"clamp: at most {fc['max_rows']} verified rows ({fc['clamp_reason']})")
        lines.append(f"predicted at L={fc['kv_length']} (plain {fc['plain_tokens_per_s']:.2f} tok/s):")
        lines.append(f"  {'N':>4} {'d/k':>6} {'tau':>6} {'draft':>8} {'verify':>8} {'step ms':>8} {'tok/s':>9} {'speedup':>8}")
        for p in fc["per_budget"]:
            mark = "  <- best" if fc["best"] and p["total_tokens"] == fc["best"]["total_tokens"] else ""
            lines.append(f"  {p['total_tokens']:>4} {str(p['depth']) + '/' + str(p['top_k']):>6} {p['tau']:6.2f} "
                         f"{p['draft_ms']:8.2f} {p['verify_ms']:8.2f} {p['step_ms']:8.2f} {p['tokens_per_s']:9.2f} "
                         f"{p['speedup']:7.2f}x{mark}")
        for other in f["forecast"]:
            b = other["best"]
            if b:
                verdict = "speculate" if other["speculate"] else f"speculation off (< {other['min_gain']}x)"
                lines.append(f"best at L={other['kv_length']}: {tree(b)}, "
                             f"{b['tokens_per_s']:.2f} tok/s, {b['speedup']:.2f}x over plain: {verdict}")
    return "\n".join(lines)


def plot(doc: dict, path: str | Path) -> Path:
    from eaglechat.bench.plot import require_matplotlib

    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    fig.suptitle(f"eaglechat bench --costs: {doc['model']} ({doc['source']}) on {doc['device_name']}, "
                 f"{doc['threads']} threads, {doc['date'][:10]}", fontsize=10)
    styles = ["-", "--", ":", "-."]
    for i, f in enumerate(doc["formats"]):
        color = f"C{i}"
        for j, c in enumerate(f["measured"]["costs"]):
            ts = [int(t) for t in c["verify_ms"]]
            axes[0].plot(ts, list(c["verify_ms"].values()), marker="o", ms=3, ls=styles[j % 4], color=color,
                         label=f"{f['format']} L={c['kv_length']}")
        c0 = f["measured"]["costs"][0]
        by_k: dict[str, list[tuple[int, float]]] = {}
        for key, ms in c0["draft_ms"].items():
            d, k = key.split(",")
            by_k.setdefault(k, []).append((int(d), ms))
        for j, (k, pts) in enumerate(sorted(by_k.items(), key=lambda kv: int(kv[0]))):
            pts.sort()
            axes[1].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, ls=styles[j % 4], color=color,
                         label=f"{f['format']} top_k={k}")
        fc = primary(f)
        xs = [p["total_tokens"] for p in fc["per_budget"]]
        axes[2].plot(xs, [p["speedup"] for p in fc["per_budget"]], marker="o", ms=3, color=color,
                     label=f"{f['format']} (plain {fc['plain_tokens_per_s']:.1f} tok/s)")
        if fc["best"]:
            axes[2].scatter([fc["best"]["total_tokens"]], [fc["best"]["speedup"]], s=80, facecolors="none",
                            edgecolors=color, linewidths=1.5)
    axes[0].set_xscale("log", base=2)
    rows = doc["plan"]["rows"]
    axes[0].set_xticks(rows, [str(t) for t in rows])
    axes[0].set_xlabel("verified rows T (tree tokens + root)")
    axes[0].set_ylabel("ms per verify forward (median)")
    axes[0].set_title("verify cost", fontsize=10)
    axes[1].set_xlabel("draft depth")
    axes[1].set_ylabel("ms per draft (median)")
    axes[1].set_title(f"draft cost at L={doc['formats'][0]['measured']['costs'][0]['kv_length']}" if doc["formats"] else "draft cost", fontsize=10)
    axes[2].axhline(1.0, color="black", lw=0.8, ls="--")
    axes[2].set_xlabel("tree budget N (--total-tokens)")
    axes[2].set_ylabel("predicted speedup over plain")
    tau = primary(doc["formats"][0])["tau_source"].split(":")[0] if doc["formats"] else ""
    axes[2].set_title(f"prediction ({tau} tau; circle = pick)", fontsize=10)
    for ax in axes:
        ax.legend(fontsize=6)
    return save_figure(fig, path)
