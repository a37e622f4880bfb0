"""gpt-oss's harmony format end to end: the reply decodes whole (it ends at <|return|>, not at the <|end|> of
its analysis message), the channel markers stay in the engine's text, and the analysis channel is the
reasoning, the final channel the answer: in the splitter (whole and cut anywhere), the engine, the chat, and
both faces of the server, streamed and whole, through the real `ollama` and `openai` clients. The model is
tests/thinking_models.py's save_harmony_pair: a tiny llama whose greedy reply is a harmony analysis + final."""

from __future__ import annotations

import ollama
import openai
import pytest
from serving import serving
from thinking_models import (
    ANSWER,
    HARMONY_MARKERS,
    HARMONY_MESSAGES,
    REASONING,
    cuts_in_three,
    harmony_reply,
    save_harmony_pair,
)
from tiny_models import tiny_tokenizer

from eaglechat.chat.reasoning import channel_of, split_reasoning
from eaglechat.engine.local import stop_token_ids
from eaglechat.engine.protocol import Finished, GenerationParams, Speculate, TextDelta, TreeBudget
from eaglechat.engine.text import Detokenizer
from eaglechat.loader import load_engine
from eaglechat.models import catalog
from eaglechat.server import create_app

THOUGHT, SAID = f" {REASONING}", f" {ANSWER}"  # as the model writes them (the reply keeps its spaces)


# -- the splitter, on harmony text ----------------------------------------------------------------

TEXTS = {
    "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Answer.": ("Think.", "Answer."),
    "<|channel|>final<|message|>Only an answer.": ("", "Only an answer."),
    "<|channel|>analysis<|message|>cut before the answer<|end|><|start|>assist": ("cut before the answer", ""),
    "<|channel|>analysis<|message|>one<|end|><|start|>assistant<|channel|>commentary<|message|>Let me see."
    "<|end|><|start|>assistant<|channel|>analysis<|message|>two<|end|><|start|>assistant<|channel|>final"
    "<|message|>Done <|ret": ("one\n\ntwo", "Let me see.\n\nDone <|ret"),
    "<|start|>assistant<|channel|>final <|constrain|>text<|message|>a<b <| c": ("", "a<b <| c"),
    "<|message|>no header at all": ("", "no header at all"),
}


@pytest.mark.parametrize("text", TEXTS)
def test_harmony_text_splits_into_analysis_and_final_wherever_the_pieces_are_cut(text):
    whole = split_reasoning(text)
    assert (whole.reasoning, whole.answer) == TEXTS[text]
    for parts, got in cuts_in_three(text):
        assert got == TEXTS[text], parts


def test_where_the_answer_starts_and_whether_it_is_still_thinking():
    text = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Answer."
    done = split_reasoning(text)
    assert text[done.answer_at:] == "Answer." and not done.thinking
    for cut in ("<|chan", "<|channel|>analysis<|message|>Thi", text[:text.index("final")]):
        part = split_reasoning(cut)
        assert part.thinking and part.answer == "" and part.answer_at == len(cut), cut
    assert channel_of("assistant<|channel|>commentary to=functions.f <|constrain|>json") == "commentary"
    assert channel_of("assistant") == channel_of("<|channel|><|constrain|>json") == ""


# -- stops and text -------------------------------------------------------------------------------

def test_a_harmony_vocabulary_stops_at_return_and_call_not_at_end():
    tok = tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": HARMONY_MARKERS})
    ids = set(map(tok.convert_tokens_to_ids, ["<|return|>", "<|call|>", "<|end|>"]))
    catalog_stops = list(catalog.resolve("gpt-oss-20b-eagle3").stop_tokens)
    for extra in ([], catalog_stops):  # even where an eos says <|end|>
        stops = stop_token_ids(tok, FakeModel(eos=tok.convert_tokens_to_ids("<|end|>")), extra)
        assert ids & stops == ids - {tok.convert_tokens_to_ids("<|end|>")}
    phi = tiny_tokenizer()
    phi.add_special_tokens({"additional_special_tokens": ["<|end|>"]})  # Phi-3's end of turn stays a stop
    assert phi.convert_tokens_to_ids("<|end|>") in stop_token_ids(phi, FakeModel(eos=0))


class FakeModel:
    def __init__(self, eos: int):
        self.config = type("Config", (), {"eos_token_id": eos})()


def test_the_detokenizer_keeps_the_markers_when_asked():
    tok = tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": HARMONY_MARKERS})
    text = "<|channel|>final<|message|>caf\u00e9 eagle"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    kept, skipped = Detokenizer(tok, keep_special=True), Detokenizer(tok)
    assert "".join(kept.add([i]) for i in ids) + kept.flush() == text
    assert "".join(skipped.add([i]) for i in ids) + skipped.flush() == "finalcaf\u00e9 eagle"


# -- the engine, the chat and the server ----------------------------------------------------------

@pytest.fixture(scope="module")
def harmony(tmp_path_factory, module_home):
    base, head = save_harmony_pair(tmp_path_factory.mktemp("harmony"))
    engine = load_engine(str(base), head=str(head), tree=TreeBudget(8, 3, 4), device="cpu", dtype="float32",
                         quant="none", max_context=192)
    with serving(create_app(engine, model="harmony")) as url:
        yield engine, url


@pytest.mark.parametrize("speculate", [Speculate.OFF, Speculate.ON])
def test_the_engine_decodes_the_whole_harmony_reply_markers_kept(harmony, speculate):
    engine, _ = harmony
    events = list(engine.generate(HARMONY_MESSAGES, GenerationParams(max_new_tokens=40, speculate=speculate)))
    final = events[-1]
    assert isinstance(final, Finished) and final.stop_reason == "stop"
    assert final.token_ids == harmony_reply(engine.tokenizer)[:-1]  # all of it, up to <|return|>
    assert final.text == "".join(e.text for e in events if isinstance(e, TextDelta))
    assert final.text == f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final<|message|>{SAID}"
    split = split_reasoning(final.text)
    assert (split.reasoning, split.answer) == (THOUGHT, SAID)


def test_ollama_keeps_the_analysis_apart_whole_and_streamed(harmony):
    client = ollama.Client(host=harmony[1])
    assert "thinking" in client.show("harmony").capabilities
    for think in (None, "low", True):
        whole = client.chat("harmony", messages=HARMONY_MESSAGES, think=think)
        assert (whole.message.thinking, whole.message.content) == (THOUGHT, SAID)
    chunks = list(client.chat("harmony", messages=HARMONY_MESSAGES, think="high", stream=True))
    assert "".join(c.message.thinking or "" for c in chunks) == THOUGHT
    assert "".join(c.message.content for c in chunks) == SAID
    generated = client.generate("harmony", "Hello world", think="medium")
    assert (generated.thinking, generated.response) == (THOUGHT, SAID)


def test_openai_sends_the_analysis_as_reasoning_content_whole_and_streamed(harmony):
    client = openai.OpenAI(base_url=f"{harmony[1]}/v1", api_key="unused", max_retries=0, timeout=60)
    message = client.chat.completions.create(model="harmony", messages=HARMONY_MESSAGES).choices[0].message
    assert message.content == SAID and (message.model_extra or {}).get("reasoning_content") == THOUGHT
    chunks = list(client.chat.completions.create(model="harmony", messages=HARMONY_MESSAGES, stream=True,
                                                 reasoning_effort="low"))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == THOUGHT
    assert "".join(d.content or "" for d in deltas) == SAID
    assert not any("<|" in (d.content or "") for d in deltas)


async def test_the_chat_folds_the_analysis_and_reads_back_only_the_answer(harmony, tmp_path):
    from fake_engine import make_tui_app, replies, type_and_send, wait_ready, wait_reply
    from textual.widgets import Collapsible

    engine, _ = harmony
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await type_and_send(pilot, "Hello world")
        await wait_reply(pilot)
        (reply,) = replies(app)
        assert (reply.reasoning, reply.content) == (THOUGHT, SAID)
        assert reply.query_one(Collapsible).display
        stored = app.store.messages(app.conversation.id)[-1]
        assert (stored.content, stored.reasoning) == (SAID, THOUGHT)
        # the next turn's prompt holds the answer as a final message, and no analysis
        prompt = engine.tokenizer.decode(engine.encode(app.pane._engine_messages()))
        assert f"<|channel|>final<|message|>{SAID}<|end|>" in prompt and "analysis" not in prompt
