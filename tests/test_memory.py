"""Memory planner: byte formulas against totals worked out by hand from the models' configs, and the plan's choices per GPU class."""

from __future__ import annotations

import pytest
from shapes import LLAMA31_8B, VICUNA_7B, VICUNA_13B

from eaglechat.errors import OutOfMemory
from eaglechat.fit import hardware
from eaglechat.fit.memory import ModelShape, estimate, head_bytes, kv_bytes, linear_params, weight_bytes
from eaglechat.fit.planner import contexts_to_try, plan_model
from eaglechat.fit.profiles import load_profiles
from eaglechat.units import GiB


@pytest.fixture(scope="module")
def shipped():
    return load_profiles(user_dir=False)


def cpu_device(ram_gib: float, bf16: bool = True) -> hardware.DeviceInfo:
    return hardware.DeviceInfo(kind="cpu", name="test cpu", total_bytes=int(ram_gib * GiB),
                               free_bytes=int(ram_gib * GiB), cpu_cores=8, bf16=bf16)


# ----------------------------------------------------------------------------------- formulas


def test_linear_params_match_reference():
    assert linear_params(VICUNA_7B) == 6_476_005_376  # 6.476B quantizable: 32 x (4 x 4096^2 + 3 x 4096 x 11008)
    assert linear_params(LLAMA31_8B) == 6_979_321_856


@pytest.mark.parametrize("fmt,bits", [("nf4", 4.5), ("nf4-dq", 4.127), ("int8", 8.007), ("fp16", 16.0)])
def test_bits_per_quantized_param(fmt, bits):
    # one layer's worth: everything quantizable, no embedding
    layer = ModelShape(params=202_375_168, num_layers=1, hidden_size=4096, intermediate_size=11008,
                       num_attention_heads=32, num_key_value_heads=32, head_dim=128, vocab_size=0, max_context=1)
    assert linear_params(layer) == layer.params
    assert weight_bytes(layer, fmt) * 8 / layer.params == pytest.approx(bits, rel=1e-6)


@pytest.mark.parametrize(
    "shape,fmt,weights_gib,total_gib",
    [  # worked out by hand ("tuned": shared embedding, prefill chunk 512, last-position logits), 2k context;
        # 16-bit weights, head and KV are allocated once: no fragmentation on them (15.7 -> 14.9, 17.6 -> 16.5)
        (VICUNA_7B, "fp16", 12.55, 14.9),
        (VICUNA_7B, "int8", 6.52, 9.3),
        (VICUNA_7B, "nf4", 3.88, 6.6),
        (VICUNA_7B, "nf4-dq", 3.60, 6.3),
        (LLAMA31_8B, "fp16", 14.96, 16.5),
        (LLAMA31_8B, "int8", 8.46, 10.7),
        (LLAMA31_8B, "nf4", 5.61, 7.8),
        (LLAMA31_8B, "nf4-dq", 5.31, 7.5),
    ],
)
def test_totals_reproduce_hand_computed_table(shape, fmt, weights_gib, total_gib):
    e = estimate(shape, fmt, 2048, total_tokens=60, depth=5, top_k=10)
    assert e.weights / GiB == pytest.approx(weights_gib, abs=0.02)
    assert e.total / GiB == pytest.approx(total_gib, abs=0.2)


def test_head_shares_embedding_and_kv_per_token():
    shared = head_bytes(VICUNA_7B)
    assert shared / GiB == pytest.approx(0.44, abs=0.01)
    copy = head_bytes(LLAMA31_8B, share_embedding=False) - head_bytes(LLAMA31_8B)
    assert copy / GiB == pytest.approx(0.98, abs=0.01)  # the 128k-vocab embedding EAGLE's code duplicates
    assert kv_bytes(VICUNA_7B, 1, draft_layers=0) == 512 * 1024
    assert kv_bytes(LLAMA31_8B, 1, draft_layers=0) == 128 * 1024


def test_activation_peak_grows_with_context_and_tree():
    small = estimate(LLAMA31_8B, "fp16", 2048, total_tokens=16)
    longer = estimate(LLAMA31_8B, "fp16", 16384, total_tokens=16)
    assert longer.activations > 4 * small.activations
    # a huge tree makes the verify pass (T x vocab logits) the peak
    wide = estimate(LLAMA31_8B, "fp16", 512, total_tokens=500, depth=6, top_k=10)
    narrow = estimate(LLAMA31_8B, "fp16", 512, total_tokens=8, depth=3, top_k=4)
    assert wide.activations - narrow.activations > 480 * LLAMA31_8B.vocab_size * 8
    # 4-bit adds the dequant scratch of the largest linear
    assert estimate(VICUNA_7B, "nf4", 2048).activations > estimate(VICUNA_7B, "int8", 2048).activations


def test_contexts_to_try():
    assert contexts_to_try(8192) == [8192, 4096, 2048, 1024]
    assert contexts_to_try(2048) == [2048, 1024]
    assert contexts_to_try(512) == [512]
    assert contexts_to_try(4096, floor=256)[-1] == 256


# ----------------------------------------------------------------------------------- plans


def test_vicuna_7b_on_12gb_refuses_fp16_picks_int8_or_nf4(shipped):
    plan = plan_model(VICUNA_7B, hardware.fake_gpu("rtx3060"), model="vicuna", profiles=shipped)
    assert plan.profile == "gpu-12gb"
    assert plan.choice.format in ("int8", "nf4", "nf4-dq")
    assert plan.choice.context == 2048
    fp16 = next(o for o in plan.considered if o.quant == "none")
    assert fp16.status == "wont_fit" and fp16.estimate.weights / GiB > 12.5
    assert any("fp16 won't fit" in n for n in plan.notes)
    # pinning fp16 refuses and says what would fit
    pinned = plan_model(VICUNA_7B, hardware.fake_gpu("12"), model="vicuna", quant="none", profiles=shipped)
    assert pinned.choice is None
    line = pinned.refusal()
    assert "\n" not in line and "--quant 8bit" in line and "--quant 4bit" in line
    with pytest.raises(OutOfMemory):
        pinned.require()


@pytest.mark.parametrize(
    "gpu,quants,min_ctx,max_ctx",
    [("8", {"4bit"}, 1024, 2048), ("rtx3060", {"4bit", "8bit"}, 2048, 8192), ("rtx4090", {"none"}, 8192, 16384)],
)
def test_llama31_8b_per_class(shipped, gpu, quants, min_ctx, max_ctx):
    plan = plan_model(LLAMA31_8B, hardware.fake_gpu(gpu), model="llama", profiles=shipped)
    c = plan.choice
    assert c is not None and c.quant in quants and min_ctx <= c.context <= max_ctx
    assert c.total <= plan.budget_bytes
    if gpu == "8":
        assert c.format == "nf4-dq" and c.tree["depth"] <= 3  # large vocab: one less draft step
    if gpu == "rtx4090":
        assert plan.dtype == "float16" and c.format == "fp16"


def test_llama31_8b_4bit_tree_is_small(shipped):
    c = plan_model(LLAMA31_8B, hardware.fake_gpu("12"), profiles=shipped, quant="4bit").choice
    assert c.tree["total_tokens"] <= 32  # bnb's fused 4-bit kernel turns compute-bound after a few tokens


def test_cpu_plan(shipped):
    plan = plan_model(VICUNA_7B, cpu_device(64, bf16=True), model="vicuna", profiles=shipped)
    assert plan.profile == "cpu" and plan.device["kind"] == "cpu"
    # float32 even with native bf16: the one format in which greedy EAGLE is token for token
    assert plan.choice.format == "fp32" and plan.choice.tree["total_tokens"] <= 12
    assert plan.choice.estimate.runtime < GiB
    # no bf16 and 16 GiB RAM: fp32 (25 GiB) won't fit, 4-bit does
    small = plan_model(VICUNA_7B, cpu_device(16, bf16=False), profiles=shipped)
    assert small.dtype == "float32" and small.choice.quant == "4bit"


def test_nothing_fits_lists_a_bigger_gpu_and_never_falls_back_to_cpu(shipped):
    plan = plan_model(VICUNA_13B, hardware.fake_gpu("6"), model="vicuna-13b", profiles=shipped)
    assert plan.choice is None and plan.status == "wont_fit"
    assert plan.device["kind"] == "cuda"
    assert any(a["device"].endswith("GB GPU") for a in plan.alternatives)
    assert "12 GB GPU" in plan.refusal()


def test_pinned_context_is_not_reduced(shipped):
    plan = plan_model(LLAMA31_8B, hardware.fake_gpu("8"), quant="4bit", context=8192, profiles=shipped)
    assert plan.choice is None
    assert any(a["context"] < 8192 for a in plan.alternatives)


def test_no_speculation_drops_head_and_tree(shipped):
    on = plan_model(VICUNA_7B, hardware.fake_gpu("24"), profiles=shipped).choice
    off = plan_model(VICUNA_7B, hardware.fake_gpu("24"), profiles=shipped, speculate=False).choice
    assert off.estimate.head == 0 and off.estimate.tree_buffers == 0 and off.total < on.total


def test_oom_ladder_shrinks_tree_then_context_then_gives_up():
    from eaglechat.engine.oom import shrink_after_oom

    steps, state = [], (60, 5, 10, 8192)
    while (s := shrink_after_oom(*state, used_tokens=1500)) is not None:
        steps.append(s.what)
        state = (s.total_tokens, s.depth, s.draft_top_k, s.context)
        assert "out of memory" in s.message and s.draft_top_k <= max(s.total_tokens, 2)
    assert steps == ["tree", "tree", "tree", "tree", "context", "context"]
    assert state[0] == 4 and state[3] == 2048  # 1024 would drop the 1500 tokens already in the chat
    assert shrink_after_oom(4, 2, 2, 1024, used_tokens=900) is None


def test_format_choice_weighs_speed_and_says_why(shipped):
    # 12 GB: fp16 cannot fit; nf4 comes before LLM.int8 (slowest: host syncs in every Linear)
    plan = plan_model(VICUNA_7B, hardware.fake_gpu("rtx3060"), model="vicuna", profiles=shipped)
    assert plan.choice.quant == "4bit"
    assert "fp16 needs 14.9 GiB" in plan.reason and "faster than LLM.int8" in plan.reason
    assert plan.to_dict()["reason"] == plan.reason
    # 24 GB: fp16 fits and is the fastest
    big = plan_model(VICUNA_7B, hardware.fake_gpu("rtx4090"), model="vicuna", profiles=shipped)
    assert big.choice.quant == "none" and "fastest" in big.reason
    # pinned: says so
    pinned = plan_model(VICUNA_7B, hardware.fake_gpu("rtx3060"), model="vicuna", quant="8bit", profiles=shipped)
    assert "--quant 8bit" in pinned.reason and "slowest" in pinned.reason


def test_measured_speed_reorders_formats(shipped):
    from eaglechat.fit.planner import by_measured_speed
    from eaglechat.fit.profiles import resolve_profile

    gpu = hardware.fake_gpu("rtx3060")
    prof = resolve_profile(gpu, VICUNA_7B, None, profiles=shipped)
    assert prof.quant_order(VICUNA_7B) == ["none", "4bit", "8bit"]
    prof.tuned = {"4bit": {"tree": {"total_tokens": 16, "depth": 3, "top_k": 4}, "choice": {"predicted_tokens_per_s": 41.0}},
                  "8bit": {"tree": {"total_tokens": 60, "depth": 5, "top_k": 10}, "choice": {"predicted_tokens_per_s": 57.5}}}
    plan = plan_model(VICUNA_7B, gpu, prof, model="vicuna")
    assert plan.choice.quant == "8bit"
    assert "measured" in plan.reason and "8bit 57.5, 4bit 41.0" in plan.reason
    # one measured format alone reorders nothing; unmeasured formats keep their slots
    assert by_measured_speed(["none", "4bit", "8bit"], {"8bit": prof.tuned["8bit"]}) == (["none", "4bit", "8bit"], {})
    assert by_measured_speed(["none", "4bit", "8bit"], prof.tuned)[0] == ["none", "8bit", "4bit"]


# ----------------------------------------------------------------------------------- what transformers loads

# config.json of Qwen/Qwen3-30B-A3B and openai/gpt-oss-20b (the keys the planner reads)
QWEN3_30B_A3B_CONFIG = {
    "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
}
GPT_OSS_20B_CONFIG = {
    "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 24,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 32,
    "num_experts_per_tok": 4, "experts_per_token": 4, "vocab_size": 201088, "max_position_embeddings": 131072,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
}


def _shape(cfg):
    from types import SimpleNamespace

    return ModelShape.from_hf_config(SimpleNamespace(**cfg))


def test_moe_shape_and_experts_from_config():
    from eaglechat.fit.memory import expert_params

    qwen = _shape(QWEN3_30B_A3B_CONFIG)
    assert (qwen.num_experts, qwen.experts_per_token, qwen.moe_intermediate_size) == (128, 8, 768)
    assert qwen.params / 1e9 == pytest.approx(30.5, abs=0.1)  # Qwen3-30B-A3B: 30.5B total
    assert expert_params(qwen) / 1e9 == pytest.approx(28.99, abs=0.01)  # 48 x 128 x 3 x 2048 x 768
    oss = _shape(GPT_OSS_20B_CONFIG)
    assert oss.checkpoint_quant == "mxfp4" and oss.num_experts == 32 and oss.moe_intermediate_size == 2880
    assert oss.params / 1e9 == pytest.approx(20.9, abs=0.1)  # the model card's 21B (20.9B)


def test_moe_experts_nf4_under_4bit_16bit_under_8bit(shipped):
    """transformers keeps Qwen3-MoE experts as fused 3D parameters, which bitsandbytes' own integration does not
    quantize; eaglechat's --quant 4bit quantizes them per expert (fit/nf4_experts.py), LLM.int8 does not: a
    30B-A3B is ~15.5 GiB of weights in nf4 and fits 24 GB, in int8 it is ~56 GiB of bf16 experts."""
    from eaglechat.fit.memory import FORMAT_BITS, expert_params

    qwen = _shape(QWEN3_30B_A3B_CONFIG)
    int8 = weight_bytes(qwen, "int8")
    assert int8 / GiB > 54 and int8 > 0.9 * weight_bytes(qwen, "bf16")  # int8 attention, bf16 experts
    nf4 = weight_bytes(qwen, "nf4-dq", expert_bits=FORMAT_BITS["nf4-dq"])
    assert nf4 / GiB == pytest.approx(15.55, abs=0.05)
    assert nf4 - weight_bytes(qwen, "nf4-dq") == pytest.approx(-expert_params(qwen) * (16 - 4.127) / 8, rel=1e-6)
    plan = plan_model(qwen, hardware.fake_gpu("24"), model="qwen3-30b-a3b", profiles=shipped)
    assert plan.choice is not None and plan.choice.quant == "4bit"
    assert plan.choice.estimate.weights == nf4
    assert any("MoE experts in nf4" in n for n in plan.notes)
    pinned = plan_model(qwen, hardware.fake_gpu("24"), quant="8bit", profiles=shipped)
    assert pinned.choice is None and any("MoE experts stay 16-bit under --quant 8bit" in n for n in pinned.notes)
    assert plan_model(qwen, hardware.fake_gpu("16"), profiles=shipped).choice is None


def test_gpt_oss_mxfp4_is_planned_as_transformers_loads_it(shipped, monkeypatch):
    from eaglechat.fit import planner

    oss = _shape(GPT_OSS_20B_CONFIG)
    gpu = hardware.fake_gpu("24")
    # without triton + kernels (this machine) transformers dequantizes the experts to bf16: ~39 GiB
    monkeypatch.setattr(planner, "mxfp4_native", lambda device: False)
    plan = plan_model(oss, gpu, model="gpt-oss-20b", profiles=shipped)
    assert plan.choice is None and [o.quant for o in plan.considered] == ["none"]
    assert plan.considered[0].estimate.weights / GiB == pytest.approx(38.9, abs=0.3)
    assert "pip install kernels" in plan.refusal() and any("dequantized to bf16" in n for n in plan.notes)
    # kept MXFP4 (CUDA cc >= 7.5 with triton and kernels): 4.25 bits per expert weight, fits 16 GB
    monkeypatch.setattr(planner, "mxfp4_native", lambda device: True)
    kept = plan_model(oss, hardware.fake_gpu("16"), model="gpt-oss-20b", profiles=shipped)
    assert kept.choice is not None and kept.choice.quant == "none"
    # 19.1B expert weights x 4.25 bits + 1.8B bf16 (attention, embeddings) = 12.8 GiB
    assert kept.choice.estimate.weights / GiB == pytest.approx(12.8, abs=0.05)
    blocked = plan_model(oss, gpu, model="gpt-oss-20b", quant="4bit", profiles=shipped)
    assert blocked.choice is None and blocked.status == "wont_fit"
    assert blocked.refusal() == "gpt-oss-20b ships mxfp4 weights: bitsandbytes cannot quantize them again (--quant 4bit); use --quant none"


def test_mxfp4_native_needs_cuda_7_5():
    from eaglechat.fit.planner import mxfp4_native

    old = hardware.fake_gpu("16")
    old.compute_capability = (7, 0)  # V100: transformers dequantizes whatever is installed
    assert mxfp4_native(old) is False
    assert mxfp4_native(cpu_device(64)) is False


def test_reduced_draft_vocabulary_is_counted_at_its_size(shipped):
    """An EAGLE-3 head's lm_head is draft_vocab x H, not vocab x H: 0.73 GiB less for Llama-3.1-8B."""
    from eaglechat.fit.planner import Planner
    from eaglechat.models.catalog import load_manifest
    from eaglechat.paths import models_dir

    full = head_bytes(LLAMA31_8B, head_kind="eagle3")
    reduced = head_bytes(LLAMA31_8B, head_kind="eagle3", draft_vocab=32000)
    assert (full - reduced) / GiB == pytest.approx((128256 - 32000) * 4096 * 2 / GiB)
    assert (full - reduced) / GiB == pytest.approx(0.73, abs=0.01)
    m = load_manifest(models_dir() / "llama3.1-8b-instruct-eagle3.yaml")
    assert m.draft_vocab == 32000
    plan = Planner(hardware.fake_gpu("24"), profiles=shipped).plan_for(m, quant="none")
    assert plan.choice.estimate.head == head_bytes(m.shape, head_kind="eagle3", draft_vocab=32000)


def test_runtime_is_not_charged_twice_on_a_measured_card(shipped):
    """mem_get_info creates the CUDA context before it reads free memory: a measured card is charged only
    what comes after (cuBLAS workspaces, lazily loaded kernels); a simulated one the whole runtime."""
    from eaglechat.fit.memory import CUDA_AFTER_CONTEXT_BYTES, RUNTIME_BYTES

    simulated = hardware.fake_gpu("16")
    measured = hardware.DeviceInfo(kind="cuda", name="RTX 4060 Ti", total_bytes=16 * GiB, free_bytes=int(15.4 * GiB),
                                   compute_capability=(8, 9), bf16=True)
    a = plan_model(VICUNA_7B, simulated, profiles=shipped, quant="4bit").choice.estimate
    b = plan_model(VICUNA_7B, measured, profiles=shipped, quant="4bit").choice.estimate
    assert a.runtime == RUNTIME_BYTES["cuda"] and b.runtime == CUDA_AFTER_CONTEXT_BYTES < a.runtime


def test_no_fragmentation_charge_on_weights_allocated_once():
    e = estimate(VICUNA_7B, "fp16", 2048, total_tokens=60, depth=5, top_k=10)
    assert e.fragmentation == int(0.06 * (e.activations + e.tree_buffers))
    q = estimate(VICUNA_7B, "nf4", 2048, total_tokens=60, depth=5, top_k=10)
    assert q.fragmentation == int(0.06 * (q.activations + q.tree_buffers + q.weights))  # quantized at load


def test_vicuna_7b_fp16_fits_16gb(shipped):
    plan = plan_model(VICUNA_7B, hardware.fake_gpu("16"), model="vicuna", quant="none", profiles=shipped)
    assert plan.choice is not None and plan.choice.format == "fp16" and plan.choice.context == 2048
    assert 14.3 < plan.choice.total / GiB < 15.0  # ~14.5 GiB of tensors + the runtime


def test_a_head_folder_given_by_path_is_sized_from_its_own_config(tmp_path):
    import json

    from eaglechat.loader import planned_head

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "vocab_size": 128256,
                                                       "draft_vocab_size": 32000}))
    assert planned_head(None, tmp_path) == ("eagle3", 32000)
    assert planned_head(None, None) == (None, None)


def test_plan_says_what_the_h200_measured_of_each_format(shipped):
    """LLM.int8 forwards cost 5-6x fp16's and an nf4 verify of several rows 1.4-1.8x a one-row nf4 step
    (one H200, Vicuna-7B shape): the reason line says so for each format."""
    int8 = plan_model(VICUNA_7B, hardware.fake_gpu("rtx3060"), model="vicuna", quant="8bit", profiles=shipped)
    assert "5-6x fp16's" in int8.reason and "H200" in int8.reason
    nf4 = plan_model(VICUNA_7B, hardware.fake_gpu("rtx3060"), model="vicuna", profiles=shipped)
    assert nf4.choice.quant == "4bit" and "44-61 ms for 8-128 rows" in nf4.reason
    fp16 = plan_model(VICUNA_7B, hardware.fake_gpu("rtx4090"), model="vicuna", profiles=shipped)
    assert "LLM.int8 forwards cost 5-6x fp16's" in fp16.reason


def test_fp16_is_chosen_wherever_it_fits_even_for_models_a_class_usually_quantizes(shipped):
    """A 16B model on a 48 GB card: its size class lists nf4 first, but 32 GB of fp16 weights fit at the
    class's context, and fp16 is the fastest format; where fp16 does not fit, nf4 still comes first."""
    shape = ModelShape(params=16_000_000_000, num_layers=40, hidden_size=5120, intermediate_size=13824,
                       num_attention_heads=40, num_key_value_heads=8, head_dim=128, vocab_size=32000,
                       max_context=4096)
    assert plan_model(shape, hardware.fake_gpu("48"), profiles=shipped).choice.quant == "none"
    assert plan_model(shape, hardware.fake_gpu("24"), profiles=shipped).choice.quant == "4bit"


# ----------------------------------------------------------------------------------- Gemma 4's kinds of layer


def _gemma4(**overrides):
    from tiny_models import GEMMA4, TINY
    from transformers import AutoConfig

    return AutoConfig.for_model("gemma4_text", **{**TINY, **GEMMA4, **overrides})


def _meta(config):
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("overrides", [
    {}, {"attention_k_eq_v": False}, {"enable_moe_block": False}, {"num_kv_shared_layers": 0},
    {"hidden_size_per_layer_input": 8, "use_double_wide_mlp": True},
], ids=["tiny", "own-values", "dense", "unshared", "per-layer-inputs"])
def test_gemma4_params_are_transformers_own_count(overrides):
    """The tiny Gemma 4 (global layers with their own head_dim and one KV head, values = keys, two KV-shared
    layers, a dense MLP and a Linear router beside 4 experts) and its variants: ModelShape's count is the
    parameter count of transformers' model, and its Linears (bar the per-layer-input ones) those in the layers."""
    from eaglechat.fit.memory import count_params

    config = _gemma4(**overrides)
    shape, model = ModelShape.from_hf_config(config), _meta(config)
    assert shape.params == sum(p.numel() for p in model.parameters())
    if "hidden_size_per_layer_input" not in overrides:
        assert linear_params(shape) == sum(m.weight.numel() for n, m in model.named_modules()
                                           if type(m).__name__ == "Linear" and ".layers." in n)
        assert shape.params - count_params(shape) < 0.01 * shape.params  # Gemma's extra norms only
    if not overrides:
        assert (shape.global_layers, shape.global_head_dim, shape.global_kv_heads, shape.global_values_are_keys,
                shape.kv_shared_layers, shape.kv_shared_global_layers) == (3, 32, 1, True, 2, 1)
        assert shape.experts_per_token == 2 and shape.dense_mlp_beside_experts


def test_homogeneous_configs_read_as_before():
    """Every other tiny architecture (transformers gives each config a per-layer view; Qwen2's lacks head_dim):
    one attention shape, no global or KV-shared layers."""
    from tiny_models import ALL

    for kind, make in ALL.items():
        config = make()
        shape = ModelShape.from_hf_config(getattr(config, "text_config", None) or config)
        assert (shape.global_layers, shape.kv_shared_layers) == ((3, 2) if kind == "gemma4_text" else (0, 0)), kind


def test_gemma4_config_json_in_each_spelling_reads_the_same(tmp_path):
    """transformers 5.25 saves the global layers as `per_layer_config` overrides; Google's config.json states
    `global_head_dim` and `num_global_key_value_heads` under a multimodal `text_config`: one shape from each,
    and the loader's (a real transformers config) is the same."""
    import json

    from tiny_models import tiny_tokenizer

    from eaglechat.loader import model_shape

    config = _gemma4()
    expected = ModelShape.from_hf_config(config)
    config.save_pretrained(tmp_path / "saved")
    tiny_tokenizer().save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert saved["per_layer_config"] and ModelShape.from_config_json(tmp_path / "saved" / "config.json") == expected
    assert model_shape(tmp_path / "saved") == (expected, None)
    text = {k: v for k, v in saved.items() if k != "per_layer_config"}
    google = {"model_type": "gemma4", "text_config": {**text, "global_head_dim": 32, "num_global_key_value_heads": 1}}
    (tmp_path / "google.json").write_text(json.dumps(google))
    assert ModelShape.from_config_json(tmp_path / "google.json") == expected


def test_gemma4_kv_bytes_are_what_the_engine_allocates():
    """Per position, the engine's cache holds each kind of layer's keys and values (global layers: one KV head
    of 32, values beside keys; KV-shared layers: nothing): the bytes the planner charges, exactly."""
    from tiny_models import tiny_model

    from eaglechat.engine.decode import Decoder
    from eaglechat.engine.protocol import GenerationParams, TreeBudget
    from eaglechat.fit.memory import kv_bytes_per_token

    model = tiny_model("gemma4_text")
    decoder = Decoder(model, None, 256)
    list(decoder.generate([5, 6, 7], GenerationParams(max_new_tokens=3, speculate=False), TreeBudget(8, 3, 4), set()))
    capacity = decoder.cache.groups[0].shape[-2]
    shape = ModelShape.from_hf_config(model.config)
    assert decoder.cache.memory_bytes() == kv_bytes_per_token(shape, 4, draft_layers=0) * capacity
    # Gemma 4 31B: 50 sliding layers of 16 KV heads x 256, 10 global ones of 4 x 512, the head's layer
    big = ModelShape(params=1, num_layers=60, hidden_size=5376, intermediate_size=21504, num_attention_heads=32,
                     num_key_value_heads=16, head_dim=256, vocab_size=262144, max_context=262144, global_layers=10,
                     global_head_dim=512, global_kv_heads=4, global_values_are_keys=True)
    assert kv_bytes_per_token(big) == (50 * 2 * 16 * 256 + 10 * 2 * 4 * 512 + 2 * 16 * 256) * 2
