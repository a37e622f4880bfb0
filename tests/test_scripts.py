"""The measurement programs in scripts/ still import and run after the package moves under them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def run(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", sorted(p.name for p in SCRIPTS.glob("*.py")))
def test_help(name):
    r = run(name, "--help")
    assert r.returncode == 0, r.stderr
    assert "usage" in r.stdout.lower() or "python scripts/" in r.stdout


def test_microbench_runs_on_a_small_cache():
    r = run("microbench.py", "--layers", "2", "--kv-heads", "2", "--head-dim", "16", "--context", "64",
            "--repeats", "2", "--threads", "1")
    assert r.returncode == 0, r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()[2:5]] == ["16/4/4", "32/5/8", "60/6/10"]


def test_evaluate_head_merges_a_split_evaluation(tmp_path):
    rows = {"a": [{"i": 0, "tau": 2.0, "forwards": 10, "looped": False}],
            "b": [{"i": 1, "tau": 4.0, "forwards": 30, "looped": True}, {"i": 0, "tau": 9.0, "forwards": 1, "looped": False}]}
    for folder, rs in rows.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    r = run("evaluate_head.py", "--merge", str(tmp_path / "a"), str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)  # prompt 0 from the first folder only
    assert summary["prompts"] == 2 and summary["tau"] == 3.5 and summary["tau_without_looping"] == 2.0


@pytest.mark.skipif("__import__('torch').cuda.is_available()", reason="on a GPU the check runs for minutes")
def test_gpu_check_without_a_gpu_prints_its_table(tmp_path):
    """The GPU check on a machine without CUDA: every section says so, the table and verdict.json are
    still written, and it exits 0 (a GPU run's table has the same rows)."""
    r = run("gpu_check.py", "--out", str(tmp_path), "--device", "cuda")
    assert r.returncode == 0, r.stderr
    table = r.stdout[r.stdout.index("==== eaglechat GPU check"):].splitlines()
    rows = {line.split()[0]: line for line in table[3:]}
    assert sorted(rows) == ["a", "b", "c", "d", "e", "f"]
    assert all("no CUDA device" in line and "SKIP" in line for line in rows.values()), table
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert verdict["rehearsal"] is False and "no CUDA device" in verdict["machine"]
    assert {s: v["status"] for s, v in verdict["sections"].items()} == dict.fromkeys("abcdef", "SKIP")
