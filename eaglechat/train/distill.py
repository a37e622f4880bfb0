"""Self-distillation: the base model's own greedy replies to the training prompts.

Prompts go through the base model's chat template, are sorted by length and generated in batches with
left padding (bf16 on CPU is ~1.5x faster than fp32 where the CPU has avx512_bf16). Replies are capped
at `max_new_tokens`. Greedy SmolLM2 replies fall into repetition loops 30-45 % of the time; a row stops
as soon as one 8-gram occurs for the third time (`LoopStop`, see eaglechat/looping.py), which keeps two
repetitions in the data and does not spend generation time on the rest of the loop.

Output: `distill/shard-NNNNN.pt` files of `shard_size` prompts each, written atomically, so an
interrupted run resumes at the first missing shard.

With `keep_features` each row also carries the base's features (its final norm's output, the lm_head
input, bf16), captured by a hook while `generate` runs: the prefill gives the prompt's, each decode step
the previous token's. The feature stage then only reshapes them instead of running the base over every
reply a second time (on a CPU that pass cost as much as a third of the generation). A reply cut by the
length cap has no feature for its last token (no step consumed it), so that token is dropped.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from eaglechat.looping import NGRAM, STOP_REPEATS
from eaglechat.train.store import atomic_save, shard_name


class LoopStop:
    """Per-row stopping criterion for `generate`: stop a row when an n-gram repeats `repeats` times."""

    def __init__(self, prompt_len: int, n: int = NGRAM, repeats: int = STOP_REPEATS):
        self.prompt_len, self.n, self.repeats = prompt_len, n, repeats
        self.counts: list[dict] | None = None
        self.stopped_at: dict[int, int] = {}

    def __call__(self, input_ids: torch.Tensor, scores=None, **kwargs) -> torch.Tensor:
        b, length = input_ids.shape
        if self.counts is None:
            self.counts = [{} for _ in range(b)]
        gen = length - self.prompt_len
        out = torch.zeros(b, dtype=torch.bool, device=input_ids.device)
        if gen < self.n:
            return out
        tail = input_ids[:, -self.n:].tolist()
        for row in range(b):
            if row in self.stopped_at:
                out[row] = True
                continue
            key = tuple(tail[row])
            c = self.counts[row].get(key, 0) + 1
            self.counts[row][key] = c
            if c >= self.repeats:
                self.stopped_at[row] = gen
                out[row] = True
        return out


@dataclass
class DistillConfig:
    max_new_tokens: int = 256
    batch_size: int = 16
    shard_size: int = 64
    stop_loops: bool = True
    keep_features: bool = False


def chat_prompt_ids(tok, prompt: str) -> list[int]:
    """The prompt as the engine encodes a chat turn: the base's own template, rendered under the same
    limits (engine/templates.py), typed control tokens kept as text."""
    from eaglechat.engine.templates import apply_template

    return apply_template(tok, [{"role": "user", "content": prompt}])


def plan_shards(tok, prompts: list[str], shard_size: int) -> list[list[tuple[int, list[int]]]]:
    """Tokenise and sort by length (deterministic), then cut into shards of (prompt index, ids)."""
    items = [(i, chat_prompt_ids(tok, p)) for i, p in enumerate(prompts)]
    items.sort(key=lambda it: (len(it[1]), it[0]))
    return [items[i:i + shard_size] for i in range(0, len(items), shard_size)]


@torch.inference_mode()
def generate_batch(model, tok, batch: list[list[int]], cfg: DistillConfig) -> list[dict]:
    from transformers import StoppingCriteriaList

    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos = tok.eos_token_id
    width = max(len(ids) for ids in batch)
    device = next(model.parameters()).device
    input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    for r, ids in enumerate(batch):  # left padding
        input_ids[r, width - len(ids):] = torch.tensor(ids)
        attn[r, width - len(ids):] = 1
    stopper = LoopStop(width) if cfg.stop_loops else None
    captured: list[torch.Tensor] = []
    hook = None
    if cfg.keep_features:
        from eaglechat.train.features import base_body

        hook = base_body(model).norm.register_forward_hook(
            lambda _module, _args, output: captured.append(output.to(torch.bfloat16).cpu()))
    try:
        out = model.generate(
            input_ids=input_ids.to(device), attention_mask=attn.to(device), max_new_tokens=cfg.max_new_tokens,
            do_sample=False, pad_token_id=pad, eos_token_id=eos,
            stopping_criteria=StoppingCriteriaList([stopper]) if stopper else None,
        )
    finally:
        if hook is not None:
            hook.remove()
    gen = out[:, width:].cpu().tolist()
    # [B, width + steps, H]: the prefill's positions, then one per decode step (the features of the
    # prompt and of generated tokens 0 .. steps-1)
    feats = torch.cat(captured, dim=1) if captured else None
    rows = []
    for r, ids in enumerate(batch):
        g = gen[r]
        looped = False
        if stopper is not None and r in stopper.stopped_at:
            reply, looped, finished = g[:stopper.stopped_at[r]], True, "loop"
        elif eos in g:
            reply, finished = g[:g.index(eos) + 1], "eos"
        else:
            reply, finished = g, "length"
        row = {"prompt_ids": ids, "reply_ids": reply, "looped": looped, "finished": finished}
        if feats is not None:
            have = feats.shape[1] - width  # reply tokens whose feature a decode step computed
            row["reply_ids"] = reply = reply[:have]
            row["features"] = feats[r, width - len(ids):width + len(reply)].clone()
        rows.append(row)
    return rows


def run_distill(model, tok, prompts: list[str], out_dir: Path, cfg: DistillConfig,
                deadline: float | None = None) -> list[Path]:
    """Generate every missing shard; with `deadline` (time.time()), stop starting new shards after it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shards = plan_shards(tok, prompts, cfg.shard_size)
    paths = [out_dir / shard_name(i) for i in range(len(shards))]
    # shards hold similar lengths (cheap padding); they run in a shuffled order so that a run cut short
    # (stop_after) still covers short and long prompts alike
    order = list(range(len(shards)))
    random.Random(0).shuffle(order)
    todo = [i for i in order if not paths[i].exists()]
    bar = tqdm(total=len(prompts), desc="distill (prompts)", unit="prompt", dynamic_ncols=True,
               initial=len(prompts) - sum(len(shards[i]) for i in todo))
    tokens = 0
    for i in todo:
        if deadline is not None and time.time() > deadline:
            break
        rows = []
        shard = shards[i]
        for b in range(0, len(shard), cfg.batch_size):
            chunk = shard[b:b + cfg.batch_size]
            got = generate_batch(model, tok, [ids for _, ids in chunk], cfg)
            for (idx, _), row in zip(chunk, got):
                row["index"] = idx
                rows.append(row)
                tokens += len(row["reply_ids"])
            bar.update(len(chunk))
            bar.set_postfix(reply_tokens=tokens)
        atomic_save(rows, paths[i])
    bar.close()
    return [p for p in paths if p.exists()]
