"""A chat template that runs past its time limit on the real server: that request gets a 400 naming the
limit, and the requests beside it are answered meanwhile (each render has a worker process of its own)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from serving import serving
from tiny_models import save_tiny_pair

from eaglechat.engine import templates
from eaglechat.engine.protocol import TreeBudget
from eaglechat.loader import load_engine
from eaglechat.server import create_app

# slow only for a message that is a link: one urlize over 30 MB of text (17-40 s in-process); built from
# the message, not a constant, which Jinja would fold (run) while compiling the template for every request
SLOW_FOR_ONE = ("{% if messages[-1]['content'].startswith('www.') %}{{ (messages[-1]['content'] * 3000000) | urlize }}"
                "{% endif %}"
                "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def local(tmp_path_factory, module_home):
    base, head = save_tiny_pair(tmp_path_factory.mktemp("pair"))
    engine = load_engine(str(base), head=str(head), tree=TreeBudget(8, 3, 4), device="cpu", dtype="float32",
                         quant="none", max_context=256)
    with serving(create_app(engine, aliases=("tiny",))) as url:
        yield engine, url


def test_a_slow_template_render_is_a_400_and_holds_up_no_other_request(local, monkeypatch):
    engine, url = local
    monkeypatch.setattr(templates, "RENDER_SECONDS", 2.0)
    monkeypatch.setattr(engine.tokenizer, "chat_template", SLOW_FOR_ONE)
    templates._Worker().give_back()  # with the one the engine started: two wait, as after two requests at once
    slow = {}

    def ask_slow():
        slow["answer"] = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "www.a.com "}], "max_tokens": 2})

    thread = threading.Thread(target=ask_slow)
    thread.start()
    time.sleep(0.5)
    fast = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert fast.status_code == 200, fast.text
    assert thread.is_alive()  # answered while the slow render still ran
    thread.join()
    assert slow["answer"].status_code == 400
    assert "ran for more than 2 s; refusing to render it" in slow["answer"].json()["error"]["message"]
