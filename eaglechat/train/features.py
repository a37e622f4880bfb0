"""Teacher-forced features: the base model's last hidden state (after its final norm) for prompt+reply.

feature f_t = model.model(ids).last_hidden_state[t] (the lm_head input, what the head predicts).
Per sequence we keep ids (int32), features (bf16 [L, H]) and prompt_len; the loss covers reply tokens.
One output shard per distill shard, written atomically, so extraction resumes per shard. Rows that
distillation gave their features already (`DistillConfig.keep_features`) are taken as they are.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tqdm import tqdm

from eaglechat.train import store

MAX_TOKENS_PER_FORWARD = 4096


def base_body(model):
    """The decoder stack of a *ForCausalLM (returns post-norm last_hidden_state)."""
    return model.get_decoder() if hasattr(model, "get_decoder") else model.model


@torch.inference_mode()
def extract(model, seqs: list[list[int]], pad_id: int = 0) -> list[torch.Tensor]:
    """Features [L_i, H] (bf16, cpu) for each token sequence; right padding, batched by token count."""
    device = next(model.parameters()).device
    body = base_body(model)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out: list[torch.Tensor | None] = [None] * len(seqs)
    i = 0
    while i < len(order):
        width = len(seqs[order[i]])
        j = i
        while j < len(order) and (j - i + 1) * max(width, len(seqs[order[j]])) <= MAX_TOKENS_PER_FORWARD:
            width = max(width, len(seqs[order[j]]))
            j += 1
        j = max(j, i + 1)
        batch = [order[k] for k in range(i, j)]
        width = max(len(seqs[k]) for k in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        for r, k in enumerate(batch):
            ids[r, :len(seqs[k])] = torch.tensor(seqs[k])
            attn[r, :len(seqs[k])] = 1
        hidden = body(input_ids=ids.to(device), attention_mask=attn.to(device)).last_hidden_state
        for r, k in enumerate(batch):
            out[k] = hidden[r, :len(seqs[k])].to(torch.bfloat16).cpu().clone()
        i = j
    return out  # type: ignore[return-value]


def feature_name(src: Path) -> str:
    """features/<source folder>-shard-N.pt: self-distilled and dataset shards share one folder."""
    return f"{src.parent.name}-{src.name}"


def run_features(model, distill_shards: list[Path], out_dir: Path, deadline: float | None = None) -> dict:
    """Extract every missing shard; with `deadline` (time.time()), start no new shard after it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = [p for p in distill_shards if not (out_dir / feature_name(p)).exists()]
    bar = tqdm(total=len(distill_shards), initial=len(distill_shards) - len(todo), desc="features (shards)",
               unit="shard", dynamic_ncols=True)
    for path in todo:
        if deadline is not None and time.time() > deadline:
            break
        rows = store.load(path)
        seqs = [list(r["prompt_ids"]) + list(r["reply_ids"]) for r in rows]
        missing = [i for i, r in enumerate(rows) if "features" not in r]
        feats = [r.get("features") for r in rows]
        for i, f in zip(missing, extract(model, [seqs[i] for i in missing])):
            feats[i] = f
        items = [
            {"ids": torch.tensor(s, dtype=torch.int32), "features": f, "prompt_len": len(r["prompt_ids"]),
             "looped": bool(r["looped"]), "source": r.get("source", "self")}
            for s, f, r in zip(seqs, feats, rows)
            if len(r["reply_ids"]) >= 2
        ]
        store.atomic_save(items, out_dir / feature_name(path))
        bar.update(1)
    bar.close()
    n = positions = reply = 0
    for p in sorted(out_dir.glob("*shard-*.pt")):
        for it in store.load(p):
            n += 1
            positions += len(it["ids"])
            reply += len(it["ids"]) - it["prompt_len"]
    return {"sequences": n, "positions": positions, "reply_tokens": reply}
