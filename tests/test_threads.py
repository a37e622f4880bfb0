"""CPU thread settings chosen before torch loads: user variables win, busy or small machines get the
passive OpenMP wait policy and no more threads than the cores left free."""

from __future__ import annotations

import subprocess
import sys

from eaglechat.threads import choose


def test_small_or_loaded_machines_get_passive_waits_and_the_free_cores():
    assert choose({}, cores=2, load=0.1) == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "2"}
    assert choose({}, cores=2, load=1.2) == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    assert choose({}, cores=2, load=6.0) == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    # a large idle machine keeps OpenMP's default policy and every core
    assert choose({}, cores=16, load=0.2) == {"OMP_NUM_THREADS": "16"}
    assert choose({}, cores=16, load=9.0) == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "7"}
    assert choose({}, cores=16, load=None) == {"OMP_NUM_THREADS": "16"}  # no load average (Windows)


def test_user_settings_win_and_the_switch_turns_it_off():
    assert choose({"OMP_NUM_THREADS": "3"}, cores=2, load=0.0) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert choose({"OMP_WAIT_POLICY": "ACTIVE"}, cores=2, load=0.0) == {"OMP_NUM_THREADS": "2"}
    assert choose({"EAGLECHAT_AUTO_THREADS": "0"}, cores=2, load=3.0) == {}


def test_the_entry_point_applies_them_first(monkeypatch):
    import pytest

    from eaglechat import threads
    from eaglechat.cli import main

    calls = []
    monkeypatch.setattr(threads, "apply", lambda: calls.append(1))
    with pytest.raises(SystemExit):
        main(["--version"])
    assert calls == [1]


def test_torch_takes_the_chosen_thread_count(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "EAGLECHAT_HOME": str(tmp_path), "PYTHONPATH": ":".join(sys.path)}
    probe = ("import os, sys\n"
             "from eaglechat import cli, threads\n"
             "assert 'torch' not in sys.modules\n"
             "chosen = threads.apply()\n"
             "import torch\n"
             "print(os.environ.get('OMP_WAIT_POLICY'), os.environ['OMP_NUM_THREADS'], torch.get_num_threads())\n")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out[1] == out[2]  # torch took the chosen count
    user = subprocess.run([sys.executable, "-c", probe], env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, check=True).stdout.split()
    assert user[1:] == ["1", "1"]
