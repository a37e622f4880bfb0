"""Training EAGLE-3 heads online (arXiv:2503.01840; SafeAILab/EAGLE `eagle/traineagle3/`).

The frozen base runs inside the loop and gives, per batch, the fused features (inputs of layers 2,
N//2, N-3) and its logits; nothing is stored per position (3H-wide features would triple the trainer's
feature files). Training-time test (TTT), `steps` unrolled draft steps:
  step 0 reads fc(fused f_t) + emb(x_{t+1}) at position t; step k reads the step k-1 output at t (no fc)
  + emb(x_{t+k+1}) (teacher-forced tokens) at position t+k, and sees the step-0 keys causally plus, of
  steps 1..k, only the key at its own t: what a depth-k tree node sees at inference.
  Its target is the base distribution of x_{t+k+2}, restricted to the draft vocabulary and renormalised;
  positions whose base argmax is outside the draft vocabulary, or whose token is not a reply token,
  are masked. Loss = sum_k 0.8^k CE_k. No feature-regression term.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from eaglechat.engine.heads import Eagle3Config, Eagle3Head, init_weights
from eaglechat.engine.heads.eagle3 import feature_layers, set_draft_vocab
from eaglechat.train import store


@dataclass
class Eagle3TrainConfig:
    ttt_steps: int = 7
    decay: float = 0.8
    lr: float = 1e-3
    batch_size: int = 2
    epochs: float = 1.0
    warmup_steps: int = 20
    clip_norm: float = 0.5
    max_len: int = 512
    seed: int = 0
    max_steps: int = 0  # 0 = no limit
    max_minutes: float = 0.0  # 0 = no limit
    checkpoint_every_s: float = 300.0


def new_head3(model, draft_ids: list[int] | None = None, std: float = 0.02) -> Eagle3Head:
    cfg = Eagle3Config.for_base(model.config, draft_vocab_size=len(draft_ids) if draft_ids else 0)
    head = init_weights(Eagle3Head(cfg, model.get_input_embeddings()), std=std)
    if draft_ids and cfg.reduced_vocab:
        set_draft_vocab(head, draft_ids)
    p = model.get_output_embeddings().weight
    return head.to(device=p.device)


@torch.no_grad()
def target_pass(model, ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
    """-> fused features [B, L, 3H] (inputs of layers 2, N//2, N-3) and base logits [B, L, V], one forward."""
    layers = feature_layers(int(model.config.num_hidden_layers))
    out = model(input_ids=ids, attention_mask=attention_mask, output_hidden_states=layers, use_cache=False)
    fused = torch.cat([out.hidden_states[i] for i in layers], dim=-1)
    return fused, out.logits


class ListKV:
    """The head attention's KV hook for training: appends per step (autograd-safe, no in-place writes)."""

    def __init__(self):
        self.k, self.v = [], []

    def write(self, start, k, v, width=None):
        self.k.append(k)
        self.v.append(v)
        return torch.cat(self.k, dim=2), torch.cat(self.v, dim=2)


def ttt_mask(t: int, step: int, device=None) -> torch.Tensor:
    """[t, (step+1)*t] bool: step-0 keys causal, keys of steps 1..step only at the query's own position."""
    mask = torch.zeros(t, (step + 1) * t, dtype=torch.bool, device=device)
    mask[:, :t] = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=device)
    for j in range(1, step + 1):
        mask[:, j * t:(j + 1) * t] = eye
    return mask


def ttt_loss(head: Eagle3Head, fused, logits, ids, loss_mask, steps: int = 7, decay: float = 0.8):
    """fused [B,L,3H], logits [B,L,V] (base), ids [B,L], loss_mask [B,L] bool (token j is a reply token)
    -> (loss, {"acc": [per-step top-1 agreement], "ce": [per-step CE]})."""
    b, length = ids.shape
    t = length - 1
    device = ids.device
    if t < 2:
        raise ValueError("sequences need at least 3 tokens")
    pos = torch.arange(t, device=device)
    ids_pad = torch.cat([ids, ids.new_zeros(b, steps + 2)], dim=1)
    mask_pad = torch.cat([loss_mask, loss_mask.new_zeros(b, steps + 2)], dim=1)
    logits_pad = torch.cat([logits, logits.new_zeros(b, steps + 2, logits.shape[-1])], dim=1)
    d2t = head.draft_to_target
    hidden = fused[:, :t].to(head.fc.weight.dtype)
    kv = ListKV()
    total = hidden.new_zeros((), dtype=torch.float32)
    accs, losses = [], []
    for k in range(steps):
        tokens = ids_pad[:, k + 1:k + 1 + t]
        positions = (pos + k)[None].expand(b, t)
        out = head(hidden, tokens, positions, ttt_mask(t, k, device)[None, None], kv, k * t)
        draft_logp = torch.log_softmax(head.logits(out).float(), dim=-1)  # [B, t, Vd]
        with torch.no_grad():
            target = logits_pad[:, k + 1:k + 1 + t].float()  # base distribution of x_{t+k+2}
            valid = mask_pad[:, k + 2:k + 2 + t] & ((pos + k + 2) < length)[None]
            top = target.argmax(-1)
            if d2t is not None:
                target = target[..., d2t]
                valid = valid & head.t2d[top]
            p = torch.softmax(target, dim=-1)
        ce = -(p * draft_logp).sum(-1)
        n = valid.sum().clamp(min=1)
        loss_k = (ce * valid).sum() / n
        total = total + (decay ** k) * loss_k
        with torch.no_grad():
            pred = draft_logp.argmax(-1)
            pred = d2t[pred] if d2t is not None else pred
            accs.append(float(((pred == top) & valid).sum() / n))
            losses.append(float(loss_k))
        hidden = out  # the head's own pre-norm output, fed back without fc
    return total, {"acc": accs, "ce": losses}


def batches(seqs: list[tuple[list[int], int]], batch_size: int, max_len: int, rng: random.Random):
    """(ids, prompt_len) pairs -> right-padded (ids, attention_mask, loss_mask) batches, shuffled."""
    order = list(range(len(seqs)))
    rng.shuffle(order)
    for i in range(0, len(order), batch_size):
        group = [seqs[j] for j in order[i:i + batch_size]]
        width = min(max_len, max(len(s) for s, _ in group))
        ids = torch.zeros(len(group), width, dtype=torch.long)
        attn = torch.zeros(len(group), width, dtype=torch.long)
        reply = torch.zeros(len(group), width, dtype=torch.bool)
        for r, (s, prompt_len) in enumerate(group):
            s = s[:width]
            ids[r, :len(s)] = torch.tensor(s)
            attn[r, :len(s)] = 1
            reply[r, prompt_len:len(s)] = True
        yield ids, attn, reply


def train_eagle3(model, seqs: list[tuple[list[int], int]], cfg: Eagle3TrainConfig, *, draft_ids=None,
                 head: Eagle3Head | None = None, log=print, ckpt: Path | None = None) -> tuple[Eagle3Head, list[dict]]:
    """Train an EAGLE-3 head on (ids, prompt_len) sequences with the frozen `model` in the loop.

    With `ckpt`, head + optimizer + history are saved every few minutes, at the end and on Ctrl-C; a
    later call resumes there, replaying the same data order (the batch shuffles are seeded)."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    head = head if head is not None else new_head3(model, draft_ids)
    head.train().requires_grad_(True)
    head.embed_tokens.requires_grad_(False)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    per_epoch = math.ceil(len(seqs) / cfg.batch_size)
    total = max(1, int(per_epoch * cfg.epochs))
    if cfg.max_steps:
        total = min(total, cfg.max_steps)

    def lr_at(step):
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)))

    history: list[dict] = []
    if ckpt is not None and Path(ckpt).exists():
        saved = store.load(Path(ckpt))
        head.load_state_dict(saved["head"])
        opt.load_state_dict(saved["opt"])
        history = saved["history"]
    resumed = step = len(history)

    def save():
        if ckpt is not None:
            store.atomic_save({"head": head.state_dict(), "opt": opt.state_dict(), "history": history}, Path(ckpt))

    started = last_save = time.time()
    bar = tqdm(total=total, initial=step, desc="train eagle3 (steps)", unit="step", dynamic_ncols=True,
               disable=log is None)
    try:
        seen = 0  # batches drawn, counting the ones replayed to reach a resumed position
        while step < total:
            for ids, attn, reply in batches(seqs, cfg.batch_size, cfg.max_len, rng):
                seen += 1
                if seen <= resumed:
                    continue
                if step >= total or (cfg.max_minutes and time.time() - started > 60 * cfg.max_minutes):
                    step = total
                    break
                device = head.fc.weight.device
                ids, attn, reply = ids.to(device), attn.to(device), reply.to(device)
                fused, logits = target_pass(model, ids, attn)
                for group in opt.param_groups:
                    group["lr"] = cfg.lr * lr_at(step)
                loss, info = ttt_loss(head, fused, logits, ids, reply & attn.bool(), cfg.ttt_steps, cfg.decay)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, cfg.clip_norm)
                opt.step()
                value = float(loss.detach())
                history.append({"step": step, "loss": value, **info})
                step += 1
                bar.update(1)
                bar.set_postfix(loss=f"{value:.3f}", acc0=f"{info['acc'][0]:.3f}")
                if log and ((step - 1) % 20 == 0 or step == total):
                    log(f"eagle3 step {step - 1}/{total} loss {value:.3f} acc0 {info['acc'][0]:.3f}")
                if time.time() - last_save > cfg.checkpoint_every_s:
                    save()
                    last_save = time.time()
    finally:  # also on Ctrl-C: the steps taken so far are kept
        save()
        bar.close()
    return head.eval().requires_grad_(False), history


def sequences_from_work(work: Path) -> list[tuple[list[int], int]]:
    """(prompt+reply ids, prompt length) for every row of a trainer work folder's distill/replies shards."""
    out = []
    for sub in ("distill", "replies"):
        for shard in store.shards(Path(work) / sub):
            for row in store.load(shard):
                if len(row["reply_ids"]) >= 2:
                    out.append((list(row["prompt_ids"]) + list(row["reply_ids"]), len(row["prompt_ids"])))
    return out
