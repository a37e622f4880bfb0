"""Head training with the EAGLE-1 recipe (arXiv:2401.15077; SafeAILab/EAGLE `eagle/train/main.py`).

At position t the head reads (feature f_t, token x_{t+1}) and predicts f_{t+1}. Loss on positions whose
next-next token x_{t+2} is a reply token:
    SmoothL1(pred, f_{t+1}) + 0.1 * CE(softmax(lm_head(f_{t+1})), log_softmax(lm_head(pred)))
through the frozen base lm_head. Input features get uniform noise (+-0.1 of the feature RMS).
AdamW betas (0.9, 0.95), linear warm-up then cosine decay to 10 %, gradient-norm clipping 0.5.

Training-time test (`ttt_steps` > 1; HASS arXiv:2408.15766, EAGLE-3 arXiv:2503.01840): at inference a
depth-k tree node reads the head's own output of depth k-1, not the base's feature, and drafts drift.
Step k (k >= 1) of a batch feeds step k-1's prediction at t back with the teacher-forced token x_{t+k+1}
at position t+k, targets f_{t+k+1}, and attends to the step-0 keys causally plus, of steps 1..k, only the
key at its own t: what a depth-k node sees (the mask of eaglechat/train/eagle3.py). Step k's loss is
weighted 0.8^k; gradients flow through the fed-back predictions.

Departures from the official recipe, because the budget is ~1000 sequences instead of 68k:
- lr 1e-3 instead of 3e-5 (measured: 3e-5 barely moves in a few hundred steps);
- `fc` starts as "pass the feature through" (identity on the feature half), so the untrained head
  already predicts f_{t+1} ~ f_t and training learns the change.
With `draft_vocab` N > 0 the head gets a reduced draft vocabulary: the N most frequent reply tokens
(as EAGLE-3 does, `eagle/traineagle3/`). Both sides of the soft cross-entropy are then taken over those N rows of the
lm_head (softmax over a subset = the target renormalised to it), which also makes a training step
several times cheaper on a small model, where the 49k-row lm_head dominates.
A checkpoint (head, optimizer, position in the epoch) is written every few minutes and at every
epoch end, and the head is exported after every epoch, so Ctrl-C loses at most a few minutes.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from eaglechat.engine.heads import EagleHead, HeadConfig, init_weights
from eaglechat.errors import UsageError
from eaglechat.train import store
from eaglechat.train.eagle3 import ListKV, ttt_mask
from eaglechat.train.export import export_head

CLS_WEIGHT = 0.1


@dataclass
class TrainerConfig:
    epochs: float = 3.0
    lr: float = 1e-3
    batch_size: int = 4
    warmup_steps: int = 40
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    clip_norm: float = 0.5
    noise: float = 0.1  # uniform noise amplitude, as a fraction of the feature RMS
    seed: int = 0
    max_minutes: float = 0.0  # 0 = no time limit
    checkpoint_every_s: float = 300.0
    val_sequences: int = 24
    export_dtype: str = "bfloat16"
    log_every: int = 20
    max_steps: int = 0  # 0 = no limit (tests use it)
    draft_vocab: int = 0  # > 0: reduced draft vocabulary of this many reply tokens
    init_head: str = ""  # an EAGLE-1/2 head folder to continue from (its fc and decoder layer)
    ttt_steps: int = 1  # draft steps unrolled per position (1: the EAGLE-1 recipe)
    ttt_decay: float = 0.8  # step k's loss weight is ttt_decay ** k


def new_head(model) -> EagleHead:
    cfg = HeadConfig.for_base(model.config, bias=True)
    head = EagleHead(cfg, model.get_input_embeddings(), model.get_output_embeddings())
    init_weights(head)
    with torch.no_grad():  # fc: [embedding | feature] -> feature passes through
        h = cfg.hidden_size
        head.fc.weight[:, h:].copy_(torch.eye(h))
        head.fc.weight[:, :h].mul_(0.1)
        head.layers[0].self_attn.o_proj.weight.mul_(0.1)
        head.layers[0].mlp.down_proj.weight.mul_(0.1)
    return head


def load_init_head(src_dir: Path, model) -> EagleHead:
    """The EAGLE-1/2 head a run continues from (`--init-head`), with load_head's strict checks."""
    from eaglechat.engine.heads import load_head

    src = load_head(Path(src_dir), model)
    if not isinstance(src, EagleHead):
        raise UsageError(f"--init-head {src_dir}: an EAGLE-3 head; continuing needs an EAGLE-1/2 head")
    return src


def copy_trained_weights(head: EagleHead, src: EagleHead, src_dir: Path) -> None:
    """Start from `src`: its fc and decoder layer (the draft vocabulary is picked again from this run's
    data; the lm_head rows are the base's either way)."""
    try:
        with torch.no_grad():
            head.fc.load_state_dict(src.fc.state_dict())
            head.layers.load_state_dict(src.layers.state_dict())
    except RuntimeError as exc:  # shape mismatches
        raise UsageError(f"--init-head {src_dir}: not an EAGLE-1/2 head of this shape ({str(exc).splitlines()[0]})") from None


def load_items(paths: list[Path]) -> list[dict]:
    items = []
    for p in paths:
        items.extend(store.load(p))
    return [it for it in items if len(it["ids"]) - it["prompt_len"] >= 2]


def make_batches(items: list[dict], batch_size: int, seed: int) -> list[list[int]]:
    """Shuffled batches of similar-length sequences (less padding); deterministic per seed."""
    rng = random.Random(seed)
    idx = list(range(len(items)))
    rng.shuffle(idx)
    chunk = batch_size * 32
    batches = []
    for c in range(0, len(idx), chunk):
        part = sorted(idx[c:c + chunk], key=lambda i: len(items[i]["ids"]))
        batches.extend(part[b:b + batch_size] for b in range(0, len(part), batch_size))
    rng.shuffle(batches)
    return batches


def collate(items: list[dict], batch: list[int], device) -> dict:
    """Inputs (f_t, x_{t+1}, t), targets f_{t+1} and the loss mask (x_{t+2} is a reply token)."""
    seqs = [items[i] for i in batch]
    width = max(len(s["ids"]) for s in seqs) - 1
    hidden = seqs[0]["features"].shape[-1]
    feats = torch.zeros(len(seqs), width, hidden, dtype=torch.bfloat16)
    target = torch.zeros(len(seqs), width, hidden, dtype=torch.bfloat16)
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    for r, s in enumerate(seqs):
        n = len(s["ids"]) - 1
        feats[r, :n] = s["features"][:-1]
        target[r, :n] = s["features"][1:]
        tokens[r, :n] = s["ids"][1:].long()
        lo = max(s["prompt_len"] - 2, 0)
        mask[r, lo:n - 1] = True  # t + 2 in [prompt_len, L - 1]
    positions = torch.arange(width).expand(len(seqs), width)
    return {k: v.to(device) for k, v in
            dict(features=feats, target=target, tokens=tokens, mask=mask, positions=positions).items()}


def head_loss(head: EagleHead, batch: dict, noise_amp: float = 0.0, steps: int = 1,
              decay: float = 0.8) -> tuple[torch.Tensor, dict]:
    """The loss of `steps` unrolled draft steps (1: the EAGLE-1 recipe), and per-step figures: "acc" is
    step 0's top-1 agreement with the base, "acc1".. the deeper steps'."""
    feats = batch["features"].float()
    if noise_amp > 0:
        feats = feats + (torch.rand_like(feats) - 0.5) * (2 * noise_amp)
    width = feats.shape[1]
    shifted = {k: _pad_right(batch[k], steps - 1) for k in ("tokens", "target", "mask")}
    total, stats = feats.new_zeros(()), {"n": int(batch["mask"].sum())}
    # bf16 autocast on GPUs only: CPUs without avx512_bf16 run bf16 matmuls many times slower than fp32
    use_amp = feats.device.type == "cuda"
    for k, pred in enumerate(unrolled(head, feats, shifted["tokens"], batch["positions"], steps, use_amp)):
        with torch.autocast(device_type=feats.device.type, dtype=torch.bfloat16, enabled=use_amp):
            m = shifted["mask"][:, k:k + width]
            p = pred[m].float()
            tgt = shifted["target"][:, k:k + width][m].float()
            reg = F.smooth_l1_loss(p, tgt)
            dtype = head.lm_head.weight.dtype
            with torch.no_grad():
                t_logits = head.logits(tgt.to(dtype)).float()
                t_prob = t_logits.softmax(-1)
            logits = head.logits(p.to(dtype)).float()
            ce = -(t_prob * logits.log_softmax(-1)).sum(-1).mean()
            total = total + decay ** k * (reg + CLS_WEIGHT * ce)
        acc = (logits.argmax(-1) == t_logits.argmax(-1)).float().mean().item()
        if k == 0:
            stats |= {"l1": reg.item(), "ce": ce.item(), "acc": acc}
        else:
            stats[f"acc{k}"] = acc
    stats["loss"] = total.item()
    return total, stats


def unrolled(head: EagleHead, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, steps: int,
             autocast: bool = False):
    """Yield the predictions of draft steps 0..steps-1 at every position t: step 0 reads (f_t, x_{t+1}),
    step k reads step k-1's prediction and tokens[:, t + k] at position t + k. `tokens` holds
    width + steps - 1 columns."""
    width = features.shape[1]
    kv = ListKV() if steps > 1 else None
    hidden = features
    for k in range(steps):
        with torch.autocast(device_type=features.device.type, dtype=torch.bfloat16, enabled=autocast):
            mask = ttt_mask(width, k, features.device)[None, None] if kv is not None else None
            pred = head(hidden, tokens[:, k:k + width], positions + k, mask, kv, k * width)
        yield pred
        hidden = pred.float()


def _pad_right(t: torch.Tensor, n: int) -> torch.Tensor:
    """`t` [B, W, ...] with n zero (False) positions appended: the targets of step k are t[:, k:k + W]."""
    if n == 0:
        return t
    return torch.cat([t, t.new_zeros((t.shape[0], n, *t.shape[2:]))], dim=1)


def _lr_at(step: int, total: int, cfg: TrainerConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


@torch.no_grad()
def validate(head: EagleHead, items: list[dict], batch_size: int, device, steps: int = 1, decay: float = 0.8) -> dict:
    head.eval()
    tot: dict[str, float] = {}
    n = 0
    for b in range(0, len(items), batch_size):
        batch = collate(items, list(range(b, min(b + batch_size, len(items)))), device)
        _, st = head_loss(head, batch, steps=steps, decay=decay)
        for k, v in st.items():
            if k != "n":
                tot[k] = tot.get(k, 0.0) + v * st["n"]
        n += st["n"]
    head.train()
    return {k: round(v / max(n, 1), 4) for k, v in tot.items()} | {"positions": n}


def train(model, feature_shards: list[Path], work: Path, out_dir: Path, cfg: TrainerConfig, *, log=print) -> dict:
    device = next(model.parameters()).device
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    items = load_items(feature_shards)
    if len(items) < 2:
        raise UsageError(f"{len(items)} usable training sequence(s) in the work folder, 2 needed: more --prompts "
                         "or --dataset-replies (each reply needs 2 tokens or more)")
    rng = random.Random(cfg.seed)
    order = list(range(len(items)))
    rng.shuffle(order)
    n_val = min(cfg.val_sequences, max(1, len(items) // 10))
    val = [items[i] for i in order[:n_val]]
    items = [items[i] for i in order[n_val:]]
    rms = float(torch.cat([it["features"][:64].float().flatten() for it in items[:200]]).pow(2).mean().sqrt())
    noise_amp = cfg.noise * rms

    torch.manual_seed(cfg.seed)
    head = new_head(model).to(device=device, dtype=torch.float32).train()
    if cfg.init_head:
        copy_trained_weights(head, load_init_head(Path(cfg.init_head), model), Path(cfg.init_head))
        log(f"train: continuing from the head in {cfg.init_head}")
    vocab_info = {}
    if cfg.draft_vocab > 0:
        vocab_info = set_reply_vocab(head, items + val, cfg.draft_vocab, model)
        log(f"train: draft vocabulary {vocab_info['draft_vocab_size']} tokens, "
            f"{vocab_info['coverage']:.2%} of reply tokens")
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    per_epoch = len(make_batches(items, cfg.batch_size, cfg.seed))
    planned = max(1, int(round(cfg.epochs * per_epoch)))
    if cfg.max_steps:
        planned = min(planned, cfg.max_steps)
    state = {"step": 0, "total": planned, "elapsed": 0.0, "history": [], "exports": []}
    ckpt = work / "ckpt.pt"
    if ckpt.exists():
        saved = store.load(ckpt)
        head.load_state_dict(saved["head"], strict=False)
        opt.load_state_dict(saved["opt"])
        state = saved["state"]
        log(f"train: resumed at step {state['step']}/{state['total']}")
    log(f"train: {len(items)} sequences (+{len(val)} validation), {per_epoch} steps/epoch, "
        f"{state['total']} steps planned, feature rms {rms:.3f}")

    def save_ckpt():
        store.atomic_save({"head": head.state_dict(), "opt": opt.state_dict(), "state": state}, ckpt)

    t_start = time.time() - state["elapsed"]
    last_ckpt = time.time()
    budget_s = cfg.max_minutes * 60 if cfg.max_minutes > 0 else None
    bar = tqdm(total=state["total"], initial=state["step"], desc="train (steps)", unit="step", dynamic_ncols=True)
    window: list[dict] = []
    stopped_early = False
    tokens_seen = 0
    t_window = time.time()
    while state["step"] < state["total"]:
        epoch, pos = divmod(state["step"], per_epoch)
        batches = make_batches(items, cfg.batch_size, cfg.seed + epoch)
        for bi in range(pos, per_epoch):
            if state["step"] >= state["total"]:
                break
            lr = _lr_at(state["step"], state["total"], cfg)
            for g in opt.param_groups:
                g["lr"] = lr
            batch = collate(items, batches[bi], device)
            loss, st = head_loss(head, batch, noise_amp, cfg.ttt_steps, cfg.ttt_decay)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.clip_norm)
            opt.step()
            state["step"] += 1
            tokens_seen += int(batch["tokens"].numel())
            window.append(st)
            bar.update(1)
            if state["step"] % cfg.log_every == 0 or state["step"] == state["total"]:
                avg = {k: round(sum(w[k] for w in window) / len(window), 4) for k in window[0] if k != "n"}
                rate = tokens_seen / max(time.time() - t_window, 1e-6)
                tokens_seen, t_window = 0, time.time()
                state["history"].append({"step": state["step"], "lr": lr, **avg, "tok_s": round(rate)})
                bar.set_postfix(loss=avg["loss"], l1=avg["l1"], ce=avg["ce"], acc=avg["acc"], lr=f"{lr:.1e}")
                log(f"step {state['step']}/{state['total']} lr {lr:.2e} {avg} {rate:.0f} tok/s")
                window = []
            state["elapsed"] = time.time() - t_start
            if budget_s and state["step"] == 20 and state["elapsed"] > 0:  # fit the schedule to the time budget
                fits = int(state["step"] + (budget_s - state["elapsed"]) / (state["elapsed"] / 20) * 0.97)
                if fits < state["total"]:
                    log(f"train: time budget fits ~{fits} of {state['total']} planned steps; schedule shortened")
                    state["total"] = max(fits, state["step"] + 1)
                    bar.total = state["total"]
            if time.time() - last_ckpt > cfg.checkpoint_every_s:
                save_ckpt()
                last_ckpt = time.time()
            if budget_s and state["elapsed"] > budget_s:
                stopped_early = True
                break
        if state["step"] % per_epoch == 0 or state["step"] >= state["total"] or stopped_early:
            v = validate(head, val, cfg.batch_size, device, cfg.ttt_steps, cfg.ttt_decay)
            state["exports"].append({"step": state["step"], "epoch": round(state["step"] / per_epoch, 2), "val": v})
            log(f"train: step {state['step']} (epoch {state['step'] / per_epoch:.2f}) validation {v}")
            export_head(head, out_dir, cfg.export_dtype)
            save_ckpt()
            last_ckpt = time.time()
        if stopped_early:
            log("train: time budget reached; exported the head as it is")
            break
    bar.close()
    return {
        "steps": state["step"], "planned_steps": state["total"], "steps_per_epoch": per_epoch,
        "epochs": round(state["step"] / per_epoch, 2), "sequences": len(items), "validation_sequences": len(val),
        "minutes": round(state["elapsed"] / 60, 1), "final": state["history"][-1] if state["history"] else {},
        "validation": state["exports"][-1]["val"] if state["exports"] else {}, "history": state["history"],
        "config": asdict(cfg), "feature_rms": rms, "stopped_early": stopped_early, **vocab_info,
    }


def set_reply_vocab(head: EagleHead, items: list[dict], n: int, model) -> dict:
    """Give `head` the n most frequent reply tokens of `items` (the model's stop tokens always) as its
    draft vocabulary."""
    from eaglechat.engine.local import stop_token_ids
    from eaglechat.train.vocab import pick_draft_vocab

    replies = (it["ids"][it["prompt_len"]:].tolist() for it in items)
    vocab = pick_draft_vocab(replies, head.lm_head.weight.shape[0], n, stop_token_ids(None, model))
    head.set_draft_vocab(vocab["ids"])
    return {"draft_vocab_size": vocab["draft_vocab_size"], "coverage": round(vocab["coverage"], 4)}
