"""Where `eaglechat run` spends its start: phases of one run in a fresh process, and the import tree.

    python scripts/startup_phases.py [--model smollm2-135m-eagle2] [--rounds 3] [--importtime]

Each round starts a fresh interpreter that runs `eaglechat run MODEL "Hi" --max-new-tokens 8` through
eaglechat.cli.main with timestamps taken at each progress report and at the first streamed text; the
parent measures the first byte of the reply on the pipe and the whole process (interpreter start and
exit included, as `eaglechat run` in a shell: the reply comes back through the program's own exit). Prints one line per phase with
the median over the rounds (seconds). --importtime also prints the heaviest top-level imports of one
run (python -X importtime). Uses whatever EAGLECHAT_HOME is set (a fresh one measures a cold start).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
marks = [("python started", 0.0)]
def mark(name):
    marks.append((name, time.perf_counter() - t0))
import eaglechat.cli as cli
mark("eaglechat.cli imported")
import eaglechat.commands.run as run_cmd
real_printer = run_cmd.progress_printer
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
def report():  # an atexit handler: eaglechat may end the process without returning from main()
    mark("reply done")
    out.write("\nPHASES " + json.dumps(marks) + "\n")
    out.flush()
import atexit
atexit.register(report)
sys.argv = ["eaglechat", *sys.argv[1:]]
sys.exit(cli.main())  # as the program: argv from sys.argv
"""


def one_round(argv: list[str]) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first_byte = None
    out = b""
    while chunk := proc.stdout.read1(4096):
        if first_byte is None and chunk.strip():
            first_byte = time.perf_counter() - start
        out += chunk
    err = proc.stderr.read()
    proc.wait()
    total = time.perf_counter() - start
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("PHASES ")), None)
    if line is None:
        raise SystemExit(f"the run failed: {done.stderr.strip()[-400:]}")
    marks = json.loads(line.removeprefix("PHASES "))
    phases = {name: at for name, at in marks}
    phases["first reply byte (parent clock)"] = first_byte
    phases["process exited (parent clock)"] = total
    phases["CPU time, user + sys"] = cpu
    return phases


def importtime(argv: list[str], top: int = 15) -> list[tuple[int, str]]:
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "eaglechat", *argv], capture_output=True, text=True)
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|")
        if not cumulative.strip().isdigit():
            continue
        if not name.startswith(" ") or name.startswith("  "):  # top-level imports only
            continue
        rows.append((int(cumulative), name.strip()))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2-135m-eagle2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--importtime", action="store_true")
    p.add_argument("extra", nargs="*", help="more `run` flags, after --")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    argv = ["run", args.model, "Hi", "--max-new-tokens", "8", *args.extra]
    rounds = [one_round(argv) for _ in range(args.rounds)]
    names = list(rounds[0])
    for name in names:
        values = [r[name] for r in rounds if name in r]
        print(f"{statistics.median(values):7.2f} s  {name}  ({', '.join(f'{v:.2f}' for v in values)})")
    if args.importtime:
        print("heaviest top-level imports (cumulative):")
        for micros, name in importtime(argv):
            print(f"{micros / 1e6:7.2f} s  {name}")


if __name__ == "__main__":
    main()
