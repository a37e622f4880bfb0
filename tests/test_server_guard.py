"""A server left running on a desktop: what a web page (DNS rebinding, cross-origin simple requests)
and a careless or hostile client (huge conversations, half-sent bodies, a stream nobody reads, bad
values) can do to it. Real uvicorn on 127.0.0.1, raw sockets where a client library would behave;
the scripted engine, one server per module."""

from __future__ import annotations

import json
import logging
import socket
import time

import httpx
import pytest
from fake_engine import FakeEngine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serving import serving

from eaglechat import cli
from eaglechat.engine.protocol import Finished
from eaglechat.server import create_app

GOOD = {"model": "fake-eagle", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def fake():
    return FakeEngine(["fine"])


@pytest.fixture(scope="module")
def url(fake):
    app = create_app(fake, allow_hosts=("chat.lan",), cors_origins=("http://localhost:3000",), max_messages=8,
                     max_prompt_tokens=60, read_timeout=0.5, write_timeout=0.5)
    with serving(app, header_timeout=0.5) as base:
        yield base


def port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def calls(fake) -> int:
    return len(fake.calls)


# -- web pages ----------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example", "localhost.evil.example"])
def test_a_rebinding_host_is_refused_on_every_route(url, fake, host):
    before = calls(fake)
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("GET", "/api/tags"),
                         ("POST", "/api/chat"), ("GET", "/health")):
        r = httpx.request(method, f"{url}{path}", json=GOOD, headers={"Host": host})
        assert r.status_code == 403, (path, r.text)
        error = r.json()["error"]
        assert "--allow-host" in (error if path.startswith("/api/") else error["message"])
    assert calls(fake) == before


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:1234", "127.0.0.1", "[::1]:80", "192.168.1.20", "chat.lan",
                                  "app.localhost"])
def test_loopback_names_ip_literals_and_allowed_hosts_pass(url, host):
    assert httpx.get(f"{url}/v1/models", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("kind", ["application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x", None])
def test_a_post_a_browser_can_send_without_preflight_is_refused(url, fake, kind):
    before = calls(fake)
    headers = {} if kind is None else {"Content-Type": kind}
    paths = ("/v1/chat/completions", "/v1/completions", "/api/chat", "/api/generate", "/tokenize")
    for path in paths if kind else ("/v1/chat/completions", "/v1/completions", "/tokenize"):
        r = httpx.post(f"{url}{path}", content=json.dumps(GOOD).encode(), headers=headers)
        assert r.status_code == 415, (path, r.text)
    if kind is None:  # Ollama's face takes a typeless body, but never from a page (Origin or cross-site fetch)
        for path in ("/api/chat", "/api/generate"):
            for browser in ({"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
                r = httpx.post(f"{url}{path}", content=json.dumps(GOOD).encode(), headers=browser)
                assert r.status_code in (403, 415), (path, browser, r.text)
                assert isinstance(r.json()["error"], str)
    assert calls(fake) == before
    ok = httpx.post(f"{url}/v1/chat/completions", content=json.dumps(GOOD), headers={"Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


def test_cors_only_for_named_origins(url, fake):
    preflight = {"Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type, authorization, x-stainless-lang"}  # openai's JS SDK
    r = httpx.options(f"{url}/v1/chat/completions", headers={"Origin": "http://localhost:3000", **preflight})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
    r = httpx.post(f"{url}/v1/chat/completions", json=GOOD, headers={"Origin": "http://localhost:3000"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
    before = calls(fake)
    for method in ("OPTIONS", "GET", "POST"):
        r = httpx.request(method, f"{url}/v1/models" if method == "GET" else f"{url}/v1/chat/completions",
                          json=GOOD if method == "POST" else None, headers={"Origin": "https://evil.example", **preflight})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    assert calls(fake) == before


def test_without_cors_origins_no_origin_gets_in():
    with serving(create_app(FakeEngine(["fine"]))) as base:
        r = httpx.options(f"{base}/v1/chat/completions", headers={"Origin": "http://localhost:3000",
                                                                  "Access-Control-Request-Method": "POST"})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        assert httpx.post(f"{base}/v1/chat/completions", json=GOOD).status_code == 200


# -- careless or hostile clients ------------------------------------------------------------------

def test_limits_on_messages_and_prompt_tokens_before_the_engine(url, fake):
    before = calls(fake)
    many = [{"role": "user", "content": "x"}] * 9
    r = httpx.post(f"{url}/v1/chat/completions", json={**GOOD, "messages": many})
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_messages"
    long = [{"role": "user", "content": "word " * 100}]  # the fake counts a token per word
    r = httpx.post(f"{url}/v1/chat/completions", json={**GOOD, "messages": long})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = httpx.post(f"{url}/api/chat", json={**GOOD, "messages": long, "stream": False})
    assert r.status_code == 400 and "60" in r.json()["error"]
    assert calls(fake) == before


def raw_request(url: str, body: bytes, declared: int, *, path="/v1/chat/completions") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port(url)))
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {declared}\r\n\r\n").encode()
    sock.sendall(head + body)
    return sock


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_half_sent_headers_and_bodies_time_out_and_a_vanishing_upload_is_one_line(url, fake):
    lines = Lines()
    loggers = [logging.getLogger(n) for n in ("eaglechat.server", "uvicorn.error", "uvicorn")]
    for logger in loggers:
        logger.addHandler(lines)
    try:
        sock = raw_request(url, b'{"messages": ', 500)
        sock.settimeout(10)
        start = time.monotonic()
        answer = sock.recv(4096).decode()
        assert answer.startswith("HTTP/1.1 408") and time.monotonic() - start < 5
        sock.close()
        sock = socket.create_connection(("127.0.0.1", port(url)))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never end
        sock.settimeout(10)
        start = time.monotonic()
        assert sock.recv(4096) == b"" and time.monotonic() - start < 5  # closed by the server
        sock.close()
        sock = raw_request(url, b'{"messages": ', 500)
        time.sleep(0.1)
        sock.close()  # gone mid-upload
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any("disconnected" in r.getMessage() for r in lines.records):
            time.sleep(0.05)
    finally:
        for logger in loggers:
            logger.removeHandler(lines)
    left = [r for r in lines.records if "disconnected" in r.getMessage()]
    assert len(left) == 1 and left[0].exc_info is None
    assert len([r for r in lines.records if "part of its request headers" in r.getMessage()]) == 1
    assert not [r for r in lines.records if r.exc_info or r.levelno >= logging.ERROR]
    assert httpx.post(f"{url}/v1/chat/completions", json=GOOD).status_code == 200


class Watched:
    """Wraps an engine: the stop reason of each generation, once it ends."""

    def __init__(self, engine):
        self.engine, self.info, self.reasons = engine, engine.info, []

    def generate(self, messages, params, cancel=None):
        for event in self.engine.generate(messages, params, cancel):
            if isinstance(event, Finished):
                self.reasons.append(event.stop_reason)
            yield event


def test_a_stream_nobody_reads_is_cancelled():
    word = "x" * 4000
    fake = FakeEngine([" ".join([word] * 4000)], tokens_per_step=4, step_delay=0.01, max_context=8192)
    engine = Watched(fake)
    with serving(create_app(engine, write_timeout=0.5)) as base:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port(base)))
        body = json.dumps({**GOOD, "stream": True, "max_tokens": 4000}).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        # never read: the server's sends block, and after the write timeout the generation stops
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not engine.reasons:
            time.sleep(0.05)
        sock.close()
    assert engine.reasons == ["cancelled"]  # 1000 steps of 10 ms would have run 10 s and more


def test_a_reader_that_stops_reading_on_loopback_is_noticed_before_any_send_blocks():
    """Default socket buffers: the whole reply (about 1.2 MB) fits in what the two kernels buffer, so no
    send ever blocks; what stops is the client's TCP acknowledging, once its receive buffer is full."""
    word = "y" * 1000
    fake = FakeEngine([" ".join([word] * 1200)], tokens_per_step=4, step_delay=0.02, max_context=8192)
    engine = Watched(fake)
    with serving(create_app(engine, write_timeout=1.0)) as base:
        sock = socket.create_connection(("127.0.0.1", port(base)))
        body = json.dumps({**GOOD, "stream": True, "max_tokens": 1200}).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")  # it reads the start, then nothing more
        start = time.monotonic()
        while time.monotonic() - start < 30 and not engine.reasons:
            time.sleep(0.05)
        stopped_after = time.monotonic() - start
        metrics = httpx.get(f"{base}/metrics").text
        sock.close()
    assert engine.reasons == ["cancelled"] and stopped_after < 5  # 300 steps of 20 ms: 6 s to the end
    assert "eaglechat:stream_write_timeouts_total{" in metrics
    assert next(x for x in metrics.splitlines() if x.startswith("eaglechat:stream_write_timeouts_total")).endswith(" 1")


# -- bad values: a 4xx naming them, never a 500 -----------------------------------------------------

@pytest.mark.parametrize("raw,param", [
    ('{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content"),
    ('{"messages": [{"role": "user", "content": "hi"}], "stop": ["\\udfff"]}', "stop[0]"),
    ('{"messages": [{"role": "user", "content": "hi"}], "\\ud800": 1}', "body"),
    ('{"messages": [{"role": "user", "content": "hi"}], "seed": 18446744073709551616}', "seed"),
    ('{"messages": [{"role": "user", "content": "hi"}], "seed": -1}', "seed"),
    ('{"messages": [{"role": "user", "content": "hi"}], "repetition_penalty": 0}', "repetition_penalty"),
    ('{"messages": [{"role": "user", "content": "hi"}], "min_p": 2}', "min_p"),
])
def test_bad_values_are_400s_naming_them(url, raw, param):
    r = httpx.post(f"{url}/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.post(f"{url}/tokenize", content=raw, headers={"Content-Type": "application/json"})
    if "\\u" in raw:  # the tokenizer never sees a lone surrogate
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    else:
        assert r.status_code == 200, r.text


def test_serve_refuses_what_is_not_an_origin(capsys):
    assert cli.main(["serve", "--cors-origin", "localhost:3000", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scheme://host[:port]" in err[0]


def test_serve_port_out_of_range_is_one_line(capsys):
    for value in ("99999", "-1", "http"):
        assert cli.main(["serve", f"--port={value}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert "--port" in err[-1] and "Traceback" not in "".join(err)


NUMBERS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([5e-324, 1e-40, 1e-300, 0.0, 1.0]))
VALUES = st.one_of(NUMBERS, st.text(max_size=5), st.lists(st.text(max_size=3), max_size=5), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
PARAMS = ["temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "max_completion_tokens", "stop", "n",
          "stream", "stream_options", "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs",
          "speculate", "response_format", "tools", "tool_choice", "user", "suffix", "prompt", "echo", "options"]


@settings(derandomize=True, max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(route=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/api/chat", "/api/generate"]),
       params=st.dictionaries(st.sampled_from(PARAMS), VALUES, max_size=4),
       content=st.one_of(st.just("hi"), st.text(max_size=8)))
def test_no_request_gets_a_500_or_an_empty_stop(url, route, params, content):
    body = {"model": "fake-eagle", "messages": [{"role": "user", "content": content}], "prompt": content,
            "stream": False, **params}
    r = httpx.post(f"{url}{route}", json=body, timeout=30)
    assert r.status_code < 500, r.text
    if r.status_code != 200 or r.headers["content-type"].startswith(("text/event-stream", "application/x-ndjson")):
        return
    answer = r.json()
    if route.startswith("/v1/"):
        choice = answer["choices"][0]
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        reason = choice["finish_reason"]
    else:
        text, reason = answer.get("message", {}).get("content", answer.get("response", "")), answer.get("done_reason")
        if reason == "load":
            return
    if content.strip():
        assert text or reason != "stop", answer


# -- one origin rule for the Guard and CORS ---------------------------------------------------------

PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}


@pytest.mark.parametrize("allowed,origin,ok", [
    ("https://x.example/", "https://x.example", True),  # a trailing slash on either side
    ("https://x.example", "https://X.Example:443", True),  # case, the default port
    ("http://x.example:80", "http://x.example", True),
    ("https://x.example", "https://x.example:8443", False),
    ("chrome-extension://*", "chrome-extension://abcdefghijklmnop", True),
    ("chrome-extension://*", "moz-extension://abc", False),
    ("http://localhost:*", "http://localhost:5173", True),
    ("http://localhost:*", "http://localhost", True),
    ("http://localhost:*", "http://localhost.evil.example:80", False),
    ("https://*.example.org", "https://chat.example.org", True),
    ("https://*.example.org", "https://evilexample.org", False),
])
def test_the_guard_and_cors_read_one_origin_rule(allowed, origin, ok):
    with serving(create_app(FakeEngine(["fine"]), cors_origins=(allowed,))) as base:
        pre = httpx.options(f"{base}/v1/chat/completions", headers={"Origin": origin, **PREFLIGHT})
        post = httpx.post(f"{base}/api/chat", json={**GOOD, "stream": False}, headers={"Origin": origin})
        if ok:
            assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == origin
            assert post.status_code == 200 and post.headers["access-control-allow-origin"] == origin
        else:
            assert pre.status_code == 403 and post.status_code == 403
            assert "access-control-allow-origin" not in post.headers


def test_local_apps_and_private_network_preflights():
    with serving(create_app(FakeEngine(["fine"]), cors_local_apps=True)) as base:
        for origin in ("http://localhost:3000", "https://127.0.0.1", "tauri://localhost", "app://obsidian.md",
                       "vscode-webview://1234", "file://"):
            r = httpx.options(f"{base}/api/chat", headers={"Origin": origin, **PREFLIGHT,
                                                           "Access-Control-Request-Private-Network": "true"})
            assert r.status_code == 200, (origin, r.text)
            assert r.headers["access-control-allow-private-network"] == "true"
        r = httpx.options(f"{base}/api/chat", headers={"Origin": "https://evil.example", **PREFLIGHT,
                                                       "Access-Control-Request-Private-Network": "true"})
        assert r.status_code == 403 and "access-control-allow-private-network" not in r.headers


def test_serve_takes_origin_patterns(capsys):
    assert cli.main(["serve", "--cors-origin", "a://*/*", "--port", "0"]) == 2
    assert "one '*'" in capsys.readouterr().err
