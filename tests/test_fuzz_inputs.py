"""Property tests (hypothesis) over what a user hands eaglechat: command-line flags, profile YAML files,
head and base config.json files. Whatever the input, the outcome is a clean success or an
EaglechatError: one line on stderr, a non-zero exit, never a traceback. Bounded: few examples, no
deadline (the first example of a run pays for the imports)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglechat import cli, paths
from eaglechat.errors import EaglechatError

REPO = Path(__file__).resolve().parent.parent
# derandomized: the same examples every run, so CI is stable (drop derandomize locally to explore further)
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
NOWHERE = "/nonexistent/eaglechat-fuzz-model"


def assert_clean(code: int, err: str) -> None:
    """Success, or exactly one `eaglechat: error:` line and a non-zero exit."""
    assert "Traceback" not in err, err
    if code == 0:
        return
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eaglechat: error: "), err


# ------------------------------------------------------------------------------------------ value pools

WEIRD_TEXT = ["nan", "NaN", "inf", "-inf", "1e309", "-0", "0", "-1", "-5", "10000", "99999999999999999999",
              "0x10", "1_000", "", " ", "abc", "½", "١٢", "--", "-", "1.5", "true", "None", "\u202e5"]
flag_values = st.one_of(
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(WEIRD_TEXT),
    st.text(max_size=6),
)
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
)
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=6)


# --------------------------------------------------------------------------------------------- CLI flags


def _options(verb: str) -> list[str]:
    """The value-taking flags of a verb, read from its real parser (the shared vocabulary included)."""
    import argparse

    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[verb]
    return sorted(opt for action in parser._actions if action.nargs is None and action.option_strings
                  for opt in action.option_strings if opt.startswith("--"))


VERBS = {"run": [NOWHERE, "Hello"], "plan": [NOWHERE], "bench": [NOWHERE], "tune": [NOWHERE], "train": [NOWHERE]}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_any_flag_value_is_a_clean_outcome(verb, capsys):
    options = _options(verb)

    @FUZZ
    @given(st.lists(st.tuples(st.sampled_from(options), flag_values), min_size=1, max_size=3))
    def check(pairs):
        argv = [verb, *VERBS[verb]]
        for flag, value in pairs:
            argv += [flag, value] if not value.startswith("-") else [f"{flag}={value}"]
        capsys.readouterr()
        code = cli.main(argv)
        _, err = capsys.readouterr()
        assert code != 0  # the model does not exist: nothing may succeed, whatever the flags
        assert_clean(code, err)

    check()


# A few through the real entry point, on a real (tiny) model, where a value only shows its effect
# after loading (the tree budget against the candidate pool) or before argparse sees it (bytes).
SUBPROCESS_CASES = [
    ["--temperature", "nan"], ["--temperature", "inf"], ["--max-context", "-5"], ["--depth", "100"],
    ["--total-tokens", "10000"], ["--top-p", "0"], ["--draft-top-k", "0"], ["--max-new-tokens", "0"],
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tiny_models import save_tiny_pair

    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


def _subprocess(argv, home: Path, stdin: bytes = b"") -> subprocess.CompletedProcess:
    env = dict(os.environ, EAGLECHAT_HOME=str(home), PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "eaglechat", *argv], env=env, input=stdin,
                          capture_output=True, timeout=300)


@pytest.mark.parametrize("flags", SUBPROCESS_CASES, ids=[" ".join(f) for f in SUBPROCESS_CASES])
def test_out_of_range_flags_through_the_entry_point(pair, tmp_path, flags):
    base, head = pair
    got = _subprocess(["run", str(base), "--head", str(head), "Hello", "--max-new-tokens", "4", *flags], tmp_path)
    err = got.stderr.decode("utf-8", "replace")
    assert got.returncode != 0
    assert_clean(got.returncode, err)


def test_invalid_utf8_in_argv_and_on_stdin(pair, tmp_path):
    base, head = pair
    bad = os.fsdecode(b"caf\xe9")  # what Python makes of a Latin-1 byte in argv
    got = _subprocess(["run", str(base), "--head", str(head), bad, "--max-new-tokens", "4"], tmp_path)
    assert got.returncode != 0
    assert_clean(got.returncode, got.stderr.decode("utf-8", "replace"))
    got = _subprocess(["run", str(base), "--head", str(head), "-", "--max-new-tokens", "4"], tmp_path, stdin=b"caf\xe9\n")
    assert_clean(got.returncode, got.stderr.decode("utf-8", "replace"))


# ----------------------------------------------------------------------------------------- profiles


PROFILE_KEYS = ["priority", "reserve_gib", "dtype", "double_quant", "models", "tree", "tree_by_capability",
                "large_vocab", "speculate", "memory", "calibrate", "draft_vocab", "match", "description"]


@FUZZ
@given(st.dictionaries(st.sampled_from(PROFILE_KEYS), json_values, max_size=4))
def test_any_user_profile_is_a_clean_outcome(capsys, raw):
    path = paths.user_profiles_dir() / "fuzz.yaml"
    path.write_text(yaml.safe_dump({"name": "cpu", **raw}, allow_unicode=True))
    capsys.readouterr()
    code = cli.main(["plan", "smollm2-135m-eagle2", "--json"])
    _, err = capsys.readouterr()
    assert_clean(code, err)
    if code:
        assert str(path) in err


@FUZZ
@given(st.text(max_size=60))
def test_any_profile_text_is_a_clean_outcome(capsys, text):
    (paths.user_profiles_dir() / "fuzz.yaml").write_text(text, encoding="utf-8", errors="surrogatepass")
    capsys.readouterr()
    code = cli.main(["show", "smollm2-135m-eagle2", "--profile", "--json"])
    _, err = capsys.readouterr()
    assert_clean(code, err)


# ------------------------------------------------------------------------------------ config.json files


@pytest.fixture(scope="module")
def tiny_base(pair):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(pair[0])


HEAD_KEYS = ["hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
             "rms_norm_eps", "rope_theta", "rope_scaling", "bias", "qkv_bias", "head_dim", "draft_vocab_size"]


@FUZZ
@given(st.one_of(json_values, st.dictionaries(st.sampled_from(HEAD_KEYS), json_values, max_size=3)))
def test_any_head_config_is_a_clean_outcome(pair, tiny_base, tmp_path_factory, changes):
    import shutil

    from eaglechat.engine.heads import load_head

    folder = tmp_path_factory.mktemp("head")
    shutil.rmtree(folder)
    shutil.copytree(pair[1], folder)
    if isinstance(changes, dict) and set(changes) <= set(HEAD_KEYS):
        cfg = json.loads((folder / "config.json").read_text())
        cfg.update(changes)
    else:
        cfg = changes  # not even an object
    (folder / "config.json").write_text(json.dumps(cfg, allow_nan=True))
    try:
        load_head(folder, tiny_base)
    except EaglechatError as exc:
        assert "\n" not in str(exc) and str(exc)


BASE_KEYS = ["model_type", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
             "num_hidden_layers", "vocab_size", "max_position_embeddings", "head_dim", "auto_map"]


@FUZZ
@given(st.dictionaries(st.sampled_from(BASE_KEYS), json_values, max_size=3))
def test_any_base_config_is_a_clean_outcome(pair, tmp_path_factory, capsys, changes):
    import shutil

    folder = tmp_path_factory.mktemp("base")
    shutil.rmtree(folder)
    shutil.copytree(pair[0], folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg, allow_nan=True))
    capsys.readouterr()
    code = cli.main(["plan", str(folder), "--json"])
    _, err = capsys.readouterr()
    assert_clean(code, err)


def test_json_floats_are_what_hypothesis_makes():  # NaN/Infinity reach the checks as floats
    assert math.isnan(json.loads(json.dumps(float("nan"), allow_nan=True)))
