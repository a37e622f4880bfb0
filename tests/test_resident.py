"""The resident engine: a running `eaglechat serve` answers `run` instead of a fresh load, only when it
holds the model as the run would load it, and its greedy reply is the local one, token for token."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from eaglechat import resident
from eaglechat.fit.choose import LoadRequest
from eaglechat.models import default_model

REPO = Path(__file__).resolve().parent.parent
ALIAS = default_model.DEFAULT_ALIAS
RUN_AND_SAY_IF_TORCH_LOADED = textwrap.dedent("""
    import sys
    from eaglechat.cli import main
    code = main(sys.argv[1:])
    print("torch loaded:", "torch" in sys.modules)
    sys.exit(code)
""")


def run_in(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EAGLECHAT_HOME": str(home), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", RUN_AND_SAY_IF_TORCH_LOADED, *args], env=env, capture_output=True,
                          text=True, timeout=300)


def wait_for_record(home: Path, proc: subprocess.Popen, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list((home / "data" / "resident").glob("*.json")) if (home / "data" / "resident").is_dir() else []
        if found:
            return json.loads(found[0].read_text())
        if proc.poll() is not None:
            raise AssertionError(f"serve ended: {proc.stderr.read()}")
        time.sleep(0.2)
    raise AssertionError("serve wrote no record")


@pytest.fixture(scope="module")
def server(shared_default_base, tmp_path_factory):
    """A real `eaglechat serve` of the default model in its own home (the converted model linked in)."""
    home = tmp_path_factory.mktemp("resident-home")
    models = home / "cache" / "models"
    models.mkdir(parents=True)
    (models / default_model.CONVERTED_NAME).symlink_to(shared_default_base, target_is_directory=True)
    env = {**os.environ, "EAGLECHAT_HOME": str(home), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "eaglechat", "serve", "--port", "0"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield home, proc, wait_for_record(home, proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


@pytest.mark.slow
def test_a_run_answered_by_the_resident_engine_is_the_local_reply(server):
    home, proc, record = server
    prompt = "Name three colours of the rainbow."
    attached = run_in(home, "run", ALIAS, prompt, "--max-new-tokens", "24", "--json", "--temperature", "0")
    assert attached.returncode == 0, attached.stderr
    assert attached.stderr.strip() == (f"eaglechat: answered by the resident engine at {record['url'][:-3]} "
                                       f"(eaglechat serve, pid {proc.pid}); --no-resident loads the model here")
    assert attached.stdout.splitlines()[-1] == "torch loaded: False"  # no model loaded here
    local = run_in(home, "run", ALIAS, prompt, "--max-new-tokens", "24", "--json", "--no-resident", "--temperature", "0")
    assert local.returncode == 0, local.stderr
    assert "answered by" not in local.stderr and local.stdout.splitlines()[-1] == "torch loaded: True"
    remote_reply, local_reply = (json.loads(r.stdout.splitlines()[0]) for r in (attached, local))
    assert remote_reply["token_ids"] == local_reply["token_ids"] and len(local_reply["token_ids"]) > 3
    assert remote_reply["text"] == local_reply["text"]


@pytest.mark.slow
def test_only_a_run_asking_for_the_same_load_attaches(server, monkeypatch):
    from eaglechat.cli import parse
    from eaglechat.commands.common import resident_options

    home, proc, record = server
    monkeypatch.setenv("EAGLECHAT_HOME", str(home))

    def found(*flags: str, model: str = ALIAS, speculate: bool = True):
        args = parse(["run", model, "hi", *flags])
        return resident.find(args.model, resident_options(args, speculate=speculate))

    assert found().pid == proc.pid
    assert found(speculate=False).pid == proc.pid  # plain decoding: the request says speculate false
    for flags in (["--max-context", "2048"], ["--quant", "8bit"], ["--dtype", "bfloat16"], ["--device", "cpu"],
                  ["--total-tokens", "4"], ["--compile", "off"], ["--head", str(REPO / "models" / ALIAS)]):
        assert found(*flags) is None, flags
    assert found(model="qwen2.5-0.5b-eagle3") is None


@pytest.mark.slow
def test_the_chat_opens_the_resident_engine_under_the_models_own_name(server, monkeypatch):
    """The chat's loader asks the same question; the model keeps its name (what the chat remembers as the
    last model), the load's progress names the engine."""
    from eaglechat.tui.sources import default_loader

    home, proc, record = server
    monkeypatch.setenv("EAGLECHAT_HOME", str(home))
    phases = []
    engine = default_loader(ALIAS, progress=lambda phase, fraction=None: phases.append(phase), quant="auto",
                            compile="auto")
    assert engine.info.server == "eaglechat" and engine.info.model == ALIAS and engine.url == record["url"]
    assert phases == [f"using the resident engine at {record['url'][:-3]} (eaglechat serve, pid {proc.pid})"]
    engine.close()


@pytest.mark.slow
def test_stopping_the_server_removes_its_record(server):
    home, proc, _ = server
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    assert list((home / "data" / "resident").glob("*.json")) == []


def test_the_chat_asks_the_resident_lookup_and_the_loader_for_one_request(monkeypatch):
    """`eaglechat chat`'s flags make one LoadRequest; the chat's loader hands that same request to the
    resident lookup and then to the local load; --no-resident skips the lookup."""
    import eaglechat.commands.chat as chat
    from eaglechat import cli, loader
    from eaglechat.tui.sources import default_loader

    opened = []
    monkeypatch.setattr(chat, "run_app", lambda app, store: opened.append(app) or 0)
    monkeypatch.setattr(chat, "_is_terminal", lambda stream: True)
    assert cli.main(["chat", "--quant", "8bit", "--device", "cpu", "--max-context", "512", "--no-resident"]) == 0
    request = opened[-1].load_request
    assert request == LoadRequest(quant="8bit", device="cpu", max_context=512, compile="auto")
    assert opened[-1].resident is False and opened[-1].api_key is None
    seen = []
    monkeypatch.setattr(resident, "find", lambda model, asked, api_key=None: seen.append(("resident", asked)))
    monkeypatch.setattr(loader, "load_engine", lambda model, asked, progress=None: seen.append(("load", asked)) or "here")
    assert default_loader(ALIAS, request) == "here" and seen == [("resident", request), ("load", request)]
    seen.clear()
    assert default_loader(ALIAS, request, resident=False) == "here" and seen == [("load", request)]


def write_record(pid: int, url: str) -> Path:
    from eaglechat import paths

    path = paths.resident_dir() / f"{pid}.json"
    path.write_text(json.dumps({"version": resident.RECORD_VERSION, "pid": pid, "url": url, "served": ALIAS,
                                "names": [ALIAS], "options": resident.load_options(LoadRequest()),
                                "api_key_required": False}))
    return path


def test_a_dead_servers_record_is_removed():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    path = write_record(gone.pid, "http://127.0.0.1:9/v1")
    assert resident.find(ALIAS, LoadRequest()) is None and not path.exists()


def test_a_record_whose_port_does_not_answer_is_skipped_and_kept():
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = write_record(os.getpid(), f"http://127.0.0.1:{port}/v1")
    assert resident.find(ALIAS, LoadRequest()) is None and path.exists()


@pytest.mark.slow  # a real serve process: seconds of imports and a model load
def test_keep_alive_stops_an_idle_server_and_removes_its_record(tmp_path):
    """A tiny local model folder (not the default model): `serve --keep-alive 1` ends by itself."""
    from tiny_models import save_tiny_pair

    base, _head = save_tiny_pair(tmp_path / "pair")
    home = tmp_path / "home"
    env = {**os.environ, "EAGLECHAT_HOME": str(home), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "eaglechat", "serve", str(base), "--port", "0", "--keep-alive", "1"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        record = wait_for_record(home, proc)
        assert str(Path(base).resolve()) in record["names"]
        assert proc.wait(60) == 0
        assert "no request for 1s (--keep-alive), stopping" in proc.stderr.read()
        assert list((home / "data" / "resident").glob("*.json")) == []
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("text, seconds", [("300", 300), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1.5m", 90)])
def test_durations(text, seconds):
    assert resident.duration(text) == seconds


@pytest.mark.parametrize("text", ["0", "-5", "5d", "soon", ""])
def test_bad_durations(text):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        resident.duration(text)
