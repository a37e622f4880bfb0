"""The small things a newcomer meets in the first minutes: `list` without a column of dashes, `run --json` with a
real time to first token, the whole tokenizer error, and a base folder given as `--head` called what it is."""

from __future__ import annotations

import json
import shutil

import pytest

from eaglechat.cli import main


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tiny_models import save_tiny_pair

    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


def test_list_shows_no_id_column_before_anything_is_pulled(capsys):
    assert main(["list"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["NAME", "SIZE", "STATUS", "FORMAT", "MODIFIED"]
    assert not any(line.split()[1] == "—" for line in rows if line.split() and not line.startswith("("))


def test_run_json_reports_the_time_to_the_first_token(pair, capsys):
    base, head = pair
    assert main(["run", str(base), "Hello", "--head", str(head), "--max-new-tokens", "4", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    # measured around the engine: at least its prefill (the first token comes from it), never the old 0.0
    assert stats["ttft_s"] > 0 and stats["ttft_s"] >= stats["prefill_s"]


def test_a_tokenizer_that_cannot_load_is_told_whole(pair, tmp_path, capsys):
    base = tmp_path / "base"
    shutil.copytree(pair[0], base)
    (base / "tokenizer.json").unlink()  # only the tokenizer config is left: transformers lists what it tried
    assert main(["run", str(base), "Hello", "--max-new-tokens", "2"]) != 0
    err = capsys.readouterr().err
    assert err.startswith(f"eaglechat: error: cannot load the tokenizer in {base}: ") and err.count("\n") == 1
    assert "(1) a `tokenizers` library serialization file" in err  # it stopped at "... from one of:"


def test_a_base_folder_given_as_the_head_is_called_a_base_model(pair, capsys):
    base, _ = pair
    assert main(["run", str(base), "Hello", "--head", str(base), "--max-new-tokens", "2"]) != 0
    assert capsys.readouterr().err == (f"eaglechat: error: {base} is a base model (llama, 3 layers), not a draft head: "
                                       "give it as the model, and --head an EAGLE head folder (one decoder layer)\n")
