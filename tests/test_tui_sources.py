"""The chat's real model sources (eaglechat/tui/sources.py) against the shipped catalog (models/*.yaml):
the picker's list and its fits / tight / won't-fit badges on a patched device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fake_engine import make_tui_app, wait_ready, wait_until

from eaglechat import paths
from eaglechat.fit import hardware
from eaglechat.tui.screens import ModelPickerScreen
from eaglechat.tui.sources import catalog_models, plan_badges
from eaglechat.units import GiB

MODELS = Path(__file__).resolve().parent.parent / "models"
SHIPPED = sorted(yaml.safe_load(p.read_text())["name"] for p in MODELS.glob("*.yaml"))


def cpu(free_gib: float, total_gib: float = 64, bf16: bool = False) -> hardware.DeviceInfo:
    return hardware.DeviceInfo(kind="cpu", name="Test CPU", total_bytes=int(total_gib * GiB),
                               free_bytes=int(free_gib * GiB), cpu_cores=8, bf16=bf16)


@pytest.fixture
def device(monkeypatch):
    """Set what hardware.probe() answers for the rest of the test."""
    def use(dev: hardware.DeviceInfo) -> None:
        monkeypatch.setattr(hardware, "probe", lambda device=None: dev)

    return use


def test_catalog_list_puts_ready_models_first():
    rows = catalog_models()
    legacy = {p.stem for p in MODELS.glob("*.yaml") if yaml.safe_load(p.read_text()).get("legacy")}
    assert sorted(name for name, _ in rows) == sorted(set(SHIPPED) - legacy) and len(SHIPPED) - len(legacy) >= 10
    name, desc = rows[0]
    assert name == "smollm2-135m-eagle2" and desc.startswith("built in · ")
    others = dict(rows[1:])
    assert others["vicuna-7b-eagle2"].startswith("not pulled: enter pulls it (about ")
    assert " GB) · Vicuna 7B" in others["vicuna-7b-eagle2"]
    # a pull record makes a model ready: it moves up, right after the built-in one
    (paths.pulls_dir() / "vicuna-7b-eagle2.json").write_text(json.dumps({"version": 1, "name": "vicuna-7b-eagle2"}))
    rows = catalog_models()
    assert [name for name, _ in rows[:2]] == ["smollm2-135m-eagle2", "vicuna-7b-eagle2"]
    assert rows[1][1].startswith("pulled · ")


# Totals at 2k context worked out from the configs (tests/test_memory.py): Vicuna-7B fp16 14.9 GiB,
# int8 9.3, nf4 6.2-6.5; Llama-3.1-8B fp16 16.5, nf4 7.3-7.6; Vicuna-13B fp16 27.5. Float32 on a CPU
# without bf16 doubles the fp16 weights (Vicuna-7B ~30 GiB).
@pytest.mark.parametrize("quant,expected", [
    ("none", {"smollm2-135m-eagle2": "fits", "vicuna-7b-eagle2": "wont_fit", "llama3.1-8b-instruct-eagle2": "wont_fit",
              "vicuna-13b-eagle2": "wont_fit"}),
    ("4bit", {"smollm2-135m-eagle2": "fits", "vicuna-7b-eagle2": "fits", "llama3.1-8b-instruct-eagle2": "fits"}),
    ("auto", {"vicuna-7b-eagle2": "fits", "llama3.1-8b-instruct-eagle2": "fits"}),
])
def test_badges_on_a_12gb_card(device, quant, expected):
    device(hardware.fake_gpu("12"))
    badges = plan_badges(SHIPPED, quant)
    assert set(badges) == set(SHIPPED)  # every shipped manifest has a shape
    assert {name: badges[name] for name in expected} == expected


def test_badges_on_the_cpu_and_a_small_card(device):
    device(cpu(free_gib=48))  # a 7B model fits in RAM unquantized
    assert plan_badges(["vicuna-7b-eagle2"], "none") == {"vicuna-7b-eagle2": "fits"}
    device(cpu(free_gib=16))  # in 16 GiB only 4-bit does (13B: under 8 % headroom once the reserve is out)
    assert plan_badges(["vicuna-7b-eagle2", "vicuna-13b-eagle2"], "4bit") == {
        "vicuna-7b-eagle2": "fits", "vicuna-13b-eagle2": "tight"}
    assert plan_badges(["vicuna-13b-eagle2"], "none") == {"vicuna-13b-eagle2": "wont_fit"}
    device(hardware.fake_gpu("8"))  # the same 7B on an 8 GB card: only 4-bit
    assert plan_badges(["vicuna-7b-eagle2"], "none") == {"vicuna-7b-eagle2": "wont_fit"}
    assert plan_badges(["vicuna-7b-eagle2"], "4bit") == {"vicuna-7b-eagle2": "fits"}


@pytest.mark.parametrize("dev,name,quant,expected", [
    (cpu(free_gib=16), "vicuna-7b-eagle2", "none", "wont_fit"),  # float32 on this CPU: ~30 GiB
    # 10.5 GiB of 11.5 (0.5 GiB reserve): no fragmentation charged on the head and KV cache, allocated once
    (hardware.fake_gpu("12"), "vicuna-13b-eagle2", "4bit", "fits"),
])
def test_badges_agree_with_the_planner(device, dev, name, quant, expected):
    device(dev)
    assert plan_badges([name], quant) == {name: expected}


async def test_picker_shows_the_real_catalog_with_badges(tmp_path, device):
    device(hardware.fake_gpu("12"))
    app = make_tui_app(tmp_path, models=catalog_models, badges=None)  # the app's own sources
    async with app.run_test(size=(110, 34)) as pilot:
        await wait_ready(pilot)
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPickerScreen), what="picker")
        await wait_until(pilot, lambda: app.screen.badges, timeout=30, what="badges")
        picker = app.screen
        assert [name for name, _ in picker.models] == [name for name, _ in catalog_models()]
        assert picker.badges["smollm2-135m-eagle2"] == "fits" and picker.badges["vicuna-7b-eagle2"] == "wont_fit"
        options = picker.query_one("#picker-list")
        labels = {o.id: str(o.prompt) for o in map(options.get_option_at_index, range(options.option_count))}
        assert "won't fit" in labels["vicuna-7b-eagle2"] and "fits" in labels["smollm2-135m-eagle2"]
