"""The bench JSON document -> one PNG with three panels (matplotlib, Agg backend, no display needed):

  1. speedup over plain decoding per prompt category (EAGLE per tree size, and the peers)
  2. the distribution of tau over runs (EAGLE), with the pooled tau marked
  3. tokens/s against tree size when several --total-tokens were measured (plain and peers as lines);
     with a single tree: P(a step accepts >= d drafts) per depth d
"""

from __future__ import annotations

from pathlib import Path


def require_matplotlib() -> None:
    """--plot needs matplotlib, an optional extra: one line before any measuring, not an ImportError after."""
    import importlib.util

    from eaglechat.errors import UsageError

    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib, which is optional: pip install 'eaglechat[plot]'")


def plot(doc: dict, path: str | Path) -> Path:
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    names = [m["name"] for m in doc["methods"]]
    others = [n for n in names if n != "plain"]
    eagles = [n for n in names if n.startswith("eagle-")]
    overall = doc["overall"]["methods"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    fig.suptitle(
        f"eaglechat bench: {doc['model']} on {doc['device_name'] or doc['device']} ({doc['threads']} threads), "
        f"{doc['prompts_source']} x{doc['overall']['prompts']}, T={doc['settings']['temperature']}, "
        f"{doc['settings']['max_new_tokens']} new tokens, {doc['date'][:10]}"
        + (" (interrupted: finished prompts only)" if doc.get("interrupted") else ""),
        fontsize=10,
    )

    # 1. speedup per category
    ax = axes[0]
    cats = list(doc["by_category"]) + ["all"]
    width = 0.8 / max(1, len(others))
    for j, n in enumerate(others):
        ys = [(doc["by_category"][c]["methods"][n]["speedup"] if c != "all" else overall[n]["speedup"]) or 0 for c in cats]
        ax.bar([i + (j - (len(others) - 1) / 2) * width for i in range(len(cats))], ys, width, label=n)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks(range(len(cats)), cats, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("speedup over plain (tokens/s ratio of medians)")
    ax.set_title("speedup per prompt category", fontsize=10)
    ax.legend(fontsize=7)

    # 2. tau distribution
    ax = axes[1]
    taus = {n: [r["tau"] for p in doc["prompts"] if n in p["methods"] for r in p["methods"][n]["runs_detail"]
                if r["tau"] is not None] for n in eagles}
    every = [t for ts in taus.values() for t in ts]
    if every:
        lo, hi = min(every), max(every)
        bins = [lo + (hi - lo + 1e-9) * i / 15 for i in range(16)] if hi > lo else 5
        for i, n in enumerate(eagles):
            if taus[n]:
                ax.hist(taus[n], bins=bins, alpha=0.5, color=f"C{i}", label=f"{n} (pooled tau {overall[n]['tau']:.2f})")
                ax.axvline(overall[n]["tau"], lw=1.2, color=f"C{i}")
    ax.set_xlabel("tau = decode tokens / target forwards (per run)")
    ax.set_ylabel("runs")
    ax.set_title("tau distribution", fontsize=10)
    ax.legend(fontsize=7)

    # 3. tokens/s vs tree size, or acceptance by depth
    ax = axes[2]
    if len(eagles) > 1:
        xs = [overall[n]["tree"]["total_tokens"] for n in eagles]
        med = [overall[n]["tokens_per_s"]["median"] if overall[n]["tokens_per_s"] else 0 for n in eagles]
        lo = [m - (overall[n]["tokens_per_s"] or {}).get("p25", m) for m, n in zip(med, eagles)]
        hi = [(overall[n]["tokens_per_s"] or {}).get("p75", m) - m for m, n in zip(med, eagles)]
        ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label="EAGLE (median, p25-p75)")
        for i, n in enumerate(n for n in names if n not in eagles):
            if overall[n]["tokens_per_s"]:
                ax.axhline(overall[n]["tokens_per_s"]["median"], ls=["--", ":", "-."][i % 3], lw=1.2,
                           color=f"C{i + 1}", label=n)
        ax.set_xticks(xs)
        ax.set_xlabel("tree size (--total-tokens)")
        ax.set_ylabel("tokens/s (median over prompts)")
        ax.set_title("tokens/s vs tree size", fontsize=10)
    else:
        for n in eagles:
            acc = overall[n].get("acceptance_by_depth") or []
            ax.bar([a["depth"] for a in acc], [a["reached"] for a in acc], label=n)
        ax.set_xticks(sorted({a["depth"] for n in eagles for a in overall[n].get("acceptance_by_depth") or []}))
        ax.set_xlabel("depth d")
        ax.set_ylabel("P(step accepts >= d drafts)")
        ax.set_ylim(0, 1)
        ax.set_title("acceptance by tree depth", fontsize=10)
    ax.legend(fontsize=7)

    return save_figure(fig, path)


def save_figure(fig, path: Path) -> Path:
    """Lay out, write (folders made) and close a bench figure: the one way bench plots are saved."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
