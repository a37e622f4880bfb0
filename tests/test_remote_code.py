"""A model folder that brings its own Python code (config.json `auto_map` to modeling_x.py) never gets it
run, and transformers' "Do you wish to run the custom code? [y/N]" never appears: every verb that reads
a folder, with stdin closed, as a script or a pipe would run it. Pickled weights that hold code are
refused and called what they are."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _code(marker: Path) -> str:
    return f"from pathlib import Path\nPath({str(marker)!r}).write_text(__name__)\n"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tiny_models import save_tiny_pair

    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


def _with_code(src: Path, dst: Path, marker: Path, model_type: str) -> Path:
    """A copy of a base folder whose config and tokenizer point at the folder's own code."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["model_type"] = model_type
    cfg["auto_map"] = {"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XModel"}
    (dst / "config.json").write_text(json.dumps(cfg))
    (dst / "configuration_x.py").write_text(
        _code(marker) + f"from transformers import LlamaConfig\nclass XConfig(LlamaConfig):\n    model_type = {model_type!r}\n")
    (dst / "modeling_x.py").write_text(_code(marker) + "from transformers import LlamaForCausalLM as XModel\n")
    tok = json.loads((dst / "tokenizer_config.json").read_text())
    tok["auto_map"] = {"AutoTokenizer": ["tokenization_x.XTokenizer", None]}
    (dst / "tokenizer_config.json").write_text(json.dumps(tok))
    (dst / "tokenization_x.py").write_text(_code(marker) + "from transformers import PreTrainedTokenizerFast as XTokenizer\n")
    return dst


def _eaglechat(*argv, home: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, EAGLECHAT_HOME=str(home), PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "eaglechat", *map(str, argv)], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)


def _verbs(base: Path, head: Path):
    return {
        "run": ["run", base, "--head", head, "Hello", "--max-new-tokens", "4"],
        "plan": ["plan", base],
        "show": ["show", base],
        "train": ["train", base, "--prompts", "2", "--max-new-tokens", "4", "--epochs", "1"],
    }


@pytest.mark.parametrize("verb", ["run", "plan", "show", "train"])
def test_unknown_model_type_with_its_own_code_is_refused_without_a_prompt(pair, tmp_path, verb):
    base, head = pair
    marker = tmp_path / "CODE-RAN"
    evil = _with_code(base, tmp_path / "evil", marker, "evil-llama")
    got = _eaglechat(*_verbs(evil, head)[verb], home=tmp_path / "home")
    assert not marker.exists(), "the folder's code ran"
    assert "Do you wish to run the custom code" not in got.stdout + got.stderr
    assert "Traceback" not in got.stderr
    assert got.returncode != 0
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eaglechat: error: "), got.stderr
    if verb != "show":  # show knows catalog names only, and says so
        assert "never runs code from a model folder" in lines[0]


def test_known_model_type_with_an_auto_map_loads_the_builtin_code_only(pair, tmp_path):
    base, head = pair
    marker = tmp_path / "CODE-RAN"
    folder = _with_code(base, tmp_path / "llama-with-code", marker, "llama")
    got = _eaglechat("run", folder, "--head", head, "Hello", "--max-new-tokens", "4", home=tmp_path / "home")
    assert got.returncode == 0, got.stderr
    assert not marker.exists()
    assert "Do you wish to run the custom code" not in got.stdout + got.stderr


def test_a_pickle_that_holds_code_is_refused_as_code_not_as_corruption(pair, tmp_path):
    base, head = pair
    marker = tmp_path / "PICKLE-RAN"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    folder = tmp_path / "head-pickle"
    folder.mkdir()
    shutil.copy(head / "config.json", folder / "config.json")
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"fc.weight": Payload()}, protocol=2))  # torch.save's
    got = _eaglechat("run", base, "--head", folder, "Hello", "--max-new-tokens", "4", home=tmp_path / "home")
    assert not marker.exists()
    assert got.returncode != 0 and "Traceback" not in got.stderr
    line = got.stderr.strip().splitlines()[-1]
    assert "hold code, not weights (it calls posix.system)" in line and "corrupt" not in line, line
