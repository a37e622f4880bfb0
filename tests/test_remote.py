"""RemoteEngine: the Engine protocol over HTTP, against a real `eaglechat serve` on 127.0.0.1 and against
small stand-in servers replaying the documented vLLM and SGLang response shapes (those need GPUs;
the stand-ins are the one fake here)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from fake_engine import FakeEngine
from serving import Recording, serving
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route
from tiny_models import save_tiny_pair

from eaglechat import cli
from eaglechat.engine.protocol import Finished, GenerationParams, TextDelta, TreeBudget
from eaglechat.engine.remote import RemoteEngine, base_url
from eaglechat.errors import ModelNotFound, RemoteError
from eaglechat.loader import load_engine
from eaglechat.server import create_app

REPO = Path(__file__).resolve().parent.parent
MESSAGES = [{"role": "user", "content": "The quick brown fox"}]


def collect(engine, params=None, cancel=None):
    events = list(engine.generate(MESSAGES, params or GenerationParams(max_new_tokens=20), cancel))
    assert isinstance(events[-1], Finished) and all(isinstance(e, TextDelta) for e in events[:-1])
    return events


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("EAGLECHAT_HOME", str(tmp_path_factory.mktemp("home")))
    base, head = save_tiny_pair(tmp_path_factory.mktemp("pair"))
    engine = load_engine(str(base), head=str(head), tree=TreeBudget(8, 3, 4), device="cpu", dtype="float32",
                         quant="none", max_context=512)
    with serving(create_app(engine)) as url:
        yield engine, url, (base, head)
    mp.undo()


def test_base_url_forms():
    assert base_url("localhost:8000") == "http://localhost:8000/v1"
    assert base_url("http://gpu-box:30000/") == "http://gpu-box:30000/v1"
    assert base_url("https://h/v1/") == "https://h/v1"


def test_remote_eaglechat_equals_the_local_engine(tiny):
    local, url, _ = tiny
    remote = RemoteEngine(url)
    assert remote.info.server == "eaglechat" and remote.info.model == local.info.model
    assert (remote.info.tree.total_tokens, remote.info.tree.depth, remote.info.max_context) == (8, 3, 512)
    for speculate in (True, False):
        params = GenerationParams(max_new_tokens=20, speculate=speculate)
        want = list(local.generate(MESSAGES, params))[-1]
        events = collect(remote, params)
        got = events[-1]
        assert got.text == want.text and got.token_ids == want.token_ids
        assert [t for e in events[:-1] for t in e.token_ids] == got.token_ids
        assert "".join(e.text for e in events[:-1]) == got.text
        assert got.stop_reason == want.stop_reason
        assert got.stats.new_tokens == len(want.token_ids) and got.stats.prefill_tokens == len(local.encode(MESSAGES))
        assert got.stats.speculate is speculate and not got.stats.server_wide
        assert got.stats.target_forwards == want.stats.target_forwards
        assert got.stats.mean_accepted == pytest.approx(want.stats.mean_accepted if speculate else 1.0)
        assert got.stats.ttft_s > 0 and got.stats.tokens_per_s > 0
        # step for step: the same deltas, drafted flags, per-token texts and step stats as the local engine
        def shape(delta):
            step = delta.step and (delta.step.accepted, delta.step.tree_size, delta.step.decode_tokens)
            return delta.text, delta.token_ids, delta.drafted, delta.token_texts, step

        local_deltas = [e for e in local.generate(MESSAGES, params) if isinstance(e, TextDelta)]
        assert [shape(e) for e in events[:-1]] == [shape(e) for e in local_deltas]
        assert got.stats.decode_tokens == want.stats.decode_tokens


def test_remote_eaglechat_speculate_auto_passes_through(tiny):
    """The server's default ("auto" with a head) reaches the client's EngineInfo; speculate="auto" is sent
    as the string, and the server's engine says what it chose (the chat's status bar shows it)."""
    local, url, _ = tiny
    remote = RemoteEngine(url)
    assert remote.info.speculate_by_default == local.info.speculate_by_default == "auto"
    params = GenerationParams(max_new_tokens=20, speculate="auto")
    assert remote.request_body(MESSAGES, params, stream=True)["speculate"] == "auto"
    got = collect(remote, params)[-1]
    want = list(local.generate(MESSAGES, GenerationParams(max_new_tokens=20, speculate=False)))[-1]
    assert got.token_ids == want.token_ids and got.text == want.text  # both modes are exact
    assert got.stats.speculate is True and got.stats.speculation.startswith("auto")


def test_speculate_by_default_from_a_card():
    from eaglechat.engine.remote import speculate_default

    assert [speculate_default(v) for v in (True, False, "auto", "yes", None, 1)] == ["on", "off", "auto", "on", "on", "on"]


def test_cancel_closes_the_stream_and_the_server_stops():
    fake = FakeEngine(["a b c d e f g"], tokens_per_step=1, pause_after_steps=1)
    engine = Recording(fake)
    with serving(create_app(engine)) as url:
        remote = RemoteEngine(url)
        cancel = threading.Event()
        events = []
        for event in remote.generate(MESSAGES, GenerationParams(max_new_tokens=20), cancel):
            events.append(event)
            if isinstance(event, TextDelta):
                cancel.set()  # the server is paused after one step: only its keep-alive comes now
        assert events[-1].stop_reason == "cancelled" and events[-1].text == "a"
        assert engine.cancels[0].wait(10)  # the server saw the connection close and cancelled


def test_errors_are_one_line(tiny, capsys):
    _, url, _ = tiny
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    with pytest.raises(RemoteError, match="cannot reach http://127.0.0.1"):
        RemoteEngine(f"http://127.0.0.1:{closed}")
    with pytest.raises(ModelNotFound, match="has no model 'nope'"):
        RemoteEngine(url, model="nope")

    with serving(create_app(FakeEngine(), api_key="k")) as keyed:
        with pytest.raises(RemoteError, match="refused the API key"):
            RemoteEngine(keyed, api_key="wrong")
        assert cli.main(["run", "--remote", keyed, "hello"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "refused the API key" in err[0]
        assert RemoteEngine(keyed, api_key="k").info.model == "fake-eagle"

    failing = FakeEngine(error=RuntimeError("kaboom"))
    with serving(create_app(failing)) as bad:
        with pytest.raises(RemoteError, match=r"failed \(HTTP 500\).*kaboom"):
            collect(RemoteEngine(bad, stream=False))
        with pytest.raises(RemoteError, match="failed mid-reply.*kaboom"):
            collect(RemoteEngine(bad))


def test_eaglechat_run_remote_prints_what_run_prints(tiny, capsys):
    local, url, (base, head) = tiny
    assert cli.main(["run", str(base), "--head", str(head), "--json", "--device", "cpu", "--dtype", "float32",
                     "--quant", "none", "--max-context", "512", "--total-tokens", "8", "--depth", "3",
                     "--draft-top-k", "4", "--max-new-tokens", "16", "Hello world"]) == 0
    want = json.loads(capsys.readouterr().out)
    # a lone positional that is not a served model is the prompt; the server's model is used
    assert cli.main(["run", "--remote", url, "--json", "--max-new-tokens", "16", "Hello world"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["text"] == want["text"] and got["token_ids"] == want["token_ids"]
    assert cli.main(["run", "--remote", url, local.info.model, "Hello world", "--max-new-tokens", "16",
                     "--verbose"]) == 0
    out = capsys.readouterr()
    assert out.out.rstrip("\n") == want["text"]
    assert "eaglechat at " + url in out.err and "(this request)" in out.err and "time to first token" in out.err


# -- stand-ins replaying vLLM's and SGLang's documented shapes ----------------------------------------

def stand_in(owner: str, *, per_request: bool = False, max_len: int = 4096):
    """A server that answers like vLLM (owner "vllm") or SGLang (owner "sglang"): the reply is fixed,
    the speculation figures are the documented fields; every request body is recorded."""
    seen: list[dict] = []
    counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0}
    words = ["Speculative", " decoding", " is", " exact", "."]

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [
            {"id": "meta-llama/Llama-3.1-8B-Instruct", "object": "model", "owned_by": owner, "max_model_len": max_len}]})

    async def metrics(request: Request):
        if owner == "vllm":
            return PlainTextResponse(
                "# TYPE vllm:spec_decode_num_drafts_total counter\n"
                f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {counters["drafts"]}.0\n'
                f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {counters["draft_tokens"]}.0\n'
                f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {counters["accepted"]}.0\n'
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} 3.0\n')
        return PlainTextResponse(  # two tensor-parallel ranks report the gauge
            '# TYPE sglang:spec_accept_length gauge\n'
            'sglang:spec_accept_length{model_name="m",tp_rank="0"} 3.0\n'
            'sglang:spec_accept_length{model_name="m",tp_rank="1"} 3.5\n'
            'sglang:spec_accept_rate{model_name="m",tp_rank="0"} 0.5\n'
            'sglang:spec_accept_rate{model_name="m",tp_rank="1"} 0.6\n')

    async def chat(request: Request):
        body = await request.json()
        seen.append(body)
        if owner == "sglang" and body.get("stream") and body.get("return_meta_info"):
            return JSONResponse({"object": "error", "message": "return_meta_info is not supported with streaming.",
                                 "type": "BadRequestError", "param": None, "code": 400}, status_code=400)
        counters["drafts"] += 2
        counters["draft_tokens"] += 6
        counters["accepted"] += 3  # vLLM: 1 + 3/2 = 2.5
        spec = {"num_spec_steps": 2, "num_draft_tokens": 6, "num_accepted_draft_tokens": 3,
                "acceptance_histogram": [0, 1, 1, 0], "mean_acceptance_length": 2.5, "draft_acceptance_rate": 0.5}
        usage = {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}
        rid, created = "chatcmpl-standin", 1700000000
        if not body.get("stream"):
            choice = {"index": 0, "message": {"role": "assistant", "content": "".join(words)}, "finish_reason": "stop"}
            if owner == "sglang" and body.get("return_meta_info"):
                choice["meta_info"] = {"id": "x", "prompt_tokens": 11, "completion_tokens": 5, "spec_verify_ct": 2,
                                       "spec_accept_length": 2.5, "spec_accept_rate": 0.42, "e2e_latency": 0.1}
            out = {"id": rid, "object": "chat.completion", "created": created, "model": body["model"],
                   "choices": [choice], "usage": usage}
            if owner == "vllm" and per_request:
                out["metrics"] = {"speculative_decoding": spec}
            return JSONResponse(out)

        async def events():
            def chunk(choices, **extra):
                return "data: " + json.dumps({"id": rid, "object": "chat.completion.chunk", "created": created,
                                              "model": body["model"], "choices": choices, **extra}) + "\n\n"
            yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}], usage=None)
            for w in words:
                yield chunk([{"index": 0, "delta": {"content": w}, "finish_reason": None}], usage=None)
            yield chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}], usage=None)
            if (body.get("stream_options") or {}).get("include_usage"):
                extra = {"metrics": {"speculative_decoding": spec}} if owner == "vllm" and per_request else {}
                yield chunk([], usage=usage, **extra)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/models", models), Route("/metrics", metrics),
                            Route("/v1/chat/completions", chat, methods=["POST"])])
    return app, seen


@pytest.mark.parametrize("per_request", [True, False])
def test_vllm_per_request_metrics_or_server_counters(per_request):
    app, seen = stand_in("vllm", per_request=per_request)
    with serving(app) as url:
        remote = RemoteEngine(url)
        events = collect(remote, GenerationParams(max_new_tokens=64, top_k=20, speculate=False))
    final = events[-1]
    assert remote.info.server == "vllm" and remote.info.max_context == 4096
    assert final.text == "Speculative decoding is exact." and final.stop_reason == "stop"
    assert final.stats.new_tokens == 5 and final.stats.prefill_tokens == 11
    assert final.stats.speculate and final.stats.mean_accepted == pytest.approx(2.5)
    assert final.stats.draft_acceptance_rate == pytest.approx(0.5)
    assert final.stats.server_wide is (not per_request)  # counters cover every client of the server
    sent = seen[0]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["top_k"] == 20 and sent["max_tokens"] == 64 and "speculate" not in sent  # eaglechat's own flag


def test_sglang_streamed_reads_the_gauge_whole_reads_meta_info():
    app, seen = stand_in("sglang")
    with serving(app) as url:
        streamed = collect(RemoteEngine(url))[-1]
        whole = collect(RemoteEngine(url, stream=False))[-1]
    assert "return_meta_info" not in seen[0]  # SGLang refuses it with stream=true
    assert streamed.text == whole.text == "Speculative decoding is exact."
    assert streamed.stats.server_wide and streamed.stats.mean_accepted == pytest.approx(3.25)  # mean over ranks
    assert streamed.stats.draft_acceptance_rate == pytest.approx(0.55)
    assert seen[1]["return_meta_info"] is True and seen[1]["stream"] is False
    assert not whole.stats.server_wide and whole.stats.mean_accepted == pytest.approx(5 / 2)  # tokens / verify steps
    assert whole.stats.target_forwards == 2 and whole.stats.draft_acceptance_rate == pytest.approx(0.42)


def test_a_plain_openai_compatible_server_reports_no_speculation():
    app, seen = stand_in("llamacpp")
    with serving(app) as url:
        remote = RemoteEngine(url)
        final = collect(remote, GenerationParams(top_k=5))[-1]
    assert remote.info.server == "openai" and "top_k" not in seen[0] and "return_token_ids" not in seen[0]
    assert final.text == "Speculative decoding is exact." and not final.stats.speculate
    assert final.stats.mean_accepted == 0.0


# -- the real command ---------------------------------------------------------------------------------

def test_remote_engine_against_eaglechat_serve_the_command(tiny, tmp_path):
    """`eaglechat serve` as a user starts it (its own process, an API key, port 0), then Ctrl-C."""
    _, _, (base, head) = tiny
    env = {**os.environ, "PYTHONPATH": str(REPO), "EAGLECHAT_HOME": str(tmp_path / "home"),
           "EAGLECHAT_API_KEY": "k3y", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "eaglechat", "serve", str(base), "--head", str(head), "--port", "0",
                             "--device", "cpu", "--quant", "none", "--max-context", "256"],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        url, lines, deadline = None, [], time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"at (http://127\.0\.0\.1:\d+/v1)", line)
            url = m.group(1) if m else None
        assert url, "".join(lines)
        assert "API key required" in lines[-1]
        assert httpx.get(f"{url}/models").status_code == 401
        remote = RemoteEngine(url, api_key="k3y")
        final = collect(remote, GenerationParams(max_new_tokens=8))[-1]
        assert final.stats.new_tokens == len(final.token_ids) > 0 and final.stats.speculate
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0


# -- the chat app, unchanged, on a remote engine ------------------------------------------------------

async def test_the_chat_app_chats_with_a_remote_server(tmp_path):
    from fake_engine import make_tui_app, wait_until

    from eaglechat.tui.sources import default_loader, remote_models
    from eaglechat.tui.widgets import MessageView, PromptInput

    with serving(create_app(FakeEngine(["Hello from the box down the hall."]), api_key="k")) as url:
        assert remote_models(url, "wrong") == []  # the picker still lists the local models
        entries = remote_models(url, "k")
        assert entries == [(f"{url}/v1#fake-eagle", f"remote · eaglechat server · {url}/v1")]
        app = make_tui_app(tmp_path, loader=default_loader, model=entries[0][0], api_key="k",
                           models=lambda: entries)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_until(pilot, lambda: app.engine is not None, what="the remote engine")
            assert app.engine.info.server == "eaglechat"
            app.query_one(PromptInput).focus()
            await pilot.press(*"Hi", "enter")
            await wait_until(pilot, lambda: not app.generating, what="the reply")
            await pilot.pause()
            reply = [v for v in app.query(MessageView) if v.role == "assistant"][-1]
            assert reply.content == "Hello from the box down the hall."
            from eaglechat.tui.widgets import StatusBar

            status = " · ".join(app.query_one(StatusBar).parts)
            assert f"remote (eaglechat) · {url.split('://')[1]}" in status and "first text after" in status


def test_chat_remote_opens_the_servers_model_and_lists_it_first(monkeypatch, capsys, tmp_path):
    import eaglechat.commands.chat as chat

    opened = []
    monkeypatch.setattr(chat, "run_app", lambda app, store: opened.append(app) or 0)
    monkeypatch.setattr(chat, "_is_terminal", lambda stream: True)  # as in a terminal (pytest's stdin is not one)
    monkeypatch.setenv("EAGLECHAT_API_KEY", "k")
    with serving(create_app(FakeEngine(), api_key="k")) as url:
        assert cli.main(["chat", "--remote", url]) == 0
        app = opened[-1]
        assert app.model_name == f"{url}/v1#fake-eagle"
        assert app.models_fn()[0] == (f"{url}/v1#fake-eagle", f"remote · eaglechat server · {url}/v1")
        assert app.api_key == "k"
        assert not app.remember_remote  # for this run only
        assert cli.main(["chat", "--remote", url, "--save-remote"]) == 0 and opened[-1].remember_remote
        monkeypatch.setenv("EAGLECHAT_API_KEY", "wrong")
        assert cli.main(["chat", "--remote", url]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refused the API key" in err[0]


def test_status_bar_says_server_kind_first_token_and_server_wide():
    from eaglechat.engine.protocol import EngineInfo, GenerationStats
    from eaglechat.tui.stats import TurnNumbers, status_parts

    info = EngineInfo(model="m", device="remote", server="vllm", endpoint="http://gpu-box:8000/v1",
                      tree=TreeBudget(0, 0, 0, kind="remote"))
    stats = GenerationStats(new_tokens=40, elapsed_s=2.0, tokens_per_s=20.0, speculate=True, mean_accepted=2.5,
                            draft_acceptance_rate=0.4, server_wide=True, ttft_s=0.31)
    parts = status_parts(info, TurnNumbers.from_finished(stats, TurnNumbers(tokens=40), "stop"), None, True)
    assert "20.0 tok/s" in parts and "τ 2.50 (server-wide)" in parts
    assert "40% of drafts accepted (server-wide)" in parts and "first text after 0.31 s" in parts
    assert parts[-2:] == ["remote (vllm)", "gpu-box:8000"] and not any("mem" in p or "quant" in p for p in parts)
    per_request = GenerationStats(new_tokens=40, elapsed_s=2.0, tokens_per_s=20.0, mean_accepted=2.5, ttft_s=0.3)
    parts = status_parts(info, TurnNumbers.from_finished(per_request, TurnNumbers(tokens=40), "stop"), None, True)
    assert "τ 2.50" in parts and not any("server-wide" in p for p in parts)


def test_a_whole_reply_claims_no_first_token_time_or_decode_rate():
    """Without streaming the text arrives at once: a decode rate over the ~0 s after it would be absurd."""
    app, _ = stand_in("llamacpp")
    with serving(app) as url:
        streamed = collect(RemoteEngine(url))[-1]
        whole = collect(RemoteEngine(url, stream=False))[-1]
    assert streamed.stats.ttft_s > 0 and whole.text == streamed.text
    assert whole.stats.ttft_s == 0.0 and whole.stats.decode_tokens_per_s == 0.0 and whole.stats.prefill_s == 0.0
    assert whole.stats.new_tokens > 1 and whole.stats.tokens_per_s > 0
