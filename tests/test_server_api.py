"""The API surface clients call, each through its real client library over real HTTP: `openai`
(/v1/completions, fill-in-the-middle, /v1/models/{id}), `ollama` (the native /api routes), and
`eaglechat run --remote`; in front of one real LocalEngine per module (a tiny random model whose
tokenizer has StarCoder's FIM tokens, plus a random head)."""

from __future__ import annotations

import json

import httpx
import ollama
import openai
import pytest
from fake_engine import FakeEngine
from serving import serving, sse_events
from tiny_models import save_tiny_pair

from eaglechat import cli
from eaglechat.engine.fim import fim_prompt
from eaglechat.engine.protocol import GenerationParams, TreeBudget
from eaglechat.loader import load_engine
from eaglechat.server import create_app

FIM = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"), special_tokens=FIM)


@pytest.fixture(scope="module")
def local(pair, module_home):
    base, head = pair
    engine = load_engine(str(base), head=str(head), tree=TreeBudget(8, 3, 4), device="cpu", dtype="float32",
                         quant="none", max_context=256)
    engine.stop_ids = set()  # a random model: replies end by length, so an empty "stop" is always a bug
    with serving(create_app(engine, aliases=("tiny",))) as url:
        yield engine, url


def oa(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def plain_text(engine, prompt_ids, n, speculate=False) -> str:
    events = list(engine.generate_ids(prompt_ids, GenerationParams(max_new_tokens=n, speculate=speculate)))
    return events[-1].text


# -- /v1/completions ------------------------------------------------------------------------------

def test_completions_continue_the_raw_prompt_streamed_and_whole(local):
    engine, url = local
    ids = engine.tokenizer(PROMPT)["input_ids"]
    expected = plain_text(engine, ids, 12)
    c = oa(url)
    whole = c.completions.create(model=engine.info.model, prompt=PROMPT, max_tokens=12, temperature=0)
    assert whole.object == "text_completion" and whole.choices[0].text == expected
    assert whole.choices[0].finish_reason == "length" and whole.usage.prompt_tokens == len(ids)
    assert whole.usage.completion_tokens == 12
    chunks = list(c.completions.create(model="tiny", prompt=[PROMPT], max_tokens=12, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"speculate": False}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == expected
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12
    assert len(c.completions.create(model=engine.info.model, prompt=PROMPT).choices[0].text) > 0  # default 16 tokens


def test_suffix_fills_in_the_middle_in_the_models_fim_format(local):
    engine, url = local
    vocab = engine.tokenizer.get_vocab()
    ids = fim_prompt(engine.tokenizer, "def add(a, b):", "\n    return c")
    enc = engine.tokenizer("def add(a, b):", add_special_tokens=False)["input_ids"]
    assert ids[0] == vocab["<fim_prefix>"] and ids[1:1 + len(enc)] == enc
    assert ids[1 + len(enc)] == vocab["<fim_suffix>"] and ids[-1] == vocab["<fim_middle>"]
    typed = fim_prompt(engine.tokenizer, "a<fim_middle>b", "c")  # typed marker text stays text
    assert typed.count(vocab["<fim_middle>"]) == 1
    r = oa(url).completions.create(model=engine.info.model, prompt="def add(a, b):", suffix="\n    return c",
                                   max_tokens=6)
    assert r.choices[0].text == plain_text(engine, ids, 6)


def test_suffix_on_a_model_without_fim_tokens_is_a_400_naming_it():
    with serving(create_app(FakeEngine(["fine"]))) as url:
        with pytest.raises(openai.BadRequestError) as info:
            oa(url).completions.create(model="fake-eagle", prompt="a", suffix="b")
        assert info.value.body["param"] == "suffix" and "fill-in-the-middle" in info.value.body["message"]
        assert oa(url).completions.create(model="fake-eagle", prompt="a").choices[0].text == "fine"
        for bad, param in (({"prompt": ["a", "b"]}, "prompt"), ({"prompt": 3}, "prompt"), ({"echo": True}, "echo"),
                           ({"best_of": 2}, "best_of"), ({"logprobs": 2}, "logprobs")):
            r = httpx.post(f"{url}/v1/completions", json={"model": "fake-eagle", "prompt": "a", **bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


# -- /v1/models/{id} ------------------------------------------------------------------------------

def test_models_retrieve_by_id_and_alias(local):
    engine, url = local
    c = oa(url)
    card = c.models.retrieve(engine.info.model)
    assert card.id == engine.info.model and card.model_extra["max_model_len"] == 256
    assert c.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("gpt-4o")


# -- degenerate values through the real engine: a reply or a 400, never an empty "stop" ------------

@pytest.mark.parametrize("change", [{"top_p": 1e-300, "temperature": 1.0}, {"temperature": 5e-324},
                                    {"temperature": 1e-40}, {"min_p": 1.0, "temperature": 1.5}])
def test_sampling_values_that_leave_one_token_decode_greedily(local, change):
    engine, url = local
    greedy = oa(url).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0)
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "max_tokens": 6,
                                                       "seed": 1, **change}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == greedy.choices[0].message.content != ""


def test_a_chat_template_that_raises_is_its_own_message_in_a_400(local):
    engine, url = local
    template = engine.tokenizer.chat_template
    engine.tokenizer.chat_template = "{{ raise_exception('Conversation roles must alternate user/assistant') }}"
    try:
        for route, body in (("/v1/chat/completions", {"messages": MESSAGES}), ("/tokenize", {"messages": MESSAGES})):
            r = httpx.post(f"{url}{route}", json=body, timeout=30)
            assert r.status_code == 400, r.text
            assert "roles must alternate" in r.json()["error"]["message"]
    finally:
        engine.tokenizer.chat_template = template


def test_a_chat_template_that_raises_is_one_line_through_eaglechat_run(tmp_path, capsys, module_home):
    base, head = save_tiny_pair(tmp_path, chat_template="{{ raise_exception('roles must alternate') }}")
    code = cli.main(["run", str(base), "--head", str(head), "--device", "cpu", "--quant", "none",
                     "--max-new-tokens", "2", "hi"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "roles must alternate" in err[0], err


# -- the Ollama API through the `ollama` client -----------------------------------------------------

def test_ollama_client_lists_shows_and_reports_the_model(local):
    engine, url = local
    client = ollama.Client(host=url)
    models = client.list().models
    assert [m.model for m in models] == [engine.info.model] and models[0].details.family == "llama"
    shown = client.show(engine.info.model)
    assert shown.modelinfo["llama.context_length"] == 256 and "insert" in shown.capabilities
    assert "<|im_start|>" in shown.template
    running = client.ps().models
    assert running[0].model == engine.info.model and running[0].context_length == 256
    assert httpx.get(f"{url}/api/version").json()["version"]
    assert httpx.get(f"{url}/").status_code == 200
    assert client.show("llama3:8b").capabilities == shown.capabilities  # any name: the served model


def test_ollama_chat_and_generate_equal_the_openai_replies(local):
    engine, url = local
    client = ollama.Client(host=url)
    expected = oa(url).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10).choices[0].message.content
    whole = client.chat(model=f"{engine.info.model}:latest", messages=MESSAGES, stream=False,
                        options={"num_predict": 10, "temperature": 0, "num_ctx": 4096, "repeat_penalty": 1.0})
    assert whole.message.content == expected and whole.done and whole.done_reason == "length"
    assert whole.eval_count == 10 and whole.prompt_eval_count == len(engine.encode(MESSAGES))
    parts = list(client.chat(model="tiny", messages=MESSAGES, options={"num_predict": 10}, stream=True))
    assert "".join(p.message.content for p in parts) == expected and parts[-1].done and not parts[0].done
    generated = client.generate(model="tiny", prompt=PROMPT, options={"num_predict": 10}, stream=False)
    assert generated.response == expected  # not raw: the prompt goes through the chat template
    raw = "".join(p.response for p in client.generate(model="tiny", prompt=PROMPT, raw=True, options={"num_predict": 8},
                                                   stream=True))
    assert raw == plain_text(engine, engine.tokenizer(PROMPT)["input_ids"], 8)
    fim = client.generate(model="tiny", prompt="def f():", suffix="  return x", options={"num_predict": 5}, stream=False)
    assert fim.response == plain_text(engine, fim_prompt(engine.tokenizer, "def f():", "  return x"), 5)
    loaded = client.generate(model="tiny", prompt="")
    assert loaded.done and loaded.done_reason == "load"


@pytest.mark.parametrize("options,name", [({"repeat_penalty": 0.001}, "repeat_penalty"), ({"mirostat": 2}, "mirostat"),
                                          ({"repeat_last_n": -3, "repeat_penalty": 1.1}, "repeat_last_n"),
                                          ({"frobnicate": 1}, "frobnicate"), ({"temperature": 7}, "temperature"),
                                          ({"num_predict": 0}, "num_predict"), ({"seed": 2**64}, "seed")])
def test_ollama_options_that_would_change_the_output_are_refused(local, options, name):
    engine, url = local
    with pytest.raises(ollama.ResponseError) as info:
        ollama.Client(host=url).chat(model="tiny", messages=MESSAGES, options=options, stream=False)
    assert info.value.status_code == 400 and name in info.value.error


def test_repetition_penalty_through_both_apis_is_the_engines(local):
    engine, url = local
    ids = engine.encode(MESSAGES)
    expected = list(engine.generate_ids(ids, GenerationParams(max_new_tokens=10, repetition_penalty=1.4, speculate=False)))
    r = oa(url).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10,
                                        extra_body={"repetition_penalty": 1.4})
    assert r.choices[0].message.content == expected[-1].text
    o = ollama.Client(host=url).chat(model="tiny", messages=MESSAGES, stream=False,
                                     options={"num_predict": 10, "repeat_penalty": 1.4, "repeat_last_n": -1})
    assert o.message.content == expected[-1].text


def test_ollama_stream_is_ndjson(local):
    engine, url = local
    body = {"model": "tiny", "messages": MESSAGES, "options": {"num_predict": 4, "seed": -1}}
    with httpx.stream("POST", f"{url}/api/chat", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    assert {"total_duration", "eval_count", "prompt_eval_count", "created_at"} <= set(lines[-1])


# -- eaglechat's own client ----------------------------------------------------------------------

def test_eaglechat_run_remote_against_the_server(local, capsys):
    engine, url = local
    assert cli.main(["run", "--remote", url, "--json", "--max-new-tokens", "8", PROMPT]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = oa(url).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8).choices[0].message.content
    assert out["text"] == expected and len(out["token_ids"]) == 8


def test_streamed_chat_completion_shape_unchanged(local):
    engine, url = local
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
        events = sse_events(r.iter_lines())
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-2]["choices"][0]["delta"] == {} and events[-2]["choices"][0]["finish_reason"] == "length"
