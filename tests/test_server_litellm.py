"""litellm itself (its `ollama/`, `ollama_chat/` and `openai/` providers) against the real server over a
real LocalEngine, a reasoning model's thinking included (tests/thinking_models.py: a tiny llama that
writes a fixed script). litellm is imported in the fixture, not at collection: its import takes seconds."""

from __future__ import annotations

import os

import pytest
from serving import serving
from thinking_models import ANSWER, REASONING, save_thinking_pair

from eaglechat.engine.protocol import TreeBudget
from eaglechat.loader import load_engine
from eaglechat.server import create_app

pytestmark = pytest.mark.slow  # litellm's import alone takes seconds
MESSAGES = [{"role": "user", "content": "The quick brown fox"}]


@pytest.fixture(scope="module")
def litellm():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # its model price list from the package, offline
    import litellm

    litellm.telemetry = False
    return litellm


@pytest.fixture(scope="module")
def url(tmp_path_factory, module_home):
    base, head = save_thinking_pair(tmp_path_factory.mktemp("thinker"))
    engine = load_engine(str(base), head=str(head), tree=TreeBudget(8, 3, 4), device="cpu", dtype="float32",
                         quant="none", max_context=192)
    with serving(create_app(engine, model="thinker")) as url:
        yield url


def streamed(chunks) -> tuple[str, str]:
    reasoning = content = ""
    for chunk in chunks:
        delta = chunk.choices[0].delta if chunk.choices else None
        reasoning += (getattr(delta, "reasoning_content", None) or "") if delta else ""
        content += (delta.content or "") if delta else ""
    return reasoning, content


@pytest.mark.parametrize("provider, base", [("ollama_chat", ""), ("openai", "/v1")])
def test_litellm_reads_the_reasoning_apart_whole_and_streamed(litellm, url, provider, base):
    ask = dict(model=f"{provider}/thinker", messages=MESSAGES, api_base=f"{url}{base}", api_key="unused", timeout=60)
    whole = litellm.completion(**ask)
    message = whole.choices[0].message
    assert (message.reasoning_content, message.content) == (REASONING, ANSWER)
    assert streamed(litellm.completion(**ask, stream=True)) == (REASONING, ANSWER)


def test_litellm_ollama_generate_never_puts_the_block_in_the_answer(litellm, url):
    """litellm's `ollama/` provider reads `thinking` only from streamed lines: whole, it finds the answer
    alone (it looks for <think> tags in `response`, which this server keeps out of it)."""
    ask = dict(model="ollama/thinker", messages=MESSAGES, api_base=url, timeout=60)
    whole = litellm.completion(**ask).choices[0].message
    assert whole.content == ANSWER and "<think>" not in whole.content
    assert streamed(litellm.completion(**ask, stream=True)) == (REASONING, ANSWER)


OPENAI_EFFORT = {"reasoning_effort": "none", "allowed_openai_params": ["reasoning_effort"]}  # else refused by litellm


@pytest.mark.parametrize("provider, base, ask", [
    ("ollama_chat", "", {"reasoning_effort": "none"}), ("ollama", "", {"reasoning_effort": "none"}),
    ("openai", "/v1", OPENAI_EFFORT), ("openai", "/v1", {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}),
])
def test_litellm_turns_the_switch_off(litellm, url, provider, base, ask):
    """reasoning_effort "none": litellm's Ollama providers send `think: false`, its openai provider the field
    itself (for a model it does not know, only when allowed); or vLLM's chat_template_kwargs. The template's
    switch is off and the model answers at once."""
    reply = litellm.completion(model=f"{provider}/thinker", messages=MESSAGES, api_base=f"{url}{base}", timeout=60,
                               api_key="unused", **ask)
    message = reply.choices[0].message
    assert message.content == f" {ANSWER}" and not getattr(message, "reasoning_content", None)


@pytest.mark.parametrize("provider, base", [("ollama_chat", ""), ("ollama", ""), ("openai", "/v1")])
def test_litellm_max_tokens_reaches_the_engine(litellm, url, provider, base):
    """max_tokens as litellm maps it (Ollama's num_predict): three tokens are `<think>`, `Ġqu`, `ick`, so the
    reply is cut inside the block: reasoning only (litellm's `ollama/` drops a whole reply's `thinking`;
    its Ollama providers say "stop" for any whole reply, the openai one passes "length" on)."""
    reply = litellm.completion(model=f"{provider}/thinker", messages=MESSAGES, api_base=f"{url}{base}", timeout=60,
                               api_key="unused", max_tokens=3, temperature=0)
    message = reply.choices[0].message
    assert getattr(message, "reasoning_content", None) == (None if provider == "ollama" else "quick")
    assert not message.content
    assert reply.choices[0].finish_reason == ("length" if provider == "openai" else "stop")
