"""No sampling value empties a reply: every field of both APIs, drawn by hypothesis (extremes included),
on the real default model and a prompt it answers, gets a 4xx naming the field or a non-empty reply;
never a 5xx. (A repetition_penalty of 1e-38 once came back as an empty 200: dividing a logit by it
overflows fp32.)"""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serving import serving

from eaglechat.server import create_app

PROMPT = [{"role": "user", "content": "What is the capital of France?"}]
EXTREMES = [0.0, 1e-38, 0.0099, 0.01, 2.0, 2.01, -2.0, 1e308]
NUMBERS = st.one_of(st.sampled_from(EXTREMES), st.floats(-3, 3, allow_nan=False), st.integers(-3, 100))
OPENAI_FIELDS = ["temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty", "repeat_last_n",
                 "presence_penalty", "frequency_penalty", "max_tokens"]
OLLAMA_FIELDS = ["temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty", "repeat_last_n", "num_predict"]


@pytest.fixture(scope="module")
def url(shared_default_base):
    from eaglechat.loader import load_engine

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EAGLECHAT_HOME", str(shared_default_base.parents[2]))
        from eaglechat.models import default_model

        engine = load_engine(default_model.DEFAULT_ALIAS, device="cpu", dtype="float32", quant="none")
    with serving(create_app(engine)) as base:
        yield base


def ask(url: str, face: str, values: dict) -> None:
    """A 4xx naming one of `values`' fields, or a 200 with text; never a 5xx."""
    if face.startswith("/v1"):
        body = {"model": "any", "messages": PROMPT, "max_tokens": 4, "seed": 1, **values}
    else:
        body = {"model": "any", "messages": PROMPT, "stream": False,
                "options": {"num_predict": 4, "seed": 1, **values}}
    r = httpx.post(f"{url}{face}", json=body, timeout=120)
    assert r.status_code < 500, r.text
    if r.status_code != 200:
        error = r.json()["error"]
        named = error["param"] if isinstance(error, dict) else error
        assert any(name in named for name in values), (values, error)
        return
    answer = r.json()
    text = answer["choices"][0]["message"]["content"] if face.startswith("/v1") else answer["message"]["content"]
    assert text.strip(), (values, answer)


@pytest.mark.slow
def test_every_sampling_field_at_its_extremes(url):
    for face, fields in (("/v1/chat/completions", OPENAI_FIELDS), ("/api/chat", OLLAMA_FIELDS)):
        for field in fields:
            for value in EXTREMES:
                ask(url, face, {field: value})


@pytest.mark.slow
@settings(derandomize=True, max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(face=st.sampled_from(["/v1/chat/completions", "/api/chat"]), data=st.data())
def test_no_combination_of_sampling_values_empties_a_reply(url, face, data):
    fields = OPENAI_FIELDS if face.startswith("/v1") else OLLAMA_FIELDS
    ask(url, face, data.draw(st.dictionaries(st.sampled_from(fields), NUMBERS, min_size=2, max_size=4)))
