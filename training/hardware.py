"""The hardware a plan is made for: peak FLOP/s per precision and memory per device, from a named table, or the
machine this process runs on.

GPU peaks are the vendors' dense tensor-core figures (no sparsity). fp32 is the plain fp32 rate: PyTorch leaves
TF32 off for matmuls by default. Memory is what the device reports; a plan counts only `USABLE` of it, since the
CUDA context, the allocator's fragmentation and NCCL buffers take the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from mlops.errors import ConfigError, did_you_mean

USABLE = 0.9
GIB = 2**30


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: dict[str, float]  # by precision
    memory_bytes: float  # per device
    mfu: float  # the default model FLOPs utilisation for wall time
    gpu: bool = True
    bf16: bool = True
    fp16: bool = True

    def peak(self, precision: str) -> float:
        return self.peak_flops["fp32" if precision == "fp32" else "half"]


TABLE = {
    "a100-80gb": Hardware("a100-80gb", {"half": 312e12, "fp32": 19.5e12}, 80 * GIB, 0.4),
    "h100-80gb": Hardware("h100-80gb", {"half": 989e12, "fp32": 67e12}, 80 * GIB, 0.4),
    "h200": Hardware("h200", {"half": 989e12, "fp32": 67e12}, 140 * GIB, 0.4),
}
CPU_MFU = 0.3  # an assumption until measured: a smoke run logs its `mfu` metric; pass that with --mfu


def host_memory_bytes() -> float:
    """Physical memory of this machine. Total, not available: a plan refuses what can never fit, not what does
    not fit this minute."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def cpu(measure: bool = True) -> Hardware:
    """This machine as a CPU device: its measured fp32 matmul rate (bf16 has no faster path here without AMX).
    `measure=False` skips the half-second measurement when only memory matters (peak reads 1 FLOP/s)."""
    from training.metrics import measured_peak_flops

    peak = measured_peak_flops("cpu") if measure else 1.0
    return Hardware("cpu", {"half": peak, "fp32": peak}, host_memory_bytes(), CPU_MFU, gpu=False, fp16=False)


def named(name: str) -> Hardware:
    if name == "cpu":
        return cpu()
    if name not in TABLE:
        raise ConfigError(
            f"--gpu '{name}' is not in the hardware table: {did_you_mean(name, [*TABLE, 'cpu'])}. "
            f"Fix: pass one of {', '.join([*TABLE, 'cpu'])}."
        )
    return TABLE[name]


def local(measure: bool = True) -> Hardware:
    """The device this process would train on: a table entry matched by the CUDA device name, else its own
    figures (bf16 from the device's capability, peak from a quick matmul), else the CPU."""
    import torch

    if not torch.cuda.is_available() or os.environ.get("DS_ACCELERATOR") == "cpu":
        return cpu(measure)
    props = torch.cuda.get_device_properties(0)
    lowered = props.name.lower()
    for key, hw in TABLE.items():
        if key.split("-")[0] in lowered and (key == "h200" or "80" in lowered or props.total_memory > 60 * GIB):
            return Hardware(hw.name, hw.peak_flops, float(props.total_memory), hw.mfu)
    from training.metrics import measured_peak_flops

    peak = measured_peak_flops("cuda") if measure else 1.0
    return Hardware(props.name, {"half": peak, "fp32": peak}, float(props.total_memory), 0.4,
                    bf16=torch.cuda.is_bf16_supported())
