"""Files the user writes by hand (settings.yaml, keys.yaml, profiles) and records eaglechat keeps
for them (tuned results): a file that cannot be read is reported in one line, with the line and
column where YAML or JSON gave up, and is never replaced by a write. Where a record must be written
anyway, the unreadable one is set aside under a new name first, so its bytes stay on disk.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

# libyaml's parser where PyYAML was built with it (PyPI's wheels are): the same documents and error positions,
# ~10x faster than the pure-Python one (`eaglechat list` reads the shipped profiles once per catalog model)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class UnreadableFile(ValueError):
    """`PATH line L, column C: problem` (one line)."""


def yaml_problem(exc: yaml.YAMLError) -> str:
    """`line 3, column 7: mapping values are not allowed here`: where PyYAML stopped, 1-based."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or str(exc).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}"


def read_yaml(path: Path):
    """The YAML document in `path` (None for an empty file); UnreadableFile names where it breaks.
    OSError (missing, unreadable) is left to the caller."""
    raw = Path(path).read_bytes()
    try:
        return yaml.load(raw.decode("utf-8"), Loader=_LOADER)
    except UnicodeDecodeError as exc:
        raise UnreadableFile(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise UnreadableFile(f"{path} {yaml_problem(exc)}") from None


def read_json(path: Path):
    raw = Path(path).read_bytes()
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise UnreadableFile(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise UnreadableFile(f"{path} line {exc.lineno}, column {exc.colno}: {exc.msg}") from None


def set_aside(path: Path) -> Path:
    """Rename `path` to `NAME.unreadable-YYYYmmdd-HHMMSS[-N]` beside it (never over another file)
    and return the new path."""
    path = Path(path)
    stem = f"{path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}"
    target, n = path.with_name(stem), 1
    while target.exists():
        target, n = path.with_name(f"{stem}-{n}"), n + 1
    path.rename(target)
    return target


def write_json_keeping(path: Path, body, read, unreadable: type[Exception] | tuple = UnreadableFile,
                       notice=None) -> Path:
    """Write `body` as JSON to `path` (through a temporary file, so a reader never sees half of it). A file
    already there that `read` cannot read (edited by hand, half written) is renamed aside first, never
    written over, and `notice` is told where it went."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file():
        try:
            read(path)
        except unreadable as exc:
            kept = set_aside(path)
            if notice is not None:
                notice(f"{exc}; kept as {kept}")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path
