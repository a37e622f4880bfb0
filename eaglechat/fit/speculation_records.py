"""Speculation records: what this machine measured of plain decoding against draft trees, per (device,
model, quantization), so that `speculate="auto"` (engine/autospec.py) starts a fresh chat from it.

A record lives beside the tuned records (paths.tuned_profiles_dir()/speculation/KEY.json, KEY as
`tuned_key`); `eaglechat tune` writes it from its measurements (bench/tune.py `speculation_arms`). Its
`arms` map an arm's name (a tree's label, '12/3/4') to

    tokens_per_step   tokens a step of that tree emits on average (plain decoding: 1)
    cost              the step's time over a plain step's on this machine

A missing or unreadable record is no record (the chooser then probes at once); `save` sets an
unreadable file aside (NAME.unreadable-DATE) before writing, never over it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from eaglechat.fit.profiles import tuned_key
from eaglechat.userfiles import UnreadableFile, read_json, write_json_keeping


class RecordError(ValueError):
    """A speculation record that cannot be used: one line, naming the file and what is wrong."""


def record_path(device, model: str, quant: str, directory: Path | None = None) -> Path:
    if directory is None:
        from eaglechat import paths

        directory = paths.tuned_profiles_dir() / "speculation"
    return Path(directory) / f"{tuned_key(device, model, quant)}.json"


def check_arms(arms: Any, where: str) -> dict[str, dict]:
    """`arms` as a record holds them; RecordError naming the first bad entry."""
    if not isinstance(arms, dict):
        raise RecordError(f"{where}: 'arms' must be a mapping of tree labels")
    for name, entry in arms.items():
        if not isinstance(entry, dict):
            raise RecordError(f"{where}: arms.{name} must be a mapping")
        for field in ("tokens_per_step", "cost"):
            value = entry.get(field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise RecordError(f"{where}: arms.{name}.{field} must be a positive number")
    return arms


def read(path: Path) -> dict:
    """The record at `path`; RecordError (one line) when it cannot be used."""
    try:
        record = read_json(path)
    except (UnreadableFile, OSError) as exc:
        raise RecordError(str(exc)) from None
    if not isinstance(record, dict) or "arms" not in record:
        raise RecordError(f"{path}: expected a speculation record (a mapping with 'arms')")
    check_arms(record["arms"], str(path))
    return record


def load(device, model: str, quant: str, directory: Path | None = None) -> dict[str, dict]:
    """The record's arms for this machine and model ({} when there is none or it cannot be used: a
    measurement to start from, never a reason to fail)."""
    path = record_path(device, model, quant, directory)
    if not path.is_file():
        return {}
    try:
        return read(path)["arms"]
    except RecordError:
        return {}


def save(device, model: str, quant: str, arms: dict[str, dict], directory: Path | None = None,
         *, notice=None, **extra) -> Path:
    """Write the record (`extra`: what else to keep with it, e.g. the load it was measured under); a file
    there that cannot be read is renamed aside first and `notice` told where it went."""
    check_arms(arms, "speculation record")
    body = {"device": device.name, "device_key": device.key, "model": model, "quant": quant, **extra, "arms": arms}
    return write_json_keeping(record_path(device, model, quant, directory), body, read, RecordError, notice)
