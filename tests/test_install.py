"""`make` installs the torch build that fits the machine and says which (scripts/install_torch.sh): the CUDA build
where an NVIDIA driver answers, else the CPU wheel (never PyPI's multi-GB CUDA build on a CPU-only box); the
Makefile's setup says what each step does instead of echoing commands."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "install_torch.sh"


def choose(tmp_path: Path, *, gpu: str | None, **env) -> subprocess.CompletedProcess:
    """The script's choice (DRY_RUN), with an `nvidia-smi` on PATH that lists `gpu` (None: no driver answers)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{gpu}'\n" if gpu else "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    smi.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if k != "TORCH"}
    return subprocess.run(["sh", str(SCRIPT)], env={**base, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DRY_RUN": "1",
                                                   "PIP": "PIP", **env}, capture_output=True, text=True, timeout=30)


@pytest.mark.skipif(os.uname().sysname == "Darwin", reason="macOS takes PyPI's wheel either way")
def test_no_nvidia_driver_installs_the_cpu_wheel_and_says_so(tmp_path):
    got = choose(tmp_path, gpu=None)
    assert got.returncode == 0, got.stderr
    said, *commands = got.stdout.splitlines()
    assert said == ("eaglechat setup: torch 2.13.0, cpu build (no NVIDIA driver answered; make TORCH=cuda to "
                    "choose the CUDA build)")
    assert commands == ["PIP install -q --progress-bar off torch==2.13.0+cpu",
                        "PIP install -q --progress-bar off torch==2.13.0+cpu --extra-index-url "
                        "https://download.pytorch.org/whl/cpu"]


def test_an_answering_nvidia_driver_installs_the_cuda_build_and_names_the_gpu(tmp_path):
    got = choose(tmp_path, gpu="GPU 0: NVIDIA H200 (UUID: GPU-0b1c)")
    assert got.stdout.splitlines() == ["eaglechat setup: torch 2.13.0, cuda build (nvidia-smi: GPU 0: NVIDIA H200)",
                                       "PIP install -q --progress-bar off torch==2.13.0"]


def test_torch_chooses_and_a_wrong_choice_is_one_line(tmp_path):
    got = choose(tmp_path, gpu="GPU 0: NVIDIA H200 (UUID: GPU-0b1c)", TORCH="cpu", TORCH_VERSION="2.14.0")
    assert got.stdout.splitlines()[0] == "eaglechat setup: torch 2.14.0, cpu build (TORCH=cpu)"
    got = choose(tmp_path, gpu=None, TORCH="gpu")
    assert got.returncode == 2 and got.stderr == "eaglechat setup: TORCH must be cpu or cuda, got 'gpu'\n"


def test_setup_says_each_step_and_echoes_no_command():
    """Every recipe line of the setup target is silent (@) but the progress lines."""
    text = (REPO / "Makefile").read_text()
    recipe = text[text.index("$(STAMP): pyproject.toml"):text.index(".PHONY")].splitlines()[1:]
    lines = [line.strip() for line in recipe if line.startswith("\t")]
    assert lines and all(line.startswith(("@", "$(SAY)")) for line in lines), lines
    assert [line for line in lines if line.startswith("$(SAY)")][:2] == [
        '$(SAY) "[1/5] a virtual environment in $(VENV) ($(PY))"', '$(SAY) "[2/5] torch"']
    assert "scripts/install_torch.sh" in text and all(" -q" in line for line in lines if "pip install" in line)
