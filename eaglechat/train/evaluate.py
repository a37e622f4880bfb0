"""Mean accepted length (tau) of a trained head on held-out prompts, through eaglechat's own engine.

Prompts: MT-bench first turns (never used for training), greedy, `max_new_tokens` 128 by default.
tau per prompt is the engine's `mean_accepted` (tokens emitted in decode / target forwards in decode);
the pooled tau weights prompts by their forwards. Greedy SmolLM2 replies often loop, and loops are
trivially predictable, so tau is also reported without the looping replies (eaglechat.looping.is_looping).
Results are appended per prompt to `results.jsonl`, so an interrupted evaluation resumes.
"""

from __future__ import annotations

import json
from pathlib import Path

from tqdm import tqdm

from eaglechat.looping import is_looping


def interleaved(n: int, blocks: int = 8) -> list[int]:
    """MT-bench lists its 8 categories in blocks of 10: take one of each in turn, so that a partial
    evaluation still covers every category."""
    size = n // blocks
    if size * blocks != n:
        return list(range(n))
    return [c * size + j for j in range(size) for c in range(blocks)]


def summarize(rows: list[dict]) -> dict:
    def pooled(rs):
        fw = sum(r["forwards"] for r in rs)
        return round(sum(r["tau"] * r["forwards"] for r in rs) / fw, 3) if fw else None

    clean = [r for r in rows if not r["looped"]]
    out = {
        "prompts": len(rows),
        "tau": pooled(rows),
        "tau_mean_per_prompt": round(sum(r["tau"] for r in rows) / len(rows), 3) if rows else None,
        "looping": sum(r["looped"] for r in rows),
        "tau_without_looping": pooled(clean),
        "tau_looping_only": pooled([r for r in rows if r["looped"]]),
    }
    checked = [r for r in rows if "same_as_plain" in r]
    if checked:
        out["lossless_checked"] = len(checked)
        out["lossless_mismatches"] = sum(not r["same_as_plain"] for r in checked)
    return out


def evaluate(model, tok, head_dir: Path, out_dir: Path, *, n_prompts: int = 80, max_new_tokens: int = 128,
             base_dir: Path | None = None, tree=None, check_plain: bool = False, dtype: str | None = None,
             reverse: bool = False, plain_ids: dict[int, list[int]] | None = None) -> dict:
    """`model`/`tok` are unused when `base_dir` is given (the engine loads its own copy). `reverse` walks
    the prompts from the other end, so a second process can share an evaluation (separate out_dir).
    `plain_ids` (prompt index -> plain greedy ids from an earlier checked run, see `stored_plain_ids`)
    replaces the plain decode of `check_plain` where it has the prompt: plain output does not depend on
    the head or the tree."""
    from eaglechat.datasets import mtbench_first_turns
    from eaglechat.engine.protocol import GenerationParams, TreeBudget

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.jsonl"
    rows = [json.loads(x) for x in results.read_text().splitlines()] if results.exists() else []
    questions = mtbench_first_turns()
    order = interleaved(len(questions))[:n_prompts]
    if reverse:
        order.reverse()
    engine = _engine(model, tok, head_dir, base_dir, tree or TreeBudget(), dtype)
    done = {r["i"] for r in rows}
    for i in tqdm(order, desc="eval tau (prompts)", unit="prompt", dynamic_ncols=True):
        if i in done:
            continue
        prompt = questions[i]
        params = GenerationParams(temperature=0.0, max_new_tokens=max_new_tokens)
        fin = _run(engine, prompt, params)
        st = fin.stats
        row = {"i": i, "tau": st.mean_accepted, "forwards": st.target_forwards, "new_tokens": st.new_tokens,
               "tokens_per_s": st.tokens_per_s, "looped": is_looping(fin.token_ids),
               "accepted_hist": list(st.accepted_hist), "token_ids": fin.token_ids}  # kept so that runs with other trees can be compared token for token
        if check_plain:
            if plain_ids and i in plain_ids:
                plain = plain_ids[i]
            else:
                plain = _run(engine, prompt, GenerationParams(temperature=0.0, max_new_tokens=max_new_tokens,
                                                              speculate=False)).token_ids
            row["same_as_plain"] = plain == fin.token_ids
            if not row["same_as_plain"]:
                row["plain_ids"] = plain
        rows.append(row)
        with results.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
    info = summarize(rows)
    info["tree"] = engine.info.tree.to_dict()
    info["max_new_tokens"] = max_new_tokens
    info["dtype"] = engine.info.dtype
    (out_dir / "summary.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def load_rows(dirs: list[Path]) -> list[dict]:
    """results.jsonl rows of one evaluation split over several folders (first row per prompt wins)."""
    rows: dict[int, dict] = {}
    for d in dirs:
        path = Path(d) / "results.jsonl"
        for line in (path.read_text().splitlines() if path.exists() else []):
            r = json.loads(line)
            rows.setdefault(r["i"], r)
    return [rows[i] for i in sorted(rows)]


def stored_plain_ids(dirs: list[Path]) -> dict[int, list[int]]:
    """Plain greedy ids per prompt from checked evaluations (same fp32 engine, same max_new_tokens)."""
    out = {}
    for r in load_rows(dirs):
        if "plain_ids" in r:
            out[r["i"]] = r["plain_ids"]
        elif r.get("same_as_plain"):
            out[r["i"]] = r["token_ids"]
    return out


def _run(engine, prompt: str, params):
    from eaglechat.engine.protocol import Finished

    fin = None
    for ev in engine.generate([{"role": "user", "content": prompt}], params):
        if isinstance(ev, Finished):
            fin = ev
    return fin


def _engine(model, tok, head_dir, base_dir, tree, dtype):
    if base_dir is not None:
        from eaglechat.loader import load_engine

        return load_engine(str(base_dir), head=str(head_dir), tree=tree, dtype=dtype)
    # reuse the model already in memory
    from eaglechat.engine.heads import load_head
    from eaglechat.loader import assemble_engine

    head = load_head(Path(head_dir), model)
    name = Path(getattr(model.config, "_name_or_path", "base")).name
    return assemble_engine(model, tok, head, model=name, tree=tree, max_context=4096, head_path=str(head_dir))
