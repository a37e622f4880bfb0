"""`eaglechat train`: prompts -> self-distillation -> features -> training -> export -> tau eval.

Every stage writes into one work folder and leaves a `<stage>.done` marker, so a run interrupted with
Ctrl-C continues where it stopped (distillation and feature extraction per shard, training from its
last checkpoint). Runs on a GPU when one is given or found, on the CPU otherwise.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eaglechat.errors import UsageError
from eaglechat.train import store


@dataclass
class TrainConfig:
    base: str
    out: str
    work: str
    prompts: int = 1000
    max_new_tokens: int = 256
    epochs: float = 3.0
    lr: float = 1e-3
    batch_size: int = 4
    gen_batch_size: int = 16
    device: str = "auto"
    seed: int = 0
    distill_minutes: float = 0.0  # > 0: stop starting new distill shards after this long
    train_minutes: float = 0.0  # > 0: stop training after this long (export what there is)
    threads: int = 0  # torch CPU threads (0: torch's default); 1 is far steadier on a busy 2-core VM
    dtype: str = "auto"  # base model dtype: auto = float32 on CPU (bf16 is slow without avx512_bf16)
    features_minutes: float = 0.0  # > 0: stop extracting new shards after this long
    dataset_replies: int = 0  # extra prompts trained on ShareGPT's own reply (no generation)
    eval_prompts: int = 80
    export_dtype: str = "bfloat16"
    draft_vocab: int = 0  # > 0: reduced draft vocabulary (the N most frequent reply tokens)
    init_head: str = ""  # continue training from this EAGLE-1/2 head folder
    head_kind: str = "eagle2"  # or "eagle3" (fused low/mid/high features, training-time test)
    ttt_steps: int = 0  # draft steps unrolled per training position (0: 1 for eagle2, 7 for eagle3)
    skip_prompts: int = 0  # start after this many prompts of the shuffled order
    data_keys: tuple = field(default=("prompts", "max_new_tokens", "seed", "skip_prompts"), repr=False)


def base_dtype(name: str, device: str) -> str:
    """`--dtype auto`: float32 on the CPU (bf16 is slow without avx512_bf16), bfloat16 on a GPU."""
    if name == "auto":
        return "float32" if device == "cpu" else "bfloat16"
    return name


def load_base(base_dir: Path, device: str, *, dtype: str = "float32"):
    """The frozen base for distillation and features; batched generation pads with eos when the
    tokenizer has no pad token."""
    from eaglechat.fit import hardware
    from eaglechat.loader import load_base as load_model

    model, tok = load_model(base_dir, device=device, dtype=hardware.torch_dtype(dtype))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok


def _check_work(work: Path, cfg: TrainConfig) -> None:
    cfg_path = work / "config.json"
    data = {k: getattr(cfg, k) for k in cfg.data_keys}
    if cfg_path.exists():
        old = json.loads(cfg_path.read_text()).get("data", {})
        was = {k: old.get(k, TrainConfig.__dataclass_fields__[k].default) for k in data}  # keys added later: their default
        diff = {k: (was[k], v) for k, v in data.items() if was[k] != v}
        if diff and store.shards(work / "distill"):
            k, (was, now) = next(iter(diff.items()))
            raise UsageError(f"work folder {work} was made with {k}={was}, not {now}; use another --work")
    store.atomic_write_text(cfg_path, json.dumps({"data": data, "last": asdict(cfg) | {"data_keys": None}},
                                                 indent=2, default=str) + "\n")


def run(cfg: TrainConfig, base_dir: Path, *, log=print) -> dict:
    import torch

    torch.manual_seed(cfg.seed)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    work, out = Path(cfg.work), Path(cfg.out)
    work.mkdir(parents=True, exist_ok=True)
    _check_work(work, cfg)
    from eaglechat.fit import hardware

    device = hardware.torch_device(cfg.device)
    log(f"train: base {base_dir}, device {device}, work {work}, out {out}")
    model, tok = load_base(base_dir, device, dtype=base_dtype(cfg.dtype, device))
    if cfg.init_head:  # a bad --init-head fails now, not after hours of distillation
        if cfg.head_kind == "eagle3":
            raise UsageError("--init-head continues an EAGLE-1/2 head; EAGLE-3 training starts from a fresh head")
        from eaglechat.train.trainer import load_init_head

        load_init_head(Path(cfg.init_head), model)
    summary: dict = {"base": str(base_dir), "device": device}

    # (a) prompts
    prompts_path = work / "prompts.json"
    if not prompts_path.exists():
        from eaglechat.train.data import sharegpt_prompts

        prompts = sharegpt_prompts(cfg.skip_prompts + cfg.prompts, seed=cfg.seed)[cfg.skip_prompts:]
        store.atomic_write_text(prompts_path, json.dumps(prompts) + "\n")
    prompts = json.loads(prompts_path.read_text())

    # (b) self-distillation
    if not store.is_done(work, "distill") and not prompts:
        store.mark_done(work, "distill", {"replies": 0, "skipped": "--prompts 0"})
    if not store.is_done(work, "distill"):
        from eaglechat.train.distill import DistillConfig, run_distill

        t0 = time.time()
        # EAGLE-1/2 training reads stored features: capture them during generation (EAGLE-3 trains online)
        dcfg = DistillConfig(max_new_tokens=cfg.max_new_tokens, batch_size=cfg.gen_batch_size,
                             keep_features=cfg.head_kind != "eagle3")
        deadline = t0 + cfg.distill_minutes * 60 if cfg.distill_minutes > 0 else None
        done = run_distill(model, tok, prompts, work / "distill", dcfg, deadline=deadline)
        info = _distill_stats(done)
        info["seconds_this_run"] = round(time.time() - t0, 1)
        store.mark_done(work, "distill", info)
    summary["distill"] = store.read_done(work, "distill")
    log(f"distill: {summary['distill']}")

    # (b2) dataset replies for more prompts, teacher-forced (cheap: no generation)
    if cfg.dataset_replies > 0 and not store.is_done(work, "replies"):
        from eaglechat.train.data import sharegpt_pairs
        from eaglechat.train.replies import run_replies

        used = set(prompts)
        pairs = [pr for pr in sharegpt_pairs(cfg.skip_prompts + len(prompts) + cfg.dataset_replies, seed=cfg.seed)
                 if pr[0] not in used][cfg.skip_prompts:]
        done = run_replies(tok, pairs[:cfg.dataset_replies], work / "replies", cfg.max_new_tokens)
        store.mark_done(work, "replies", _distill_stats(done))
    if store.is_done(work, "replies"):
        summary["replies"] = store.read_done(work, "replies")
        log(f"replies: {summary['replies']}")

    if cfg.head_kind == "eagle3":
        # (c+d) EAGLE-3 trains online: the frozen base gives fused features per batch, nothing stored
        if not store.is_done(work, "train-eagle3"):
            store.mark_done(work, "train-eagle3", _train_eagle3(cfg, model, work, out, log))
        summary["train"] = store.read_done(work, "train-eagle3")
    else:
        summary.update(_features_and_train(cfg, model, work, out, log))
    log(f"train: {summary['train']}")

    # (f) tau on held-out prompts
    if cfg.eval_prompts > 0 and not store.is_done(work, "eval"):
        from eaglechat.train.evaluate import evaluate

        info = evaluate(model, tok, out, work / "eval", n_prompts=cfg.eval_prompts)
        store.mark_done(work, "eval", info)
    summary["eval"] = store.read_done(work, "eval")
    log(f"eval: {summary['eval']}")
    store.atomic_write_text(out / "training_summary.json", json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def _features_and_train(cfg: TrainConfig, model, work: Path, out: Path, log) -> dict:
    """(c) teacher-forced features, then (d) EAGLE-1/2 training with an export after every epoch."""
    summary: dict = {}
    # (c) features
    if not store.is_done(work, "features"):
        from eaglechat.train.features import run_features

        t0 = time.time()
        sources = store.shards(work / "distill") + store.shards(work / "replies")
        deadline = t0 + cfg.features_minutes * 60 if cfg.features_minutes > 0 else None
        info = run_features(model, sources, work / "features", deadline=deadline)
        info["seconds_this_run"] = round(time.time() - t0, 1)
        store.mark_done(work, "features", info)
    summary["features"] = store.read_done(work, "features")
    log(f"features: {summary['features']}")

    # (d) training (+ (e) export after every epoch)
    from eaglechat.train.trainer import TrainerConfig, train

    tcfg = TrainerConfig(epochs=cfg.epochs, lr=cfg.lr, batch_size=cfg.batch_size, seed=cfg.seed,
                         max_minutes=cfg.train_minutes, export_dtype=cfg.export_dtype, draft_vocab=cfg.draft_vocab,
                         init_head=cfg.init_head, ttt_steps=cfg.ttt_steps or 1)
    if not store.is_done(work, "train"):
        info = train(model, store.shards(work / "features"), work / "train", out, tcfg)
        store.mark_done(work, "train", info)
    summary["train"] = store.read_done(work, "train")
    return summary


def _train_eagle3(cfg: TrainConfig, model, work: Path, out: Path, log) -> dict:
    """EAGLE-3 head on the distilled (and dataset) replies, reduced draft vocabulary when asked."""
    import copy

    from eaglechat.engine.heads import save_head
    from eaglechat.engine.local import stop_token_ids
    from eaglechat.fit import hardware
    from eaglechat.train.eagle3 import Eagle3TrainConfig, sequences_from_work, train_eagle3
    from eaglechat.train.vocab import pick_draft_vocab

    seqs = sequences_from_work(work)
    if len(seqs) < 2:
        raise UsageError(f"work folder {work} has fewer than 2 usable replies to train on")
    info: dict = {"head_kind": "eagle3", "sequences": len(seqs)}
    draft_ids = None
    if cfg.draft_vocab > 0:
        vocab = pick_draft_vocab((s[n:] for s, n in seqs), model.get_input_embeddings().weight.shape[0],
                                 cfg.draft_vocab, stop_token_ids(None, model))
        draft_ids = vocab["ids"]
        info |= {"draft_vocab_size": vocab["draft_vocab_size"], "coverage": round(vocab["coverage"], 4)}
        log(f"train: draft vocabulary {len(draft_ids)} tokens, {info['coverage']:.2%} of reply tokens")
    t0 = time.time()
    e3 = Eagle3TrainConfig(ttt_steps=cfg.ttt_steps or Eagle3TrainConfig.ttt_steps, lr=cfg.lr, batch_size=cfg.batch_size, epochs=cfg.epochs, seed=cfg.seed,
                           max_minutes=cfg.train_minutes)
    head, history = train_eagle3(model, seqs, e3, draft_ids=draft_ids, log=log,
                                 ckpt=work / "train-eagle3" / "ckpt.pt")
    save_head(copy.deepcopy(head).to(hardware.torch_dtype(cfg.export_dtype)), out)
    last = history[-1] if history else {}
    info |= {"steps": len(history), "minutes": round((time.time() - t0) / 60, 1),
             "final": {"loss": round(last.get("loss", float("nan")), 4), "acc": [round(a, 3) for a in last.get("acc", [])]},
             "config": asdict(e3)}
    return info


def _distill_stats(paths: list[Path]) -> dict:
    n = tokens = looped = capped = 0
    for p in paths:
        for row in store.load(p):
            n += 1
            tokens += len(row["reply_ids"])
            looped += bool(row["looped"])
            capped += row["finished"] == "length"
    return {"shards": len(paths), "replies": n, "reply_tokens": tokens, "looped": looped, "hit_cap": capped}
