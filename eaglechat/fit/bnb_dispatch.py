"""Which bitsandbytes kernel a 4-bit verify takes on this GPU, and the most rows that stay on the fused one.

bitsandbytes 0.50 runs a no-grad 4-bit Linear through `bitsandbytes::gemm_4bit`. On CUDA its dispatch
(`_gemm_4bit_use_custom_cuda(device_index, dtype, M, N, K)` in bitsandbytes/backends/cuda/ops.py)
picks, per weight shape and row count M, either the fused dequantize-and-multiply kernel or a full
dequantization to fp16 followed by cuBLAS. The switch point depends on the architecture and the SM
count it reads from `torch.cuda.get_device_properties` (multi_processor_count, major, minor): on a
4090 the 4096x4096 projections of a 7B model leave the fused kernel above 8 rows, on a 3060 above 128.
A tree verify past that point pays the dequantization of every weight each step, so the tree budget
(total_tokens + 1 verified rows) is clamped to the largest M for which every quantized Linear of the
model stays fused.

The decision function is bitsandbytes' own: it is compiled from the installed bitsandbytes source,
because importing that module needs a CUDA build of torch (the CPU test suite exercises the same
code with patched device properties). When it cannot be found (another bitsandbytes layout) no clamp
is applied and the reason says so.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

WANTED = ("_gpu_dispatch_props", "_gemm_4bit_use_custom_cuda", "_rocm_gfx_arch", "_gemm_4bit_use_custom_rocm")
BLOCKSIZE = 64  # Params4bit's default block size (the loader's BitsAndBytesConfig keeps it)


@dataclass
class Dispatch:
    use_custom: object  # (device_index, dtype, M, N, K) -> bool
    max_m: int  # above this M bitsandbytes always dequantizes
    source: str


def _ops_source() -> Path | None:
    spec = importlib.util.find_spec("bitsandbytes")
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "backends" / "cuda" / "ops.py"
    return path if path.is_file() else None


def load_dispatch() -> Dispatch | None:
    """bitsandbytes' gemm_4bit decision, freshly compiled (its caches start empty), or None."""
    import torch

    path = _ops_source()
    if path is None:
        return None
    tree = ast.parse(path.read_text(encoding="utf-8"))
    body: list[ast.stmt] = []
    max_m = {"cuda": 1536, "rocm": 256}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in WANTED:
            body.append(node)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_GEMM_4BIT_CUSTOM_FLOOR_M" for t in node.targets):
            body.append(node)
        elif isinstance(node, ast.If) and "hip" in ast.unparse(node.test):  # `if torch.version.hip is None:`
            for branch, key in ((node.body, "cuda"), (node.orelse, "rocm")):
                for stmt in branch:
                    if isinstance(stmt, ast.Assign) and getattr(stmt.targets[0], "id", "") == "_gemm_4bit_custom_max_m":
                        max_m[key] = ast.literal_eval(stmt.value)
    names = {n.name for n in body if isinstance(n, ast.FunctionDef)}
    if "_gemm_4bit_use_custom_cuda" not in names or "_gpu_dispatch_props" not in names:
        return None
    namespace = {"torch": torch, "functools": functools}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)  # bitsandbytes' own code
    rocm = torch.version.hip is not None and "_gemm_4bit_use_custom_rocm" in names
    fn = namespace["_gemm_4bit_use_custom_rocm" if rocm else "_gemm_4bit_use_custom_cuda"]
    return Dispatch(fn, max_m["rocm" if rocm else "cuda"], str(path))


def quantized_linears(shape) -> list[tuple[str, int, int]]:
    """(name, N = out_features, K = in_features) of the 4-bit Linears of the decoder layers, one row per shape
    (lm_head and embeddings stay 16-bit under transformers' bitsandbytes integration): attention, Gemma 4's
    global layers' too, and the MLP (an MoE's fused experts are not Linears; Gemma 4's dense MLP and router
    beside them are)."""
    h, i = shape.hidden_size, shape.intermediate_size
    out = []
    for kind, heads, hd in (("", shape.num_key_value_heads, shape.head_dim),
                            (" (global)", shape.global_kv_heads, shape.global_head_dim)):
        if not hd:
            continue
        q, kv = shape.num_attention_heads * hd, heads * hd
        out += [(f"q_proj{kind}", q, h), (f"k_proj{kind}", kv, h), (f"v_proj{kind}", kv, h), (f"o_proj{kind}", h, q)]
    if not shape.is_moe or shape.dense_mlp_beside_experts:
        out += [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)]
    if shape.dense_mlp_beside_experts:
        out.append(("router.proj", shape.num_experts, h))
    return out


@dataclass
class RowLimit:
    rows: int | None  # the most verified rows that keep every 4-bit Linear fused; None = unknown
    reason: str


def fused_row_limit(shape, *, device_index: int = 0, dtype=None, search: int = 256) -> RowLimit:
    """The largest M <= `search` for which every quantized Linear of `shape` takes the fused kernel."""
    import torch

    dtype = dtype or torch.float16
    dispatch = load_dispatch()
    if dispatch is None:
        return RowLimit(None, "bitsandbytes' gemm_4bit dispatch was not found; no clamp")
    props = torch.cuda.get_device_properties(device_index)  # what bitsandbytes' dispatch reads too
    gpu = f"{getattr(props, 'name', 'GPU')} (sm{props.major}{props.minor}, {props.multi_processor_count} SMs)"
    for m in range(1, search + 1):
        for name, n, k in quantized_linears(shape):
            fused = m <= dispatch.max_m and k % BLOCKSIZE == 0 and dispatch.use_custom(device_index, dtype, m, n, k)
            if not fused:
                return RowLimit(m - 1, f"bitsandbytes {_bnb_version()} leaves its fused 4-bit kernel for "
                                       f"{name} ({k}->{n}) above {m - 1} rows on {gpu}")
    return RowLimit(search, f"every 4-bit Linear stays on bitsandbytes' fused kernel up to {search} rows on {gpu}")


def _bnb_version() -> str:
    import importlib.metadata as md

    try:
        return md.version("bitsandbytes")
    except md.PackageNotFoundError:
        return "?"


def verify_row_limit(device_kind: str, quant: str, shape, *, device_index: int = 0, dtype=None) -> RowLimit | None:
    """The clamp on verified rows (total_tokens + 1) for this device and format, None when there is none:
    only 4-bit bitsandbytes layers on CUDA switch kernels by row count."""
    if quant != "4bit" or device_kind != "cuda" or shape is None:
        return None
    return fused_row_limit(shape, device_index=device_index, dtype=dtype)


# What a 4-bit verify costs past the fused kernel, as a multiple of the one-row step, measured on one H200
# (Vicuna-7B shape, torch 2.11, bitsandbytes 0.50.2): one row 31-34 ms, 8 to 128 rows 44-61 ms (every weight
# dequantized once per forward, then cuBLAS): nearly flat in the rows. (rows, cost) points, interpolated.
OFF_FUSED_COST = ((1, 1.0), (8, 1.4), (128, 1.8))


def off_fused_cost(rows: int) -> float:
    """A `rows`-row 4-bit verify past the fused kernel, in one-row steps (OFF_FUSED_COST, flat outside)."""
    points = OFF_FUSED_COST
    if rows <= points[0][0]:
        return points[0][1]
    for (r0, c0), (r1, c1) in zip(points, points[1:]):
        if rows <= r1:
            return c0 + (c1 - c0) * (rows - r0) / (r1 - r0)
    return points[-1][1]


def clamp_tree(budget, limit: RowLimit | None, tau=None):
    """-> (budget, note): total_tokens lowered so total_tokens + 1 rows stay within `limit`, unless the
    expected tokens per step (`tau(total_tokens, depth, top_k)`; default EAGLE-2's published curve,
    fit/tau.py) say the full tree past the fused kernel is faster: it costs `off_fused_cost` one-row
    steps (measured), the clamped tree about one (the fused kernel grows little over its few rows; an
    assumption)."""
    from dataclasses import replace

    from eaglechat.fit.tau import PublishedTau

    if limit is None or limit.rows is None or budget.total_tokens + 1 <= limit.rows:
        return budget, ""
    total = max(1, limit.rows - 1)
    tau = tau or PublishedTau()
    cost = off_fused_cost(budget.total_tokens + 1)
    full, clamped = tau(budget.total_tokens, budget.depth, budget.draft_top_k) / cost, tau(total, budget.depth, budget.draft_top_k)
    if full > clamped:
        return budget, (f"tree {budget.total_tokens} kept past bitsandbytes' fused 4-bit kernel: a "
                        f"{budget.total_tokens + 1}-row verify costs ~{cost:.1f}x a one-row step (measured on an "
                        f"H200), expected {full:.2f} tokens per one-row step against {clamped:.2f} clamped to "
                        f"{total} ({limit.reason})")
    return replace(budget, total_tokens=total), f"tree {budget.total_tokens} -> {total} drafted tokens: {limit.reason}"


def int8_compute_dtype(quant: str, device_kind: str, dtype: str, dtype_given: bool) -> str:
    """LLM.int8 computes in fp16: on a GPU an 8-bit base runs in float16 unless the user asked otherwise
    (bitsandbytes casts bf16/fp32 activations to fp16 in every Linear, with a warning each call)."""
    if quant == "8bit" and device_kind != "cpu" and not dtype_given:
        return "float16"
    return dtype
