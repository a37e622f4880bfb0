"""Memory estimates: pure functions of (model shape, weight format, context, tree) -> bytes.

No torch, no files, no device: which configuration to load is the planner's question (planner.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglechat.engine.protocol import PREFILL_CHUNK, pool_size
from eaglechat.fit.hardware import DTYPE_SHORT
from eaglechat.units import GiB

GEMMA4_TYPES = ("gemma4", "gemma4_text")  # the multimodal model's config.json and its language model's
GPT2_NAMES = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
              "max_position_embeddings": "n_positions", "intermediate_size": "n_inner"}


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs to know about a base model, before any weights are downloaded."""

    params: int  # total parameters of the base model (embeddings included)
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_context: int
    tied_embeddings: bool = False
    # mixture of experts (0 = dense): experts per MoE layer, how many a token uses, their MLP width
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    checkpoint_quant: str = ""  # a pre-quantized checkpoint's method ("mxfp4": gpt-oss), "" for 16/32-bit
    # Layers of a second attention shape (Gemma 4's global layers, 1 in 6): how many, their head_dim and KV
    # heads (0: the fields above), and whether their values are their keys (no v_proj: attention_k_eq_v)
    global_layers: int = 0
    global_head_dim: int = 0
    global_kv_heads: int = 0
    global_values_are_keys: bool = False
    # layers that attend over an earlier layer's keys and values (no k/v projection, no cache of their own:
    # Gemma 4's num_kv_shared_layers), and how many of them are global layers
    kv_shared_layers: int = 0
    kv_shared_global_layers: int = 0
    # Gemma 4's MoE layers also run a dense MLP (intermediate_size wide) beside the experts, and route with an
    # nn.Linear (which bitsandbytes quantizes; Qwen3-MoE's and gpt-oss's routers are bare parameters)
    dense_mlp_beside_experts: bool = False

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @classmethod
    def from_config_json(cls, path) -> "ModelShape":
        """From a Hugging Face config.json as it lies on disk, without transformers (multimodal configs:
        the language model's `text_config`)."""
        from types import SimpleNamespace

        raw = read_config_json(path)
        for ours, gpt2 in GPT2_NAMES.items():  # GPT-2-style configs spell the sizes their own way
            if raw.get(ours) is None and raw.get(gpt2) is not None:
                raw[ours] = raw[gpt2]
        if raw.get("intermediate_size") is None and isinstance(raw.get("hidden_size"), int) and "n_embd" in raw:
            raw["intermediate_size"] = 4 * raw["hidden_size"]  # GPT-2's n_inner default
        return cls.from_hf_config(SimpleNamespace(**raw))

    @classmethod
    def from_hf_config(cls, cfg) -> "ModelShape":
        """From a transformers config (or a config.json's keys as attributes). Gemma 4's heterogeneous
        configs (per-layer head_dim and KV heads) are read layer by layer."""
        from dataclasses import replace

        from eaglechat.validate import config_value

        heads = int(cfg.num_attention_heads)
        hidden = int(cfg.hidden_size)
        inter = int(cfg.intermediate_size)
        layers = int(cfg.num_hidden_layers)
        kv = int(config_value(cfg, "num_key_value_heads") or heads)
        head_dim = int(config_value(cfg, "head_dim") or hidden // heads)
        vocab = int(cfg.vocab_size)
        tied = bool(getattr(cfg, "tie_word_embeddings", False))
        # Qwen3-MoE/Mixtral name it num_experts / num_experts_per_tok, gpt-oss num_local_experts / experts_per_token,
        # Gemma 4 num_experts / top_k_experts (its experts exist only under enable_moe_block)
        experts = int(getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None) or 0)
        if getattr(cfg, "enable_moe_block", True) is False:
            experts = 0
        per_token = int(getattr(cfg, "num_experts_per_tok", None) or getattr(cfg, "experts_per_token", None)
                        or getattr(cfg, "top_k_experts", None) or 0)
        moe_inter = int(getattr(cfg, "moe_intermediate_size", None) or inter) if experts else 0
        quant = getattr(cfg, "quantization_config", None) or {}
        method = str((quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", "")) or "")
        shape = cls(
            params=0,
            num_layers=layers,
            hidden_size=hidden,
            intermediate_size=inter,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=head_dim,
            vocab_size=vocab,
            max_context=int(getattr(cfg, "max_position_embeddings", 2048)),
            tied_embeddings=tied,
            num_experts=experts,
            experts_per_token=per_token if experts else 0,
            moe_intermediate_size=moe_inter,
            checkpoint_quant=method,
            dense_mlp_beside_experts=bool(experts and getattr(cfg, "enable_moe_block", False)),
            **attention_layout(cfg, kv, head_dim),
        )
        return replace(shape, params=count_params(shape) + gemma4_vectors(cfg, shape))


def layer_attention(cfg, kv: int, head_dim: int) -> list[tuple[int, int, bool]]:
    """(KV heads, head_dim, values = keys) of each layer. A transformers config states per-layer values in
    `per_layer_config` (a dict of overrides once saved); Gemma 4's own config.json states its global layers as
    `global_head_dim` (default 512) and, where `attention_k_eq_v`, `num_global_key_value_heads` (transformers
    5.25's Gemma4TextConfig.__post_init__ turns them into the same overrides)."""
    layers = int(cfg.num_hidden_layers)
    types = getattr(cfg, "layer_types", None)
    gemma4 = str(getattr(cfg, "model_type", "")) in GEMMA4_TYPES or hasattr(cfg, "global_head_dim")
    if types is None and gemma4:  # transformers' default: five sliding layers to one global, the last global
        types = ["sliding_attention" if (i + 1) % 6 and i < layers - 1 else "full_attention" for i in range(layers)]
    k_eq_v = bool(getattr(cfg, "attention_k_eq_v", False))
    overrides = getattr(cfg, "per_layer_config", None)
    out = []
    for i in range(layers):
        full = types is not None and types[i] != "sliding_attention"
        if isinstance(overrides, dict):  # a saved config.json
            over = overrides.get(str(i)) or overrides.get(i) or {}
        elif getattr(cfg, "is_heterogeneous", False):  # transformers' per-layer view (every config has one)
            over = {k: getattr(overrides[i], k, None) for k in ("head_dim", "num_key_value_heads")}
        elif gemma4 and full:
            over = {"head_dim": getattr(cfg, "global_head_dim", None) or 512}
            if k_eq_v and getattr(cfg, "num_global_key_value_heads", None):
                over["num_key_value_heads"] = cfg.num_global_key_value_heads
        else:
            over = {}
        out.append((int(over.get("num_key_value_heads") or kv), int(over.get("head_dim") or head_dim),
                    k_eq_v and full))
    return out


def attention_layout(cfg, kv: int, head_dim: int) -> dict:
    """ModelShape's global_* and kv_shared_* fields of a config (a second attention shape at most)."""
    per_layer = layer_attention(cfg, kv, head_dim)
    shared_from = len(per_layer) - int(getattr(cfg, "num_kv_shared_layers", 0) or 0)
    others = {a for a in per_layer if a != (kv, head_dim, False)}
    if len(others) > 1:
        raise ValueError(f"more than two attention shapes across layers: {sorted(others)}")
    glob = others.pop() if others else None
    is_global = [a == glob for a in per_layer]
    return {
        "global_layers": sum(is_global),
        "global_kv_heads": glob[0] if glob else 0,
        "global_head_dim": glob[1] if glob else 0,
        "global_values_are_keys": bool(glob and glob[2]),
        "kv_shared_layers": len(per_layer) - shared_from,
        "kv_shared_global_layers": sum(is_global[shared_from:]),
    }


def attention_kinds(shape: ModelShape) -> list[tuple[int, int, int, bool, bool]]:
    """(layers, KV heads, head_dim, own K/V projections and cache, a v_proj) of each kind of attention layer."""
    g, s, sg = shape.global_layers, shape.kv_shared_layers, shape.kv_shared_global_layers
    kv, hd = shape.num_key_value_heads, shape.head_dim
    gkv, ghd = shape.global_kv_heads or kv, shape.global_head_dim or hd
    gv = not shape.global_values_are_keys
    return [(shape.num_layers - g - (s - sg), kv, hd, True, True), (s - sg, kv, hd, False, True),
            (g - sg, gkv, ghd, True, gv), (sg, gkv, ghd, False, gv)]


def attention_params(shape: ModelShape) -> int:
    """Every layer's q, k, v and o projections (all nn.Linear), per kind of layer."""
    h, heads = shape.hidden_size, shape.num_attention_heads
    total = 0
    for n, kv, hd, own, has_v in attention_kinds(shape):
        total += n * (2 * h * heads * hd + (h * kv * hd * (2 if has_v else 1) if own else 0))
    return total


def count_params(shape: ModelShape) -> int:
    """Parameters the shape's fields imply: embeddings (and an untied lm_head), every layer's attention, MLP
    or experts and router (plus a dense MLP beside them) and two norms, the final norm. Families with more
    vectors per layer add theirs (`gemma4_vectors`)."""
    h = shape.hidden_size
    mlp = 3 * h * shape.intermediate_size
    per_layer = 2 * h
    if shape.is_moe:
        per_layer += shape.num_experts * (3 * h * shape.moe_intermediate_size + h)
        per_layer += mlp if shape.dense_mlp_beside_experts else 0
    else:
        per_layer += mlp
    return attention_params(shape) + shape.num_layers * per_layer + shape.vocab_size * h * (1 if shape.tied_embeddings else 2) + h


def gemma4_vectors(cfg, shape: ModelShape) -> int:
    """What Gemma 4 (transformers' Gemma4TextModel) holds beyond `count_params`: four norms a layer (not two),
    q and k norms, three more norms and the router's two scales in MoE layers, the per-layer-input tables and
    projections (PLE: E2B/E4B) and the doubled MLP of KV-shared layers (`use_double_wide_mlp`); 0 for others.
    The last two hold Linears that bitsandbytes quantizes: weight_bytes charges them 16-bit (an over-count)."""
    if str(getattr(cfg, "model_type", "")) not in GEMMA4_TYPES:
        return 0
    h, layers = shape.hidden_size, shape.num_layers
    extra = layers * 2 * h
    for n, _, hd, own, _ in attention_kinds(shape):
        extra += n * hd * (2 if own else 1)  # q_norm; k_norm where the layer has its own keys
    if shape.is_moe:
        extra += layers * (3 * h + h + shape.num_experts)
    ple = int(getattr(cfg, "hidden_size_per_layer_input", 0) or 0)
    if ple:
        ple_vocab = int(getattr(cfg, "vocab_size_per_layer_input", None) or shape.vocab_size)
        extra += ple_vocab * layers * ple + h * layers * ple + ple + layers * (2 * h * ple + h)
    if getattr(cfg, "use_double_wide_mlp", False):
        extra += shape.kv_shared_layers * 3 * h * shape.intermediate_size
    return extra


def read_config_json(path) -> dict:
    """A config.json as a dict, a multimodal one's `text_config` merged under the top level."""
    import json
    from pathlib import Path

    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    return {**raw.get("text_config", {}), **raw}


# ============================================================================== byte estimates
#
# Everything below is arithmetic on a ModelShape: no torch, no files. Sources and the numbers these
# formulas reproduce: bitsandbytes' storage formats (tests/test_quant.py measures the resident bits), the
# models' config.json shapes and the EAGLE README's head sizes (tests/test_memory.py).

# resident bits per quantizable-linear parameter, bitsandbytes 0.50 (absmax, nested absmax, SCB included)
FORMAT_BITS = {"fp32": 32.0, "fp16": 16.0, "bf16": 16.0, "int8": 8.007, "nf4": 4.5, "nf4-dq": 4.127}
FORMAT_LABEL = {
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "int8": "bitsandbytes LLM.int8",
    "nf4": "bitsandbytes nf4",
    "nf4-dq": "bitsandbytes nf4 + double quant",
}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}

# allocator fragmentation: charged on what is allocated and freed while the engine runs (activations,
# tree buffers) and on weights that bitsandbytes quantizes layer by layer from 16-bit copies at load.
# 16/32-bit weights, the head and the static KV cache are allocated once, in order: no charge.
FRAGMENTATION = 0.06
RUNTIME_BYTES = {  # CUDA context + cuBLAS workspace; on CPU/MPS: the Python/torch process itself
    "cuda": int(0.5 * GiB),
    "mps": int(0.3 * GiB),
    "cpu": int(0.5 * GiB),
}
# A real card's free memory is read with torch.cuda.mem_get_info, which creates the CUDA context first:
# the context is already out of that number. What is left to come is cuBLAS/cuBLASLt's handles and
# workspaces and the kernels CUDA loads lazily at their first call (an allowance, not a measurement).
CUDA_AFTER_CONTEXT_BYTES = int(0.25 * GiB)
# MXFP4 (OCP microscaling): 4-bit E2M1 values plus one 8-bit E8M0 scale per block of 32
MXFP4_BITS = 4.25
TIGHT_FRACTION = 0.92  # above this share of the budget a plan is "tight"


def format_for(quant: str, dtype: str = "float16", double_quant: bool = True) -> str:
    """`--quant` value (+ compute dtype) -> weight format name used in plans."""
    if quant in (None, "none"):
        return DTYPE_SHORT.get(dtype, "fp16")  # the unquantized formats are named as the dtypes
    if quant == "8bit":
        return "int8"
    if quant == "4bit":
        return "nf4-dq" if double_quant else "nf4"
    raise ValueError(f"unknown quantization {quant!r} (none, 8bit, 4bit)")


def linear_params(shape: ModelShape) -> int:
    """Parameters in the decoder layers' nn.Linear modules: what bitsandbytes quantizes (transformers'
    replace_with_bnb_linear swaps `type(module) is nn.Linear` and nothing else): every layer's attention by
    kind (Gemma 4's global layers their own shape), the MLP, or beside the experts Gemma 4's dense MLP and
    router projection."""
    h = shape.hidden_size
    mlp = 3 * h * shape.intermediate_size
    if shape.is_moe:
        mlp = mlp + shape.num_experts * h if shape.dense_mlp_beside_experts else 0
    return attention_params(shape) + shape.num_layers * mlp


def expert_params(shape: ModelShape) -> int:
    """Parameters of the MoE experts. transformers 5 keeps them as fused 3D nn.Parameters
    (Qwen3MoeExperts, GptOssExperts, MixtralExperts: gate_up_proj [E, 2I, H], down_proj [E, H, I]), which
    are not nn.Linear: transformers' bitsandbytes integration leaves them in the compute dtype; eaglechat's
    --quant 4bit quantizes them to nf4 per expert (fit/nf4_experts.py), --quant 8bit does not."""
    if not shape.is_moe:
        return 0
    return shape.num_layers * shape.num_experts * 3 * shape.hidden_size * shape.moe_intermediate_size


def weight_bytes(shape: ModelShape, fmt: str, dtype_bytes: int = 2, *, expert_bits: float | None = None) -> int:
    """Resident bytes of the base weights: quantizable linears at the format's bits, MoE experts at
    `expert_bits` (default: the compute dtype, as transformers' bitsandbytes integration leaves them), everything
    else (embedding, lm_head, norms, routers that are bare parameters) in the compute dtype."""
    lin = linear_params(shape)
    experts = expert_params(shape)
    rest = max(0, shape.params - lin - experts)  # embeddings, norms, anything the shape does not itemize
    unquantized = fmt in ("fp32", "fp16", "bf16")
    lin_bits = FORMAT_BITS[fmt] if not unquantized else dtype_bytes * 8
    e_bits = expert_bits if expert_bits is not None else dtype_bytes * 8
    return int(lin * lin_bits / 8) + int(experts * e_bits / 8) + rest * dtype_bytes


def head_params(shape: ModelShape, head_kind: str = "eagle2", draft_vocab: int | None = None) -> int:
    """EAGLE draft head without the shared embedding: one decoder layer + fc. EAGLE-3 heads also
    carry their own (reduced-vocabulary) lm_head and a 3H->H fc."""
    h = shape.hidden_size
    q, kv = shape.num_attention_heads * shape.head_dim, shape.num_key_value_heads * shape.head_dim
    layer = 2 * h * q + 2 * h * kv + 3 * h * shape.intermediate_size + 2 * h
    if head_kind in ("eagle3", "eagle-3"):
        # attention input is cat(embedding, fused feature) = 2H wide
        layer += h * q + 2 * h * kv
        return layer + 3 * h * h + (draft_vocab or shape.vocab_size) * h + h
    return layer + 2 * h * h + h


def head_bytes(
    shape: ModelShape,
    dtype_bytes: int = 2,
    *,
    share_embedding: bool = True,
    head_kind: str = "eagle2",
    draft_vocab: int | None = None,
) -> int:
    """The draft head in the compute dtype. eaglechat points the head at the base embedding; the
    official code keeps a copy (share_embedding=False adds it)."""
    params = head_params(shape, head_kind, draft_vocab)
    if not share_embedding:
        params += shape.vocab_size * shape.hidden_size
    return params * dtype_bytes


def kv_bytes_per_token(shape: ModelShape, dtype_bytes: int = 2, draft_layers: int = 1) -> int:
    """Keys and values of one position: every base layer with a cache of its own, by kind (Gemma 4's global
    layers hold their fewer, wider heads, values beside keys even where values = keys: they are normed apart;
    KV-shared layers hold none), plus the draft layer's (the shape's first kind)."""
    values = sum(n * 2 * kv * hd for n, kv, hd, own, _ in attention_kinds(shape) if own)
    return (values + draft_layers * 2 * shape.num_key_value_heads * shape.head_dim) * dtype_bytes


def kv_bytes(shape: ModelShape, context: int, dtype_bytes: int = 2, draft_layers: int = 1) -> int:
    """Static KV cache for `context` positions: every base layer plus the head's one layer."""
    return kv_bytes_per_token(shape, dtype_bytes, draft_layers) * context


def tree_bytes(shape: ModelShape, context: int, total_tokens: int, top_k: int, depth: int, dtype_bytes: int = 2) -> int:
    """Per-step tree state: KV slots for the tree tokens past the context, the 4D verify mask,
    the draft's per-step logits over top_k rows and the candidate pool's features."""
    t = total_tokens + 1
    pool = pool_size(depth, top_k)
    kv_slots = kv_bytes_per_token(shape, dtype_bytes) * t
    mask = t * (context + t) * 4
    draft_logits = 2 * top_k * shape.vocab_size * 4
    features = pool * shape.hidden_size * dtype_bytes * 2
    return kv_slots + mask + draft_logits + features


def activation_bytes(
    shape: ModelShape,
    fmt: str,
    context: int,
    total_tokens: int,
    dtype_bytes: int = 2,
    prefill_chunk: int = PREFILL_CHUNK,
) -> int:
    """Peak transient memory of one forward: the larger of a chunked prefill (eager attention scores
    fp16 + fp32 softmax + cast = 8 B per score, MLP intermediates, last-position logits) and a tree
    verification (T x context scores, T x vocab logits in the dtype + fp32 upcast + probabilities).
    4-bit formats add bitsandbytes' dequantization scratch (one 16-bit copy of the largest linear)."""
    heads, h, inter, vocab = shape.num_attention_heads, shape.hidden_size, shape.intermediate_size, shape.vocab_size
    if shape.is_moe:  # a token goes through experts_per_token expert MLPs
        inter = max(1, shape.experts_per_token) * shape.moe_intermediate_size
        inter += shape.intermediate_size if shape.dense_mlp_beside_experts else 0  # Gemma 4: and a dense MLP

    def forward_peak(q_len: int, kv_len: int, logits_rows: int) -> int:
        scores = heads * q_len * kv_len * 8
        mlp = q_len * inter * dtype_bytes * 3
        hidden = q_len * h * dtype_bytes * 4
        logits = logits_rows * vocab * (dtype_bytes + 4 + 4)
        return scores + mlp + hidden + logits

    chunk = min(prefill_chunk, context)
    t = total_tokens + 1
    peak = max(forward_peak(chunk, context, 1), forward_peak(t, context + t, t))
    if fmt in ("nf4", "nf4-dq"):
        widest_q = shape.num_attention_heads * max(shape.head_dim, shape.global_head_dim)
        peak += max(h * inter, h * widest_q) * 2
    return peak


@dataclass
class Estimate:
    """Bytes of one configuration (format, context, tree) on one device kind."""

    format: str
    context: int
    total_tokens: int
    weights: int
    head: int
    kv_cache: int
    tree_buffers: int
    activations: int
    fragmentation: int
    runtime: int

    @property
    def total(self) -> int:
        return (
            self.weights + self.head + self.kv_cache + self.tree_buffers + self.activations + self.fragmentation + self.runtime
        )

    def to_dict(self) -> dict:
        return {
            "weights": self.weights,
            "head": self.head,
            "kv_cache": self.kv_cache,
            "tree_buffers": self.tree_buffers,
            "activations": self.activations,
            "fragmentation": self.fragmentation,
            "runtime": self.runtime,
            "total": self.total,
        }


def estimate(
    shape: ModelShape,
    fmt: str,
    context: int,
    *,
    total_tokens: int = 16,
    depth: int = 4,
    top_k: int = 4,
    dtype: str = "float16",
    device_kind: str = "cuda",
    share_embedding: bool = True,
    head_kind: str = "eagle2",
    draft_vocab: int | None = None,
    prefill_chunk: int = PREFILL_CHUNK,
    speculate: bool = True,
    expert_bits: float | None = None,
    runtime_bytes: int | None = None,
) -> Estimate:
    """Every byte a loaded engine holds at `context` tokens, against which free memory is compared.
    `expert_bits`: resident bits of MoE expert weights (default: the compute dtype); `runtime_bytes`:
    what the process or CUDA runtime adds (default RUNTIME_BYTES for the device kind)."""
    if fmt not in FORMAT_BITS:
        raise ValueError(f"unknown weight format {fmt!r}")
    db = 4 if fmt == "fp32" else (2 if fmt in ("fp16", "bf16") else DTYPE_BYTES.get(dtype, 2))
    if not speculate:
        total_tokens, depth, top_k = 0, 0, 0
    weights = weight_bytes(shape, fmt, db, expert_bits=expert_bits)
    head = head_bytes(shape, db, share_embedding=share_embedding, head_kind=head_kind, draft_vocab=draft_vocab) if speculate else 0
    kv = kv_bytes(shape, context, db, draft_layers=1 if speculate else 0)
    tree = tree_bytes(shape, context, total_tokens, top_k, depth, db) if speculate else 0
    act = activation_bytes(shape, fmt, context, total_tokens, db, prefill_chunk)
    churn = tree + act + (weights if fmt not in ("fp32", "fp16", "bf16") else 0)
    frag = int(FRAGMENTATION * churn)
    runtime = RUNTIME_BYTES.get(device_kind, 0) if runtime_bytes is None else int(runtime_bytes)
    return Estimate(fmt, context, total_tokens, weights, head, kv, tree, act, frag, runtime)


def classify(total: int, budget: int) -> str:
    """fits / tight / wont_fit of `total` bytes against `budget` bytes."""
    if total > budget:
        return "wont_fit"
    return "tight" if total > TIGHT_FRACTION * budget else "fits"
