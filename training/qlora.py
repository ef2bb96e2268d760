"""QLoRA: a 4-bit NF4 base with double quantization (bitsandbytes) under LoRA adapters in the compute dtype.

Measured on this machine kind (DeepSpeed 0.19.8's CPU accelerator over gloo, bitsandbytes 0.50.2, transformers
5.24, peft 0.21; 2026-12-03): QLoRA trains at ZeRO-0, 1, 2 and 3, with optimizer offload (ZeRO >= 1) and
parameter offload (ZeRO-3), in fp32 and bf16, with 1 and 2 processes, and the first loss equals ZeRO-0's at
every stage. Two rules make it compose:
* ZeRO-3 partitions every parameter, the packed 4-bit ones too, and casts float parameters to the engine's
  dtype. The packed bytes are therefore stored in that dtype (`bnb_4bit_quant_storage`): stored as uint8 they
  would not partition, stored as fp32 under bf16 the cast would rewrite them. transformers refuses a
  `device_map` under ZeRO-3, so the base loads without one there.
* Quantization is deterministic, so the 4-bit base never needs saving: checkpoints hold the adapters (as for
  LoRA), a resume re-quantizes the base, and the final model re-quantizes it, dequantizes it and merges the
  adapters in float32, which is exactly the function the run trained.
"""

from __future__ import annotations

import os

COMPUTE_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
QUANT_TYPE = "nf4"


def compute_dtype(precision: str):
    import torch

    return getattr(torch, COMPUTE_DTYPES[precision])


def quantization_config(precision: str, zero_stage: int):
    """The one BitsAndBytesConfig of a run: NF4, double quantization, the precision's compute dtype."""
    import torch
    from transformers import BitsAndBytesConfig

    dtype = compute_dtype(precision)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=QUANT_TYPE, bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=dtype,
                              bnb_4bit_quant_storage=dtype if zero_stage == 3 else torch.uint8)


def _device_map(zero3: bool) -> dict | None:
    import torch

    if zero3:
        return None  # ZeRO-3 places (and partitions) the weights itself
    gpu = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR", "") != "cpu"
    return {"": int(os.environ.get("LOCAL_RANK", "0"))} if gpu else {"": "cpu"}


def load_base(base_path: str, precision: str, *, zero_stage: int):
    """The base model with its linear layers in 4-bit NF4 (the same bytes on every load)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        base_path, quantization_config=quantization_config(precision, zero_stage), dtype=compute_dtype(precision),
        device_map=_device_map(zero_stage == 3), trust_remote_code=False)


def prepare_for_training(model, *, activation_checkpointing: bool):
    """peft's k-bit preparation: frozen base, norms and embeddings upcast to fp32, inputs that carry gradients
    (so checkpointed layers over a frozen base still backpropagate into the adapters)."""
    from peft import prepare_model_for_kbit_training

    keep_training_layout(model)
    return prepare_model_for_kbit_training(
        model, use_gradient_checkpointing=activation_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if activation_checkpointing else None)


def keep_training_layout(model) -> None:
    """On a CPU with AVX512-BF16, bitsandbytes repacks a Linear4bit's bytes in place on its first no-grad eval
    forward (an inference layout) and unpacks them again in state_dict. In a run that breaks what holds the
    weights: ZeRO-3's fetch trace sees new shapes after the first validation ("tracing error at step N") and a
    checkpoint unpacks a partitioned, empty tensor (an AssertionError in bitsandbytes). Training, validation
    and checkpoints keep the one layout the base was quantized in; the merged deployment model is dequantized."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


def dequantized_base(base_path: str, precision: str):
    """The 4-bit base exactly as the run trained on it, dequantized to a plain float32 model on the CPU."""
    import torch

    model = load_base(base_path, precision, zero_stage=0)
    return model.dequantize(dtype=torch.float32)


# What a Params4bit adds to a state dict beside its packed bytes: the frozen base's quantization constants, which a
# checkpoint carries although it excludes frozen parameters. A re-quantized base has the same ones.
QUANT_STATE_SUFFIXES = (".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map",
                        ".quant_state.bitsandbytes__nf4")


def without_quant_state(state: dict) -> dict:
    return {k: v for k, v in state.items() if not k.endswith(QUANT_STATE_SUFFIXES)}


def count_4bit(model) -> int:
    """Linear layers held in 4-bit (a check that the base stayed quantized)."""
    import bitsandbytes as bnb

    return sum(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())


def device_can_quantize(device: str, precision: str) -> tuple[bool, str]:
    """(ok, reason): bitsandbytes quantizes and dequantizes a block on this device, in this compute dtype.
    Milliseconds; run before any folder or run exists."""
    try:
        import torch
        from bitsandbytes import functional as bnbf
    except Exception as err:  # noqa: BLE001 - a missing or broken install, whatever its error
        return False, f"bitsandbytes cannot be imported ({type(err).__name__}: {err})"
    try:
        block = torch.linspace(-1, 1, 128, dtype=compute_dtype(precision), device=device)
        packed, state = bnbf.quantize_4bit(block, blocksize=64, quant_type=QUANT_TYPE, compress_statistics=True)
        back = bnbf.dequantize_4bit(packed, state)
    except Exception as err:  # noqa: BLE001 - any backend failure means the device cannot run QLoRA
        return False, f"bitsandbytes has no working 4-bit backend on {device} ({type(err).__name__}: {err})"
    if not bool(torch.isfinite(back).all()) or float((back.float() - block.float()).abs().max()) > 0.2:
        return False, f"bitsandbytes' 4-bit round trip on {device} is wrong (a broken backend)"
    return True, ""
