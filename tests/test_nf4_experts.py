"""MoE experts in nf4 (eaglechat/fit/nf4_experts.py): bitsandbytes' real 4-bit quantization and matmul on CPU.

  - the nf4 experts forward equals the experts class's own 16-bit forward on the dequantized weights, for every
    fused-experts layout transformers has (Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE, gpt-oss: transposed, biased,
    its clamped interleaved gate; Gemma 4), and the weights are the originals up to nf4's rounding;
  - only the routed experts run, each on its own tokens;
  - resident bits per expert weight are the planner's (memory.FORMAT_BITS), at a real expert's shape;
  - a `--quant 4bit` load through eaglechat's loader quantizes the experts as they load (LLM.int8 leaves them);
  - greedy EAGLE equals plain greedy token for token on that 4-bit MoE (fp32 compute), and on a 4-bit Gemma 4
    (experts nf4, its dense MLP and router 4-bit Linears, as the planner counts them);
  - the plans: Qwen3-30B-A3B fits a 24 GB card in 4-bit, a 16 GB card is refused in one line.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from tiny_models import ARCHITECTURES, TINY, build_model, random_head, save_tiny_pair

from eaglechat.engine.decode import Decoder
from eaglechat.engine.protocol import GenerationParams, TreeBudget
from eaglechat.fit import nf4_experts as nx
from eaglechat.fit.memory import FORMAT_BITS

pytestmark = pytest.mark.usefixtures("quiet_bitsandbytes")


def gemma4_moe():
    from transformers import AutoConfig

    return AutoConfig.for_model("gemma4_text", **TINY, enable_moe_block=True, num_experts=4, top_k_experts=2,
                                moe_intermediate_size=64)


def wide_experts(kind: str):
    """The tiny config with expert matrices 64 wide on their input side, as every real one is (bitsandbytes
    0.50's CPU dequantize_4bit misplaces blocks in rows narrower than a multiple of 64: 0.2 weight error)."""
    config = ARCHITECTURES[kind]()
    config.moe_intermediate_size = 64
    return config


CONFIGS = {kind: (lambda kind=kind: wide_experts(kind)) for kind in ("qwen3_moe", "qwen3_next", "qwen3_5_moe_text",
                                                                      "gpt_oss")}
CONFIGS["gemma4_text"] = gemma4_moe


def dequantized_reference(quantized, original):
    """`original` with each expert matrix replaced by what `quantized` holds, dequantized, in its own layout,
    decoding with the experts class's own eager forward."""
    ref = copy.deepcopy(original)
    for a, b in zip(quantized.modules(), ref.modules()):
        for name in (getattr(a, "nf4_states", None) or {}):
            w = nx.dequantize_experts(a, name)
            b._parameters[name].data.copy_(w.transpose(1, 2) if a.is_transposed else w)
    ref.set_experts_implementation("eager")
    return ref


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_nf4_experts_equal_the_16bit_module_on_dequantized_weights(kind):
    original = build_model(CONFIGS[kind](), seed=0, scale=4.0)
    model = copy.deepcopy(original)
    assert nx.quantize_model_experts(model) == 2  # one experts module per layer
    assert model.config._experts_implementation == nx.EXPERTS_IMPLEMENTATION
    for a, b in zip(model.modules(), original.modules()):
        for name in (getattr(a, "nf4_states", None) or {}):
            packed, w = a._parameters[name], b._parameters[name]
            assert packed.dtype == torch.uint8 and packed.shape == (w.shape[0], w[0].numel() // 2)
            back = nx.dequantize_experts(a, name)
            back = back.transpose(1, 2) if a.is_transposed else back
            assert ((back - w).norm() / w.norm()).item() < 0.15  # nf4's rounding (~0.1), in the right layout
    ref = dequantized_reference(model, original)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, want = model(ids).logits, ref(ids).logits
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()


def test_only_the_routed_experts_run(monkeypatch):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    torch.manual_seed(0)
    config = wide_experts("qwen3_moe")
    experts = Qwen3MoeExperts(config)
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0, 0.1)
    original = copy.deepcopy(experts)
    nx.quantize_module(experts)
    calls = []
    real = nx._matmul
    monkeypatch.setattr(nx, "_matmul", lambda m, name, e, x: calls.append((name, e, x.shape[0])) or real(m, name, e, x))
    hidden = torch.randn(3, config.hidden_size)
    index = torch.tensor([[1, 3], [3, 1], [1, 3]])  # experts 0 and 2 are not routed to
    weights = torch.tensor([[0.7, 0.3], [0.6, 0.4], [0.5, 0.5]])
    out = nx.nf4_experts_forward(experts, hidden, index, weights)
    assert sorted(calls) == [("down_proj", 1, 3), ("down_proj", 3, 3), ("gate_up_proj", 1, 3), ("gate_up_proj", 3, 3)]
    for name in ("gate_up_proj", "down_proj"):
        original._parameters[name].data.copy_(nx.dequantize_experts(experts, name))
    original.config._experts_implementation = "eager"
    assert torch.allclose(out, original(hidden, index, weights), atol=1e-6)


def test_resident_bits_per_expert_weight_are_the_planners():
    """One Qwen3-30B-A3B expert's gate_up_proj shape (1536 x 2048), two experts: packed nibbles + the 8-bit
    absmax + the nested fp32 absmax, per weight, is what the planner charges (nf4 + double quant)."""
    weight = torch.randn(2, 1536, 2048) * 0.02
    packed, states = nx.quantize_experts(weight, double_quant=True)
    nbytes = packed.numel() + sum(s.absmax.numel() * s.absmax.element_size()
                                  + s.state2.absmax.numel() * s.state2.absmax.element_size() for s in states)
    assert nbytes * 8 / weight.numel() == pytest.approx(FORMAT_BITS["nf4-dq"], abs=0.01)
    single, _ = nx.quantize_experts(weight, double_quant=False)
    assert single.numel() * 2 == weight.numel()


# --------------------------------------------------------------------------------------------- the real load


@pytest.fixture(scope="module")
def moe_pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("moe"), family="qwen3_moe")


_loaded: dict = {}


def load(base_dir, quant: str):
    from eaglechat.loader import load_base

    key = (str(base_dir), quant)
    if key not in _loaded:
        model, _ = load_base(base_dir, device="cpu", dtype=torch.float32, quant=quant)
        import bitsandbytes as bnb

        for m in model.modules():  # the dequantize + F.linear CPU path: fp32 throughout (the packed one is bf16)
            if isinstance(m, bnb.nn.Linear4bit):
                m.support_avx512bf16_for_cpu = False
        _loaded[key] = model
    return _loaded[key]


def test_4bit_load_quantizes_the_experts_as_they_load(moe_pair):
    import bitsandbytes as bnb
    from transformers import AutoModelForCausalLM

    from eaglechat.loader import module_bytes

    base_dir, _ = moe_pair
    model = load(base_dir, "4bit")
    full = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    layer, full_layer = model.model.layers[0].mlp.experts, full.model.layers[0].mlp.experts
    assert set(layer.nf4_states) == {"gate_up_proj", "down_proj"} and model.config._experts_implementation == nx.EXPERTS_IMPLEMENTATION
    assert layer.gate_up_proj.dtype == torch.uint8 and layer.gate_up_proj.numel() * 2 == full_layer.gate_up_proj.numel()
    assert isinstance(model.model.layers[0].self_attn.q_proj, bnb.nn.Linear4bit)
    assert len(nx.quantized_experts(model)) == 2
    assert module_bytes(layer) * 8 == module_bytes(full_layer)  # 4 bits of 32 (absmax: in the QuantStates)
    assert module_bytes(model) < module_bytes(full)
    ids = torch.randint(3, 300, (1, 10), generator=torch.Generator().manual_seed(2))
    ref = dequantized_reference(model, full)
    for a, b in zip(model.modules(), ref.modules()):  # the Linears too: the reference is the 4-bit model in 16 bits
        if isinstance(a, bnb.nn.Linear4bit):
            import bitsandbytes.functional as F

            b.weight.data.copy_(F.dequantize_4bit(a.weight.data, a.weight.quant_state))
    with torch.no_grad():
        got, want = model(ids).logits, ref(ids).logits
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()


def test_experts_are_quantized_layer_by_layer_as_they_load(moe_pair, monkeypatch):
    """Each fused expert tensor is packed the moment the loader assigns it (one layer's 16-bit tensor at a
    time), not after a whole 16-bit model was built."""
    from eaglechat.loader import load_base

    seen, real = [], nx.quantize_experts
    monkeypatch.setattr(nx, "quantize_experts", lambda w, **kw: seen.append((tuple(w.shape), w.dtype)) or real(w, **kw))
    base_dir, _ = moe_pair
    model, _ = load_base(base_dir, device="cpu", dtype=torch.float32, quant="4bit")
    config = model.config
    gate_up = (config.num_experts, 2 * config.moe_intermediate_size, config.hidden_size)
    down = (config.num_experts, config.hidden_size, config.moe_intermediate_size)
    assert sorted(seen) == sorted([(gate_up, torch.float32), (down, torch.float32)] * config.num_hidden_layers)


def test_a_4bit_moe_engine_decodes_eagerly_and_says_so(moe_pair):
    """load_engine with --quant 4bit and a compiled step asked for: the experts pick theirs on the host, so the
    steps run eagerly, said once (no failed capture or compile first)."""
    from eaglechat.loader import load_engine

    base_dir, head_dir = moe_pair
    said = []
    engine = load_engine(str(base_dir), head=str(head_dir), quant="4bit", compile="inductor", device="cpu",
                         dtype="float32", progress=lambda text, fraction=None: said.append(text))
    assert nx.quantized_experts(engine.model) and engine.decoder.runner is None
    assert any("4-bit MoE experts are chosen on the host" in s for s in said)


def test_8bit_load_leaves_the_experts_16bit(moe_pair):
    base_dir, _ = moe_pair
    model = load(base_dir, "8bit")
    layer = model.model.layers[0].mlp.experts
    assert not getattr(layer, "nf4_states", None) and layer.gate_up_proj.dtype == torch.float32
    assert layer.gate_up_proj.dim() == 3 and model.config._experts_implementation != nx.EXPERTS_IMPLEMENTATION


def greedy(model, prompt: list[int], speculate: bool, budget: TreeBudget, n: int = 24):
    decoder = Decoder(model, random_head(model, seed=1), 128)
    ids = []
    for step in decoder.generate(prompt, GenerationParams(max_new_tokens=n, speculate=speculate), budget, set()):
        ids += step.tokens
    return ids, decoder.stats


@pytest.mark.parametrize("budget", [TreeBudget(8, 3, 4), TreeBudget(4, 1, 4)], ids=lambda b: b.label())
def test_greedy_eagle_equals_plain_on_a_4bit_moe(moe_pair, budget):
    base_dir, _ = moe_pair
    model = load(base_dir, "4bit")
    prompt = torch.randint(3, 300, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    plain, _ = greedy(model, prompt, False, budget)
    eagle, stats = greedy(model, prompt, True, budget)
    assert eagle == plain and stats.target_forwards < len(plain) + 2


def test_oracle_drafts_are_accepted_whole_on_a_4bit_moe(moe_pair):
    """Every tree row verified through the nf4 experts agrees with one-token decoding: drafts of the true
    continuation are accepted to their full depth."""
    from test_engine_lossless import OracleDrafter

    base_dir, _ = moe_pair
    model = load(base_dir, "4bit")
    prompt = torch.randint(3, 300, (12,), generator=torch.Generator().manual_seed(4)).tolist()
    budget = TreeBudget(8, 4, 2)
    plain, _ = greedy(model, prompt, False, budget)
    decoder = Decoder(model, random_head(model, seed=1), 128)
    decoder.drafter = OracleDrafter(decoder.drafter.head, decoder)
    steps = decoder.generate(prompt, GenerationParams(max_new_tokens=24), budget, set())
    assert [t for s in steps for t in s.tokens] == plain
    assert decoder.stats.mean_accepted == pytest.approx(5.0, abs=0.5)


@pytest.fixture(scope="module")
def gemma4_dir(tmp_path_factory):
    """The tiny Gemma 4 (global layers, KV-shared layers, a dense MLP and a Linear router beside 4 experts),
    experts 64 wide on their input side (see wide_experts), saved as a checkpoint folder."""
    from tiny_models import tiny_tokenizer

    tok = tiny_tokenizer()
    config = wide_experts("gemma4_text")
    config.vocab_size, config.eos_token_id, config.bos_token_id = max(len(tok), 320), tok.eos_token_id, tok.bos_token_id
    folder = tmp_path_factory.mktemp("gemma4") / "tiny-gemma4"
    build_model(config, seed=0, scale=4.0).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_a_4bit_gemma4_has_nf4_experts_and_greedy_eagle_equals_plain(gemma4_dir):
    """`--quant 4bit` through the real loader: every layer's fused experts are nf4 as they load, and the
    Linears bitsandbytes made 4-bit are exactly the ones the planner counts as quantized (attention of both
    kinds, the dense MLP and the router beside the experts); greedy EAGLE equals plain token for token."""
    import bitsandbytes as bnb

    from eaglechat.fit.memory import linear_params
    from eaglechat.loader import model_shape

    model = load(gemma4_dir, "4bit")
    assert type(model).__name__ == "Gemma4ForCausalLM" and model.config._experts_implementation == nx.EXPERTS_IMPLEMENTATION
    layers = model.model.layers
    assert len(nx.quantized_experts(model)) == len(layers)
    assert all(layer.experts.gate_up_proj.dtype == torch.uint8 for layer in layers)
    assert all(isinstance(m, bnb.nn.Linear4bit) for layer in layers for m in (layer.mlp.down_proj, layer.router.proj))
    shape, _ = model_shape(gemma4_dir)
    four_bit = sum(m.weight.numel() * 2 for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit))
    assert four_bit == linear_params(shape)
    prompt = torch.randint(3, 300, (12,), generator=torch.Generator().manual_seed(5)).tolist()
    for budget in (TreeBudget(8, 3, 4), TreeBudget(4, 1, 4)):
        plain, _ = greedy(model, prompt, False, budget)
        eagle, stats = greedy(model, prompt, True, budget)
        assert eagle == plain and stats.target_forwards < len(plain) + 2, budget


# --------------------------------------------------------------------------------------------- the plans


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path))
    monkeypatch.delenv("EAGLECHAT_CATALOG", raising=False)


@pytest.mark.parametrize("name", ["qwen3-30b-a3b-eagle3", "qwen3-coder-30b-a3b-eagle3"])
def test_a_30b_a3b_fits_24gb_in_4bit_and_is_refused_on_16gb(home, capsys, name):
    from eaglechat.cli import main
    from eaglechat.units import GiB

    assert main(["plan", name, "--gpu", "24", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    choice = plan["choice"]
    assert (choice["quant"], choice["format"], choice["context"]) == ("4bit", "nf4-dq", 4096)
    assert choice["breakdown"]["weights"] / GiB == pytest.approx(15.55, abs=0.05)  # bf16 would be 56.9 GiB
    assert choice["total_bytes"] / GiB == pytest.approx(18.7, abs=0.1) and plan["memory"]["budget_gib"] == 23.5
    assert any("MoE experts in nf4" in n for n in plan["notes"])
    assert main(["plan", name, "--gpu", "16"]) == 3
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "would fit: a 24 GB GPU (nf4-dq" in err


# --------------------------------------------------------------------------------------------- the heads


@pytest.mark.parametrize("qk_norm", [True, False])
def test_a_speculators_head_copied_from_a_qwen3_moe_config_reads_as_a_dense_layer(tmp_path, qk_norm):
    """A speculators head for a Qwen3-MoE base may carry the base's model_type and MoE keys in its
    transformer_layer_config; its draft layer is dense (Qwen3's q/k norms where the checkpoint has them)."""
    from test_eagle3 import deep_model
    from test_head_formats import (
        assert_same_drafts,
        head3,
        speculators_eagle3_config,
        speculators_state,
        transformer_layer_config,
        write,
    )

    from eaglechat.engine.heads import load_head

    model = deep_model("qwen3")
    head = head3(model, qk_norm=qk_norm)
    tlc = transformer_layer_config("qwen3_moe", num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                                   decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)
    config = speculators_eagle3_config(tlc, 0)
    loaded = load_head(write(tmp_path / "moe", config, speculators_state(head, model)), model)
    assert loaded.config.qk_norm == qk_norm
    assert_same_drafts(model, loaded, head)
