"""`eaglechat run` on a reasoning model: stdout holds only the answer, the thinking streams to stderr framed
as `ollama run` frames it ("Thinking...", "...done thinking."), `--hide-thinking` drops it, and `--json`
gives it as its own `reasoning` field. The models are tests/thinking_models.py's tiny llamas whose greedy
reply is a `<think>` block then an answer (Qwen3's, and R1's whose prompt opens the block) or a harmony
analysis + final (gpt-oss); a model that does not reason prints as it always did."""

from __future__ import annotations

import io
import json

import pytest
from thinking_models import ANSWER, HARMONY_MESSAGES, OPENED_TEMPLATE, REASONING, save_harmony_pair, save_thinking_pair

from eaglechat.cli import main
from eaglechat.commands.run import ReplyPrinter

LOCAL = ["--device", "cpu", "--dtype", "float32", "--quant", "none", "--temperature", "0", "--no-resident",
         "--max-new-tokens", "24"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("thinkers")
    return {"think": save_thinking_pair(root / "think"), "opened": save_thinking_pair(root / "opened", OPENED_TEMPLATE),
            "harmony": save_harmony_pair(root / "harmony")}


def run(capsys, pair, *extra, prompt="The quick brown fox") -> tuple[str, str]:
    base, head = pair
    assert main(["run", str(base), prompt, "--head", str(head), *LOCAL, *extra]) == 0
    got = capsys.readouterr()
    return got.out, got.err


PROMPTS = {"think": "The quick brown fox", "opened": "The quick brown fox", "harmony": HARMONY_MESSAGES[0]["content"]}
# (reasoning, answer): harmony's messages keep the spaces the model wrote (chat/reasoning.py), a <think> block's are trimmed
SPLIT = {"think": (REASONING, ANSWER), "opened": (REASONING, ANSWER), "harmony": (f" {REASONING}", f" {ANSWER}")}


@pytest.mark.parametrize("kind", ["think", "opened", "harmony"])
def test_stdout_is_the_answer_and_the_thinking_goes_to_stderr(models, capsys, kind):
    reasoning, answer = SPLIT[kind]
    out, err = run(capsys, models[kind], prompt=PROMPTS[kind])
    assert out == f"{answer}\n"
    assert err == f"Thinking...\n{reasoning}\n...done thinking.\n\n"


@pytest.mark.parametrize("kind", ["think", "harmony"])
def test_hide_thinking_drops_it(models, capsys, kind):
    out, err = run(capsys, models[kind], "--hide-thinking", prompt=PROMPTS[kind])
    assert (out, err) == (f"{SPLIT[kind][1]}\n", "")


@pytest.mark.parametrize("kind", ["think", "opened", "harmony"])
def test_json_gives_the_reasoning_its_own_field(models, capsys, kind):
    out, err = run(capsys, models[kind], "--json", prompt=PROMPTS[kind])
    reply = json.loads(out)
    assert (reply["reasoning"], reply["text"], err) == (*SPLIT[kind], "")
    assert reply["token_ids"] and reply["stats"]["new_tokens"] == len(reply["token_ids"])
    hidden = json.loads(run(capsys, models[kind], "--json", "--hide-thinking", prompt=PROMPTS[kind])[0])
    assert hidden["text"] == SPLIT[kind][1] and "reasoning" not in hidden


def test_a_model_that_does_not_reason_prints_as_before(tmp_path, capsys):
    from tiny_models import save_tiny_pair

    from eaglechat.engine.protocol import Finished, GenerationParams, Speculate
    from eaglechat.loader import load_engine

    base, head = save_tiny_pair(tmp_path)
    out, err = run(capsys, (base, head))
    reply = json.loads(run(capsys, (base, head), "--json")[0])
    engine = load_engine(str(base), head=str(head), device="cpu", dtype="float32", quant="none")
    final = list(engine.generate([{"role": "user", "content": "The quick brown fox"}],
                                 GenerationParams(temperature=0.0, max_new_tokens=24, speculate=Speculate.ON)))[-1]
    assert isinstance(final, Finished) and final.text.strip()
    assert (out, err) == (final.text + "\n", "")
    assert reply["text"] == final.text and "reasoning" not in reply


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("no_color", ["", "1"])
def test_on_a_terminal_the_thinking_is_dimmed(monkeypatch, no_color):
    monkeypatch.setenv("NO_COLOR", no_color)
    out, err = io.StringIO(), Terminal()
    printer = ReplyPrinter(opened=False, out=out, err=err)
    for piece in ("<thi", "nk>\nplan", " it\n</th", "ink>\n\nThe answer."):
        printer.feed(piece)
    printer.close()
    dim, reset = ("", "") if no_color else (ReplyPrinter.DIM, ReplyPrinter.RESET)
    assert out.getvalue() == "The answer.\n"
    assert err.getvalue() == f"{dim}Thinking...\nplan it\n...done thinking.\n\n{reset}"


def test_a_reply_cut_off_while_thinking_closes_the_block_without_done(capsys):
    out, err = io.StringIO(), io.StringIO()
    printer = ReplyPrinter(opened=True, out=out, err=err)
    printer.feed(" still going ")
    printer.close()
    assert (out.getvalue(), err.getvalue()) == ("\n", "Thinking...\nstill going\n")


@pytest.mark.parametrize("kind", ["think", "opened"])
def test_remote_reasoning_is_kept_apart_too(models, capsys, kind):
    """An eaglechat server's reply (its raw text, the ids' spelling) is split as a local reply is (a resident
    `eaglechat serve` answers the same way); a template that opens the block in the prompt (R1's) is told
    by the server's card, as the client cannot render the prompt."""
    from serving import serving

    from eaglechat.engine.protocol import TreeBudget
    from eaglechat.loader import load_engine
    from eaglechat.server import create_app

    base, head = models[kind]
    engine = load_engine(str(base), head=str(head), tree=TreeBudget(8, 3, 4), device="cpu", dtype="float32",
                         quant="none", max_context=192)
    with serving(create_app(engine, model="thinker")) as url:
        for extra in ([], ["--json"]):
            assert main(["run", "--remote", url, "The quick brown fox", "--temperature", "0", *extra]) == 0
            got = capsys.readouterr()
            if extra:
                reply = json.loads(got.out)
                assert (reply["reasoning"], reply["text"], got.err) == (REASONING, ANSWER, "")
            else:
                assert (got.out, got.err) == (f"{ANSWER}\n", f"Thinking...\n{REASONING}\n...done thinking.\n\n")
