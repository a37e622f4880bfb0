"""`eaglechat bench --startup`: the phases of fresh `eaglechat run` processes (what scripts/startup_phases.py
measured before it became a bench mode)."""

from __future__ import annotations

import subprocess
import sys

from eaglechat.bench import startup
from eaglechat.commands.bench import startup_argv


def eaglechat(*args: str, home) -> subprocess.CompletedProcess:
    env = startup.child_env() | {"EAGLECHAT_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "eaglechat", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_help_names_the_startup_mode(tmp_path):
    r = eaglechat("bench", "--help", home=tmp_path)
    assert r.returncode == 0, r.stderr
    for flag in ("--startup", "--rounds", "--importtime"):
        assert flag in r.stdout


def test_the_timed_run_carries_the_load_flags():
    from eaglechat.cli import build_parser

    args = build_parser().parse_args(["bench", "--startup", "tiny", "--device", "cpu", "--quant", "none",
                                      "--max-context", "512"])
    argv = startup_argv(args)
    assert argv[:5] == ["run", "tiny", "Hi", "--max-new-tokens", "8"]
    assert argv[argv.index("--device") + 1] == "cpu" and argv[argv.index("--quant") + 1] == "none"
    assert argv[argv.index("--max-context") + 1] == "512" and "--dtype" not in argv and "--head" not in argv


def test_phases_medians_and_report():
    out = 'Hello\nPHASES [["python started", 0.0], ["ready", 2.5], ["first text", 3.0]]\n'
    assert startup.parse_phases(out) == [("python started", 0.0), ("ready", 2.5), ("first text", 3.0)]
    assert startup.parse_phases("no marks\n") is None
    rounds = [{"ready": 2.0, "first reply byte (parent clock)": None}, {"ready": 4.0, "first reply byte (parent clock)": 5.0},
              {"ready": 3.0, "first reply byte (parent clock)": 6.0}]
    phases = startup.medians(rounds)
    assert phases["ready"] == {"median_s": 3.0, "rounds_s": [2.0, 4.0, 3.0]}
    assert phases["first reply byte (parent clock)"]["median_s"] == 5.5  # a round without a byte is left out
    doc = {"phases": phases, "imports": [{"cumulative_s": 1.25, "module": "torch"}]}
    text = startup.render(doc)
    assert "   3.00 s  ready  (2.00, 4.00, 3.00)" in text and "   1.25 s  torch" in text


def test_importtime_keeps_top_level_imports_heaviest_first():
    stderr = "\n".join([
        "import time: self [us] | cumulative | imported package",
        "import time:       100 |        100 |   _nested",
        "import time:       300 |       1300 | torch_like",
        "import time:        50 |        900 | transformers_like",
        "some other line",
    ])
    assert startup.parse_importtime(stderr) == [(1300, "torch_like"), (900, "transformers_like")]


def test_a_failing_run_is_one_line_and_a_nonzero_exit(tmp_path):
    r = eaglechat("bench", "--startup", "nosuch-model", "--rounds", "1", "--json", str(tmp_path / "s.json"),
                  home=tmp_path)
    assert r.returncode == 2
    errors = [line for line in r.stderr.splitlines() if line.startswith("eaglechat:")]
    assert errors == [errors[0]] and "unknown model 'nosuch-model'" in errors[0], r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "s.json").exists()


def test_the_child_marks_a_real_eaglechat_process(tmp_path):
    """The marks come back from a real `eaglechat` process through the child's atexit report (`eaglechat
    list`: no model is loaded, so this stays fast)."""
    marks = subprocess.run([sys.executable, "-c", startup.CHILD, "list"], capture_output=True, text=True,
                           env=startup.child_env() | {"EAGLECHAT_HOME": str(tmp_path)}, timeout=120)
    assert marks.returncode == 0, marks.stderr
    names = [name for name, _ in startup.parse_phases(marks.stdout)]
    assert names[:2] == ["python started", "eaglechat.cli imported"] and names[-1] == "reply done"


def test_the_timed_child_runs_this_eaglechat_not_one_in_the_working_folder(tmp_path, monkeypatch):
    """Run from inside another checkout, `python -m eaglechat` would import that checkout's package; the
    child must time the code the parent runs."""
    decoy = tmp_path / "eaglechat"
    decoy.mkdir()
    (decoy / "__init__.py").write_text(f"open({str(tmp_path / 'decoy-imported')!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))
    startup.importtime(["list"])
    assert not (tmp_path / "decoy-imported").exists()
