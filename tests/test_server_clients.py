"""Clients as people run them, each through its real library against the real server over a real
LocalEngine (a tiny random model and head, one per module): Ollama's own default options, bodies sent
without a Content-Type (litellm's and aider's Ollama path), embeddings on both faces, and the /v1 edges
llama-server and Ollama answer (32 stop strings, max_tokens beyond the context, any model name, OpenAI's
presence and frequency penalties)."""

from __future__ import annotations

import json
import math

import httpx
import ollama
import openai
import pytest
import torch
from serving import serving
from tiny_models import save_tiny_pair

from eaglechat.engine.protocol import GenerationParams, TreeBudget
from eaglechat.loader import load_engine
from eaglechat.server import create_app

MESSAGES = [{"role": "user", "content": "The quick brown fox"}]
# more than Ollama's window of 64 tokens, so the window changes the reply
LONG = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog, then naps in the sun all day, and then the fox runs home."}]
CONTEXT = 192


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="module")
def local(pair, module_home):
    base, head = pair
    engine = load_engine(str(base), head=str(head), tree=TreeBudget(8, 3, 4), device="cpu", dtype="float32",
                         quant="none", max_context=CONTEXT)
    engine.stop_ids = set()  # a random model: replies end by length
    with serving(create_app(engine)) as url:
        yield engine, url


def oa(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def engine_text(engine, n: int, messages=MESSAGES, **params) -> str:
    events = list(engine.generate(messages, GenerationParams(max_new_tokens=n, speculate=False, **params)))
    return events[-1].text


# -- Ollama as its clients call it ------------------------------------------------------------------

def test_ollama_default_options_are_honoured_with_its_default_window(local):
    engine, url = local
    expected = engine_text(engine, 12, LONG, repetition_penalty=1.8, repeat_last_n=64)
    assert expected != engine_text(engine, 12, LONG)  # the penalty changes this reply
    client = ollama.Client(host=url)
    seen, generate = [], engine.generate
    engine.generate = lambda messages, params, cancel=None: (seen.append(params), generate(messages, params, cancel))[1]
    options = {"num_predict": 12, "repeat_penalty": 1.8, "temperature": 0, "top_k": 40, "top_p": 1.0,
               "presence_penalty": 0, "frequency_penalty": 0, "mirostat": 0, "tfs_z": 1, "typical_p": 1,
               "penalize_newline": True, "num_ctx": 2048}
    try:
        assert client.chat(model="tiny", messages=LONG, options=options, stream=False).message.content == expected
    finally:
        del engine.generate
    assert (seen[0].repetition_penalty, seen[0].repeat_last_n, seen[0].top_k) == (1.8, 64, 40)
    assert len(engine.encode(LONG)) > 64
    windowed = client.chat(model="tiny", messages=LONG, stream=False,
                           options={"num_predict": 12, "repeat_penalty": 1.8, "repeat_last_n": -1})
    assert windowed.message.content == engine_text(engine, 12, LONG, repetition_penalty=1.8)
    off = client.chat(model="tiny", messages=LONG, stream=False,
                      options={"num_predict": 12, "repeat_penalty": 1.8, "repeat_last_n": 0})
    assert off.message.content == engine_text(engine, 12, LONG)
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="tiny", messages=MESSAGES, options={"presence_penalty": 0.5}, stream=False)
    assert info.value.status_code == 400 and "repeat_last_n" in info.value.error


def test_langchain_ollama_with_a_repeat_penalty(local):
    langchain_ollama = pytest.importorskip("langchain_ollama")
    engine, url = local
    chat = langchain_ollama.ChatOllama(model="llama3.1", base_url=url, repeat_penalty=1.8, num_predict=12,
                                       temperature=0)
    assert chat.invoke(LONG[0]["content"]).content == engine_text(engine, 12, LONG, repetition_penalty=1.8,
                                                                  repeat_last_n=64)


def test_a_body_without_content_type_is_json_when_no_browser_sent_it(local):
    engine, url = local
    body = {"model": "llama3", "messages": MESSAGES, "stream": False, "options": {"num_predict": 6}}
    bare = httpx.post(f"{url}/api/chat", content=json.dumps(body).encode(), timeout=60)  # litellm's request
    assert "content-type" not in bare.request.headers
    assert bare.status_code == 200 and bare.json()["message"]["content"] == engine_text(engine, 6)
    generated = httpx.post(f"{url}/api/generate", content=json.dumps({**body, "prompt": "hi"}).encode(), timeout=60)
    assert generated.status_code == 200 and generated.json()["done"]
    browser = httpx.post(f"{url}/api/chat", content=json.dumps(body).encode(), headers={"Sec-Fetch-Site": "cross-site"})
    assert browser.status_code == 415
    assert httpx.post(f"{url}/v1/chat/completions", content=json.dumps(body).encode()).status_code == 415


# -- embeddings -----------------------------------------------------------------------------------

def reference_embedding(base, text: str) -> list[float]:
    """The definition, from a fresh transformers model: the last hidden state (after the final norm)
    mean-pooled over the text's tokens, L2-normalised."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    ids = AutoTokenizer.from_pretrained(base)(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states[-1][0]
    return torch.nn.functional.normalize(hidden.mean(0), dim=0).tolist()


def close(a, b, tol=1e-4) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


def test_embeddings_on_both_faces_through_their_clients(local, pair):
    engine, url = local
    texts = ["The quick brown fox", "jumps over the lazy dog"]
    expected = [reference_embedding(pair[0], t) for t in texts]
    assert not close(expected[0], expected[1])
    r = oa(url).embeddings.create(model="text-embedding-3-small", input=texts)  # base64 on the wire
    assert [d.index for d in r.data] == [0, 1] and r.model == engine.info.model
    assert all(close(d.embedding, e) for d, e in zip(r.data, expected))
    assert math.isclose(sum(x * x for x in r.data[0].embedding), 1.0, rel_tol=1e-5)
    assert r.usage.prompt_tokens == sum(len(engine.tokenizer(t)["input_ids"]) for t in texts)
    floats = oa(url).embeddings.create(model="x", input=texts[0], encoding_format="float")
    assert close(floats.data[0].embedding, expected[0])
    client = ollama.Client(host=url)
    embedded = client.embed(model="nomic-embed-text", input=texts)
    assert all(close(v, e) for v, e in zip(embedded.embeddings, expected)) and embedded.prompt_eval_count > 0
    assert close(client.embeddings(model="tiny", prompt=texts[1]).embedding, expected[1])
    # a chat after an embedding is unchanged (the embedding left no cached prefix behind)
    assert oa(url).chat.completions.create(model="x", messages=MESSAGES, max_tokens=6).choices[0].message.content \
        == engine_text(engine, 6)


@pytest.mark.parametrize("body,param", [({"input": []}, "input"), ({"input": [""]}, "input[0]"),
                                        ({"input": [[1, -3]]}, "input"), ({"input": 3}, "input"),
                                        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
                                        ({"input": "a", "dimensions": 7}, "dimensions")])
def test_bad_embedding_requests_are_400s_naming_the_field(local, body, param):
    engine, url = local
    r = httpx.post(f"{url}/v1/embeddings", json={"model": "x", **body}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    long = httpx.post(f"{url}/api/embed", json={"model": "x", "input": "word " * 400, "truncate": False})
    assert long.status_code == 400 and "context" in long.json()["error"]
    assert httpx.post(f"{url}/api/embed", json={"model": "x", "input": "word " * 400}).status_code == 200


# -- /v1 edges ------------------------------------------------------------------------------------

def test_v1_edges_as_llama_server_answers_them(local):
    engine, url = local
    c = oa(url)
    expected = engine_text(engine, 8)
    r = c.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=8,
                                  stop=[f"never{i}" for i in range(32)])
    assert r.choices[0].message.content == expected and r.model == engine.info.model
    prompt = len(engine.encode(MESSAGES))
    full = c.chat.completions.create(model="x", messages=MESSAGES, max_tokens=CONTEXT, extra_body={"speculate": False})
    # clamped to the room left: the reply fills the context (its last token needs no cache entry)
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens in (CONTEXT - prompt, CONTEXT - prompt + 1)
    with serving(create_app(engine, strict_model=True)) as strict:
        with pytest.raises(openai.NotFoundError):
            oa(strict).chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2)
        with pytest.raises(ollama.ResponseError) as info:
            ollama.Client(host=strict).chat(model="llama3", messages=MESSAGES)
        assert info.value.status_code == 404


def test_presence_and_frequency_penalties_are_openais(local):
    engine, url = local
    expected = engine_text(engine, 16, presence_penalty=1.5, frequency_penalty=0.7)
    assert expected != engine_text(engine, 16)
    for speculate in (False, True):
        r = oa(url).chat.completions.create(model="x", messages=MESSAGES, max_tokens=16, presence_penalty=1.5,
                                            frequency_penalty=0.7, extra_body={"speculate": speculate})
        assert r.choices[0].message.content == expected
