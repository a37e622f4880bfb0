"""`eaglechat bench --startup MODEL`: where `eaglechat run` spends its start, phase by phase.

Each round starts a fresh interpreter that runs `eaglechat run MODEL "Hi" --max-new-tokens 8` through
eaglechat.cli.main with timestamps taken at each progress report and at the first streamed text; the
parent measures the first byte of the reply on the pipe and the whole process (interpreter start and exit
included, as `eaglechat run` in a shell: the reply comes back through the program's own exit), and the
child's CPU seconds. The report is the median of each phase over the rounds. `--importtime` adds the
heaviest top-level imports of one run (python -X importtime). Uses whatever EAGLECHAT_HOME is set (a
fresh one measures a cold start, conversion included).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from eaglechat.errors import UsageError

# The child: eaglechat.cli.main with marks at each progress report, the first text and the process's end
# (an atexit handler: eaglechat may end the process without returning from main()).
CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
marks = [("python started", 0.0)]
def mark(name):
    marks.append((name, time.perf_counter() - t0))
import eaglechat.cli as cli
mark("eaglechat.cli imported")
import eaglechat.commands.run as run_cmd
def printer(verbose, stream):
    def progress(phase, fraction=None):
        mark(phase.split(" (")[0])
    return progress
run_cmd.progress_printer = printer
out = sys.stdout
class Tee:
    first = True
    def write(self, text):
        if self.first and text.strip():
            mark("first text"); Tee.first = False
        return out.write(text)
    def flush(self):
        out.flush()
    def isatty(self):
        return False
sys.stdout = Tee()
def report():
    mark("reply done")
    out.write("\nPHASES " + json.dumps(marks) + "\n")
    out.flush()
import atexit
atexit.register(report)
sys.argv = ["eaglechat", *sys.argv[1:]]
sys.exit(cli.main())
"""
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the child imports this copy of eaglechat


# `python -c` and `-m` put the working folder first on sys.path: run from inside another checkout, the child
# would time that checkout's eaglechat. -P (Python 3.11) leaves it out, so PYTHONPATH names the code timed.
SAFE_PATH = ("-P",)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_ROOT, env.get("PYTHONPATH")]))
    return env


def parse_phases(stdout: str) -> list[tuple[str, float]] | None:
    """The child's marks, from its PHASES line (None when the run ended without one)."""
    line = next((ln for ln in stdout.splitlines() if ln.startswith("PHASES ")), None)
    return None if line is None else [(name, at) for name, at in json.loads(line.removeprefix("PHASES "))]


def one_round(argv: list[str]) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *SAFE_PATH, "-c", CHILD, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=child_env())
    first_byte = None
    out = b""
    while chunk := proc.stdout.read1(4096):
        if first_byte is None and chunk.strip():
            first_byte = time.perf_counter() - start
        out += chunk
    err = proc.stderr.read().decode(errors="replace")
    proc.wait()
    total = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    marks = parse_phases(out.decode(errors="replace"))
    if marks is None or proc.returncode != 0:
        last = err.strip().splitlines()[-1].removeprefix("eaglechat: error: ") if err.strip() else f"exit status {proc.returncode}"
        raise UsageError(f"the timed `eaglechat {' '.join(argv)}` failed: {last}")
    phases = dict(marks)
    phases["first reply byte (parent clock)"] = first_byte
    phases["process exited (parent clock)"] = total
    phases["CPU time, user + sys"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return phases


def parse_importtime(stderr: str, top: int = 15) -> list[tuple[int, str]]:
    """The heaviest top-level imports (cumulative microseconds, name) of `python -X importtime` output."""
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or line.count("|") != 2:
            continue
        _, cumulative, name = line.split("|")
        if not cumulative.strip().isdigit() or not name.startswith(" ") or name.startswith("  "):
            continue  # the header, or a nested import
        rows.append((int(cumulative), name.strip()))
    return sorted(rows, reverse=True)[:top]


def importtime(argv: list[str], top: int = 15) -> list[tuple[int, str]]:
    done = subprocess.run([sys.executable, *SAFE_PATH, "-X", "importtime", "-m", "eaglechat", *argv], capture_output=True,
                          text=True, env=child_env())
    return parse_importtime(done.stderr, top)


def medians(rounds: list[dict[str, float | None]]) -> dict[str, dict]:
    """Per phase (in the first round's order) the median over the rounds and every round's value."""
    out = {}
    for name in rounds[0]:
        values = [r[name] for r in rounds if r.get(name) is not None]
        if values:
            out[name] = {"median_s": statistics.median(values), "rounds_s": values}
    return out


def render(doc: dict) -> str:
    """One line per phase: the median, then each round's value (seconds)."""
    lines = [f"{v['median_s']:7.2f} s  {name}  ({', '.join(f'{x:.2f}' for x in v['rounds_s'])})"
             for name, v in doc["phases"].items()]
    if "imports" in doc:
        lines.append("heaviest top-level imports (cumulative):")
        lines += [f"{row['cumulative_s']:7.2f} s  {row['module']}" for row in doc["imports"]]
    return "\n".join(lines)


def run_startup(argv: list[str], rounds: int, with_imports: bool, tick=lambda label: None) -> dict:
    """Time `rounds` fresh `eaglechat ARGV` processes (and, if asked, one under -X importtime)."""
    measured = []
    for i in range(rounds):
        tick(f"round {i + 1}/{rounds}")
        measured.append(one_round(argv))
    doc = {"command": ["eaglechat", *argv], "rounds": rounds, "phases": medians(measured)}
    if with_imports:
        tick("importtime")
        doc["imports"] = [{"cumulative_s": micros / 1e6, "module": name} for micros, name in importtime(argv)]
    return doc
