"""LLM.int8 with the outliers of each row kept to that row, in fixed shapes: a tree verify computes every
row as the one-token step of plain decoding computes it, with no host sync, and compiles whole.

bitsandbytes' Linear8bitLt (LLM.int8(), arXiv:2208.07339) splits each input by a threshold (6.0): the
columns in which an element reaches it go through a 16-bit matmul, the rest through int8. The column
set is taken over the whole batch (bitsandbytes/backends/default/ops.py and backends/cuda/ops.py,
`int8_vectorwise_quant`, zero the outlier columns "across all rows" when rows > 1). A verify forward
over 17 tree rows therefore treats row r differently from the one-row forward plain decoding runs at
the same position: a column that is an outlier only in another row is 16-bit for r in the batch and
int8 alone. The logits differ by ~1e-2 relative and a near-tie flips the greedy pick, so greedy
EAGLE stops matching plain greedy decoding. Finding that column set (`outliers.any()`, `argwhere`)
also reads the device twice per Linear and gives the graph a data-dependent shape, which
torch.compile(fullgraph=True) refuses.

`RowExactLinear8bitLt.forward` keeps each row's own outliers, at most `ROW_OUTLIERS` of them:
  * each row takes its `ROW_OUTLIERS` largest |x| (a fixed-size top-k, no host read); those that reach
    the threshold are the row's outliers. A row with more outliers than that sends its smallest extra
    ones through int8, i.e. its threshold rises to its (ROW_OUTLIERS+1)-th largest |x|: a function of
    the row alone, so the batch never changes it;
  * int8 part: the row quantized with its own outliers zeroed (its own absmax, bitsandbytes' op), the
    integer matmul and dequantisation of bitsandbytes (per row, independent of the other rows);
  * 16-bit part: the row's outlier values times their dequantized weight columns (bitsandbytes'
    dequantisation), one small matmul per row (a batched matmul: row r never meets another row's
    columns), or, when rows x ROW_OUTLIERS would gather more columns than the layer has, one dense
    matmul over all columns with zeros outside each row's outliers.
Nothing depends on the data's values for its shape, so a step is the same graph whatever the
activations. Compared with bitsandbytes' own one-row call, what differs is the summation order of
the 16-bit part (zeros for the unused candidate columns; ~1e-7 relative) and, in a row with more than
ROW_OUTLIERS outliers, the raised threshold.
"""

from __future__ import annotations

import functools
import sys

import torch

# Outliers kept per row. LLM.int8 reports a handful of outlier feature dimensions per hidden state at
# 6.0 (arXiv:2208.07339, section 4); the MLP down-projection inputs of SmolLM2-135M hold up to ~200 of
# 1536, where the raised threshold applies: its logits on a 33-token prompt stay as close to fp32 at
# 32 (max error 0.097 of the largest logit) as with no cap (0.098; bitsandbytes' batch call: 0.103).
# A verify of R rows gathers R x 32 weight columns per Linear.
ROW_OUTLIERS = 32


def _row_exact_forward(layer, x: torch.Tensor) -> torch.Tensor:
    state = layer.state
    if state.has_fp16_weights or (torch.is_grad_enabled() and x.requires_grad):
        return _original_forward(layer, x)  # training keeps bitsandbytes' own path (and its backward)
    if layer.weight.CB is not None:  # done by make_rows_exact; a layer switched later does it here, once
        layer.init_8bit_state()
    bias = layer.bias
    if bias is not None and bias.dtype != x.dtype:  # the first (eager) call casts it, as bitsandbytes does
        bias.data = bias.data.to(x.dtype)
    ops = torch.ops.bitsandbytes
    shape = x.shape
    a = x.reshape(-1, shape[-1])
    a16 = a.to(torch.float16)  # bitsandbytes quantizes from fp16 whatever the compute dtype
    if state.threshold > 0.0:
        keep = min(ROW_OUTLIERS, a.shape[-1])
        top, cols = torch.topk(a16.abs(), keep, dim=-1, sorted=False)  # [R, keep]: the row's candidates
        mine = top >= state.threshold
        outliers = torch.zeros_like(a16, dtype=torch.bool).scatter_(1, cols, mine)  # [R, K]
        codes, row_scale, _ = ops.int8_vectorwise_quant.default(a16.masked_fill(outliers, 0), 0.0)
        out = ops.int8_scaled_mm.default(codes, state.CB, row_scale, state.SCB, bias=bias, dtype=a.dtype)
        return (out + _outlier_part(state, a, cols, mine, outliers)).reshape(*shape[:-1], out.shape[-1])
    codes, row_scale, _ = ops.int8_vectorwise_quant.default(a16, 0.0)
    out = ops.int8_scaled_mm.default(codes, state.CB, row_scale, state.SCB, bias=bias, dtype=a.dtype)
    return out.reshape(*shape[:-1], out.shape[-1])


def _outlier_part(state, a, cols, mine, outliers) -> torch.Tensor:
    """Each row's outlier values (original precision) times the dequantized weight columns: [R, N]."""
    dequant = torch.ops.bitsandbytes.int8_vectorwise_dequant.default
    rows, keep = cols.shape
    if rows * keep >= a.shape[-1]:  # gathering would copy more columns than the weight has
        weight = dequant(state.CB, state.SCB).to(a.dtype)  # [N, K]
        return a.masked_fill(~outliers, 0) @ weight.t()
    weight_cols = dequant(state.CB.index_select(1, cols.reshape(-1)), state.SCB).to(a.dtype)  # [N, R*keep]
    values = a.gather(1, cols).masked_fill(~mine, 0)  # [R, keep]
    return torch.bmm(values[:, None, :], weight_cols.t().reshape(rows, keep, -1))[:, 0]


def _original_forward(layer, x):
    return _row_exact_class().__mro__[1].forward(layer, x)


def make_rows_exact(model: torch.nn.Module) -> int:
    """Switch every bitsandbytes Linear8bitLt of `model` to the per-row forward; returns how many.
    Idempotent. bitsandbytes is not imported here: a model with 8-bit layers has imported it already.
    The 8-bit state is moved where the forward reads it now, so a compiled step never mutates it."""
    bnb = sys.modules.get("bitsandbytes")
    if bnb is None:
        return 0
    row_exact = _row_exact_class()
    n = 0
    for module in model.modules():
        if type(module) is bnb.nn.Linear8bitLt:
            module.__class__ = row_exact
            if not module.state.has_fp16_weights and module.weight.CB is not None:
                module.init_8bit_state()
        n += isinstance(module, row_exact)
    return n


@functools.cache
def _row_exact_class():
    import bitsandbytes as bnb

    class RowExactLinear8bitLt(bnb.nn.Linear8bitLt):
        """A Linear8bitLt whose rows never share outlier columns (see the module docstring)."""

        forward = _row_exact_forward

    return RowExactLinear8bitLt
