"""Greedy EAGLE against plain greedy decoding on the default model, per weight format.

For each format the same base is loaded (fp32 compute on CPU; "bf16" loads and computes in bfloat16),
each prompt is decoded twice with the same Decoder code (speculate off, then on, the shipped head, one
tree budget) and the first position where the two token sequences differ is recorded. "int8-batch" is bitsandbytes' LLM.int8 as shipped
(outlier columns chosen over the whole verify batch); "int8" is what eaglechat runs
(eaglechat/engine/int8_rows.py: each row keeps its own outliers).

    python scripts/quant_exactness.py --n 20 --max-new-tokens 64 --formats fp32,bf16,int8,int8-batch,nf4
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--formats", default="fp32,int8,int8-batch,nf4")
    ap.add_argument("--tree", default="16,4,4", help="total_tokens,depth,top_k")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from eaglechat.bench.prompts import load_prompts
    from eaglechat.engine import decode, target
    from eaglechat.engine.heads import load_head
    from eaglechat.engine.protocol import GenerationParams, TreeBudget
    from eaglechat.fit.quantization import quantization_config
    from eaglechat.models import default_model

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    base = default_model.ensure_default_base()
    tok = AutoTokenizer.from_pretrained(base)
    prompts = load_prompts("mt-bench", args.n)
    total, depth, top_k = map(int, args.tree.split(","))
    budget = TreeBudget(total_tokens=total, depth=depth, draft_top_k=top_k)
    results = {}
    for fmt in args.formats.split(","):
        quant = {"fp32": "none", "bf16": "none", "int8": "8bit", "int8-batch": "8bit", "nf4": "4bit"}[fmt]
        dtype = torch.bfloat16 if fmt == "bf16" else torch.float32  # bf16: the CPU default under dtype auto
        q = quantization_config(quant, dtype)
        model = AutoModelForCausalLM.from_pretrained(
            base, dtype=dtype, attn_implementation="sdpa", quantization_config=q,
            device_map="cpu" if q is not None else None).eval()
        head = load_head(default_model.DEFAULT_HEAD_DIR, model)
        original = target.make_rows_exact
        if fmt == "int8-batch":
            target.make_rows_exact = lambda m: 0  # bitsandbytes' own batch-wide outlier columns
        firsts, started = [], time.time()
        try:
            for p in prompts:
                ids = tok.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True)
                ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
                runs = []
                for speculate in (False, True):
                    dec = decode.Decoder(model, head, 1024)
                    out = []
                    for step in dec.generate(ids, GenerationParams(max_new_tokens=args.max_new_tokens,
                                                                   speculate=speculate), budget, set()):
                        out += step.tokens
                    runs.append(out)
                plain, eagle = runs
                first = next((i for i, (a, b) in enumerate(zip(plain, eagle)) if a != b), None)
                if first is None and len(plain) != len(eagle):
                    first = min(len(plain), len(eagle))
                firsts.append(first)
        finally:
            target.make_rows_exact = original
        diverged = [f for f in firsts if f is not None]
        results[fmt] = {"prompts": len(firsts), "identical": len(firsts) - len(diverged),
                        "first_divergence": firsts, "seconds": round(time.time() - started, 1)}
        print(f"{fmt:10s} {len(firsts) - len(diverged)}/{len(firsts)} identical; first divergence at "
              f"{sorted(diverged)} ({time.time() - started:.0f} s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
