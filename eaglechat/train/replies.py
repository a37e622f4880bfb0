"""Dataset replies: ShareGPT's own first replies, teacher-forced through the base model's chat template.

Generation is the slow stage on a CPU (~6x the cost per token of feature extraction), so the trainer
can add prompts whose *dataset* reply (ChatGPT's, as in the original EAGLE-1 recipe, which trained on
fixed ShareGPT responses) is used instead of a self-distilled one. The head still learns the base
model's features and next-token distribution at every position; only the token path is off-policy.
Rows have the distill row format, so feature extraction treats both alike. Prompts already used for
self-distillation are skipped.
"""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from eaglechat.train import store
from eaglechat.train.distill import chat_prompt_ids

SHARD = 64


def run_replies(tok, pairs: list[tuple[str, str]], out_dir: Path, max_reply_tokens: int) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    eos = tok.eos_token_id
    chunks = [pairs[i:i + SHARD] for i in range(0, len(pairs), SHARD)]
    paths = [out_dir / store.shard_name(i) for i in range(len(chunks))]
    for i, chunk in enumerate(tqdm(chunks, desc="dataset replies (shards)", unit="shard", dynamic_ncols=True)):
        if paths[i].exists():
            continue
        rows = []
        for j, (prompt, reply) in enumerate(chunk):
            if not reply.strip():
                continue
            ids = tok(reply, add_special_tokens=False)["input_ids"]
            finished = "dataset"
            if len(ids) > max_reply_tokens:
                ids, finished = ids[:max_reply_tokens], "length"
            else:
                ids = ids + [eos]
            rows.append({"prompt_ids": chat_prompt_ids(tok, prompt), "reply_ids": ids, "looped": False,
                         "finished": finished, "index": i * SHARD + j, "source": "sharegpt"})
        store.atomic_save(rows, paths[i])
    return paths
