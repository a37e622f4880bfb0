"""The history store under other processes: real processes, a real SQLite file.

A lock held by someone else (a second chat window, a backup, a `sqlite3` shell, a VACUUM) is not
damage: the store waits (and says so) or fails with one line, and never moves a healthy file aside.
Several chats started at once on a fresh database all end up with the same, complete history.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from eaglechat.chat.store import Store, StoreError

REPO = Path(__file__).resolve().parent.parent


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _python(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"helper process ended early: {proc.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} never appeared")
        time.sleep(0.02)


def _moved_aside(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".corrupt-" in p.name)


# Each writer waits for a go-file (so all of them open the fresh database within milliseconds of
# each other), opens the store, writes its conversations and prints what it saw.
WRITER = """
    import sys, time
    from pathlib import Path
    from eaglechat.chat.store import Store
    db, go, name, count = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    while not go.exists():
        time.sleep(0.001)
    store = Store(db, on_wait=lambda message: None)
    for i in range(count):
        conv = store.new_conversation(f"{name}-{i}")
        store.add_message(conv.id, "user", f"question {i}")
    print("recovered", store.recovered)
    store.close()
"""


def test_concurrent_first_starts_share_one_database(tmp_path):
    db, go = tmp_path / "history.sqlite3", tmp_path / "go"
    writers, per_writer = 5, 15
    procs = [_python(WRITER, db, go, f"w{n}", per_writer) for n in range(writers)]
    time.sleep(1.5)  # let every interpreter reach its wait loop
    go.touch()
    results = [p.communicate(timeout=120) for p in procs]
    for proc, (out, err) in zip(procs, results):
        assert proc.returncode == 0, err
        assert out.strip() == "recovered None", (out, err)
    assert _moved_aside(tmp_path) == []
    store = Store(db)
    titles = {c.title for c in store.conversations()}
    assert titles == {f"w{n}-{i}" for n in range(writers) for i in range(per_writer)}
    assert all(len(store.messages(c.id)) == 1 for c in store.conversations())


# Holds an exclusive lock on an existing history for a while, like a VACUUM or a `sqlite3` shell
# inside `BEGIN EXCLUSIVE`. locking_mode=EXCLUSIVE makes it exclusive even for WAL readers.
HOLDER = """
    import sqlite3, sys, time
    from pathlib import Path
    db, locked, seconds, mode = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    con = sqlite3.connect(db, isolation_level=None)
    if mode == "exclusive":
        con.execute("PRAGMA locking_mode=EXCLUSIVE")
    con.execute("BEGIN EXCLUSIVE")
    con.execute("UPDATE conversations SET title = title")
    locked.touch()
    time.sleep(seconds)
    con.execute("COMMIT")
    con.close()
"""


def _history_with(db: Path, n: int) -> None:
    store = Store(db)
    for i in range(n):
        store.new_conversation(f"kept-{i}")
    store.close()


def test_a_lock_held_for_seconds_is_waited_for_not_treated_as_damage(tmp_path):
    db, locked = tmp_path / "history.sqlite3", tmp_path / "locked"
    _history_with(db, 7)
    holder = _python(HOLDER, db, locked, 3.0, "exclusive")
    _wait_for(locked, holder)
    said: list[str] = []
    started = time.monotonic()
    store = Store(db, on_wait=said.append, notice_after_s=0.5, lock_wait_s=60)
    waited = time.monotonic() - started
    assert holder.wait(timeout=60) == 0
    assert store.recovered is None
    assert _moved_aside(tmp_path) == []
    assert sorted(c.title for c in store.conversations()) == [f"kept-{i}" for i in range(7)]
    assert len(said) == 1 and "locked" in said[0] and str(db) in said[0]
    assert waited > 1.0  # it really waited for the holder rather than opening something else
    store.new_conversation("after the lock")
    assert len(store.conversations()) == 8


def test_a_lock_that_outlasts_the_wait_fails_with_one_line_and_moves_nothing(tmp_path):
    db, locked = tmp_path / "history.sqlite3", tmp_path / "locked"
    _history_with(db, 3)
    holder = _python(HOLDER, db, locked, 6.0, "exclusive")
    _wait_for(locked, holder)
    try:
        with pytest.raises(StoreError) as info:
            Store(db, on_wait=lambda message: None, notice_after_s=0.2, lock_wait_s=1.0)
        message = str(info.value)
        assert "\n" not in message and "locked" in message and str(db) in message
        assert _moved_aside(tmp_path) == []
    finally:
        holder.wait(timeout=60)
    store = Store(db)
    assert len(store.conversations()) == 3


def test_a_lock_on_a_rollback_journal_database_is_waited_for(tmp_path):
    # A history last written by a tool that left it in rollback-journal mode: a plain BEGIN EXCLUSIVE
    # there blocks readers too (this is what an old eaglechat or a backup tool leaves behind).
    db, locked = tmp_path / "history.sqlite3", tmp_path / "locked"
    _history_with(db, 4)
    con = __import__("sqlite3").connect(db)
    con.execute("PRAGMA journal_mode=DELETE")
    con.close()
    holder = _python(HOLDER, db, locked, 2.0, "normal")
    _wait_for(locked, holder)
    store = Store(db, on_wait=lambda message: None, notice_after_s=0.2, lock_wait_s=60)
    assert holder.wait(timeout=60) == 0
    assert store.recovered is None and _moved_aside(tmp_path) == []
    assert len(store.conversations()) == 4


def test_real_damage_is_still_moved_aside(tmp_path):
    db = tmp_path / "history.sqlite3"
    _history_with(db, 2)
    data = bytearray(db.read_bytes())
    data[:16] = b"not a database!!"  # the SQLite header is gone: "file is not a database"
    db.write_bytes(bytes(data))
    for side in ("-wal", "-shm"):
        (tmp_path / f"history.sqlite3{side}").unlink(missing_ok=True)
    store = Store(db)
    assert store.recovered is not None and store.recovered.read_bytes() == bytes(data)
    assert store.conversations() == []
