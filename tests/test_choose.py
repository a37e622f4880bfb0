"""choose(): what to load on this machine, decided from the request, the model's facts and the device, with no
model loaded (eaglechat/fit/choose.py)."""

from __future__ import annotations

import types

import pytest
import torch

from eaglechat.engine.protocol import TreeBudget
from eaglechat.errors import UsageError
from eaglechat.fit import hardware
from eaglechat.fit.choose import LoadRequest, ModelFacts, choose
from eaglechat.fit.memory import ModelShape
from eaglechat.fit.profiles import save_tuned
from eaglechat.units import GiB

VICUNA_7B = ModelShape(params=6_738_415_616, num_layers=32, hidden_size=4096, intermediate_size=11008,
                       num_attention_heads=32, num_key_value_heads=32, head_dim=128, vocab_size=32000, max_context=2048)
TINY = ModelShape(params=2_000_000, num_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=256, max_context=512)
CPU = hardware.DeviceInfo(kind="cpu", name="test CPU", total_bytes=int(32 * GiB), free_bytes=int(24 * GiB), cpu_cores=8)


def test_a_cpu_plan_is_the_cpu_profile_in_float32():
    plan = choose(LoadRequest(), ModelFacts("tiny", TINY), CPU)
    assert (plan.device, plan.device_kind, plan.dtype, plan.quant) == ("cpu", "cpu", "float32", "none")
    assert plan.tree == TreeBudget(12, 3, 4)  # cpu.yaml's tree for an unquantized base
    assert plan.prefill_chunk == 512 and plan.speculate == "auto" and plan.context is None
    assert plan.notes == () and plan.tuned_speculate is None and plan.tuned_under_load == ""


def test_what_the_user_asked_wins():
    asked = LoadRequest(dtype="bfloat16", quant="8bit", max_context=1024, tree=TreeBudget(6, 2, 3))
    plan = choose(asked, ModelFacts("tiny", TINY), CPU)
    assert (plan.dtype, plan.quant, plan.context, plan.tree) == ("bfloat16", "8bit", 1024, TreeBudget(6, 2, 3))


def test_tree_flags_go_on_top_of_the_profile_tree_and_are_checked():
    plan = choose(LoadRequest(depth=5), ModelFacts("tiny", TINY), CPU)
    assert plan.tree == TreeBudget(12, 5, 4)
    with pytest.raises(UsageError, match="more than a depth-2, top-2 draft can offer"):
        choose(LoadRequest(total_tokens=40, depth=2, draft_top_k=2), ModelFacts("tiny", TINY), CPU)
    with pytest.raises(UsageError, match="--total-tokens 6 or less"):  # a whole tree is checked too
        choose(LoadRequest(tree=TreeBudget(40, 2, 2)), ModelFacts("tiny", TINY), CPU)


@pytest.fixture
def rtx4090(monkeypatch):
    """What bitsandbytes' 4-bit dispatch reads of the card (the CPU build of torch has no CUDA to ask)."""
    props = types.SimpleNamespace(name="RTX 4090", multi_processor_count=128, major=8, minor=9, gcnArchName="")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: props)


def test_quant_auto_is_the_planners_choice_and_needs_a_shape(rtx4090):
    gpu = hardware.fake_gpu("8")
    plan = choose(LoadRequest(quant="auto"), ModelFacts("vicuna", VICUNA_7B, checkpoint_dtype="float16"), gpu)
    assert plan.quant == "4bit" and plan.context  # 13.5 GB of fp16 weights do not fit in 8 GiB
    assert plan.device == "cuda:0" and plan.dtype == "float16"
    with pytest.raises(UsageError, match="--quant auto cannot plan odd: no shape; pass --quant none"):
        choose(LoadRequest(quant="auto"), ModelFacts("odd", None, why_no_shape="no shape"), gpu)
    with pytest.raises(UsageError):
        choose(LoadRequest(quant="3bit"), ModelFacts("tiny", TINY), CPU)


def test_an_8bit_base_on_a_gpu_computes_in_float16_unless_asked():
    gpu = hardware.fake_gpu("24")
    assert choose(LoadRequest(quant="8bit"), ModelFacts("v", VICUNA_7B), gpu).dtype == "float16"
    assert choose(LoadRequest(quant="8bit", dtype="bfloat16"), ModelFacts("v", VICUNA_7B), gpu).dtype == "bfloat16"


def test_a_4bit_tree_is_clamped_to_the_fused_kernel_and_says_so(rtx4090):
    gpu = hardware.fake_gpu("rtx4090")
    plan = choose(LoadRequest(quant="4bit", tree=TreeBudget(24, 4, 8)), ModelFacts("v", VICUNA_7B), gpu)
    assert plan.tree == TreeBudget(7, 4, 8) and len(plan.notes) == 1 and "24 -> 7" in plan.notes[0]
    asked = choose(LoadRequest(quant="4bit", tree=TreeBudget(24, 4, 8), total_tokens=20), ModelFacts("v", VICUNA_7B), gpu)
    assert asked.tree.total_tokens == 20 and asked.notes == ()  # a size the user set is theirs


def test_a_tuned_tree_brings_what_tune_measured():
    save_tuned(CPU, "tiny", "none", {"tree": {"total_tokens": 8, "depth": 2, "top_k": 4}, "speculate": False,
                                     "load": {"load1": 3.1, "cores": 2, "busy": True}})
    plan = choose(LoadRequest(), ModelFacts("tiny", TINY), CPU)
    assert plan.tree == TreeBudget(8, 2, 4) and plan.tuned_speculate is False
    assert plan.tuned_under_load == "load 3.1 on 2 cores"
    other = choose(LoadRequest(tree=TreeBudget(6, 2, 3)), ModelFacts("tiny", TINY), CPU)
    assert other.tuned_speculate is None and other.tuned_under_load == ""  # not tune's tree: not tune's figures
