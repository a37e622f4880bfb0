"""LLM.int8 with the outliers of each row kept to that row, so a tree verify computes every row as
the one-token step of plain decoding computes it.

bitsandbytes' Linear8bitLt (LLM.int8(), arXiv:2208.07339) splits each input by a threshold (6.0): the
columns in which an element reaches it go through a 16-bit matmul, the rest through int8. The column
set is taken over the whole batch (bitsandbytes/backends/default/ops.py and backends/cuda/ops.py,
`int8_vectorwise_quant`, zero the outlier columns "across all rows" when rows > 1). A verify forward
over 17 tree rows therefore treats row r differently from the one-row forward plain decoding runs at
the same position: a column that is an outlier only in another row is 16-bit for r in the batch and
int8 alone. The logits differ by ~1e-2 relative and a near-tie flips the greedy pick, so greedy
EAGLE stops matching plain greedy decoding.

`RowExactLinear8bitLt.forward` keeps each row's own outliers:
  * int8 part: row r is quantized from exactly the elements the one-row call quantizes (its own
    outliers zeroed, the same absmax, the same bitsandbytes op), so its int8 codes, the integer
    matmul and the dequantisation are those of the one-row call;
  * 16-bit part: row r multiplies its own outlier elements only (the columns where only other rows
    have outliers hold exact zeros for r), with the same dequantized weight columns.
For a single row this is bitsandbytes' computation operation for operation. In a batch, what is left
is the summation order inside the 16-bit matmul, the same batch dependence every unquantized layer
has. Memory and speed are those of LLM.int8 (one masked fill more per layer).
"""

from __future__ import annotations

import functools
import sys

import torch


def _row_exact_forward(layer, x: torch.Tensor) -> torch.Tensor:
    state = layer.state
    if state.has_fp16_weights or (torch.is_grad_enabled() and x.requires_grad):
        return _original_forward(layer, x)  # training keeps bitsandbytes' own path (and its backward)
    state.is_training = layer.training
    if layer.weight.CB is not None:
        layer.init_8bit_state()
    bias = layer.bias
    if bias is not None and bias.dtype != x.dtype:
        bias.data = bias.data.to(x.dtype)
    ops = torch.ops.bitsandbytes
    shape = x.shape
    a = x.reshape(-1, shape[-1])
    a16 = a.to(torch.float16)  # bitsandbytes quantizes from fp16 whatever the compute dtype
    outliers = a16.abs() >= state.threshold if state.threshold > 0.0 else None
    columns = outliers.any(dim=0) if outliers is not None else None
    if columns is not None and bool(columns.any()):
        codes, row_scale, _ = ops.int8_vectorwise_quant.default(a16.masked_fill(outliers, 0), 0.0)
        out = ops.int8_scaled_mm.default(codes, state.CB, row_scale, state.SCB, bias=bias, dtype=a.dtype)
        cols = torch.argwhere(columns).view(-1)
        own = a[:, cols].masked_fill(~outliers[:, cols], 0)  # each row: its own outliers, zeros elsewhere
        weight_cols = ops.int8_vectorwise_dequant.default(state.CB[:, cols].contiguous(), state.SCB)
        out = out.addmm(own, weight_cols.to(a.dtype).t())
    else:
        codes, row_scale, _ = ops.int8_vectorwise_quant.default(a16, 0.0)
        out = ops.int8_scaled_mm.default(codes, state.CB, row_scale, state.SCB, bias=bias, dtype=a.dtype)
    if state.CB is not None:
        layer.weight.data = state.CB  # as bitsandbytes leaves it after a forward
    return out.reshape(*shape[:-1], out.shape[-1])


def _original_forward(layer, x):
    return _row_exact_class().__mro__[1].forward(layer, x)


def make_rows_exact(model: torch.nn.Module) -> int:
    """Switch every bitsandbytes Linear8bitLt of `model` to the per-row forward; returns how many.
    Idempotent. bitsandbytes is not imported here: a model with 8-bit layers has imported it already."""
    bnb = sys.modules.get("bitsandbytes")
    if bnb is None:
        return 0
    row_exact = _row_exact_class()
    n = 0
    for module in model.modules():
        if type(module) is bnb.nn.Linear8bitLt:
            module.__class__ = row_exact
        n += isinstance(module, row_exact)
    return n


@functools.cache
def _row_exact_class():
    import bitsandbytes as bnb

    class RowExactLinear8bitLt(bnb.nn.Linear8bitLt):
        """A Linear8bitLt whose rows never share outlier columns (see the module docstring)."""

        forward = _row_exact_forward

    return RowExactLinear8bitLt
