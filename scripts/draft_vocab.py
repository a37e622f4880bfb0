"""Draft vocabulary measurements for BENCHMARKS.md (programs, not part of the CLI):

    python scripts/draft_vocab.py bench [--base DIR] [--work DIR ...] [--sizes 4096,8192,16384] [--rounds 25]
        median Drafter.draft() time per head layout (EAGLE-2/EAGLE-3, full vs top-N draft vocabulary)
    python scripts/draft_vocab.py e2e --head DIR [--work DIR ... | --ranking sharegpt] [--sizes 8192,4096] [--prompts 10]
        tau and decode tokens/s of a trained head, full vs restricted to top-N, against plain decoding
--ranking sharegpt ranks tokens by ShareGPT's replies, as the loader does for heads without a reduced
vocabulary (eaglechat/models/draft_vocab.py); the default counts the trainer's work folders.

The base defaults to the converted default model (fp32, CPU). Prints one JSON document.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from eaglechat.train.vocab import count_tokens, coverage, reply_rows, restrict_eagle2_head, top_n


def _measurement_base(args):
    """The fp32 CPU base model the measurement commands share: (model, tokenizer, vocabulary size)."""
    from eaglechat.loader import load_base

    torch.set_num_threads(args.threads)
    if args.base is None:
        from eaglechat.models import default_model

        args.base = str(default_model.ensure_default_base())
    model, tok = load_base(Path(args.base), device="cpu", dtype=torch.float32)
    return model, tok, model.get_input_embeddings().weight.shape[0]


def _counts(args, tok, vocab):
    """Reply token counts: the trainer's work folders, or ShareGPT's replies as the loader counts them."""
    if args.ranking == "sharegpt":
        from eaglechat.models.draft_vocab import reply_counts

        return reply_counts(tok, vocab, None)
    return count_tokens((r for w in args.work for r in reply_rows(Path(w))), vocab)


def bench(argv=None) -> dict:
    """Median Drafter.draft() time per head layout on a real base (random head weights: the time of a
    draft step does not depend on them), runs interleaved round-robin, plus top-N reply coverage."""
    import argparse
    import platform
    import statistics
    import time

    from eaglechat.engine.decode import Decoder
    from eaglechat.engine.heads import Eagle3Config, Eagle3Head, EagleHead, HeadConfig, init_weights
    from eaglechat.engine.heads.eagle3 import set_draft_vocab
    from eaglechat.engine.protocol import TreeBudget

    ap = argparse.ArgumentParser(prog="python scripts/draft_vocab.py bench")
    ap.add_argument("--base", default=None, help="base model folder (default: the converted default model)")
    ap.add_argument("--work", action="append", default=[], help="trainer work folder(s) to count reply tokens in")
    ap.add_argument("--ranking", choices=["work", "sharegpt"], default="work",
                    help="token counts from --work folders, or ShareGPT's replies (the loader's default, eaglechat/models/draft_vocab.py)")
    ap.add_argument("--sizes", default="4096,8192,16384")
    ap.add_argument("--trees", default="16x4x4,60x5x10", help="total_tokens x depth x top_k")
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    model, tok, vocab = _measurement_base(args)
    counts = _counts(args, tok, vocab) if args.work or args.ranking == "sharegpt" else None
    sizes = [int(s) for s in args.sizes.split(",")]
    ids_for = {n: (top_n(counts, n) if counts is not None else list(range(n))) for n in sizes}

    torch.manual_seed(0)
    e2 = init_weights(EagleHead(HeadConfig.for_base(model.config), model.get_input_embeddings(), model.get_output_embeddings())).eval()
    heads = {"eagle2 full": e2}
    for n in sizes:
        heads[f"eagle2 top-{n}"] = restrict_eagle2_head(e2, ids_for[n])
    heads["eagle3 full"] = init_weights(Eagle3Head(Eagle3Config.for_base(model.config), model.get_input_embeddings())).eval()
    for n in sizes:
        h = init_weights(Eagle3Head(Eagle3Config.for_base(model.config, draft_vocab_size=n), model.get_input_embeddings())).eval()
        set_draft_vocab(h, ids_for[n])
        heads[f"eagle3 top-{n}"] = h

    messages = [{"role": "user", "content": "Explain in a few sentences why the sky is blue, and what changes at sunset."}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(prompt, "keys"):
        prompt = prompt["input_ids"]
    decoders = {}
    for name, head in heads.items():
        dec = Decoder(model, head, 512)
        ids = torch.tensor(prompt)
        chain = torch.arange(ids.numel())
        with torch.no_grad():
            feats, draft_features = dec.target.forward(ids, chain, chain[:, None] >= chain[None, :])
        root = int(dec.target.logits(feats[-1]).argmax())
        dec.drafter.extend(draft_features, torch.tensor(prompt[1:] + [root]))
        decoders[name] = (dec, root)
    trees = [TreeBudget(*map(int, t.split("x"))) for t in args.trees.split(",")]
    times = {(name, i): [] for name in heads for i in range(len(trees))}
    for _ in range(args.rounds):  # interleaved: every case once per round
        for i, budget in enumerate(trees):
            for name, (dec, root) in decoders.items():
                t0 = time.perf_counter()
                dec.drafter.draft(root, budget)
                times[(name, i)].append(time.perf_counter() - t0)
    result = {
        "base": Path(args.base).name, "vocab": vocab, "hidden": int(model.config.hidden_size), "prompt_tokens": len(prompt),
        "threads": args.threads, "rounds": args.rounds, "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
        "coverage": {n: coverage(counts, ids_for[n]) for n in sizes} if counts is not None else None,
        "reply_tokens": int(counts.sum()) if counts is not None else 0,
        "draft_ms": {
            f"{t.total_tokens}x{t.depth}x{t.draft_top_k}": {name: round(1000 * statistics.median(times[(name, i)]), 2) for name in heads}
            for i, t in enumerate(trees)
        },
    }
    return result


def bench_e2e(argv=None) -> dict:
    """tau and decode tokens/s of a trained EAGLE-2 head, full vs restricted to top-N draft vocabularies,
    against plain decoding: greedy MT-bench first turns, the cases interleaved per prompt; every
    speculative reply is checked equal to the plain one."""
    import argparse
    import platform
    import statistics

    from eaglechat.datasets import mtbench_first_turns
    from eaglechat.engine.heads import load_head
    from eaglechat.engine.local import stop_token_ids
    from eaglechat.engine.protocol import Finished, GenerationParams, TreeBudget
    from eaglechat.loader import assemble_engine

    ap = argparse.ArgumentParser(prog="python scripts/draft_vocab.py e2e")
    ap.add_argument("--base", default=None)
    ap.add_argument("--head", required=True)
    ap.add_argument("--work", action="append", default=[])
    ap.add_argument("--ranking", choices=["work", "sharegpt"], default="work")
    ap.add_argument("--sizes", default="8192,4096")
    ap.add_argument("--tree", default="16x4x4")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    model, tok, vocab = _measurement_base(args)
    counts = _counts(args, tok, vocab)
    loaded = load_head(Path(args.head), model)
    full = restrict_eagle2_head(loaded, None)
    budget = TreeBudget(*map(int, args.tree.split("x")))
    heads = {"plain": None, "full": full}
    draft_ids = {}
    if loaded.draft_to_target is not None:  # a head trained with a reduced vocabulary: as shipped
        heads[f"shipped-{loaded.draft_to_target.numel()}"] = loaded
    for n in (int(x) for x in args.sizes.split(",") if x):
        draft_ids[f"top-{n}"] = top_n(counts, n, always=stop_token_ids(tok, model))  # stops must be draftable
        heads[f"top-{n}"] = restrict_eagle2_head(full, draft_ids[f"top-{n}"])
    engines = {k: assemble_engine(model, tok, h, model="bench", tree=budget, max_context=2048) for k, h in heads.items()}
    rows = {k: [] for k in heads}
    mismatches = 0
    for prompt in mtbench_first_turns()[: args.prompts]:
        messages = [{"role": "user", "content": prompt}]
        ref = None
        for name, eng in engines.items():
            params = GenerationParams(max_new_tokens=args.max_new_tokens, speculate=name != "plain")
            fin = [e for e in eng.generate(messages, params) if isinstance(e, Finished)][0]
            st = fin.stats
            if ref is None:
                ref = fin.token_ids
            elif fin.token_ids != ref:
                mismatches += 1
            rows[name].append({"tokens": st.new_tokens, "forwards": st.target_forwards,
                               "decode_tokens": getattr(st, "decode_tokens", 0), "decode_tps": st.decode_tokens_per_s})
    out = {"base": Path(args.base).name, "head": Path(args.head).name, "tree": args.tree, "prompts": args.prompts,
           "ranking": args.ranking,
           "max_new_tokens": args.max_new_tokens, "threads": args.threads, "torch": torch.__version__,
           "cpu": platform.machine(), "mismatches_vs_plain": mismatches, "cases": {}}
    plain_tps = [r["decode_tps"] for r in rows["plain"]]
    for name, rs in rows.items():
        fw = sum(r["forwards"] for r in rs)
        dt = sum(r["decode_tokens"] for r in rs)
        out["cases"][name] = {
            "tau": round(dt / fw, 3) if fw else None,
            "decode_tok_s_median": round(statistics.median(r["decode_tps"] for r in rs), 2),
            "speedup_median_per_prompt": round(statistics.median(r["decode_tps"] / p for r, p in zip(rs, plain_tps)), 3),
        }
        if name.startswith("top-"):
            out["cases"][name]["coverage"] = round(coverage(counts, draft_ids[name]), 4)
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        print(json.dumps(bench(argv[1:]), indent=2))
    elif argv[:1] == ["e2e"]:
        print(json.dumps(bench_e2e(argv[1:]), indent=2))
    else:
        print(__doc__.strip())
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
