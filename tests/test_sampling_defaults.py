"""Each model's own sampling defaults: read from its generation_config.json (or the catalog manifest),
filled into what the user or client leaves unset by `run`, the chat and (through the same function)
the server; an explicit temperature 0 stays greedy."""

import json

import pytest
import yaml
from fake_engine import FakeEngine, make_tui_app, type_and_send, wait_ready, wait_reply

from eaglechat import cli
from eaglechat.engine.protocol import GenerationParams
from eaglechat.models import catalog
from eaglechat.models import sampling as sampling_defaults

QWEN3 = {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
         "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"}  # Qwen/Qwen3-8B
LLAMA31 = {"bos_token_id": 128000, "do_sample": True, "eos_token_id": [128001, 128008, 128009],
           "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.42.3"}  # meta-llama/Llama-3.1-8B-Instruct
SMOLLM2 = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "transformers_version": "4.42.3"}


def test_a_generation_config_is_read_as_transformers_means_it():
    assert sampling_defaults.from_generation_config(QWEN3) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert sampling_defaults.from_generation_config(LLAMA31) == {"temperature": 0.6, "top_p": 0.9}
    assert sampling_defaults.from_generation_config(SMOLLM2) == {}  # greedy
    # without do_sample transformers decodes greedily whatever the temperature says; the penalty still applies
    assert sampling_defaults.from_generation_config({"temperature": 0.7, "repetition_penalty": 1.05}) == {"repetition_penalty": 1.05}
    assert sampling_defaults.from_generation_config({"do_sample": True}) == {"temperature": 1.0}
    # values no sampler takes are left out, never an error: a model's own file does not stop it loading
    assert sampling_defaults.from_generation_config({"do_sample": True, "temperature": -1, "top_p": 3, "top_k": 20}) == {
        "top_k": 20, "temperature": 1.0}
    assert sampling_defaults.from_generation_config(["not", "a", "dict"]) == {}


def test_fill_takes_the_models_values_only_where_nothing_was_said():
    own = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.1}
    params = sampling_defaults.fill(GenerationParams(max_new_tokens=9), own, given=())
    assert (params.temperature, params.top_p, params.top_k, params.repetition_penalty, params.max_new_tokens) == (0.6, 0.95, 20, 1.1, 9)
    params = sampling_defaults.fill(GenerationParams(temperature=1.2, top_k=5), own, given=("temperature", "top_k"))
    assert (params.temperature, params.top_p, params.top_k) == (1.2, 0.95, 5)
    greedy = GenerationParams(temperature=0.0)
    assert sampling_defaults.fill(greedy, own, given=("temperature",)) == greedy  # --temperature 0: greedy as is
    assert sampling_defaults.describe(own) == "temperature 0.6, top-p 0.95, top-k 20, repetition penalty 1.1"
    assert sampling_defaults.describe({}) == "greedy"


@pytest.fixture(scope="module")
def qwen_like_folder(tmp_path_factory):
    from tiny_models import save_tiny_pair

    base, head = save_tiny_pair(tmp_path_factory.mktemp("sampling"))
    (base / "generation_config.json").write_text(json.dumps({**SMOLLM2, **QWEN3, "repetition_penalty": 1.3}))
    return base, head


def test_run_decodes_with_the_models_defaults_unless_told(qwen_like_folder, monkeypatch, capsys):
    from eaglechat.engine.local import LocalEngine

    seen = []
    real = LocalEngine.generate
    monkeypatch.setattr(LocalEngine, "generate", lambda self, messages, params, *a, **k: (
        seen.append((params, dict(self.info.sampling), self.info.sampling_source)) or real(self, messages, params, *a, **k)))
    base, head = qwen_like_folder
    common = ["run", str(base), "hi", "--head", str(head), "--max-new-tokens", "4", "--seed", "1"]
    assert cli.main(common) == 0
    params, sampling, source = seen[-1]
    assert source == "generation_config.json" and sampling == {"temperature": 0.6, "top_p": 0.95, "top_k": 20,
                                                               "repetition_penalty": 1.3}
    assert (params.temperature, params.top_p, params.top_k, params.repetition_penalty) == (0.6, 0.95, 20, 1.3)
    assert cli.main(common + ["--top-k", "3", "--repetition-penalty", "1.0", "--verbose"]) == 0
    assert (seen[-1][0].temperature, seen[-1][0].top_k, seen[-1][0].repetition_penalty) == (0.6, 3, 1.0)
    assert "[sampling: temperature 0.6, top-p 0.95, top-k 3; the model's own (generation_config.json) where not given" in (
        capsys.readouterr().err)
    assert cli.main(common + ["--temperature", "0", "--json"]) == 0  # greedy, none of the model's values
    params = seen[-1][0]
    assert (params.temperature, params.top_p, params.top_k, params.repetition_penalty) == (0.0, 1.0, 0, 1.0)
    greedy = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["token_ids"]
    assert cli.main(common + ["--no-speculate", "--temperature", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["token_ids"] == greedy
    assert cli.main(common + ["--repetition-penalty", "3"]) == 2  # one line, before anything loads
    assert "--repetition-penalty: must be in (0, 2]" in capsys.readouterr().err


def test_the_catalog_states_the_default_models_sampling_and_show_prints_it(capsys):
    manifest = catalog.resolve("smollm2-135m-eagle2")
    assert manifest.sampling and manifest.sampling.get("temperature", 0) > 0  # its greedy replies loop
    assert cli.main(["show", "smollm2-135m-eagle2"]) == 0
    out = capsys.readouterr().out
    assert f"sampling          {sampling_defaults.describe(manifest.sampling)} (catalog)" in out
    assert cli.main(["show", "smollm2-135m-eagle2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sampling"]["values"] == manifest.sampling


def test_a_manifests_bad_sampling_is_one_line_naming_the_field(tmp_path):
    raw = yaml.safe_load(catalog.resolve("qwen3-8b-eagle3").manifest_path.read_text())
    raw["sampling"] = {"temperature": 0.6, "top_p": 1.5}
    path = tmp_path / "qwen3-8b-eagle3.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(catalog.ManifestError, match=r"field 'sampling.top_p': top_p must be in \(0, 1\], got 1.5"):
        catalog.load_manifest(path)
    raw["sampling"] = {"min_tokens": 3}
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(catalog.ManifestError, match="field 'sampling.min_tokens': is not a sampling field"):
        catalog.load_manifest(path)


async def test_the_chat_starts_a_conversation_with_the_models_sampling(tmp_path):
    engine = FakeEngine(["a reply"])
    engine.info.sampling = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.1}
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await type_and_send(pilot, "hello")
        await wait_reply(pilot)
        params = engine.calls[-1][1]
        assert (params.temperature, params.top_p, params.top_k, params.repetition_penalty) == (0.6, 0.95, 20, 1.1)
        assert (app.conversation.temperature, app.conversation.top_p) == (0.6, 0.95)
        await pilot.press("f3")
        await pilot.pause()
        line = app.screen.query_one("#model-sampling")
        assert "temperature 0.6, top-p 0.95, top-k 20, repetition penalty 1.1" in str(line.render())
        app.screen.dismiss({"temperature": 0.0})  # the user's greedy: none of the model's values
        await pilot.pause()
        await type_and_send(pilot, "again")
        await wait_reply(pilot)
        params = engine.calls[-1][1]
        assert (params.temperature, params.top_k, params.repetition_penalty) == (0.0, 0, 1.0)


def test_the_server_fills_what_a_request_leaves_out_with_the_models_own():
    """Both faces: a request without sampling fields decodes with the model's values; the fields it sends
    win; `temperature: 0` is greedy with nothing of the model's."""
    from eaglechat.server.ollama import ollama_params
    from eaglechat.server.openai_schema import parse_chat_request

    own = {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "repetition_penalty": 1.1}
    messages = [{"role": "user", "content": "hi"}]

    def openai(**fields):
        return parse_chat_request({"messages": messages, **fields}, model="m", max_tokens_limit=64,
                                  default_max_tokens=16, model_defaults=own).params

    def ollama(**options):
        return ollama_params({"options": options}, max_tokens_limit=64, default_max_tokens=16, model_defaults=own)[0]

    for params in (openai(), ollama()):
        assert (params.temperature, params.top_p, params.top_k, params.repetition_penalty) == (0.7, 0.9, 40, 1.1)
    sent = openai(temperature=1.2, top_k=5)
    assert (sent.temperature, sent.top_p, sent.top_k, sent.repetition_penalty) == (1.2, 0.9, 5, 1.1)
    for greedy in (openai(temperature=0), ollama(temperature=0)):
        assert (greedy.temperature, greedy.top_k, greedy.repetition_penalty) == (0.0, 0, 1.0)
    plain = parse_chat_request({"messages": messages}, model="m", max_tokens_limit=64, default_max_tokens=16).params
    assert plain.temperature == 0.0  # a model without its own values: greedy


def test_a_client_of_an_eaglechat_server_learns_the_models_own_sampling():
    """A remote engine (and so `run` answered by a resident server) fills what the user left out with the
    served model's values, as a local load of it would."""
    from fake_engine import FakeEngine
    from serving import serving

    from eaglechat.engine.remote import RemoteEngine
    from eaglechat.server.app import create_app

    engine = FakeEngine()
    engine.info.sampling = {"temperature": 0.7, "top_p": 0.9, "top_k": 40}
    with serving(create_app(engine)) as url:
        remote = RemoteEngine(url)
    assert remote.info.sampling == engine.info.sampling and remote.info.sampling_source.startswith("the server's")
