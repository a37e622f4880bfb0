"""Ships the repository's top-level models/ (catalog manifests + the embedded default head) inside
the wheel as eaglechat/_models, where eaglechat.paths.models_dir() looks first. Everything else about
the build is in pyproject.toml. An editable install skips the copy: it reads models/ in place."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

MODELS = Path(__file__).resolve().parent / "models"


class BuildPyWithModels(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return
        if not (MODELS / "smollm2-135m-eagle2" / "model.safetensors").is_file():
            raise SystemExit(f"{MODELS} is missing the embedded default head: build from a full checkout")
        target = Path(self.build_lib) / "eaglechat" / "_models"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(MODELS, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildPyWithModels})
