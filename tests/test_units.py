"""The one home of each small concept: byte units, dtype names, quantization names, and the draft
candidate pool that caps a tree (checked against what the drafter really offers)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import random_head, tiny_model

from eaglechat import units
from eaglechat.engine.draft import Drafter
from eaglechat.engine.protocol import TreeBudget, pool_size
from eaglechat.errors import UsageError
from eaglechat.fit import hardware, quantization


@pytest.mark.parametrize("n,text", [
    (None, "?"), (0, "0 B"), (1023, "1023 B"), (1024, "1 KiB"), (300 * units.MiB, "300 MiB"),
    (units.GiB - 1, "1024 MiB"), (units.GiB, "1.0 GiB"), (int(13.94 * units.GiB), "13.9 GiB"),
])
def test_fmt_bytes_in_binary_units(n, text):
    assert units.fmt_bytes(n) == text


def test_dtype_names():
    assert [hardware.canon_dtype(n) for n in ("fp32", "torch.float16", "BF16", "half", "float")] == [
        "float32", "float16", "bfloat16", "float16", "float32"]
    assert hardware.torch_dtype("bf16") is torch.bfloat16
    with pytest.raises(UsageError, match="unknown dtype 'int8'"):
        hardware.canon_dtype("int8")


def test_quant_names():
    assert quantization.QUANT_CHOICES == ("auto", "none", "8bit", "4bit")
    assert quantization.check_quant("auto", allow_auto=True) == "auto"
    with pytest.raises(UsageError, match="unknown quantization 'auto'"):
        quantization.check_quant("auto")
    assert quantization.quantization_config("none", torch.float32) is None
    assert quantization.quantization_config("4bit", torch.float32).bnb_4bit_use_double_quant


@pytest.mark.parametrize("depth,top_k", [(1, 3), (2, 4), (3, 2), (4, 3)])
def test_pool_size_is_what_the_drafter_offers(depth, top_k):
    """Ask for far more tokens than can exist: the tree the drafter returns (root excluded) is exactly
    the pool, so TreeBudget.pool_size is the real cap that the CLI refuses to exceed."""
    torch.manual_seed(0)
    model = tiny_model("llama")
    drafter = Drafter(random_head(model))
    ids = torch.tensor([5, 9, 12, 7])
    with torch.no_grad():
        out = model(ids[None], output_hidden_states=True)
    drafter.extend(out.hidden_states[-1][0], torch.tensor([9, 12, 7, 3]))
    tree = drafter.draft(3, TreeBudget(total_tokens=10_000, depth=depth, draft_top_k=top_k))
    # the tree is padded to a fixed shape (total_tokens + 1 rows); `valid` marks the drafted nodes
    assert int(tree.valid.sum()) - 1 == pool_size(depth, top_k) == TreeBudget(1, depth, top_k).pool_size
