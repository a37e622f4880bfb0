"""bitsandbytes 8-bit / 4-bit on CPU (bnb >= 0.50 runs Linear8bitLt and Linear4bit on CPU).

What is checked, on a tiny random Llama with bnb-friendly shapes (every Linear a multiple of 64),
quantized through the engine's own `quantization_config` (transformers' BitsAndBytesConfig):
  - the quantized layers are bnb's, lm_head stays a plain Linear, and resident bits/param are the
    planner's numbers (memory.FORMAT_BITS);
  - tree verification (one forward over a tree with a 4D mask) equals sequential decoding of each
    root-to-node path on the same quantized model: relative logit error < 1e-4 (4-bit, fp32 compute)
    and < 2e-2 (8-bit), same argmax;
  - greedy EAGLE decoding equals plain decoding on the same quantized model, 4-bit and 8-bit.
    8-bit: bitsandbytes' LLM.int8 routes the activation columns in which *any* row of the batch
    reaches 6.0 through a 16-bit matmul, so a tree-verification batch and a one-token forward of the
    same position round differently (measured here: 0.03 absolute on one layer; one prompt of three
    diverging at token 22). The Decoder switches the 8-bit layers to eaglechat/engine/int8_rows.py,
    where each row keeps its own outliers: a one-row call is bitsandbytes' computation exactly, and a
    batch row differs from it only by fp32 summation order (~1e-6).
Both CPU 4-bit kernel paths run: the dequantize + F.linear fallback always, the AVX512-BF16 packed
kernel where the CPU has it (skipped otherwise).
"""

from __future__ import annotations

import bitsandbytes as bnb
import pytest
import torch

from eaglechat.engine.compile import CompiledSteps
from eaglechat.engine.decode import Decoder
from eaglechat.engine.protocol import GenerationParams, TreeBudget
from eaglechat.engine.tree import tree_from_parents
from eaglechat.fit.memory import FORMAT_BITS
from eaglechat.fit.quantization import quantization_config

VOCAB, PROMPT = 512, 12
TOL = {"none": 1e-4, "4bit": 1e-4, "8bit": 1e-4}


pytestmark = pytest.mark.usefixtures("quiet_bitsandbytes")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from tiny_models import build_model
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
    model = build_model(cfg, seed=0)
    with torch.no_grad():  # larger weights: a wrong mask, position or kernel shows in the logits
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.mul_(4.0)
    path = tmp_path_factory.mktemp("tiny-quant") / "base"
    model.save_pretrained(path)
    return path


_cache: dict = {}


def load(tiny_dir, quant: str, threshold: float | None = None):
    key = (quant, threshold)
    if key not in _cache:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        q = quantization_config(quant, torch.float32)
        if q is not None and threshold is not None:
            q.llm_int8_threshold = threshold
        _cache[key] = AutoModelForCausalLM.from_pretrained(
            tiny_dir, dtype=torch.float32, attn_implementation="sdpa", quantization_config=q,
            device_map="cpu" if q is not None else None,
        ).eval()
    return _cache[key]


def cpu_paths():
    from bitsandbytes.nn.modules import has_avx512bf16

    return [False, pytest.param(True, marks=pytest.mark.skipif(not has_avx512bf16(), reason="CPU lacks AVX512-BF16"))]


def set_4bit_path(model, packed: bool) -> None:
    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            m.support_avx512bf16_for_cpu = packed


# --------------------------------------------------------------------------------------------- layers


@pytest.mark.parametrize("quant,cls", [("8bit", "Linear8bitLt"), ("4bit", "Linear4bit")])
def test_layers_and_resident_bits(tiny_dir, quant, cls):
    model = load(tiny_dir, quant)
    layer = model.model.layers[0].mlp.down_proj
    assert isinstance(layer, getattr(bnb.nn, cls))
    assert type(model.lm_head) is torch.nn.Linear  # never quantized: the head calls it per draft step
    w = layer.weight
    if quant == "4bit":
        qs = w.quant_state
        assert qs.nested  # double quant (the profiles' and the engine's default)
        nbytes = w.numel() * w.element_size() + qs.absmax.numel() * qs.absmax.element_size()
        nbytes += qs.state2.absmax.numel() * qs.state2.absmax.element_size() + 4  # + a 1 KiB code table per layer
        expected = FORMAT_BITS["nf4-dq"]
    else:
        scb = layer.state.SCB if layer.state.SCB is not None else w.SCB
        nbytes = w.numel() * w.element_size() + scb.numel() * scb.element_size()
        expected = 8 + 32 / layer.in_features  # one fp32 scale per output row
        assert 8 + 32 / 4096 == pytest.approx(FORMAT_BITS["int8"], abs=1e-3)  # what the planner uses for 7B/8B
    bits = nbytes * 8 / (layer.in_features * layer.out_features)
    assert bits == pytest.approx(expected, abs=0.01)


# --------------------------------------------------------------------------------------------- tree vs sequential


def _prefill(dec: Decoder, prompt: torch.Tensor) -> None:
    chain = torch.arange(prompt.numel())
    dec.target.forward(prompt, chain, chain[:, None] >= chain[None, :])


def tree_vs_sequential(model, seed: int = 0) -> tuple[float, int, int]:
    """Largest relative logit error between one tree forward and per-path sequential decoding."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, VOCAB, (PROMPT,), generator=g)
    parents = [-1, 0, 0, 1, 1, 2, 3, 5, 7, 8]
    tokens = torch.randint(3, VOCAB, (len(parents),), generator=g).tolist()
    tree = tree_from_parents(tokens, parents)
    dec = Decoder(model, None, 64)
    _prefill(dec, prompt)
    tree_logits = dec.target.logits(dec.target.forward(tree.tokens, tree.depth, tree.ancestors)[0])
    worst, agree = 0.0, 0
    one = torch.ones(1, 1, dtype=torch.bool)
    for node in range(len(parents)):
        dec.cache.truncate(PROMPT)
        for j in torch.nonzero(tree.ancestors[node]).flatten().tolist():
            feat = dec.target.forward(torch.tensor([tokens[j]]), torch.zeros(1, dtype=torch.long), one)[0]
        seq = dec.target.logits(feat[-1])
        worst = max(worst, ((tree_logits[node] - seq).abs().max() / seq.abs().max()).item())
        agree += int(tree_logits[node].argmax() == seq.argmax())
    return worst, agree, len(parents)


@pytest.mark.parametrize("packed", cpu_paths())
def test_4bit_tree_verification_equals_sequential(tiny_dir, packed):
    model = load(tiny_dir, "4bit")
    set_4bit_path(model, packed)
    worst, agree, n = tree_vs_sequential(model)
    tol = TOL["4bit"] if not packed else 2e-2  # the packed kernel computes in bf16
    assert worst < tol and agree == n


@pytest.mark.parametrize("quant", ["none", "8bit"])
def test_tree_verification_equals_sequential(tiny_dir, quant):
    worst, agree, n = tree_vs_sequential(load(tiny_dir, quant))
    assert worst < TOL[quant] and agree == n


# --------------------------------------------------------------------------------------------- EAGLE vs plain


class OracleDrafts:
    """Drafts the known greedy continuation (plus a wrong sibling per level): many acceptances, so the
    accept/KV-compaction path runs on the quantized model, not just the bonus token."""

    def __init__(self, real, sequence: list[int], dec: Decoder):
        self.real, self.seq, self.dec = real, sequence, dec

    def __getattr__(self, name):
        return getattr(self.real, name)

    def draft(self, root: int, budget: TreeBudget):
        pos = len(self.dec.cached_ids)  # root sits at this position
        nxt = self.seq[pos + 1 : pos + 1 + budget.depth]
        tokens, parents = [root], [-1]
        for i, tok in enumerate(nxt):
            parent = 0 if i == 0 else len(tokens) - 2
            tokens += [tok, (tok + 7) % VOCAB]
            parents += [parent, parent]
        return tree_from_parents(tokens, parents)


def greedy(model, prompt: list[int], speculate: bool, n: int = 16, oracle: list[int] | None = None, seed: int = 1):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_models import random_head

    dec = Decoder(model, random_head(model, seed=seed), 128)
    if oracle is not None:
        dec.drafter = OracleDrafts(dec.drafter, oracle, dec)
    ids = []
    budget = TreeBudget(total_tokens=8, depth=3, draft_top_k=4)
    for step in dec.generate(prompt, GenerationParams(max_new_tokens=n, speculate=speculate), budget, set()):
        ids += step.tokens
    return ids, dec.stats


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@pytest.mark.parametrize("quant", ["4bit", "none"])
def test_greedy_eagle_equals_plain_quantized(tiny_dir, quant):
    model = load(tiny_dir, quant)
    set_4bit_path(model, False)
    prompt = torch.randint(3, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(3)).tolist()
    plain, _ = greedy(model, prompt, speculate=False)
    eagle, stats = greedy(model, prompt, speculate=True)  # the real drafter with a random head
    assert eagle == plain
    oracle, ostats = greedy(model, prompt, speculate=True, oracle=prompt + plain)
    assert oracle == plain and ostats.mean_accepted > 2.0


def test_int8_rows_are_computed_as_one_row_calls(tiny_dir):
    """A batch whose rows have outliers in different columns: bitsandbytes as shipped computes each
    row differently from the same row alone; the per-row layer does not."""
    from eaglechat.engine.int8_rows import make_rows_exact

    model = load(tiny_dir, "8bit", threshold=6.0)
    layer = model.model.layers[0].mlp.gate_proj
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, layer.in_features, generator=g)
    for row in range(9):  # one outlier per row, each in its own column
        x[row, 7 * row] = 8.0 + row
    reference = type(layer) is bnb.nn.Linear8bitLt
    with torch.no_grad():
        if reference:  # bitsandbytes' own layer (before any Decoder switched this cached model)
            alone = torch.cat([layer(x[i : i + 1]) for i in range(9)])
            batch_error = (layer(x) - alone).abs().max().item()
            assert batch_error > 1e-3  # the mechanism: other rows' outlier columns change row r
        make_rows_exact(model)
        assert type(layer) is not bnb.nn.Linear8bitLt
        rows = torch.cat([layer(x[i : i + 1]) for i in range(9)])
        if reference:
            assert torch.equal(rows, alone)  # one row: bitsandbytes' computation, bit for bit
        assert (layer(x) - rows).abs().max().item() < 1e-5 * rows.abs().max().item()


@pytest.mark.parametrize("seed", [4, 7])
def test_greedy_eagle_equals_plain_8bit(tiny_dir, seed):
    """LLM.int8 with its default outlier threshold (6.0). Before the per-row layer, seeds 4 and 7
    diverged at tokens 22 and 8 (a verify row against the one-token forward of the same position)."""
    model = load(tiny_dir, "8bit")
    prompt = torch.randint(3, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(seed)).tolist()
    plain, _ = greedy(model, prompt, speculate=False, n=40)
    oracle, stats = greedy(model, prompt, speculate=True, n=40, oracle=prompt + plain)
    assert oracle == plain and stats.mean_accepted > 2.0
    eagle, _ = greedy(model, prompt, speculate=True, n=40)
    assert eagle == plain


# --------------------------------------------------------------------------------------------- the default model


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["8bit", "4bit"])
def test_default_model_quantized_eagle_vs_plain(quant, default_base, capsys):
    """SmolLM2-135M (the embedded default) quantized on CPU with its shipped head: greedy EAGLE against
    plain decoding on the same quantized model. Slow on CPU: bnb's int8 and the 4-bit dequant fallback
    are far slower than fp32 there."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from eaglechat.engine.heads import load_head
    from eaglechat.models import default_model

    base = default_base
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(
        base, dtype=torch.float32, attn_implementation="sdpa",
        quantization_config=quantization_config(quant, torch.float32), device_map="cpu",
    ).eval()
    head, which = load_head(default_model.DEFAULT_HEAD_DIR, model), "shipped head"
    tok = AutoTokenizer.from_pretrained(base)
    ids = tok.apply_chat_template([{"role": "user", "content": "Explain why the sky is blue."}],
                                  add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    budget = TreeBudget(total_tokens=8, depth=3, draft_top_k=4)
    runs = {}
    for speculate in (False, True):
        dec = Decoder(model, head, 256)
        out = []
        for step in dec.generate(ids, GenerationParams(max_new_tokens=12, speculate=speculate), budget, set()):
            out += step.tokens
        runs[speculate] = (out, dec.stats)
    (plain, _), (eagle, stats) = runs[False], runs[True]
    at = first_mismatch(eagle, plain)
    with capsys.disabled():
        print(f"\n[default model, {quant}, {which}] EAGLE vs plain: "
              f"{sum(a == b for a, b in zip(eagle, plain))}/{len(plain)} equal, first mismatch {at}, "
              f"tau {stats.mean_accepted:.2f}")
    assert eagle == plain


# --------------------------------------------------------------------------------------------- compiled steps


def quant_tensors(model) -> list[torch.Tensor]:
    """The tensors a quantized Linear reads besides its inputs: 4-bit weights and their QuantState
    (absmax, code table, nested absmax/offset), int8 codes and row scales."""
    found = []
    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            qs = m.weight.quant_state
            found += [m.weight, qs.absmax, qs.code]
            if qs.nested:
                found += [qs.offset, qs.state2.absmax, qs.state2.code]
        elif isinstance(m, bnb.nn.Linear8bitLt):
            found += [m.weight, m.state.CB, m.state.SCB]
    return [t for t in found if isinstance(t, torch.Tensor)]


class Inputs:
    """A counting torch.compile backend that records each graph's inputs: (tensor, static?) where static
    is how dynamo tagged it (`_dynamo_static_input_type`, which AOT autograd turns into the static
    input indices that CUDA graph trees replay in place instead of copying into the graph's own memory:
    torch/_functorch/_aot_autograd/frontend_utils.py, torch/_inductor/compile_fx.py get_static_input_idxs)."""

    def __init__(self):
        from torch._dynamo.testing import CompileCounterWithBackend

        self.counter = CompileCounterWithBackend("aot_eager")
        self.seen: list[tuple[torch.Tensor, bool]] = []

    def __call__(self, gm, example_inputs):
        for node, value in zip(gm.graph.find_nodes(op="placeholder"), example_inputs):
            static = bool(node.meta.get("tensor_dict", {}).get("_dynamo_static_input_type"))
            self.seen.append((value, static))
        return self.counter(gm, example_inputs)


@pytest.mark.parametrize("quant", ["4bit", "8bit"])
def test_quantized_forward_compiles_whole_and_never_copies_quant_state(tiny_dir, quant):
    """The verify forward over an nf4 base (bitsandbytes' gemm_4bit custom op, the one CUDA runs) and over the
    per-row LLM.int8 layers, under torch.compile(fullgraph=True) through AOT autograd: no graph break
    (fullgraph raises on one), one graph for every step of two prompts, the same tokens as eager
    decoding, and every quantized weight, QuantState tensor and int8 scale it reads is a static input
    (a CUDA graph replay reads it in place, no copy)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_models import random_head

    torch._dynamo.reset()
    model = load(tiny_dir, quant)
    set_4bit_path(model, False)
    budget = TreeBudget(total_tokens=8, depth=3, draft_top_k=4)
    prompts = [torch.randint(3, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(s)).tolist() for s in (3, 4)]

    def decode(decoder, prompt, n=10):
        return [t for s in decoder.generate(prompt, GenerationParams(max_new_tokens=n), budget, set()) for t in s.tokens]

    eager = Decoder(model, random_head(model), 96)
    expected = [decode(eager, p) for p in prompts]
    inputs = Inputs()
    compiled = Decoder(model, random_head(model), 96)
    compiled.use(CompiledSteps(compiled, lambda fn: torch.compile(fn, backend=inputs, fullgraph=True, dynamic=False)))  # the whole step
    try:
        assert [decode(compiled, p) for p in prompts] == expected
        assert compiled.stats.target_forwards >= 3 and inputs.counter.frame_count == 1
        quantized = quant_tensors(model)
        read = [(t, static) for t, static in inputs.seen if any(t is q for q in quantized)]
        assert len({id(t) for t, _ in read}) >= 2 * 7 * 2  # 7 Linears x 2 layers, weight + state each
        assert all(static for _, static in read), [t.shape for t, static in read if not static]
    finally:
        torch._dynamo.reset()


def test_int8_layer_reads_nothing_back_and_keeps_its_shapes(tiny_dir):
    """The per-row LLM.int8 forward makes no host read (no any()/argwhere/nonzero), whatever the
    number of outliers, in both ways of computing the 16-bit part (one row: gathered columns; a tree
    of rows: dense)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from sync_counter import SyncCounter

    from eaglechat.engine.int8_rows import make_rows_exact

    model = load(tiny_dir, "8bit", threshold=6.0)
    make_rows_exact(model)
    layer = model.model.layers[0].mlp.down_proj
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for rows, outliers in ((1, 0), (1, 3), (1, 200), (9, 5)):
            x = torch.randn(rows, layer.in_features, generator=g)
            x[:, :outliers] += 9.0
            with SyncCounter() as counter:
                out = layer(x)
            assert out.shape == (rows, layer.out_features) and bool(torch.isfinite(out).all())
            assert counter.count("reads") == 0, counter.where("reads", "all")
    # and a whole decode over the 8-bit base: one read per step, as over an unquantized one
    from sync_counter import count_decode
    from tiny_models import random_head

    decoder = Decoder(model, random_head(model), 96)
    prompt = torch.randint(3, VOCAB, (PROMPT,), generator=g).tolist()
    counter, tokens = count_decode(decoder, prompt, GenerationParams(max_new_tokens=12), TreeBudget(8, 3, 4))
    assert len(tokens) == 12 and counter.count("reads", "decode") == decoder.stats.target_forwards + 1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("quant", ["4bit", "8bit"])
@pytest.mark.parametrize("runner", ["graphs", pytest.param("inductor", marks=pytest.mark.slow)])  # inductor: minutes
def test_quantized_steps_replay_as_cuda_graphs(tiny_dir, quant, runner):
    """On a GPU: the decode steps over an nf4 / LLM.int8 base captured as CUDA graphs (or compiled by
    inductor into its own), no capture given up, no cudagraph skipped, no new graph over two prompts, the
    same tokens as eager decoding (fp32 compute, where eager and compiled kernels agree to ~1e-6)."""
    import sys
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    from eaglechat.engine.compile import CompiledSteps, GraphSteps, step_compiler

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_models import random_head

    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    model = AutoModelForCausalLM.from_pretrained(
        tiny_dir, dtype=torch.float32, attn_implementation="sdpa",
        quantization_config=quantization_config(quant, torch.float32), device_map="cuda").eval()
    budget = TreeBudget(total_tokens=8, depth=3, draft_top_k=4)
    prompts = [torch.randint(3, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(s)).tolist() for s in (3, 4)]

    def decode(decoder, prompt, speculate):
        params = GenerationParams(max_new_tokens=24, speculate=speculate)
        return [t for s in decoder.generate(prompt, params, budget, set()) for t in s.tokens]

    eager = Decoder(model, random_head(model).cuda(), 128)
    compiled = Decoder(model, random_head(model).cuda(), 128)
    steps = (GraphSteps(compiled) if runner == "graphs" else
             CompiledSteps(compiled, step_compiler("cuda"), torch.compiler.cudagraph_mark_step_begin))
    compiled.use(steps)
    built = (lambda: steps.total.captures) if runner == "graphs" else (lambda: counters["stats"]["unique_graphs"])
    try:
        for speculate in (False, True):  # warm-up builds every graph
            decode(compiled, prompts[0], speculate)
        graphs = built()
        for prompt in prompts:
            for speculate in (False, True):
                assert decode(compiled, prompt, speculate) == decode(eager, prompt, speculate)
        assert built() == graphs and compiled.runner is steps, steps.failure
        assert counters["inductor"]["cudagraph_skips"] == 0
    finally:
        torch._dynamo.reset()
