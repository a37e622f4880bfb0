"""Profiles: every shipped file is valid, each GPU class matches, user files and tuned results override."""

from __future__ import annotations

import json

import pytest
from shapes import LLAMA31_8B

from eaglechat.engine.protocol import Speculate
from eaglechat.errors import EaglechatError
from eaglechat.fit import hardware
from eaglechat.fit.profiles import (
    QUANTS,
    ProfileError,
    check_tree,
    load_profiles,
    match_profile,
    resolve_profile,
    save_tuned,
)
from eaglechat.units import GiB


@pytest.fixture(scope="module")
def shipped():
    return load_profiles(user_dir=False)


def device(kind: str, gib: float, **kw) -> hardware.DeviceInfo:
    return hardware.DeviceInfo(kind=kind, name=kw.pop("name", f"test {kind}"), total_bytes=int(gib * GiB),
                               free_bytes=int(gib * GiB), **kw)


def test_shipped_profiles_are_valid(shipped):
    names = {p.name for p in shipped}
    assert {"cpu", "gpu-6gb", "gpu-8gb", "gpu-12gb", "gpu-16gb", "gpu-24gb", "gpu-32gb", "gpu-48gb", "gpu-80gb"} <= names
    for p in shipped:
        assert set(p.tree) == set(QUANTS), p.name
        for tree in p.tree.values():
            check_tree(tree)
        assert p.models and all(row["quant"] for row in p.models)
        assert 0 < p.reserve_gib < 4
        json.dumps(p.to_dict())


@pytest.mark.parametrize(
    "gpu,expected",
    [
        ("rtx2060", "gpu-6gb"), ("6", "gpu-6gb"),
        ("rtx3070", "gpu-8gb"), ("rtx4060", "gpu-8gb"), ("8", "gpu-8gb"),
        ("rtx3060", "gpu-12gb"), ("rtx3080", "gpu-12gb"), ("rtx4070ti", "gpu-12gb"), ("11.7", "gpu-12gb"),
        ("rtx4080", "gpu-16gb"), ("rtx4060ti", "gpu-16gb"), ("16", "gpu-16gb"),
        ("rtx3090", "gpu-24gb"), ("rtx4090", "gpu-24gb"), ("23.6", "gpu-24gb"),
        ("rtx5090", "gpu-32gb"), ("a6000", "gpu-48gb"), ("l40s", "gpu-48gb"),
        ("a100", "gpu-80gb"), ("h100", "gpu-80gb"), ("h200", "gpu-80gb"),
    ],
)
def test_each_gpu_class_matches(shipped, gpu, expected):
    assert match_profile(hardware.fake_gpu(gpu), shipped).name == expected


def test_cpu_and_mps_match(shipped):
    assert match_profile(device("cpu", 16), shipped).name == "cpu"
    assert match_profile(device("mps", 24), shipped).name == "mps"


def test_cuda_classes_cover_every_size_exactly_once(shipped):
    from eaglechat.fit.profiles import matches

    for quarter in range(4, 200 * 4):
        d = device("cuda", quarter / 4)
        hits = [p.name for p in shipped if matches(p, d)]
        assert len(hits) == 1, (quarter / 4, hits)


def test_tree_per_quantization_and_capability(shipped):
    p12 = resolve_profile(hardware.fake_gpu("rtx3060"), profiles=shipped)
    assert p12.tree_for("4bit").total_tokens < p12.tree_for("8bit").total_tokens  # small trees with 4-bit
    ampere = resolve_profile(hardware.fake_gpu("rtx3090"), profiles=shipped).tree_for("none")
    ada = resolve_profile(hardware.fake_gpu("rtx4090"), profiles=shipped, quant="none").tree_for("none", device=hardware.fake_gpu("rtx4090"))
    assert (ampere.total_tokens, ada.total_tokens) == (60, 80)
    # one less depth for 128k-vocab models (their lm_head costs 1 GiB per draft step)
    vicuna_depth = p12.tree_for("8bit").depth
    assert p12.tree_for("8bit", LLAMA31_8B).depth == vicuna_depth - 1


def test_resolved_view_for_show_profile(shipped):
    p = resolve_profile(hardware.fake_gpu("rtx3060"), LLAMA31_8B, "4bit", profiles=shipped)
    d = p.to_dict()
    assert d["name"] == "gpu-12gb"
    assert d["resolved"]["quant_order"][0] == "none" and d["resolved"]["max_context"] == 8192
    assert set(d["resolved"]["tree"]) == {"4bit"}
    json.dumps(d)


def test_user_profile_overrides_shipped(tmp_path):
    (tmp_path / "mine.yaml").write_text("name: gpu-12gb\nreserve_gib: 1.5\ntree:\n  4bit: {total_tokens: 16, depth: 3, top_k: 6}\n")
    profs = load_profiles(user_dir=tmp_path)
    p = resolve_profile(hardware.fake_gpu("rtx3060"), profiles=profs)
    assert p.source == "user" and p.reserve_gib == 1.5
    assert p.tree_for("4bit").total_tokens == 16
    assert p.tree_for("8bit").total_tokens == 60  # untouched keys keep the shipped values
    assert len(p.files) == 2


def test_user_profile_with_name_rule_and_priority_wins(tmp_path):
    (tmp_path / "my3060.yaml").write_text(
        "name: my-3060\npriority: 10\nmatch: {device: cuda, name: 'RTX 3060$'}\n"
        "models: [{quant: [4bit], max_context: 4096}]\ntree: {4bit: {total_tokens: 12, depth: 2, top_k: 4}}\n"
    )
    profs = load_profiles(user_dir=tmp_path)
    assert match_profile(hardware.fake_gpu("rtx3060"), profs).name == "my-3060"
    assert match_profile(hardware.fake_gpu("rtx4070"), profs).name == "gpu-12gb"


def test_broken_user_profile_is_one_clear_error(tmp_path):
    (tmp_path / "bad.yaml").write_text("name: gpu-12gb\ntree: {4bit: {total_tokens: 999, depth: 1, top_k: 2}}\n")
    with pytest.raises(ProfileError, match="more than a depth-1, top-2 draft can offer"):
        load_profiles(user_dir=tmp_path)
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(EaglechatError, match="bad.yaml"):
        load_profiles(user_dir=tmp_path)


def test_tuned_result_overrides_user_and_shipped(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "u.yaml").write_text("name: gpu-12gb\ntree: {4bit: {total_tokens: 16, depth: 3, top_k: 6}}\n")
    tuned = tmp_path / "tuned"
    gpu = hardware.fake_gpu("rtx3060")
    save_tuned(gpu, "llama3.1-8b", "4bit", {"tree": {"total_tokens": 12, "depth": 2, "top_k": 4}, "speculate": False}, tuned)
    profs = load_profiles(user_dir=user)
    p = resolve_profile(gpu, LLAMA31_8B, "4bit", model="llama3.1-8b", profiles=profs, tuned_dir=tuned)
    assert p.source == "tuned"
    # the tuned tree is used; tune's "plain was faster" is kept, but does not pin the mode: the engine
    # measures both while decoding (speculate: auto), as the load changes
    assert p.tree_for("4bit").total_tokens == 12 and p.speculate_for("4bit") == "auto"
    assert p.tuned_speculate("4bit") is False and p.tuned_speculate("8bit") is None
    assert p.resolved["speculate"]["4bit"] == "auto"
    # another model or another quantization is not affected
    other = resolve_profile(gpu, LLAMA31_8B, "4bit", model="vicuna-7b", profiles=profs, tuned_dir=tuned)
    assert other.tree_for("4bit").total_tokens == 16 and other.source == "user"
    # the plan takes the tuned budget, decides speculation while decoding and says what tune measured
    from eaglechat.fit.planner import plan_model

    plan = plan_model(LLAMA31_8B, gpu, profile=p, quant="4bit")
    assert plan.choice.speculate == "auto"
    assert any("tune measured plain decoding faster" in n for n in plan.notes), plan.notes


def test_speculate_is_auto_unless_a_user_profile_pins_it(tmp_path):
    """Every shipped profile says auto; a user file saying true or false pins it, over a tuned record too."""
    from eaglechat.fit.profiles import SHIPPED_DIR, read_dir

    assert {raw["name"]: raw.get("speculate") for _, raw in read_dir(SHIPPED_DIR)} == {
        p.name: "auto" for p in load_profiles(user_dir=False)}
    gpu = hardware.fake_gpu("rtx3060")
    assert resolve_profile(gpu, LLAMA31_8B, "4bit", profiles=load_profiles(user_dir=False)).speculate_for("4bit") == "auto"
    user, tuned = tmp_path / "user", tmp_path / "tuned"
    user.mkdir()
    save_tuned(gpu, "llama3.1-8b", "4bit", {"tree": {"total_tokens": 12, "depth": 2, "top_k": 4}, "speculate": True}, tuned)
    for value, expected in (("false", Speculate.OFF), ("true", Speculate.ON), ("auto", Speculate.AUTO)):
        (user / "u.yaml").write_text(f"name: gpu-12gb\nspeculate: {value}\n")
        p = resolve_profile(gpu, LLAMA31_8B, "4bit", model="llama3.1-8b", profiles=load_profiles(user_dir=user),
                            tuned_dir=tuned)
        assert p.source == "tuned" and p.speculate_for("4bit") is expected


def test_standard_locations_via_eaglechat_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path))
    from eaglechat import paths

    (paths.user_profiles_dir() / "x.yaml").write_text("name: cpu\nreserve_gib: 3.0\n")
    cpu = device("cpu", 32)
    assert resolve_profile(cpu).reserve_gib == 3.0
    save_tuned(cpu, "smollm2-135m-eagle2", "none", {"tree": {"total_tokens": 4, "depth": 2, "top_k": 2}})
    assert resolve_profile(cpu, model="smollm2-135m-eagle2").tree_for("none").total_tokens == 4
