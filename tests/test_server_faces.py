"""Each face of the server answers its errors in its own shape, from handlers registered on its routes:
OpenAI's `{"error": {...}}` under /v1 and at the probes, Ollama's `{"error": "..."}` under /api."""

from __future__ import annotations

import httpx
import pytest
from fake_engine import FakeEngine
from serving import serving

from eaglechat.server import create_app


@pytest.fixture(scope="module")
def url():
    with serving(create_app(FakeEngine(["fine"]), api_key="k")) as base:
        yield base


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/api/nothing", 404), ("GET", "/api/chat", 405), ("POST", "/api/chat", 401), ("POST", "/api/show", 401),
    ("GET", "/v1/nothing", 404), ("GET", "/v1/chat/completions", 405), ("POST", "/v1/chat/completions", 401),
    ("GET", "/v1/models", 401), ("GET", "/nothing", 404), ("POST", "/tokenize", 401),
])
def test_each_face_answers_in_its_own_shape(url, method, path, status):
    r = httpx.request(method, f"{url}{path}", json={"model": "fake-eagle"} if method == "POST" else None)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    if path.startswith("/api/"):
        assert isinstance(error, str) and error
    else:
        assert set(error) == {"message", "type", "param", "code"} and error["message"]


def test_refusals_before_the_route_are_counted_once(url):
    headers = {"Authorization": "Bearer k"}
    httpx.post(f"{url}/api/chat", json={"model": "fake-eagle", "messages": []}, headers=headers)
    httpx.post(f"{url}/v1/chat/completions", json={"model": "fake-eagle", "messages": []}, headers=headers)
    metrics = httpx.get(f"{url}/metrics").text
    line = next(x for x in metrics.splitlines() if x.startswith("eaglechat:request_rejected_total") and '"400"' in x)
    assert line.endswith(" 2")


@pytest.mark.parametrize("key", ["s3cret", "clé-ünïcode-鍵", "пароль"])
def test_an_api_key_is_compared_as_utf8_bytes(key):
    with serving(create_app(FakeEngine(["fine"]), api_key=key)) as base:
        for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                           ("/api/chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False})):
            right = httpx.post(f"{base}{path}", json=body, headers={"Authorization": b"Bearer " + key.encode()})
            assert right.status_code == 200, right.text
            wrong = httpx.post(f"{base}{path}", json=body, headers={"Authorization": b"Bearer " + (key + "x").encode()})
            assert wrong.status_code == 401
            latin = httpx.post(f"{base}{path}", json=body, headers={"Authorization": b"Bearer " + key.encode("utf-8", "replace")[:-1]})
            assert latin.status_code == 401
