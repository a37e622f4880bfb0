"""The measurement programs in scripts/ still import and run after the package moves under them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
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
    assert list(rows) == ["d", "e", "b", "c", "f", "a", "m"]
    assert all("no CUDA device" in line and "SKIP" in line for line in rows.values()), table
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert verdict["rehearsal"] is False and "no CUDA device" in verdict["machine"]
    assert {s: v["status"] for s, v in verdict["sections"].items()} == dict.fromkeys("abcdefm", "SKIP")


def test_gpu_check_keeps_what_a_section_measured_before_its_limit(tmp_path, monkeypatch):
    """A section that hangs past its limit is stopped, and what it recorded and printed is kept: the figures
    in measurements.jsonl, its output in its own log (streamed, not captured at the end)."""
    import importlib.util
    import textwrap
    import types

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPTS / "gpu_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    hanging = tmp_path / "hanging_section.py"
    hanging.write_text(textwrap.dedent(f"""
        import json, sys, time
        out = sys.argv[sys.argv.index("--out") + 1]
        with open(out + "/{check.MEASUREMENTS}", "a") as f:
            f.write(json.dumps({{"section": "d", "what": "replay step ms", "value": 4.2}}) + "\\n")
        print("captured the plain step", flush=True)
        time.sleep(60)
    """))
    monkeypatch.setattr(check, "__file__", str(hanging))
    args = types.SimpleNamespace(device="cuda", rehearse=False)
    started = time.monotonic()
    result = check.run_section(args, "d", 3, tmp_path)
    assert time.monotonic() - started < 15
    assert result["status"] == "TIMEOUT" and "1 figures kept, the last: replay step ms 4.2" in result["summary"]
    assert "captured the plain step" in (tmp_path / "d.log").read_text()


@pytest.mark.slow  # a minute on a busy CPU: the captured-steps section on a tiny model, graphs stood in for
def test_gpu_check_rehearses_the_captured_steps_section_on_a_cpu(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPTS / "gpu_check.py"), "--rehearse", "--only", "d", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr
    figures = [json.loads(line) for line in (tmp_path / "measurements.jsonl").read_text().splitlines()]
    whats = {f["what"] for f in figures if f["section"] == "d"}
    assert {"capture s", "replay step ms", "eager step ms", "tokens identical", "result"} <= whats
    result = [f for f in figures if f["what"] == "result"][-1]
    assert result["status"] == "PASS" and "tokens identical 3/3" in result["summary"], result
    assert "[d] replay step ms" in (tmp_path / "d.log").read_text()
