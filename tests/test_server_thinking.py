"""A reasoning model over both faces, through the real `ollama` and `openai` clients against the real server
over a real LocalEngine: Ollama's `think`, OpenAI's `reasoning_effort` and `chat_template_kwargs`, the
reasoning apart from the answer (streamed and whole), the `thinking` capability, and the 400s for bad
values and for thinking on a model that has none (the real default model, SmolLM2, whose template has no
switch). The reasoning model is tests/thinking_models.py: a tiny llama that writes a fixed script."""

from __future__ import annotations

import httpx
import ollama
import openai
import pytest
from serving import serving
from thinking_models import (
    ANSWER,
    EFFORT_TEMPLATE,
    OPENED_TEMPLATE,
    REASONING,
    SWITCH_TEMPLATE,
    cuts_in_three,
    save_thinking_pair,
)

from eaglechat.chat.reasoning import ReasoningStream, split_reasoning
from eaglechat.engine.protocol import TreeBudget
from eaglechat.loader import load_engine
from eaglechat.server import create_app

MESSAGES = [{"role": "user", "content": "The quick brown fox"}]


def serve(root, template: str):
    base, head = save_thinking_pair(root, template)
    engine = load_engine(str(base), head=str(head), tree=TreeBudget(8, 3, 4), device="cpu", dtype="float32",
                         quant="none", max_context=192)
    return engine, serving(create_app(engine, model="thinker"))


@pytest.fixture(scope="module")
def switch(tmp_path_factory, module_home):
    engine, server = serve(tmp_path_factory.mktemp("switch"), SWITCH_TEMPLATE)
    with server as url:
        yield engine, url


@pytest.fixture(scope="module")
def opened(tmp_path_factory, module_home):
    engine, server = serve(tmp_path_factory.mktemp("opened"), OPENED_TEMPLATE)
    with server as url:
        yield engine, url


def oa(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


# -- the splitter ---------------------------------------------------------------------------------

TEXTS = ["<think>\nplan it\n</think>\n\nThe answer.", "  <think> a  b </think>  c d ", "No thinking here.",
         "<think>unclosed  ", "<think></think>answer", "<think>\n\n</think>\n\n", " lead</think>"]


@pytest.mark.parametrize("text", TEXTS)
def test_the_stream_splits_as_the_whole_text_does_wherever_the_deltas_are_cut(text):
    """Every way of cutting the text in three (tags cut mid-way included) gives split_reasoning's answer."""
    whole = split_reasoning(text) if "</think>" not in text or "<think>" in text else None
    expected = (whole.reasoning, whole.answer) if whole else ("", text)  # no opening tag: all answer
    for parts, got in cuts_in_three(text):
        assert got == expected, parts


def test_a_stream_opened_by_the_prompt_starts_inside_the_block():
    stream = ReasoningStream(opened=True)
    pieces = [stream.feed(p) for p in ("\n", "plan", " it\n</th", "ink>\n\nok")] + [stream.flush()]
    assert "".join(r for r, _ in pieces) == "plan it" and "".join(a for _, a in pieces) == "ok"


# -- Ollama ---------------------------------------------------------------------------------------

def test_ollama_shows_the_thinking_capability(switch):
    assert "thinking" in ollama.Client(host=switch[1]).show("thinker").capabilities


@pytest.mark.parametrize("think", [None, True, "high", "max"])
def test_ollama_chat_keeps_the_thinking_apart_whole_and_streamed(switch, think):
    client = ollama.Client(host=switch[1])
    whole = client.chat("thinker", messages=MESSAGES, think=think)
    assert (whole.message.thinking, whole.message.content) == (REASONING, ANSWER)
    chunks = list(client.chat("thinker", messages=MESSAGES, think=think, stream=True))
    assert "".join(c.message.thinking or "" for c in chunks) == REASONING
    assert "".join(c.message.content for c in chunks) == ANSWER
    assert chunks[-1].done and not chunks[-1].message.thinking
    assert not any(c.message.thinking and c.message.content for c in chunks)  # a line is one or the other


def test_ollama_think_false_turns_the_switch_off(switch):
    client = ollama.Client(host=switch[1])
    reply = client.chat("thinker", messages=MESSAGES, think=False)  # no block at all: the text as written
    assert (reply.message.thinking, reply.message.content) == (None, f" {ANSWER}")
    generated = client.generate("thinker", "The quick brown fox", think=False)
    assert (generated.thinking, generated.response) == (None, f" {ANSWER}")


def test_ollama_generate_keeps_the_thinking_apart_whole_and_streamed(switch):
    client = ollama.Client(host=switch[1])
    whole = client.generate("thinker", "The quick brown fox", think=True)
    assert (whole.thinking, whole.response) == (REASONING, ANSWER)
    chunks = list(client.generate("thinker", "The quick brown fox", think=True, stream=True))
    assert "".join(c.thinking or "" for c in chunks) == REASONING and "".join(c.response for c in chunks) == ANSWER


def test_a_block_the_prompt_opened_is_reasoning(opened):
    """DeepSeek-R1's template ends the prompt with <think>: the reply carries only the closing tag."""
    engine, url = opened
    assert not engine.info.thinking_switch
    reply = ollama.Client(host=url).chat("thinker", messages=MESSAGES, think=True)
    assert (reply.message.thinking, reply.message.content) == (REASONING, ANSWER)
    chunks = list(oa(url).chat.completions.create(model="thinker", messages=MESSAGES, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == REASONING
    assert "".join(d.content or "" for d in deltas) == ANSWER


@pytest.mark.parametrize("think", ["extreme", "True"])
def test_ollama_refuses_a_bad_think_value_naming_it(switch, think):
    with pytest.raises(ollama.ResponseError) as caught:
        ollama.Client(host=switch[1]).chat("thinker", messages=MESSAGES, think=think)
    assert caught.value.status_code == 400 and caught.value.error.startswith(f"invalid think value: {think!r}")
    for value in (1, {"level": "high"}):  # what the client's own types would coerce or refuse, sent as is
        reply = httpx.post(f"{switch[1]}/api/generate", json={"model": "thinker", "prompt": "hi", "think": value})
        assert reply.status_code == 400 and reply.json()["error"].startswith("invalid think value")


# -- OpenAI ---------------------------------------------------------------------------------------

def reasoning_of(message) -> tuple:
    extra = message.model_extra or {}
    return extra.get("reasoning_content"), extra.get("reasoning")


def test_openai_reasoning_content_apart_from_the_content(switch):
    reply = oa(switch[1]).chat.completions.create(model="thinker", messages=MESSAGES)
    message = reply.choices[0].message
    assert message.content == ANSWER and reasoning_of(message) == (REASONING, REASONING)
    chunks = list(oa(switch[1]).chat.completions.create(model="thinker", messages=MESSAGES, stream=True,
                                                        reasoning_effort="high"))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(reasoning_of(d)[0] or "" for d in deltas) == REASONING
    assert "".join(reasoning_of(d)[1] or "" for d in deltas) == REASONING
    assert "".join(d.content or "" for d in deltas) == ANSWER
    assert all("<think>" not in (d.content or "") for d in deltas)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "stop" and set(reasons[:-1]) == {None}


@pytest.mark.parametrize("extra", [{"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"}])
def test_openai_turns_the_switch_off(switch, extra):
    body = {"reasoning_effort": extra["reasoning_effort"]} if "reasoning_effort" in extra else {"extra_body": extra}
    reply = oa(switch[1]).chat.completions.create(model="thinker", messages=MESSAGES, **body)
    assert reply.choices[0].message.content == f" {ANSWER}" and reasoning_of(reply.choices[0].message) == (None, None)


@pytest.mark.parametrize("body, param", [
    ({"reasoning_effort": "turbo"}, "reasoning_effort"),
    ({"reasoning_effort": 3}, "reasoning_effort"),
    ({"chat_template_kwargs": {"enable_thinking": "yes"}}, "chat_template_kwargs.enable_thinking"),
    ({"chat_template_kwargs": {"tools_in_user_message": True}}, "chat_template_kwargs.tools_in_user_message"),
    ({"chat_template_kwargs": "on"}, "chat_template_kwargs"),
])
def test_openai_refuses_bad_thinking_values_naming_the_field(switch, body, param):
    with pytest.raises(openai.BadRequestError) as caught:
        oa(switch[1]).chat.completions.create(model="thinker", messages=MESSAGES, extra_body=body)
    assert caught.value.body["param"] == param


def test_a_level_reaches_a_template_that_reads_reasoning_effort(tmp_path, module_home):
    """gpt-oss's template writes the level into its system turn: the prompt grows with the level's name,
    Ollama's "max" is its "high", and true or false change nothing there."""
    engine, server = serve(tmp_path, EFFORT_TEMPLATE)
    with server as url:
        def prompt_tokens(**body) -> int:
            reply = httpx.post(f"{url}/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1, **body}, timeout=60)
            assert reply.status_code == 200, reply.text
            return reply.json()["usage"]["prompt_tokens"]

        for level in ("low", "medium", "high"):
            assert prompt_tokens(reasoning_effort=level) == len(engine.encode(MESSAGES, level))
        assert prompt_tokens() == len(engine.encode(MESSAGES, "medium"))
        assert prompt_tokens(reasoning_effort="low") != prompt_tokens(reasoning_effort="high")
        show = ollama.Client(host=url).show("thinker")
        assert "thinking" in show.capabilities
        high = ollama.Client(host=url).generate("thinker", "The quick brown fox", think="max", options={"num_predict": 1})
        assert high.prompt_eval_count == len(engine.encode(MESSAGES, "high"))


# -- a model without thinking: the real default model ---------------------------------------------

@pytest.mark.slow
def test_a_model_without_thinking_refuses_to_think_and_accepts_not_to(default_base):
    engine = load_engine(str(default_base), device="cpu", max_context=256)
    with serving(create_app(engine, model="smollm2")) as url:
        client = ollama.Client(host=url)
        assert "thinking" not in client.show("smollm2").capabilities
        for think in (True, "low"):
            with pytest.raises(ollama.ResponseError) as caught:
                client.chat("smollm2", messages=MESSAGES, think=think)
            assert caught.value.status_code == 400 and caught.value.error == '"smollm2" does not support thinking'
        reply = client.chat("smollm2", messages=MESSAGES, think=False, options={"num_predict": 4})
        assert reply.message.content and reply.message.thinking is None
        with pytest.raises(openai.BadRequestError) as refused:
            oa(url).chat.completions.create(model="smollm2", messages=MESSAGES, reasoning_effort="high")
        assert refused.value.body["param"] == "reasoning_effort" and "does not support thinking" in refused.value.message
        plain = oa(url).chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=4, reasoning_effort="none",
                                                extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert plain.choices[0].message.content and "reasoning_content" not in (plain.choices[0].message.model_extra or {})
