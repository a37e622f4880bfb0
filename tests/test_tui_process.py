"""The real chat process in a pseudo-terminal: ctrl+q, SIGTERM and SIGHUP mid-reply, while the engine is
stuck inside a step that ignores cancel, return the terminal (alternate screen left, mouse tracking
off, cooked mode back) at once and store the partial reply marked as stopped. Two chat processes on one
history: each sidebar follows the other's, and a conversation one deletes while the other writes to it
loses nothing."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from eaglechat.chat.store import Store

HERE = Path(__file__).parent
REPO = HERE.parent


def start(home: Path, *args: str):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.Popen([sys.executable, str(HERE / "chat_process.py"), str(home), *args], stdin=slave,
                            stdout=slave, stderr=slave, env=env, start_new_session=True)
    out = bytearray()

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            out.extend(data)

    threading.Thread(target=read, daemon=True).start()
    return proc, master, slave, out


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.parametrize("how", ["ctrl+q", "SIGTERM", "SIGHUP"])
def test_leaving_mid_reply_restores_the_terminal_and_keeps_the_reply(tmp_path, how):
    proc, master, slave, out = start(tmp_path)
    try:
        wait_for(lambda: b"fake-eagle" in out, 60, "the chat to start")
        time.sleep(0.5)
        os.write(master, b"hi\r")
        wait_for(lambda: (tmp_path / "stuck").exists(), 30, "the engine to get stuck")
        time.sleep(0.5)  # let the chat render what arrived
        before = termios.tcgetattr(slave)
        assert not before[3] & termios.ICANON  # the app had the terminal in raw mode
        sent = time.monotonic()
        if how == "ctrl+q":
            os.write(master, b"\x11")
        else:
            proc.send_signal(getattr(signal, how))
        code = proc.wait(timeout=20)  # the stuck step lasts 60 s: exiting now means it was not waited for
        print(f"{how}: exited {code} after {time.monotonic() - sent:.2f} s")
        time.sleep(0.2)
        output = bytes(out)
        assert b"\x1b[?1049l" in output  # alternate screen left
        assert b"\x1b[?1000l" in output  # mouse tracking off
        after = termios.tcgetattr(slave)
        assert after[3] & termios.ICANON and after[3] & termios.ECHO  # cooked mode back
        assert code == {"ctrl+q": 0, "SIGTERM": 128 + 15, "SIGHUP": 128 + 1}[how]
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
        os.close(slave)
    store = Store(tmp_path / "history.sqlite3")
    msgs = store.messages(store.conversations()[0].id)
    store.close()
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[1].content == "alpha beta gamma delta epsilon"
    assert msgs[1].stats["stop_reason"] == "cancelled"
    assert msgs[1].stats["interrupted"] == {"ctrl+q": "quit"}.get(how, how)


def report(home: Path, name: str) -> dict:
    try:
        return json.loads((home / f"{name}.json").read_text())
    except (OSError, ValueError):
        return {}


@pytest.mark.slow  # two app processes: ~8 s
def test_two_windows_on_one_history_follow_each_other_and_a_delete_loses_nothing(tmp_path):
    a, b = start(tmp_path, "a"), start(tmp_path, "b")
    try:
        for name in ("a", "b"):
            wait_for(lambda name=name: "fake-eagle ready on cpu" in " ".join(report(tmp_path, name).get("said", [])), 60,
                     f"window {name} to start")
        os.write(a[1], b"question from a\r")
        wait_for(lambda: (tmp_path / "a.paused").exists(), 30, "window a's reply to start")
        wait_for(lambda: report(tmp_path, "b").get("titles") == ["question from a"], 10,
                 "window b's sidebar to show a's conversation")
        # window b opens it (search) and deletes it while window a is still writing its reply
        os.write(b[1], b"\x06")
        wait_for(lambda: report(tmp_path, "b").get("screen") == "SearchScreen", 10, "window b's search")
        os.write(b[1], b"question\r")
        wait_for(lambda: report(tmp_path, "b").get("screen") == "Screen", 10, "window b to open it")
        os.write(b[1], b"\x1b[19~")
        wait_for(lambda: report(tmp_path, "b").get("screen") == "ConfirmScreen", 10, "window b's question")
        os.write(b[1], b"y")
        wait_for(lambda: report(tmp_path, "b").get("titles") == [], 10, "window b to delete it")
        (tmp_path / "a.go").write_text("go")
        wait_for(lambda: report(tmp_path, "a").get("generating") is False
                 and "deleted in another window" in " ".join(report(tmp_path, "a")["said"]), 15,
                 "window a to finish and say what happened")
        os.write(a[1], b"and again\r")  # was an IntegrityError that closed window a
        wait_for(lambda: report(tmp_path, "b").get("titles") == ["question from a"], 15,
                 "window b to show the conversation window a stored again")
        for proc, master, _, _ in (a, b):
            time.sleep(0.3)
            os.write(master, b"\x11")
            assert proc.wait(timeout=20) == 0
    finally:
        for proc, master, slave, _ in (a, b):
            if proc.poll() is None:
                proc.kill()
            os.close(master)
            os.close(slave)
    store = Store(tmp_path / "history.sqlite3")
    (conv,) = store.conversations()
    stored = [(m.role, m.content) for m in store.messages(conv.id)]
    store.close()
    assert stored[:3] == [("user", "question from a"), ("assistant", "alpha beta gamma delta epsilon zeta eta theta"),
                          ("user", "and again")]
