"""Memory estimates: pure functions of (model shape, quantization, context, tree)."""

from __future__ import annotations

from dataclasses import dataclass


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

    @classmethod
    def from_hf_config(cls, cfg) -> "ModelShape":
        heads = int(cfg.num_attention_heads)
        hidden = int(cfg.hidden_size)
        inter = int(cfg.intermediate_size)
        layers = int(cfg.num_hidden_layers)
        kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or hidden // heads)
        vocab = int(cfg.vocab_size)
        tied = bool(getattr(cfg, "tie_word_embeddings", False))
        per_layer = hidden * (heads * head_dim) * 2 + hidden * (kv * head_dim) * 2 + 3 * hidden * inter + 2 * hidden
        params = layers * per_layer + vocab * hidden * (1 if tied else 2) + hidden
        return cls(
            params=params,
            num_layers=layers,
            hidden_size=hidden,
            intermediate_size=inter,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=head_dim,
            vocab_size=vocab,
            max_context=int(getattr(cfg, "max_position_embeddings", 2048)),
            tied_embeddings=tied,
        )


# ============================================================================== byte estimates
#
# Everything below is arithmetic on a ModelShape: no torch, no files. Sources and the numbers these
# formulas reproduce: bitsandbytes' storage formats (tests/test_quant.py measures the resident bits), the
# models' config.json shapes and the EAGLE README's head sizes (tests/test_memory.py).

GiB = 1024**3

# resident bits per quantizable-linear parameter, bitsandbytes 0.50 (absmax, nested absmax, SCB included)
FORMAT_BITS = {"fp32": 32.0, "fp16": 16.0, "bf16": 16.0, "int8": 8.007, "nf4": 4.5, "nf4-dq": 4.127}
FORMAT_QUANT = {"fp32": "none", "fp16": "none", "bf16": "none", "int8": "8bit", "nf4": "4bit", "nf4-dq": "4bit"}
FORMAT_LABEL = {
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "int8": "bitsandbytes LLM.int8",
    "nf4": "bitsandbytes nf4",
    "nf4-dq": "bitsandbytes nf4 + double quant",
}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
QUANTS = ("none", "8bit", "4bit")

FRAGMENTATION = 0.06  # allocator fragmentation on top of the tensors themselves
RUNTIME_BYTES = {  # CUDA context + cuBLAS workspace; on CPU/MPS: the Python/torch process itself
    "cuda": int(0.5 * GiB),
    "mps": int(0.3 * GiB),
    "cpu": int(0.5 * GiB),
}
TIGHT_FRACTION = 0.92  # above this share of the budget a plan is "tight"
PREFILL_CHUNK = 512


def format_for(quant: str, dtype: str = "float16", double_quant: bool = True) -> str:
    """`--quant` value (+ compute dtype) -> weight format name used in plans."""
    if quant in (None, "none"):
        return {"float32": "fp32", "bfloat16": "bf16"}.get(dtype, "fp16")
    if quant == "8bit":
        return "int8"
    if quant == "4bit":
        return "nf4-dq" if double_quant else "nf4"
    raise ValueError(f"unknown quantization {quant!r} (none, 8bit, 4bit)")


def linear_params(shape: ModelShape) -> int:
    """Parameters in the decoder layers' Linear modules: what bitsandbytes quantizes."""
    h, q, kv = shape.hidden_size, shape.num_attention_heads * shape.head_dim, shape.num_key_value_heads * shape.head_dim
    per_layer = 2 * h * q + 2 * h * kv + 3 * h * shape.intermediate_size
    return shape.num_layers * per_layer


def embedding_params(shape: ModelShape) -> int:
    """embed_tokens + lm_head (one matrix when tied). Never quantized by the bnb integration."""
    return shape.vocab_size * shape.hidden_size * (1 if shape.tied_embeddings else 2)


def weight_bytes(shape: ModelShape, fmt: str, dtype_bytes: int = 2) -> int:
    """Resident bytes of the base weights: quantizable linears at the format's bits, everything else
    (embedding, lm_head, norms) in the compute dtype."""
    lin = linear_params(shape)
    rest = max(0, shape.params - lin)  # embeddings, norms, anything the shape does not itemize
    if fmt in ("fp32", "fp16", "bf16"):
        return int(shape.params * FORMAT_BITS[fmt] / 8)
    return int(lin * FORMAT_BITS[fmt] / 8) + rest * dtype_bytes


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
    return (shape.num_layers + draft_layers) * 2 * shape.num_key_value_heads * shape.head_dim * dtype_bytes


def kv_bytes(shape: ModelShape, context: int, dtype_bytes: int = 2, draft_layers: int = 1) -> int:
    """Static KV cache for `context` positions: every base layer plus the head's one layer."""
    return kv_bytes_per_token(shape, dtype_bytes, draft_layers) * context


def tree_bytes(shape: ModelShape, context: int, total_tokens: int, top_k: int, depth: int, dtype_bytes: int = 2) -> int:
    """Per-step tree state: KV slots for the tree tokens past the context, the 4D verify mask,
    the draft's per-step logits over top_k rows and the candidate pool's features."""
    t = total_tokens + 1
    pool = top_k + depth * top_k * top_k
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
        peak += max(h * inter, h * shape.num_attention_heads * shape.head_dim) * 2
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
) -> Estimate:
    """Every byte a loaded engine holds at `context` tokens, against which free memory is compared."""
    if fmt not in FORMAT_BITS:
        raise ValueError(f"unknown weight format {fmt!r}")
    db = 4 if fmt == "fp32" else (2 if fmt in ("fp16", "bf16") else DTYPE_BYTES.get(dtype, 2))
    if not speculate:
        total_tokens, depth, top_k = 0, 0, 0
    weights = weight_bytes(shape, fmt, db)
    head = head_bytes(shape, db, share_embedding=share_embedding, head_kind=head_kind, draft_vocab=draft_vocab) if speculate else 0
    kv = kv_bytes(shape, context, db, draft_layers=1 if speculate else 0)
    tree = tree_bytes(shape, context, total_tokens, top_k, depth, db) if speculate else 0
    act = activation_bytes(shape, fmt, context, total_tokens, db, prefill_chunk)
    frag = int(FRAGMENTATION * (weights + head + kv + tree + act))
    return Estimate(fmt, context, total_tokens, weights, head, kv, tree, act, frag, RUNTIME_BYTES.get(device_kind, 0))


def classify(total: int, budget: int) -> str:
    """fits / tight / wont_fit of `total` bytes against `budget` bytes."""
    if total > budget:
        return "wont_fit"
    return "tight" if total > TIGHT_FRACTION * budget else "fits"


# ============================================================================== the plan
#
# Which (quantization, context, tree) to load on a device, decided before anything is loaded.
# Order: the profile's quantization preference for this model size; first pass: the
# first format that fits at the profile's full context with headroom; second pass: per format, halve
# the context down to 1k and accept a tight fit. Nothing fits -> refuse and say what would.

PLAN_SCHEMA = "eaglechat.plan/1"
GPU_CLASSES_GIB = (6, 8, 12, 16, 24, 32, 48, 80)


@dataclass
class Option:
    quant: str
    format: str
    context: int
    status: str  # fits | tight | wont_fit
    estimate: Estimate
    tree: dict
    speculate: bool

    @property
    def total(self) -> int:
        return self.estimate.total

    def to_dict(self) -> dict:
        return {
            "quant": self.quant,
            "format": self.format,
            "context": self.context,
            "status": self.status,
            "tree": dict(self.tree),
            "speculate": self.speculate,
            "total_bytes": self.total,
            "total_gib": round(self.total / GiB, 2),
            "breakdown": self.estimate.to_dict(),
        }


@dataclass
class Plan:
    model: str
    device: dict
    profile: str
    dtype: str
    free_bytes: int
    reserve_bytes: int
    choice: Option | None
    considered: list
    alternatives: list
    notes: list

    @property
    def budget_bytes(self) -> int:
        return max(0, self.free_bytes - self.reserve_bytes)

    @property
    def status(self) -> str:
        return self.choice.status if self.choice else "wont_fit"

    @property
    def fits(self) -> bool:
        return self.choice is not None

    def refusal(self) -> str:
        """The one line shown when nothing fits."""
        smallest = min(self.considered, key=lambda o: o.total) if self.considered else None
        line = f"{self.model or 'the model'} does not fit {self.device.get('name')}: {self.budget_bytes / GiB:.1f} GiB available"
        if smallest is not None:
            line += f"; the smallest option ({smallest.format}, context {smallest.context}) needs {smallest.total / GiB:.1f} GiB"
        if self.alternatives:
            line += "; would fit: " + "; ".join(a["hint"] for a in self.alternatives)
        else:
            line += "; nothing smaller would fit"
        return line

    def require(self) -> "Plan":
        """The plan itself when something fits; otherwise OutOfMemory with the refusal line."""
        if self.choice is None:
            from eaglechat.errors import OutOfMemory

            raise OutOfMemory(self.refusal())
        return self

    def to_dict(self) -> dict:
        return {
            "schema": PLAN_SCHEMA,
            "model": self.model,
            "device": self.device,
            "profile": self.profile,
            "dtype": self.dtype,
            "memory": {
                "free_bytes": self.free_bytes,
                "reserve_bytes": self.reserve_bytes,
                "budget_bytes": self.budget_bytes,
                "budget_gib": round(self.budget_bytes / GiB, 2),
            },
            "status": self.status,
            "choice": self.choice.to_dict() if self.choice else None,
            "considered": [o.to_dict() for o in self.considered],
            "alternatives": list(self.alternatives),
            "notes": list(self.notes),
        }


def contexts_to_try(target: int, floor: int = 1024) -> list[int]:
    """target, target/2, ... down to `floor` (or target itself when it is already below)."""
    out, ctx = [], int(target)
    while True:
        out.append(ctx)
        if ctx // 2 < min(floor, target) or ctx <= floor:
            return out
        ctx //= 2


def plan_model(
    shape: ModelShape,
    device,
    profile=None,
    *,
    model: str = "",
    quant: str | None = None,
    context: int | None = None,
    tree=None,
    speculate: bool | None = None,
    checkpoint_dtype: str | None = None,
    head_kind: str = "eagle2",
    draft_vocab: int | None = None,
    profiles: list | None = None,
    explain: bool = True,
) -> Plan:
    """Choose (quantization, context, tree) for `shape` on `device` (a hardware.DeviceInfo).
    `quant` / `context` / `tree` pin those choices (a pinned context is not reduced). Pure given
    `profile` (or `profiles`); otherwise the user's profile folder and tuned cache are read."""
    from eaglechat.profiles import resolve_profile

    if quant == "auto":
        quant = None
    if quant is not None and quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r} (none, 8bit, 4bit)")
    prof = profile or resolve_profile(device, shape, quant, model=model or None, profiles=profiles)
    dtype = prof.compute_dtype(device, checkpoint_dtype)
    reserve = int(float(prof.reserve_gib) * GiB)
    budget = max(0, int(device.free_bytes) - reserve)
    chunk = int(prof.memory.get("prefill_chunk", PREFILL_CHUNK))
    share = bool(prof.memory.get("share_eagle_embedding", True))
    notes: list[str] = []

    target = int(context) if context else prof.max_context(shape)
    if target > shape.max_context:
        notes.append(f"context {target} is more than the model's {shape.max_context}: using {shape.max_context}")
        target = shape.max_context
    ctxs = [target] if context else contexts_to_try(target)
    order = [quant] if quant else prof.quant_order(shape)

    def option(q: str, ctx: int) -> Option:
        budget_tree = tree if tree is not None else prof.tree_for(q, shape, device)
        spec = prof.speculate_for(q) if speculate is None else bool(speculate)
        fmt = format_for(q, dtype, prof.double_quant)
        est = estimate(
            shape, fmt, ctx, total_tokens=budget_tree.total_tokens, depth=budget_tree.depth, top_k=budget_tree.top_k,
            dtype=dtype, device_kind=device.kind, share_embedding=share, head_kind=head_kind,
            draft_vocab=draft_vocab, prefill_chunk=chunk, speculate=spec,
        )
        t = {"total_tokens": budget_tree.total_tokens, "depth": budget_tree.depth, "top_k": budget_tree.top_k}
        return Option(q, fmt, ctx, classify(est.total, budget), est, t, spec)

    choice = next((o for o in (option(q, target) for q in order) if o.status == "fits"), None)
    if choice is None:
        for q in order:
            choice = next((o for o in (option(q, c) for c in ctxs) if o.status != "wont_fit"), None)
            if choice is not None:
                break

    at = choice.context if choice else target
    rest = [q for q in QUANTS if q not in order]
    considered = [option(q, at) for q in order + (rest if quant is None else [])]
    if choice is not None:
        for o in considered:
            if o.quant == choice.quant:
                break
            if o.status == "wont_fit":
                notes.append(f"{o.format} won't fit: needs {o.total / GiB:.1f} GiB at context {at}, {budget / GiB:.1f} available")
        if choice.context < target:
            notes.append(f"context reduced from {target} to {choice.context} to fit")
        if choice.status == "tight":
            notes.append("tight: under 8% headroom; other programs on this device can push it out of memory")
        if not choice.speculate:
            notes.append("speculation off for this device/quantization (tuned: predicted gain under 1.1x)")

    alternatives: list[dict] = []
    if choice is None and explain:
        alternatives = _alternatives(shape, device, prof, quant, context, tree, dtype, budget, option, profiles, head_kind, draft_vocab)
    return Plan(
        model=model,
        device=device.to_dict(),
        profile=prof.name,
        dtype=dtype,
        free_bytes=int(device.free_bytes),
        reserve_bytes=reserve,
        choice=choice,
        considered=considered,
        alternatives=alternatives,
        notes=notes,
    )


def _alternatives(shape, device, prof, quant, context, tree, dtype, budget, option, profiles, head_kind, draft_vocab) -> list[dict]:
    """What would fit when nothing asked for does: other formats or smaller contexts on this device,
    then the smallest GPU class where the default plan fits."""
    out: list[dict] = []
    top = min(shape.max_context, context or prof.max_context(shape))
    for q in QUANTS:
        for ctx in contexts_to_try(top, floor=256):
            o = option(q, ctx)
            if o.status != "wont_fit":
                if q == quant and ctx == context:
                    break
                flags = ([f"--quant {q}"] if q != quant else []) + ([f"--context {ctx}"] if ctx != top or context else [])
                out.append({
                    "device": device.name, "quant": q, "format": o.format, "context": ctx,
                    "total_bytes": o.total, "hint": f"{' '.join(flags) or 'as asked'} ({o.format}, {o.total / GiB:.1f} GiB)",
                })
                break
    if device.kind == "cuda":
        from eaglechat.hardware import fake_gpu

        for gib in GPU_CLASSES_GIB:
            if gib * GiB <= device.total_bytes:
                continue
            p = plan_model(shape, fake_gpu(str(gib)), model="", quant=quant, context=context, tree=tree,
                           head_kind=head_kind, draft_vocab=draft_vocab, profiles=profiles, explain=False)
            if p.choice is not None:
                c = p.choice
                out.append({
                    "device": f"{gib} GB GPU", "quant": c.quant, "format": c.format, "context": c.context,
                    "total_bytes": c.total, "hint": f"{'an' if gib in (8, 80) else 'a'} {gib} GB GPU ({c.format}, context {c.context}, {c.total / GiB:.1f} GiB)",
                })
                break
    return out


# ============================================================================== out of memory while chatting


@dataclass
class Shrink:
    """One step down after an out-of-memory error: what changed, and the new settings."""

    what: str  # "tree" | "context"
    total_tokens: int
    depth: int
    top_k: int
    context: int
    message: str  # one line for the user


def shrink_after_oom(
    total_tokens: int,
    depth: int,
    top_k: int,
    context: int,
    *,
    used_tokens: int = 0,
    min_tree: int = 4,
    min_context: int = 512,
) -> Shrink | None:
    """The next smaller setting after a CUDA/MPS out-of-memory error during chat:
    first halve the tree (down to `min_tree` drafted tokens, depth and top_k trimmed to match), then
    halve the context (never below what the conversation already holds, nor `min_context`), then
    None: nothing left to give back, report the error and keep the chat open."""
    if total_tokens > min_tree:
        n = max(min_tree, total_tokens // 2)
        d = max(2, min(depth, depth - 1 if n < 16 else depth))
        k = max(2, min(top_k, n))
        return Shrink("tree", n, d, k, context, f"out of memory: draft tree reduced to {n} tokens (depth {d}, top_k {k})")
    floor = max(min_context, used_tokens + 64)
    if context // 2 >= floor:
        c = context // 2
        return Shrink("context", total_tokens, depth, top_k, c, f"out of memory: context window reduced to {c} tokens")
    return None
