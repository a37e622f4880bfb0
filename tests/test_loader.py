"""The loader (eaglechat/loader.py) as the CLI and the chat reach it: --device auto, --quant auto whose
planner or profile fails, and the one fit answer shared by list, show and the chat's picker badges."""

from __future__ import annotations

import json

import pytest
from tiny_models import save_tiny_pair

from eaglechat import loader
from eaglechat.cli import main
from eaglechat.fit import hardware, memory, profiles
from eaglechat.units import GiB


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture(autouse=True)
def own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------------------- --device auto


def test_run_with_device_auto_decodes(pair, capsys):
    base, head = pair
    code, out, err = run_cli(capsys, "run", str(base), "--head", str(head), "--device", "auto", "--json",
                             "--max-new-tokens", "4", "--quant", "none", "hello")
    assert code == 0, err
    assert len(json.loads(out)["token_ids"]) == 4


def test_chat_loader_with_device_auto_picks_the_probed_device(pair):
    from eaglechat.tui.sources import default_loader

    base, head = pair
    engine = default_loader(str(base), head=str(head), device="auto", quant="none")
    assert engine.info.device == hardware.probe().torch_device


# ------------------------------------------------------------------------------------- --quant auto


def test_quant_auto_surfaces_a_planner_bug(pair, monkeypatch):
    base, head = pair

    def broken(cfg):
        raise RuntimeError("planner bug")

    monkeypatch.setattr(memory.ModelShape, "from_hf_config", staticmethod(broken))
    with pytest.raises(RuntimeError, match="planner bug"):  # never a quiet unquantized load
        loader.load_engine(str(base), head=str(head), quant="auto", device="cpu")


def test_quant_auto_surfaces_a_profile_bug(pair, monkeypatch):
    base, head = pair

    def broken(*args, **kwargs):
        raise RuntimeError("profile bug")

    monkeypatch.setattr(profiles, "resolve_profile", broken)
    with pytest.raises(RuntimeError, match="profile bug"):
        loader.load_engine(str(base), head=str(head), quant="auto", device="cpu")


def test_a_profile_error_is_one_line(pair, monkeypatch, capsys):
    base, head = pair

    def refuse(*args, **kwargs):
        raise profiles.ProfileError("profile gpu-12gb: tree key 'x' is not one of ('none', '8bit', '4bit')")

    monkeypatch.setattr(profiles, "resolve_profile", refuse)
    code, _, err = run_cli(capsys, "run", str(base), "--head", str(head), "hello")
    assert code == 1
    assert err.strip() == "eaglechat: error: profile gpu-12gb: tree key 'x' is not one of ('none', '8bit', '4bit')"


def test_quant_auto_on_a_config_the_planner_cannot_read_is_one_line(pair, monkeypatch, capsys):
    base, head = pair

    def unusual(cfg):
        raise AttributeError("'MyConfig' object has no attribute 'intermediate_size'")

    monkeypatch.setattr(memory.ModelShape, "from_hf_config", staticmethod(unusual))
    code, _, err = run_cli(capsys, "run", str(base), "--head", str(head), "hello")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--quant auto cannot plan tiny-llama" in err and "pass --quant none, 8bit or 4bit" in err
    # a pinned quantization does not need the planner
    code, out, err = run_cli(capsys, "run", str(base), "--head", str(head), "--quant", "none", "--max-new-tokens", "2", "hi")
    assert code == 0, err


# ------------------------------------------------------------------------------------- one fit answer


def fake_machine(free_gib: float) -> hardware.DeviceInfo:
    return hardware.DeviceInfo(kind="cuda", name="test GPU", total_bytes=int(24 * GiB), free_bytes=int(free_gib * GiB),
                               compute_capability=(8, 6), bf16=True)


@pytest.mark.parametrize("free_gib", [2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 14.0, 20.0, 24.0])
def test_list_show_and_the_picker_badges_agree(free_gib, monkeypatch, capsys):
    from eaglechat.tui.sources import plan_badges

    monkeypatch.setattr(hardware, "probe", lambda device=None: fake_machine(free_gib))
    names = ["vicuna-13b-eagle2", "llama3.1-8b-instruct-eagle2", "qwen2-7b-instruct-eagle2"]
    badges = plan_badges(names, "auto")
    assert main(["list", "--all", "--json"]) == 0  # legacy models too
    listed = {r["name"]: r["format"] for r in json.loads(capsys.readouterr().out)}
    for name in names:
        assert main(["show", name, "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)["format"]
        assert shown == listed[name]
        # a badge says it fits exactly when list/show name a format rather than "won't fit"
        assert (badges[name] != "wont_fit") == (listed[name] != "won't fit"), (name, badges[name], listed[name])
