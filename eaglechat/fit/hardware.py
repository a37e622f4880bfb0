"""Devices and dtypes: the one place that parses `--device` and `--dtype` and probes the machine.

`probe(device=None)` looks at the real machine (torch imported lazily); `fake_gpu("rtx3060")` or
`fake_gpu("12")` builds a simulated CUDA card for planning on a machine that has none
(`eaglechat plan NAME --gpu rtx3060`). Nothing here falls back silently: asking for `--device cuda`
on a machine without CUDA is an error, never a quiet switch to the CPU. `--device auto` (or none)
picks CUDA, then MPS, then the CPU. Dtype names: float32/float16/bfloat16 and their short forms.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import asdict, dataclass, field

from eaglechat.errors import EaglechatError, UsageError
from eaglechat.units import GiB

# ----------------------------------------------------------------------------------------- dtypes

DTYPES = ("float32", "float16", "bfloat16")  # canonical names, as torch spells them
DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}
DTYPE_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def canon_dtype(name: str) -> str:
    """"bf16", "torch.bfloat16", "bfloat16" -> "bfloat16"; anything else is a one-line error."""
    text = str(name).strip().lower().removeprefix("torch.")
    text = DTYPE_ALIASES.get(text, text)
    if text not in DTYPES:
        raise UsageError(f"unknown dtype {name!r} ({', '.join(DTYPES)})")
    return text


def torch_dtype(name: str):
    """The torch.dtype for a dtype name (torch imported lazily)."""
    import torch

    return getattr(torch, canon_dtype(name))


# name -> (VRAM GiB, compute capability, SM count), from NVIDIA's architecture whitepapers and datasheets.
KNOWN_GPUS: dict[str, tuple[float, tuple[int, int], int]] = {
    "rtx2060": (6, (7, 5), 30),
    "rtx2080": (8, (7, 5), 46),
    "rtx2080ti": (11, (7, 5), 68),
    "rtx3060": (12, (8, 6), 28),
    "rtx3060ti": (8, (8, 6), 38),
    "rtx3070": (8, (8, 6), 46),
    "rtx3080": (10, (8, 6), 68),
    "rtx3090": (24, (8, 6), 82),
    "rtx4060": (8, (8, 9), 24),
    "rtx4060ti": (16, (8, 9), 34),
    "rtx4070": (12, (8, 9), 46),
    "rtx4070ti": (12, (8, 9), 60),
    "rtx4080": (16, (8, 9), 76),
    "rtx4090": (24, (8, 9), 128),
    "rtx5060ti": (16, (12, 0), 36),
    "rtx5070": (12, (12, 0), 48),
    "rtx5080": (16, (12, 0), 84),
    "rtx5090": (32, (12, 0), 170),
    "a6000": (48, (8, 6), 84),
    "rtx6000ada": (48, (8, 9), 142),
    "l4": (24, (8, 9), 58),
    "l40s": (48, (8, 9), 142),
    "t4": (16, (7, 5), 40),
    "a100": (80, (8, 0), 108),
    "a100-40g": (40, (8, 0), 108),
    "h100": (80, (9, 0), 132),
    "h200": (141, (9, 0), 132),
}


@dataclass
class DeviceInfo:
    kind: str  # "cuda" | "mps" | "cpu"
    name: str
    total_bytes: int
    free_bytes: int
    index: int = 0
    compute_capability: tuple[int, int] | None = None
    sm_count: int | None = None
    cpu_cores: int = 1
    bf16: bool = False  # fast bf16 matmuls (CUDA cc >= 8.0; CPU with AVX512-BF16 / AMX)
    cpu_capability: str = ""  # torch's ATen CPU capability: "AVX512", "AVX2", ...
    uuid: str = ""
    simulated: bool = False  # built by fake_gpu(): planning only, nothing can run on it
    notes: list[str] = field(default_factory=list)

    @property
    def torch_device(self) -> str:
        return f"cuda:{self.index}" if self.kind == "cuda" else self.kind

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GiB

    @property
    def free_gib(self) -> float:
        return self.free_bytes / GiB

    @property
    def key(self) -> str:
        """A filesystem-safe id of this device for caches (tuned profiles)."""
        base = self.name if self.kind != "cpu" else f"cpu-{self.name}"
        return re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-") or self.kind

    def describe(self) -> str:
        parts = [self.name + (" (simulated)" if self.simulated else "")]
        if self.kind == "cpu":
            parts.append(f"{self.cpu_cores} cores" + (", bf16" if self.bf16 else ""))
            parts.append(f"{self.total_gib:.1f} GiB RAM, {self.free_gib:.1f} GiB available")
        else:
            if self.compute_capability:
                parts.append("cc %d.%d" % self.compute_capability)
            parts.append(f"{self.total_gib:.1f} GiB total, {self.free_gib:.1f} GiB free")
        return " · ".join(parts)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["compute_capability"] = list(self.compute_capability) if self.compute_capability else None
        out["total_gib"] = round(self.total_gib, 2)
        out["free_gib"] = round(self.free_gib, 2)
        return out


# ----------------------------------------------------------------------------------------- simulated


def _norm_gpu_name(text: str) -> str:
    name = text.lower().replace("nvidia", "").replace("geforce", "").replace(" ", "").replace("_", "")
    return name.replace("-", "") if not name.startswith("a100-") else name


def fake_gpu(spec: str, *, free_gib: float | None = None) -> DeviceInfo:
    """A simulated CUDA card from a known name ("rtx3060", "RTX 4090", "h100") or a size in GiB
    ("12", "12gb", "24GiB"). Total = free = nominal size (a real card reports ~2 % less and the
    desktop takes some: the profile's reserve covers that)."""
    raw = str(spec).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(g|gb|gib)?", raw.lower())
    if m:
        gib = float(m.group(1))
        if gib <= 0:
            raise UsageError(f"--gpu {raw}: memory must be positive")
        name, cc, sms = f"{gib:g} GiB GPU", (8, 6), None
    else:
        key = _norm_gpu_name(raw)
        if key.startswith("a100") and key not in KNOWN_GPUS:
            key = "a100-40g" if "40" in key else "a100"
        if key not in KNOWN_GPUS:
            raise UsageError(
                f"--gpu {raw}: unknown GPU; give a size in GiB (e.g. --gpu 12) or one of: "
                + ", ".join(sorted(KNOWN_GPUS))
            )
        gib, cc, sms = KNOWN_GPUS[key]
        name = key.upper() if key[0] != "r" else "RTX " + key[3:].upper().replace("TI", " Ti")
    total = int(gib * GiB)
    free = int((free_gib if free_gib is not None else gib) * GiB)
    return DeviceInfo(
        kind="cuda",
        name=name,
        total_bytes=total,
        free_bytes=min(free, total),
        compute_capability=cc,
        sm_count=sms,
        cpu_cores=_cpu_cores(),
        bf16=cc >= (8, 0),
        simulated=True,
    )


# ----------------------------------------------------------------------------------------- real


def _cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "cpu"


def _ram() -> tuple[int, int]:
    """(total, available) bytes of system memory."""
    info: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if "MemTotal" in info:
        return info["MemTotal"], info.get("MemAvailable", info.get("MemFree", info["MemTotal"]))
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total = page * os.sysconf("SC_PHYS_PAGES")
        try:
            avail = page * os.sysconf("SC_AVPHYS_PAGES")
        except (ValueError, OSError):
            avail = total // 2
        return total, avail
    except (ValueError, OSError, AttributeError):
        return 8 * GiB, 4 * GiB


def probe_cpu() -> DeviceInfo:
    flags = _cpu_flags()
    bf16 = bool({"avx512_bf16", "amx_bf16"} & flags)
    capability = ""
    try:
        import torch

        capability = str(torch.backends.cpu.get_cpu_capability())
        if not flags and sys.platform == "darwin":  # Apple silicon: bf16 matmul is supported
            bf16 = "arm" in os.uname().machine
    except Exception:  # noqa: BLE001 - torch missing or odd build: the probe still answers
        pass
    total, avail = _ram()
    return DeviceInfo(
        kind="cpu",
        name=_cpu_name(),
        total_bytes=total,
        free_bytes=avail,
        cpu_cores=_cpu_cores(),
        bf16=bf16,
        cpu_capability=capability,
    )


def probe_cuda(index: int = 0) -> DeviceInfo:
    import torch

    props = torch.cuda.get_device_properties(index)
    try:
        free, total = torch.cuda.mem_get_info(index)
    except RuntimeError:
        free, total = props.total_memory, props.total_memory
    cc = (int(props.major), int(props.minor))
    return DeviceInfo(
        kind="cuda",
        name=str(props.name),
        index=index,
        total_bytes=int(total),
        free_bytes=int(free),
        compute_capability=cc,
        sm_count=int(props.multi_processor_count),
        cpu_cores=_cpu_cores(),
        bf16=cc >= (8, 0),
        uuid=str(getattr(props, "uuid", "") or ""),
    )


def probe_mps() -> DeviceInfo:
    import torch

    total, avail = _ram()
    try:
        limit = int(torch.mps.recommended_max_memory())
    except Exception:  # noqa: BLE001
        limit = int(total * 0.66)
    try:
        used = int(torch.mps.driver_allocated_memory())
    except Exception:  # noqa: BLE001
        used = 0
    return DeviceInfo(
        kind="mps",
        name="Apple GPU (MPS)",
        total_bytes=limit,
        free_bytes=max(0, min(limit - used, avail)),
        cpu_cores=_cpu_cores(),
        bf16=True,
    )


def parse_device(device: str) -> tuple[str, int]:
    """"cuda:1" -> ("cuda", 1); "gpu" is "cuda"; anything else but cpu/mps is one UsageError line."""
    text = device.strip().lower()
    m = re.fullmatch(r"(cuda|gpu)(?::(\d+))?|(mps)|(cpu)", text)
    if not m:
        raise UsageError(f"--device {device}: expected auto, cpu, cuda, cuda:N or mps")
    if m.group(3):
        return "mps", 0
    if m.group(4):
        return "cpu", 0
    return "cuda", int(m.group(2) or 0)


def probe(device: str | None = None) -> DeviceInfo:
    """The device to run on: `device` None/"auto" picks CUDA, then MPS, then CPU. An explicit
    device that is not there is an error (no silent fallback)."""
    if device is None or device.strip().lower() in ("", "auto"):
        try:
            import torch
        except ImportError:
            return probe_cpu()
        if torch.cuda.is_available():
            return probe_cuda(0)
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return probe_mps()
        return probe_cpu()
    kind, index = parse_device(device)
    if kind == "cpu":
        return probe_cpu()
    import torch

    if kind == "mps":
        if not (getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()):
            raise EaglechatError("--device mps: Apple MPS is not available on this machine")
        return probe_mps()
    if not torch.cuda.is_available():
        build = "a CPU-only build" if not torch.version.cuda else f"CUDA {torch.version.cuda}"
        raise EaglechatError(f"--device {device}: torch {torch.__version__} ({build}) sees no CUDA device")
    count = torch.cuda.device_count()
    if index >= count:
        raise EaglechatError(f"--device {device}: only {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    return probe_cuda(index)


def torch_device(device: str | None = None) -> str:
    """What model.to() takes for `--device` (auto/None: the probe's pick); errors as probe()."""
    return probe(device).torch_device


def resolve(device: str | None = None, gpu: str | None = None) -> DeviceInfo:
    """`--gpu` (simulated, planning only) wins over `--device`; otherwise probe."""
    if gpu:
        return fake_gpu(gpu)
    return probe(device)
