"""Device probe and simulated GPUs."""

from __future__ import annotations

import pytest

from eaglechat.errors import EaglechatError, UsageError
from eaglechat.fit import hardware


def test_fake_gpu_by_name_and_size():
    g = hardware.fake_gpu("rtx3060")
    assert g.kind == "cuda" and g.simulated and g.compute_capability == (8, 6) and g.sm_count == 28
    assert g.total_gib == 12 and g.free_bytes == g.total_bytes and g.bf16
    assert hardware.fake_gpu("RTX 4090").name == "RTX 4090"
    assert hardware.fake_gpu("NVIDIA GeForce RTX 3060 Ti").total_gib == 8
    assert hardware.fake_gpu("12gb").total_gib == 12
    assert hardware.fake_gpu("23.5").total_gib == pytest.approx(23.5)
    assert hardware.fake_gpu("rtx2060").bf16 is False  # cc 7.5


@pytest.mark.parametrize("bad", ["rtx9999", "0", "-3", "lots"])
def test_fake_gpu_rejects_nonsense(bad):
    with pytest.raises(UsageError):
        hardware.fake_gpu(bad)


def test_probe_cpu_is_plain_data():
    d = hardware.probe("cpu")
    assert d.kind == "cpu" and d.total_bytes > 0 and 0 < d.free_bytes <= d.total_bytes and d.cpu_cores >= 1
    assert d.torch_device == "cpu" and d.key.startswith("cpu-")
    assert set(d.to_dict()) >= {"kind", "name", "total_bytes", "free_bytes", "compute_capability", "sm_count", "cpu_cores", "bf16"}


@pytest.mark.parametrize("cuda,mps,expected", [(True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")])
@pytest.mark.parametrize("spelling", [None, "auto", " AUTO "])
def test_auto_probe_prefers_cuda_then_mps_then_cpu(monkeypatch, cuda, mps, expected, spelling):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    for kind in ("cuda", "mps", "cpu"):
        monkeypatch.setattr(hardware, f"probe_{kind}", lambda *_, kind=kind: kind)
    assert hardware.probe(spelling) == expected


def test_auto_probe_on_this_machine():
    import torch

    expected = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert hardware.probe().kind == expected


def test_bad_device_strings():
    with pytest.raises(UsageError):
        hardware.probe("tpu")


def test_missing_cuda_is_an_error_not_a_fallback(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(EaglechatError, match="no CUDA"):
        hardware.probe("cuda")
    with pytest.raises(EaglechatError):
        hardware.resolve("cuda:1")


def test_gpu_flag_wins_over_device():
    assert hardware.resolve("cpu", "rtx3060").kind == "cuda"


@pytest.mark.cuda
@pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs CUDA")
def test_probe_cuda_real():
    d = hardware.probe("cuda")
    assert d.compute_capability and d.sm_count and d.free_bytes <= d.total_bytes
