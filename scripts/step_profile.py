"""Speed of the default model on this CPU, one interleaved run: plain decoding (the same loop), EAGLE with
the shipped head (reduced draft vocabulary) and with the same head over the full vocabulary, at two tree
budgets, and transformers' generate(); greedy MT-bench first turns; per-part time of a decode step.
usage: THREADS=2 python scripts/step_profile.py N_PROMPTS MAX_NEW (a measurement script for
BENCHMARKS.md, not part of the CLI)"""
import argparse
import collections
import json
import os
import platform
import statistics
import time

import torch

from eaglechat.datasets import mtbench_first_turns
from eaglechat.engine import decode as decode_mod
from eaglechat.engine.protocol import Finished, GenerationParams, TreeBudget
from eaglechat.loader import assemble_engine, load_engine
from eaglechat.models.default_model import DEFAULT_HEAD_DIR, ensure_default_base
from eaglechat.train.evaluate import interleaved
from eaglechat.train.vocab import restrict_eagle2_head


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, help="MT-bench first turns, one per category in turn")
    ap.add_argument("max_new", type=int, help="max new tokens per reply")
    args = ap.parse_args(argv)
    n, new = args.n, args.max_new
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    engine = load_engine(str(ensure_default_base()), head=str(DEFAULT_HEAD_DIR), dtype="float32", tree=TreeBudget(16, 4, 4))
    # the shipped head without its draft vocabulary: the only difference between the two EAGLE engines
    full_engine = assemble_engine(engine.model, engine.tokenizer, restrict_eagle2_head(engine.head, None),
                                  model=engine.info.model, tree=engine.info.tree, max_context=engine.info.max_context)
    times = collections.defaultdict(float)

    def timed(obj, name, label):
        fn = getattr(obj, name)

        def wrapper(*a, **k):
            t = time.perf_counter()
            out = fn(*a, **k)
            times[label] += time.perf_counter() - t
            return out
        setattr(obj, name, wrapper)

    for eng in (engine, full_engine):
        d = eng.decoder
        timed(d.drafter, "draft", "draft")
        timed(d, "tree_logits", "verify_forward")  # the verify forward and its lm_head
        timed(d.cache, "keep_path", "kv_keep")
        timed(d.drafter, "extend", "drafter_extend")
    orig_accept = decode_mod.accept

    def acc(*a, **k):
        t = time.perf_counter()
        out = orig_accept(*a, **k)
        times["accept"] += time.perf_counter() - t
        return out
    decode_mod.accept = acc

    cases = [("plain", engine, None), ("eagle 16/4/4 shipped top-8192", engine, TreeBudget(16, 4, 4)),
             ("eagle 16/4/4 full vocab", full_engine, TreeBudget(16, 4, 4)),
             ("eagle 8/3/4 shipped top-8192", engine, TreeBudget(8, 3, 4)), ("generate()", None, None)]
    res = {c[0]: collections.defaultdict(float) for c in cases}
    per_prompt = {c[0]: [] for c in cases}
    tok = engine.tokenizer
    mismatch = 0
    qs = mtbench_first_turns()
    for p in [qs[i] for i in interleaved(len(qs))[:n]]:  # one per category in turn
        msgs = [{"role": "user", "content": p}]
        ref = None
        for name, eng, tree in cases:
            r = res[name]
            if eng is None:  # transformers generate(), greedy, same prompt ids; time after a 1-token prefill
                ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
                t0 = time.perf_counter()
                engine.model.generate(**ids, max_new_tokens=1, do_sample=False)
                t1 = time.perf_counter()
                out = engine.model.generate(**ids, max_new_tokens=new, do_sample=False)
                t2 = time.perf_counter()
                k = out.shape[1] - ids["input_ids"].shape[1]
                dec_s = max((t2 - t1) - (t1 - t0), 1e-6)
                r["tokens"] += k - 1
                r["decode_s"] += dec_s
                r["forwards"] += k - 1
                per_prompt[name].append((k - 1) / dec_s)
                continue
            if tree is not None:
                eng.info.tree = tree
            params = GenerationParams(temperature=0.0, max_new_tokens=new, speculate=tree is not None)
            fin, first = None, True
            for e in eng.generate(msgs, params):
                if first:
                    times.clear()
                    first = False
                if isinstance(e, Finished):
                    fin = e
            st = fin.stats
            if ref is None:
                ref = fin.token_ids
            elif fin.token_ids != ref:
                mismatch += 1
            dec_s = st.elapsed_s - st.prefill_s
            r["forwards"] += st.target_forwards
            r["tokens"] += st.decode_tokens
            r["decode_s"] += dec_s
            per_prompt[name].append(st.decode_tokens / dec_s)
            for k2, v in times.items():
                r["part:" + k2] += v
    plain = per_prompt["plain"]
    out = {"prompts": n, "max_new_tokens": new, "threads": torch.get_num_threads(), "torch": torch.__version__,
           "machine": platform.processor() or platform.machine(), "mismatches_vs_plain": mismatch, "cases": {}}
    for name, r in res.items():
        f = max(r["forwards"], 1)
        out["cases"][name] = {
            "tau": round(r["tokens"] / f, 3), "decode_tok_s_median": round(statistics.median(per_prompt[name]), 2),
            "speedup_vs_plain_median": round(statistics.median(a / b for a, b in zip(per_prompt[name], plain)), 3),
            "ms_per_step": round(1000 * r["decode_s"] / f, 1),
            "ms_per_step_parts": {k[5:]: round(1000 * v / f, 1) for k, v in r.items() if k.startswith("part:")},
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
