"""The training work folder: atomic shard files, stage markers, the run's config.

Layout of a work dir:
  config.json          the settings the data stages were made with (a resume must match them)
  prompts.json         the training prompts
  distill/shard-*.pt   self-distilled replies
  replies/shard-*.pt   ShareGPT's own replies to further prompts (teacher-forced, optional)
  features/*shard-*.pt teacher-forced base features
  train/ckpt.pt        trainer checkpoint (head + optimizer + step), for resume
  <stage>.done         stage markers
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch


def shard_name(i: int) -> str:
    return f"shard-{i:05d}.pt"


def atomic_save(obj, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def load(path: Path):
    return torch.load(path, map_location="cpu", weights_only=True)  # plain containers of tensors and numbers


def shards(folder: Path) -> list[Path]:
    """shard-N.pt files (and features' <source>-shard-N.pt) in a folder, sorted."""
    return sorted(Path(folder).glob("*shard-*.pt"))


def is_done(work: Path, stage: str) -> bool:
    return (Path(work) / f"{stage}.done").exists()


def mark_done(work: Path, stage: str, info: dict | None = None) -> None:
    atomic_write_text(Path(work) / f"{stage}.done", json.dumps(info or {}, indent=2) + "\n")


def read_done(work: Path, stage: str) -> dict:
    path = Path(work) / f"{stage}.done"
    return json.loads(path.read_text()) if path.exists() else {}
