"""The hardware a plan is made for: peak FLOP/s per precision and memory per device, from a named table, from
figures the user gives (`--gpu-memory`, `--gpu-tflops`), or the machine this process runs on.

GPU peaks are the vendors' dense tensor-core figures (no sparsity: datasheets mark the 2:4-sparse ones with an
asterisk and print them twice as high). "half" is the bf16 rate with fp32 accumulation, the rate training runs at:
GeForce cards (and the A10G) do fp32-accumulate at half their fp16-accumulate rate, so their datasheets' headline
fp16 figure is not theirs for training. fp32 is the plain fp32 rate: PyTorch leaves TF32 off for matmuls by
default. Memory is what the device reports (nvidia-smi's memory.total, ECC on where the card has it); a plan
counts only `USABLE` of it, since the CUDA context, the allocator's fragmentation and NCCL buffers take the rest.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace

from mlops.errors import ConfigError, did_you_mean

USABLE = 0.9
GIB = 2**30
MIB = 2**20
GPU_MFU = 0.4  # the default for GPUs until a smoke run's logged `mfu` says otherwise


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: dict[str, float]  # by precision
    memory_bytes: float  # per device
    mfu: float  # the default model FLOPs utilisation for wall time
    gpu: bool = True
    bf16: bool = True
    fp16: bool = True
    cuda_name: str = ""  # a regex on the lower-cased CUDA device name, for `local()`

    def peak(self, precision: str) -> float:
        key = "fp32" if precision == "fp32" else "half"
        if key not in self.peak_flops:
            raise ConfigError(
                f"train.precision={precision} on {self.name}: the card was described by its bf16 rate only "
                "(--gpu-tflops), so an fp32 job's time is unknown. Fix: plan with train.precision=bf16, or name a "
                f"table card with --gpu ({', '.join(TABLE)})."
            )
        return self.peak_flops[key]


def _gpu(name: str, mib: float, bf16_tflops: float, fp32_tflops: float, cuda_name: str) -> Hardware:
    return Hardware(name, {"half": bf16_tflops * 1e12, "fp32": fp32_tflops * 1e12}, mib * MIB, GPU_MFU,
                    cuda_name=cuda_name)


# name: reported memory (MiB), bf16 dense TFLOPS with fp32 accumulate, fp32 TFLOPS; sources per line.
TABLE = {
    # NVIDIA L4 datasheet: 24 GB GDDR6; BF16 tensor 242 TFLOPS with sparsity -> 121 dense; FP32 30.3.
    "l4": _gpu("l4", 23034, 121, 30.3, r"\bl4$"),
    # A10G (AWS G5 only; NVIDIA publishes no datasheet for it): 24 GB GDDR6; 70 TFLOPS bf16 dense and 35 FP32 as
    # cloud providers list it (e.g. Baseten, "NVIDIA A10 vs A10G"): 80 GA102 SMs with GeForce-style half-rate
    # fp32 accumulate. Not the A10's datasheet figures (125 bf16 dense, 31.2 FP32).
    "a10g": _gpu("a10g", 23028, 70, 35, r"\ba10g\b"),
    # Ada Lovelace whitepaper (RTX 4090): BF16 tensor with FP32 accumulate 165.2 dense / 330.4 sparse (FP16 with
    # FP16 accumulate is 330.3 dense: not a training rate); FP32 82.6; 24 GB GDDR6X.
    "rtx4090": _gpu("rtx4090", 24564, 165.2, 82.6, r"rtx 4090"),
    # NVIDIA A100 datasheet: 40 GB HBM2; BF16 tensor 312 dense / 624 sparse; FP32 19.5.
    "a100-40gb": _gpu("a100-40gb", 40960, 312, 19.5, r"a100"),
    "a100-80gb": _gpu("a100-80gb", 81920, 312, 19.5, r"a100"),  # the same datasheet: 80 GB HBM2e
    # NVIDIA L40S datasheet: 48 GB GDDR6 with ECC; BF16 tensor 362.05 dense / 733 sparse; FP32 91.6.
    "l40s": _gpu("l40s", 46068, 362.05, 91.6, r"\bl40s\b"),
    # Ampere GA102 whitepaper (RTX A6000, a professional card: full-rate fp32 accumulate): BF16 tensor 154.8 dense /
    # 309.7 sparse; FP32 38.7; 48 GB GDDR6.
    "a6000": _gpu("a6000", 49140, 154.8, 38.7, r"rtx a6000"),
    # NVIDIA H100 datasheet, SXM: 80 GB HBM3; BF16 tensor 989 dense / 1,979 sparse; FP32 67. (H100 PCIe, 756 dense,
    # is not this card: `local()` does not take it for one.)
    "h100-80gb": _gpu("h100-80gb", 80 * 1024, 989, 67, r"h100(?!.*(pcie|nvl))"),
    # NVIDIA H100 datasheet, NVL: 94 GB HBM3; BF16 tensor 1,671 sparse -> 835.5 dense; FP32 60.
    "h100-94gb": _gpu("h100-94gb", 95830, 835.5, 60, r"h100 nvl"),
    # NVIDIA H200 datasheet, SXM: 141 GB HBM3e; H100 SXM's compute. (H200 NVL runs at lower clocks.)
    "h200": _gpu("h200", 140 * 1024, 989, 67, r"h200(?!.*nvl)"),
}
CPU_MFU = 0.3  # an assumption until measured: a smoke run logs its `mfu` metric; pass that with --mfu
# Beyond these a figure is almost surely in the wrong unit (bytes for GiB, FLOP/s for TFLOPS).
MAX_GIB, MAX_TFLOPS = 4096, 100_000


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
            f"Fix: pass one of {', '.join([*TABLE, 'cpu'])}, or describe the card with --gpu-memory (GiB) and "
            "--gpu-tflops (bf16 dense)."
        )
    return TABLE[name]


def _figure(value: float, option: str, unit: str, limit: float, example: str) -> float:
    if not (math.isfinite(value) and 0 < value <= limit):
        raise ConfigError(f"{option} {value:g} is not a card's {unit}: it must lie in (0, {limit:g}]. "
                          f"Fix: pass the figure in {unit}, e.g. {option} {example}.")
    return value


def _one_figure_only(name: str, memory_given: bool) -> ConfigError:
    given, missing, unit = ("--gpu-memory", "--gpu-tflops", "bf16 dense TFLOPS") if memory_given else \
        ("--gpu-tflops", "--gpu-memory", "GiB")
    which = "no table card is named with --gpu" if name == "cpu" else \
        f"--gpu '{name}' is not in the table ({did_you_mean(name, TABLE)})"
    return ConfigError(f"{given} alone does not describe a card: {which}, so the plan needs both the card's memory "
                       f"and its speed. Fix: pass {missing} too ({unit} per device), or name a table card with --gpu.")


def described(name: str, memory_gib: float | None = None, tflops: float | None = None) -> Hardware:
    """`--gpu` with `--gpu-memory` (GiB per device) and `--gpu-tflops` (bf16 dense): a table card with either
    figure replaced, or any other card from both (named by --gpu, or "custom"). Such a card has no fp32 rate."""
    if memory_gib is None and tflops is None:
        return named(name)
    memory = _figure(memory_gib, "--gpu-memory", "GiB", MAX_GIB, "24") * GIB if memory_gib is not None else None
    half = _figure(tflops, "--gpu-tflops", "TFLOPS", MAX_TFLOPS, "121") * 1e12 if tflops is not None else None
    label = ", ".join(([f"{memory_gib:g} GiB"] if memory else []) + ([f"{tflops:g} TFLOPS bf16"] if half else []))
    if name in TABLE:
        hw = TABLE[name]
        return replace(hw, name=f"{name} ({label})", memory_bytes=memory or hw.memory_bytes,
                       peak_flops={**hw.peak_flops, "half": half or hw.peak_flops["half"]})
    if memory is None or half is None:
        raise _one_figure_only(name, memory_given=memory is not None)
    return Hardware(f"{name if name != 'cpu' else 'custom'} ({label})", {"half": half}, memory, GPU_MFU)


def match(device_name: str, total_bytes: float) -> Hardware | None:
    """The table card a CUDA device is, with the memory it reports: of the cards its name matches, the one
    nearest in memory (an A100 40 GB or 80 GB); None for a card the table does not hold."""
    lowered = device_name.lower()
    cards = [hw for hw in TABLE.values() if hw.cuda_name and re.search(hw.cuda_name, lowered)]
    if not cards:
        return None
    best = min(cards, key=lambda hw: abs(hw.memory_bytes - total_bytes))
    return replace(best, memory_bytes=float(total_bytes))


def local(measure: bool = True) -> Hardware:
    """The device this process would train on: a table entry matched by the CUDA device name, else its own
    figures (bf16 from the device's capability, peak from a quick matmul), else the CPU."""
    import torch

    if not torch.cuda.is_available() or os.environ.get("DS_ACCELERATOR") == "cpu":
        return cpu(measure)
    props = torch.cuda.get_device_properties(0)
    known = match(props.name, props.total_memory)
    if known is not None:
        return known
    from training.metrics import measured_peak_flops

    peak = measured_peak_flops("cuda") if measure else 1.0
    return Hardware(props.name, {"half": peak, "fp32": peak}, float(props.total_memory), GPU_MFU,
                    bf16=torch.cuda.is_bf16_supported())
