"""The real chat process in a pseudo-terminal: ctrl+q, SIGTERM and SIGHUP mid-reply, while the engine is
stuck inside a step that ignores cancel, return the terminal (alternate screen left, mouse tracking
off, cooked mode back) at once and store the partial reply marked as stopped."""

from __future__ import annotations

import fcntl
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


def start(home: Path):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.Popen([sys.executable, str(HERE / "chat_process.py"), str(home)], stdin=slave,
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
