"""`eaglechat serve`: the OpenAI-compatible API, driven by the real `openai` client over real HTTP on
127.0.0.1, in front of the real LocalEngine (tiny random model + random head) and the scripted fake."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest
from fake_engine import FakeEngine
from serving import Recording, serving, sse_events
from tiny_models import save_tiny_pair

from eaglechat import cli
from eaglechat.engine.protocol import Speculate, TreeBudget
from eaglechat.errors import ContextTooLong
from eaglechat.loader import load_engine
from eaglechat.server import create_app

PROMPT = "The quick brown fox"
TREE = ["--total-tokens", "8", "--depth", "3", "--draft-top-k", "4"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="module")
def local(pair, module_home):
    base, head = pair
    engine = load_engine(str(base), head=str(head), tree=TreeBudget(8, 3, 4), device="cpu", dtype="float32",
                         quant="none", max_context=512)
    with serving(create_app(engine)) as url:
        yield engine, url


def client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def run_cli(pair, capsys, *extra) -> dict:
    base, head = pair
    code = cli.main(["run", str(base), "--head", str(head), "--json", "--device", "cpu", "--dtype", "float32",
                     "--quant", "none", "--max-context", "512", *TREE, *extra, PROMPT])
    assert code == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("speculate", [True, False, "auto"])
def test_greedy_equals_eaglechat_run_streamed_and_whole(local, pair, capsys, speculate):
    engine, url = local
    expected = run_cli(pair, capsys, "--max-new-tokens", "24", *([] if speculate else ["--no-speculate"]))
    messages = [{"role": "user", "content": PROMPT}]
    prompt_tokens = len(engine.encode(messages))
    c = client(url)
    assert engine.info.speculate_by_default == "auto"  # a head and the shipped profile: what a bare request gets
    extra = {} if speculate == "auto" else {"speculate": speculate}
    whole = c.chat.completions.create(model=engine.info.model, messages=messages, max_tokens=24, temperature=0,
                                      extra_body=extra)
    assert whole.choices[0].message.content == expected["text"]
    assert whole.choices[0].finish_reason == {"stop": "stop", "length": "length"}[expected["stop_reason"]]
    assert whole.usage.completion_tokens == len(expected["token_ids"])
    assert whole.usage.prompt_tokens == prompt_tokens
    assert whole.usage.total_tokens == prompt_tokens + len(expected["token_ids"])

    chunks = list(c.chat.completions.create(model=engine.info.model, messages=messages, max_tokens=24, stream=True,
                                            stream_options={"include_usage": True}, extra_body=extra))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == expected["text"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(expected["token_ids"])
    assert chunks[-1].usage.prompt_tokens == prompt_tokens
    spec = chunks[-1].model_extra["metrics"]["speculative_decoding"]
    own = chunks[-1].model_extra["metrics"]["eaglechat"]
    if speculate:
        hist = spec["acceptance_histogram"]
        assert spec["num_accepted_draft_tokens"] == sum(i * n for i, n in enumerate(hist))
        steps = spec["num_spec_steps"]  # speculative steps (under auto, plain ones are not drafts)
        assert spec["mean_acceptance_length"] == pytest.approx(1 + spec["num_accepted_draft_tokens"] / steps if steps else 0)
        assert steps == sum(hist) <= own["target_forwards"]
    if speculate is True:
        assert spec["num_spec_steps"] == expected["stats"]["target_forwards"] == own["target_forwards"]
        assert spec["num_draft_tokens"] == 8 * spec["num_spec_steps"]  # the full 8-node tree every step
        assert own["speculate"] is True and own["speculation"] == ""
    elif speculate == "auto":  # plain and EAGLE steps interleaved: a plain step drafts nothing
        assert spec["num_draft_tokens"] <= 8 * spec["num_spec_steps"]
        assert own["speculate"] is True and own["speculation"].startswith("auto")
    else:
        assert spec is None and chunks[-1].model_extra["metrics"]["eaglechat"]["tau"] == 1.0


def test_stream_is_shaped_like_the_openai_api(local):
    engine, url = local
    body = {"model": engine.info.model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 12,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == engine.info.model for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0] is chunks[-2] and finals[0]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == [] and set(chunks[-1]["usage"]) >= {"prompt_tokens", "completion_tokens", "total_tokens"}
    # without include_usage: no usage chunk
    body.pop("stream_options")
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]" and all(e["choices"] for e in events[:-1])


def test_prometheus_counters_add_up_the_requests(local):
    engine, url = local

    def counters():
        text = httpx.get(f"{url}/metrics").text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    before = counters()
    c = client(url)
    # speculating at every step: under the default, auto, how many steps speculate depends on timing
    r = c.chat.completions.create(model=engine.info.model, messages=[{"role": "user", "content": "Hello world"}],
                                  max_tokens=20, extra_body={"speculate": True})
    spec = r.model_extra["metrics"]["speculative_decoding"]
    after = counters()
    label = f'{{model_name="{engine.info.model}"}}'

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    assert delta(f"eaglechat:spec_decode_num_drafts_total{label}") == spec["num_spec_steps"] > 0
    assert delta(f"eaglechat:spec_decode_num_draft_tokens_total{label}") == spec["num_draft_tokens"]
    assert delta(f"eaglechat:spec_decode_num_accepted_tokens_total{label}") == spec["num_accepted_draft_tokens"]
    assert delta(f"eaglechat:generation_tokens_total{label}") == r.usage.completion_tokens
    pos0 = f'eaglechat:spec_decode_num_accepted_tokens_per_pos_total{{model_name="{engine.info.model}",position="0"}}'
    assert delta(pos0) == sum(spec["acceptance_histogram"][1:])


def test_models_and_health(local):
    engine, url = local
    models = client(url).models.list()
    assert [m.id for m in models.data] == [engine.info.model]
    card = models.data[0].model_extra
    assert card["max_model_len"] == 512 and card["eaglechat"]["tree"]["total_tokens"] == 8
    assert models.data[0].owned_by == "eaglechat"
    assert httpx.get(f"{url}/health").json()["status"] == "ok"


def test_a_prompt_beyond_the_context_is_a_400_streamed_or_not(local):
    engine, url = local
    huge = [{"role": "user", "content": "fox " * 600}]  # the context holds 512
    count = httpx.post(f"{url}/tokenize", json={"model": engine.info.model, "messages": huge}).json()
    assert count["count"] == len(engine.encode(huge)) > count["max_model_len"] == 512
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            r = client(url).chat.completions.create(model=engine.info.model, messages=huge, max_tokens=4, stream=stream)
            list(r) if stream else None
        assert info.value.body["code"] == "context_length_exceeded" and info.value.body["param"] == "messages"


# -- one at a time, in arrival order; a full queue says so; a client that leaves cancels ------------

def test_concurrent_requests_are_serialised_and_all_complete():
    engine = Recording(FakeEngine(["one two three four five six seven eight"], step_delay=0.01))
    with serving(create_app(engine)) as url:
        results: dict[int, str] = {}

        def ask(i):
            r = client(url).chat.completions.create(model="fake-eagle", messages=[{"role": "user", "content": f"q{i}"}],
                                                    stream=i % 2 == 0)
            results[i] = r.choices[0].message.content if i % 2 else "".join(
                ch.choices[0].delta.content or "" for ch in r if ch.choices)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert results == {i: "one two three four five six seven eight" for i in range(6)}
    spans = sorted(engine.spans)
    assert len(spans) == 6
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))  # never overlapping


def test_requests_run_in_arrival_order_and_a_full_queue_answers_429():
    fake = FakeEngine(lambda messages: messages[-1]["content"] + " done", pause_after_steps=1)
    engine = Recording(fake)
    order = []
    fake_generate = fake.generate

    def generate(messages, params, cancel=None):
        order.append(messages[-1]["content"])
        return fake_generate(messages, params, cancel)

    fake.generate = generate
    with serving(create_app(engine, max_queue=2)) as url:
        answers = {}

        def ask(name):
            answers[name] = client(url).chat.completions.create(
                model="fake-eagle", messages=[{"role": "user", "content": name}]).choices[0].message.content

        first = threading.Thread(target=ask, args=("first",))
        first.start()
        assert fake.paused.wait(10)  # "first" is running and holds the engine
        waiting = []
        for name in ("second", "third"):
            waiting.append(threading.Thread(target=ask, args=(name,)))
            waiting[-1].start()
            deadline = time.monotonic() + 10
            while httpx.get(f"{url}/health").json()["waiting"] < len(waiting) and time.monotonic() < deadline:
                time.sleep(0.01)
        with pytest.raises(openai.RateLimitError) as info:
            client(url).chat.completions.create(model="fake-eagle", messages=[{"role": "user", "content": "fourth"}])
        assert int(info.value.response.headers["retry-after"]) >= 1
        assert info.value.body["code"] == "queue_full"
        fake.resume.set()
        for t in [first, *waiting]:
            t.join(30)
    assert order == ["first", "second", "third"]
    assert answers == {n: f"{n} done" for n in ("first", "second", "third")}


def test_a_client_that_disconnects_mid_stream_cancels_its_generation():
    fake = FakeEngine(["a b c d e f g h i j k l"], tokens_per_step=1, pause_after_steps=2)
    engine = Recording(fake)
    with serving(create_app(engine)) as url:
        body = {"model": "fake-eagle", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and '"content": "a"' in line:
                    break  # one token seen; leaving the block closes the connection
        # the response is closed: the server must set the cancel event the engine is watching
        assert engine.cancels[0].wait(10)
        # and the engine is free for the next request
        fake.pause_after_steps = None
        r = client(url).chat.completions.create(model="fake-eagle", messages=[{"role": "user", "content": "again"}])
        assert r.choices[0].message.content == "a b c d e f g h i j k l"


def test_a_client_that_disconnects_while_waiting_for_a_whole_reply_cancels():
    fake = FakeEngine(["a b c"], pause_after_steps=1)
    engine = Recording(fake)
    with serving(create_app(engine)) as url:
        body = {"model": "fake-eagle", "messages": [{"role": "user", "content": "hi"}]}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=0.5))
        assert engine.cancels[0].wait(10)


def test_stop_strings_end_the_reply_before_them():
    engine = FakeEngine(["Hello! I am a **fake** engine."], tokens_per_step=1)
    with serving(create_app(engine)) as url:
        c = client(url)
        whole = c.chat.completions.create(model="fake-eagle", messages=[{"role": "user", "content": "hi"}],
                                          stop=["**f", "zzz"])
        assert whole.choices[0].message.content == "Hello! I am a "
        assert whole.choices[0].finish_reason == "stop"
        chunks = list(c.chat.completions.create(model="fake-eagle", messages=[{"role": "user", "content": "hi"}],
                                                stop="am a", stream=True))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "Hello! I "


# -- bad input: its 4xx, an OpenAI-style body naming the parameter, and the server keeps serving ------

GOOD = {"model": "fake-eagle", "messages": [{"role": "user", "content": "hi"}]}
BAD = [
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    ({"n": 2}, 400, "n"),
    ({"logprobs": True}, 400, "logprobs"),
    ({"top_logprobs": 3}, 400, "top_logprobs"),
    ({"max_tokens": -5}, 400, "max_tokens"),
    ({"max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ({"temperature": 3}, 400, "temperature"),
    ({"temperature": "hot"}, 400, "temperature"),
    ({"top_p": 0}, 400, "top_p"),
    ({"presence_penalty": 2.5}, 400, "presence_penalty"),
    ({"frequency_penalty": "much"}, 400, "frequency_penalty"),
    ({"repetition_penalty": 1e-38}, 400, "repetition_penalty"),
    ({"repetition_penalty": 0.001}, 400, "repetition_penalty"),
    ({"repeat_last_n": -2}, 400, "repeat_last_n"),
    ({"response_format": {"type": "json_object"}}, 400, "response_format"),
    ({"stop": [str(i) for i in range(33)]}, 400, "stop"),
    ({"stop": ["a", ""]}, 400, "stop"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "messages[0].content"),
    ({"model": 4}, 400, "model"),
    ({"speculate": "yes"}, 400, "speculate"),
    ({"speculate": 1}, 400, "speculate"),
]


@pytest.fixture(scope="module")
def fake_server():
    engine = FakeEngine(["fine"])
    with serving(create_app(engine, api_key="s3cret", max_body_bytes=4096)) as url:
        yield url


def post(url, body=None, *, key="s3cret", content=None):
    return httpx.post(f"{url}/v1/chat/completions", json=body, content=content, timeout=30,
                      headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})})


@pytest.mark.parametrize("change,status,param", BAD, ids=[p for _, _, p in BAD])
def test_each_bad_parameter_gets_its_error(fake_server, change, status, param):
    r = post(fake_server, {**GOOD, **change})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] and error["message"]
    assert post(fake_server, GOOD).json()["choices"][0]["message"]["content"] == "fine"


def test_speculate_is_true_false_or_auto_and_absent_is_the_engines_default():
    """`speculate`: true, false or "auto" reach the engine as they are; absent, the engine's default
    (a loaded head: "auto", the engine measuring plain and EAGLE steps while decoding); anything else is
    a 400 naming it, on the OpenAI routes and Ollama's."""
    engine = FakeEngine(["fine"])
    engine.info.head, engine.info.speculate_by_default = "fake-head", "auto"
    with serving(create_app(engine)) as url:
        c = client(url)
        card = c.models.list().data[0].model_extra
        assert card["eaglechat"]["speculate_by_default"] == "auto"
        sent = []
        for extra in ({}, {"speculate": "auto"}, {"speculate": True}, {"speculate": False}):
            r = c.chat.completions.create(model="fake-eagle", messages=[{"role": "user", "content": "hi"}],
                                          extra_body=extra)
            assert r.choices[0].message.content == "fine"
            sent.append(engine.calls[-1][1].speculate)
        assert sent == [Speculate.AUTO, Speculate.AUTO, Speculate.ON, Speculate.OFF]
        own = r.model_extra["metrics"]["eaglechat"]
        assert own["speculate"] is False and own["speculation"] == ""
        r = c.chat.completions.create(model="fake-eagle", messages=[{"role": "user", "content": "hi"}])
        assert r.model_extra["metrics"]["eaglechat"]["speculation"] == "auto: on 1.5x"
        assert r.model_extra["metrics"]["speculative_decoding"]["num_spec_steps"] > 0  # auto counts as speculative
        c.completions.create(model="fake-eagle", prompt="hi")
        assert engine.calls[-1][1].speculate == "auto"
        for route, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                            ("/v1/completions", {"prompt": "hi"}),
                            ("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "stream": False}),
                            ("/api/generate", {"prompt": "hi", "stream": False})):
            assert httpx.post(f"{url}{route}", json={"model": "fake-eagle", **body}, timeout=30).status_code == 200
            assert engine.calls[-1][1].speculate == "auto", route
            for bad in ("on", 1, [True]):
                r = httpx.post(f"{url}{route}", json={"model": "fake-eagle", "speculate": bad, **body}, timeout=30)
                assert r.status_code == 400, (route, bad, r.text)
                error = r.json()["error"]
                message = error if isinstance(error, str) else error["message"]  # Ollama's shape, OpenAI's
                assert message == "'speculate' must be true, false or \"auto\"", r.text
                assert isinstance(error, str) or error["param"] == "speculate"
            r = httpx.post(f"{url}{route}", json={"model": "fake-eagle", "speculate": False, **body}, timeout=30)
            assert r.status_code == 200 and engine.calls[-1][1].speculate is Speculate.OFF
    # an engine without a head (serve --no-speculate): a bare request decodes plainly
    plain = FakeEngine(["fine"])
    plain.info.speculate_by_default = False
    with serving(create_app(plain)) as url:
        client(url).chat.completions.create(model="fake-eagle", messages=[{"role": "user", "content": "hi"}])
        assert plain.calls[-1][1].speculate is Speculate.OFF


def test_bad_json_too_large_body_and_wrong_key(fake_server):
    for bad in (b"{not json", b'{"temperature": NaN, "messages": [{"role": "user", "content": "hi"}]}', b"[1, 2]", b"[" * 2000 + b"]" * 2000):
        r = post(fake_server, content=bad, key="s3cret")
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", bad[:20]
    r = post(fake_server, {**GOOD, "messages": [{"role": "user", "content": "x" * 5000}]})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    with pytest.raises(openai.AuthenticationError):
        client(fake_server, key="wrong").chat.completions.create(**GOOD)
    assert post(fake_server, GOOD, key=None).status_code == 401
    assert httpx.get(f"{fake_server}/v1/models").status_code == 401
    assert httpx.get(f"{fake_server}/health").status_code == 200  # probes need no key
    assert client(fake_server, key="s3cret").chat.completions.create(**GOOD).choices[0].message.content == "fine"


def test_accepted_no_op_parameters(fake_server):
    r = post(fake_server, {**GOOD, "n": 1, "user": "me", "presence_penalty": 0, "frequency_penalty": 0.0,
                           "tools": [], "tool_choice": "none", "logprobs": False, "seed": 3, "top_k": -1,
                           "response_format": {"type": "text"}, "stream": False, "parallel_tool_calls": True})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("error,status,code", [
    (RuntimeError("boom"), 500, "internal_error"),
    (ContextTooLong("the prompt is 9999 tokens but the context limit is 2048"), 400, "context_length_exceeded"),
])
def test_engine_errors_are_contained(error, status, code):
    engine = FakeEngine(["fine"], error=error)
    with serving(create_app(engine)) as url:
        r = post(url, GOOD, key=None)
        assert r.status_code == status and r.json()["error"]["code"] == code
        with httpx.stream("POST", f"{url}/v1/chat/completions", json={**GOOD, "stream": True}) as s:
            events = sse_events(s.iter_lines())
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == code
        engine.error = None
        assert post(url, GOOD, key=None).json()["choices"][0]["message"]["content"] == "fine"


# -- the command ------------------------------------------------------------------------------------

def test_serve_warns_loudly_without_a_key_on_all_interfaces(monkeypatch, capsys):
    import eaglechat.loader as load
    from eaglechat.errors import ModelNotFound

    def refuse(*args, **kwargs):
        raise ModelNotFound("stop here")

    monkeypatch.delenv("EAGLECHAT_API_KEY", raising=False)
    monkeypatch.setattr(load, "load_engine", refuse)
    assert cli.main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert "WARNING" in err and "WITHOUT an API key" in err and "stop here" in err
    monkeypatch.setenv("EAGLECHAT_API_KEY", "k")
    assert cli.main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 1
    assert "WARNING" not in capsys.readouterr().err


def test_serve_on_a_busy_port_is_one_line(capsys):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert cli.main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"127.0.0.1:{port}" in err[0]


@pytest.mark.slow
def test_default_model_greedy_equals_eaglechat_run(capsys, default_base):
    """The real default model: the server's greedy reply is `eaglechat run`'s, token for token."""
    from eaglechat.models import default_model

    prompt = "Write a haiku about eagles."
    assert cli.main(["run", default_model.DEFAULT_ALIAS, prompt, "--json", "--max-new-tokens", "48", "--temperature", "0",
                     "--quant", "none", "--device", "cpu", "--dtype", "float32", "--speculate", "on"]) == 0
    expected = json.loads(capsys.readouterr().out)
    engine = load_engine(default_model.DEFAULT_ALIAS, device="cpu", dtype="float32", quant="none")
    with serving(create_app(engine)) as url:
        c = client(url)
        messages = [{"role": "user", "content": prompt}]
        # EAGLE on, as run was asked (the same verify steps); the stream below with the server's default, auto
        whole = c.chat.completions.create(model=default_model.DEFAULT_ALIAS, messages=messages, max_tokens=48,
                                          temperature=0, extra_body={"speculate": True})
        chunks = list(c.chat.completions.create(model=default_model.DEFAULT_ALIAS, messages=messages, temperature=0,
                                                max_tokens=48, stream=True, stream_options={"include_usage": True}))
    assert whole.choices[0].message.content == expected["text"]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == expected["text"]
    assert whole.usage.completion_tokens == chunks[-1].usage.completion_tokens == len(expected["token_ids"])
    assert whole.model_extra["metrics"]["speculative_decoding"]["num_spec_steps"] == expected["stats"]["target_forwards"]
