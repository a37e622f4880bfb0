"""A reasoning model behind `--remote`: the RemoteEngine reads whether the served model has the thinking
switch (an eaglechat server's card says so), sends the chat's choice (chat_template_kwargs.enable_thinking,
a level as reasoning_effort) and gets the reasoning back where the chat can fold it: as the ids spell it
from eaglechat's server (a <think> block, harmony's channels), as a <think> block from a server that sends
it apart (vLLM's `reasoning_content`). Against the real eaglechat server over the tiny reasoning models of
tests/thinking_models.py, and a stand-in replaying vLLM's documented stream shape."""

from __future__ import annotations

import json

import pytest
from serving import serving
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from thinking_models import ANSWER, HARMONY_MESSAGES, REASONING, save_harmony_pair, save_thinking_pair

from eaglechat.chat.reasoning import split_reasoning
from eaglechat.engine.protocol import Finished, GenerationParams, TreeBudget
from eaglechat.engine.remote import RemoteEngine
from eaglechat.loader import load_engine
from eaglechat.server import create_app

MESSAGES = [{"role": "user", "content": "The quick brown fox"}]


def reply(engine, thinking, messages=MESSAGES) -> Finished:
    return list(engine.generate(messages, GenerationParams(max_new_tokens=40, thinking=thinking)))[-1]


def local(root, save):
    base, head = save(root)
    return load_engine(str(base), head=str(head), tree=TreeBudget(8, 3, 4), device="cpu", dtype="float32",
                       quant="none", max_context=192)


@pytest.fixture(scope="module")
def switch(tmp_path_factory, module_home):
    engine = local(tmp_path_factory.mktemp("switch"), save_thinking_pair)
    with serving(create_app(engine, model="thinker")) as url:
        yield engine, url


def test_the_switch_of_an_eaglechat_servers_model_reaches_its_template(switch):
    engine, url = switch
    remote = RemoteEngine(url)
    assert remote.info.thinking_switch and engine.info.thinking_switch
    for thinking in (True, False, None):
        got, want = reply(remote, thinking), reply(engine, thinking)
        assert (got.text, got.token_ids) == (want.text, want.token_ids)
    assert reply(remote, False).text == f" {ANSWER}"  # off: the template wrote an empty block, no reasoning
    split = split_reasoning(reply(remote, True).text)
    assert (split.reasoning, split.answer) == (REASONING, ANSWER)


def test_harmony_channels_come_through_as_the_ids_spell_them(tmp_path, module_home):
    engine = local(tmp_path, save_harmony_pair)
    with serving(create_app(engine, model="harmony")) as url:
        remote = RemoteEngine(url)
        assert not remote.info.thinking_switch  # gpt-oss's template has a level, not a switch
        got, want = reply(remote, None, HARMONY_MESSAGES), reply(engine, None, HARMONY_MESSAGES)
        assert (got.text, got.token_ids) == (want.text, want.token_ids)
        assert "<|channel|>final<|message|>" in got.text
        split = split_reasoning(got.text)
        assert (split.reasoning, split.answer) == (" quick brown", f" {ANSWER}")
        assert reply(remote, "high", HARMONY_MESSAGES).text == want.text  # a level reaches the template


async def test_the_chat_switches_thinking_on_a_remote_server(switch, tmp_path):
    from fake_engine import make_tui_app, replies, status_text, type_and_send, wait_ready, wait_reply
    from textual.widgets import Collapsible

    app = make_tui_app(tmp_path, RemoteEngine(switch[1]))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        assert "think on" in status_text(app)
        await type_and_send(pilot, "The quick brown fox")
        await wait_reply(pilot)
        assert (replies(app)[0].reasoning, replies(app)[0].content) == (REASONING, ANSWER)
        await pilot.press("ctrl+t")
        assert "think off" in status_text(app)
        await type_and_send(pilot, "again")
        await wait_reply(pilot)
        second = replies(app)[1]
        assert second.content.strip() == ANSWER and not second.query_one(Collapsible).display


def reasoning_stand_in(owner: str):
    """A server that answers as vLLM does with a reasoning parser: the reasoning in `reasoning_content`
    deltas (whole: in the message), then the answer; every request body is recorded."""
    seen: list[dict] = []

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": owner}]})

    async def chat(request: Request):
        body = await request.json()
        seen.append(body)
        if not body.get("stream"):
            message = {"role": "assistant", "content": "Paris.", "reasoning_content": "The capital."}
            return JSONResponse({"id": "x", "object": "chat.completion", "created": 1, "model": body["model"],
                                 "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})

        async def events():
            for delta in ({"role": "assistant", "content": ""}, {"reasoning_content": "The "},
                          {"reasoning_content": "capital."}, {"content": "Paris"}, {"content": "."}):
                chunk = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": body["model"],
                         "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])]), seen


@pytest.mark.parametrize("stream", [True, False])
def test_a_servers_reasoning_field_comes_back_as_a_think_block(stream):
    app, seen = reasoning_stand_in("vllm")
    with serving(app) as url:
        remote = RemoteEngine(url, stream=stream)
        assert not remote.info.thinking_switch  # vLLM's card does not say
        text = reply(remote, False).text
        assert text == "<think>The capital.</think>Paris."
        assert (split_reasoning(text).reasoning, split_reasoning(text).answer) == ("The capital.", "Paris.")
        reply(remote, "max")
        reply(remote, None)
    assert seen[0]["chat_template_kwargs"] == {"enable_thinking": False}
    assert seen[1]["reasoning_effort"] == "high" and "chat_template_kwargs" not in seen[1]
    assert "chat_template_kwargs" not in seen[2] and "reasoning_effort" not in seen[2]


def test_a_plain_openai_server_gets_no_chat_template_kwargs():
    app, seen = reasoning_stand_in("openai")
    with serving(app) as url:
        reply(RemoteEngine(url), True)
    assert "chat_template_kwargs" not in seen[0]
