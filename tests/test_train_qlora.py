"""QLoRA (`train.mode: qlora`) on the tiny model on CPU: a 4-bit NF4 base that stays 4-bit, adapters that learn, a
final model that is merged, dequantized and loads in transformers, exact resume, and refusals before compute."""

from __future__ import annotations

import math

import pytest

from mlops.config import load_config
from mlops.errors import ConfigError
from mlops.lineage import Tag
from mlops.tracking import MemoryTracker
from training.drill import read_trace
from training.testing import check_bitwise_resume

QLORA = {"train.mode": "qlora", "train.lora.target_modules": '["q_proj","k_proj","v_proj","o_proj","gate_proj",'
                                                              '"up_proj","down_proj"]'}


@pytest.fixture
def make_cfg(make_train_cfg):
    return lambda ckpt="a", **extra: make_train_cfg(ckpt, **{**QLORA, **extra})


def run(cfg, **kwargs):
    from training.trainer import train

    tracker = MemoryTracker()
    return train(cfg, tracker, **kwargs), tracker


def test_qlora_base_is_nf4_with_double_quantization_and_adapters_train_in_the_compute_dtype(tiny_model):
    import torch

    from training.engine import build_model
    from training.qlora import count_4bit

    t = load_config(None, [f"{k}={v}" for k, v in QLORA.items()]).train
    model = build_model(tiny_model["path"], t, seed=1, ds={"bf16": {"enabled": True}, "zero_optimization": {}})
    weight = model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight
    assert count_4bit(model) == 2 * 7  # every linear layer of both blocks; lm_head stays in float
    assert weight.quant_state.quant_type == "nf4" and weight.quant_state.nested  # nested: double quantization
    assert weight.quant_state.dtype == torch.bfloat16  # bf16 compute under train.precision=bf16
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_a_4bit_base_counts_as_many_weights_as_its_float_twin(tiny_model):
    from training.engine import build_model
    from training.metrics import count_params, flops_per_token

    ds = {"bf16": {"enabled": True}, "zero_optimization": {}}
    overrides = [f"{k}={v}" for k, v in QLORA.items()]
    quantized = build_model(tiny_model["path"], load_config(None, overrides).train, seed=1, ds=ds)
    lora = build_model(tiny_model["path"], load_config(None, [*overrides, "train.mode=lora"]).train, seed=1, ds=ds)
    counts = count_params(quantized)
    assert counts == count_params(lora)  # bitsandbytes packs two weights per byte; the plan and MFU count weights
    shape = {"layers": 2, "hidden": quantized.config.hidden_size, "seq_len": 64}
    assert flops_per_token(counts, **shape) == flops_per_token(count_params(lora), **shape)


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_qlora_trains_and_its_final_model_is_merged_dequantized_and_loads(make_cfg, tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    # bf16 compute and a vllm profile: the final model is saved in the dtype vLLM is to serve, the one trained in.
    result, tracker = run(make_cfg(**{"train.max_steps": 4, "train.eval_every": 4, "train.precision": "bf16",
                                      "train.serve_engine": "vllm"}))
    assert result.status == "FINISHED" and tracker.tags[Tag.TRAIN_MODE] == "qlora"
    trace = read_trace(tmp_path / "a" / "trace.jsonl")
    losses = [float.fromhex(trace[s]["loss"]) for s in sorted(trace)]  # exact float hex
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    # The checkpoint holds no 4-bit base weight (it re-quantizes), and the adapters moved from LoRA's zero B.
    from training.final import consolidated_state
    from training.qlora import without_quant_state

    state = without_quant_state(consolidated_state(result.checkpoint, 0))
    assert not any(k.endswith("base_layer.weight") for k in state)
    assert any(k.endswith("lora_B.default.weight") and float(v.abs().max()) > 0 for k, v in state.items())
    saved = load_file(str(next(result.model_dir.glob("*.safetensors"))))
    assert not any("lora" in k or k.endswith(("absmax", "quant_map", "quant_state.bitsandbytes__nf4")) for k in saved)
    assert {v.dtype for v in saved.values()} == {torch.bfloat16}
    model = AutoModelForCausalLM.from_pretrained(result.model_dir)
    assert getattr(model.config, "quantization_config", None) is None and model.dtype == torch.bfloat16
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize(("engine", "precision", "dtype"), [
    ("hf", "bf16", "float32"),  # the reference engine loads float32, whatever the run trained in
    ("llamacpp", "bf16", "float32"),  # the GGUF converter's source: nothing lost before the profile's quantization
    ("vllm", "bf16", "bfloat16"),
    ("vllm", "fp16", "float16"),  # a GPU without bf16 trains and serves fp16
    ("vllm", "fp32", "float32"),
])
def test_final_model_dtype_follows_the_profile_engine_and_the_run_precision(engine, precision, dtype):
    from training.final import final_dtype

    assert final_dtype(engine, precision) == dtype


def test_qlora_where_bitsandbytes_cannot_quantize_is_refused_before_any_folder_or_run(make_cfg, tmp_path,
                                                                                      monkeypatch):
    from mlops.run_store import find_runs
    from training import qlora
    from training.trainer import train

    assert qlora.device_can_quantize("cpu", "fp32") == (True, "")  # the real probe: this CPU runs QLoRA
    monkeypatch.setattr(qlora, "device_can_quantize", lambda device, precision: (False, "no 4-bit backend"))
    with pytest.raises(ConfigError, match=r"train\.mode=qlora cannot run on cpu: no 4-bit backend\. Fix: install "
                                          r"bitsandbytes.*or set train\.mode=lora"):
        train(make_cfg("refused"))
    assert not (tmp_path / "refused").exists()
    assert find_runs({}, status="RUNNING") == [] and find_runs({}, status=None) == []


def test_qlora_in_fp16_on_cpu_is_refused_naming_the_precision_that_runs(make_cfg, tmp_path):
    from training.prepare import prepare

    with pytest.raises(ConfigError, match=r"train\.precision=fp16 cannot run on cpu.*Fix: set train\.precision=bf16"):
        prepare(make_cfg("f", **{"train.precision": "fp16"}))
    assert not (tmp_path / "f").exists()


@pytest.mark.slow
@pytest.mark.parametrize("combo", [
    {},  # ZeRO-0, fp32 (the CPU default)
    {"train.precision": "bf16", "train.zero_stage": 2},
    {"train.precision": "bf16", "train.zero_stage": 3, "train.activation_checkpointing": True},
    {"train.zero_stage": 3, "train.offload": "optimizer_and_params"},
])
def test_qlora_resumes_bitwise_after_a_kill(make_cfg, tmp_path, combo):
    common = {**combo, "train.final_model": False}
    check_bitwise_resume(make_cfg, tmp_path, **common)


@pytest.mark.slow
def test_merged_qlora_model_converts_to_gguf_with_llama_cpp(make_cfg, tmp_path, monkeypatch):
    from serving.engines.llamacpp.artifact import gguf_for
    from serving.engines.llamacpp.install import LlamaCppMissing

    # At ZeRO-3 in bf16: the final model is gathered from partitioned adapters, merged, saved in float32.
    result, _ = run(make_cfg(**{"train.max_steps": 2, "train.zero_stage": 3, "train.precision": "bf16",
                                "train.serve_engine": "llamacpp", "train.serve_quantization": "f16"}))
    # As the tiny_gguf fixture converts: a file store holds no ledger, so no signed package is looked up.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'no-registry'}")
    monkeypatch.delenv("MLOPS_REGISTRY_DB", raising=False)
    try:
        gguf = gguf_for(result.model_dir, "f16", out_dir=tmp_path / "gguf")
    except LlamaCppMissing as err:
        pytest.skip(str(err))
    from gguf import GGUFReader

    names = {t.name for t in GGUFReader(str(gguf)).tensors}
    assert "blk.0.attn_q.weight" in names and not any("lora" in n for n in names)


def test_training_keeps_the_4bit_layout_through_eval_forwards():
    import bitsandbytes as bnb
    import torch

    from training.qlora import keep_training_layout

    model = torch.nn.Sequential(bnb.nn.Linear4bit(64, 64, compute_dtype=torch.bfloat16, quant_type="nf4"))
    model[0].weight = bnb.nn.Params4bit(model[0].weight.data, requires_grad=False, quant_type="nf4").to("cpu")
    keep_training_layout(model)
    assert model[0].support_avx512bf16_for_cpu is False
    shape = tuple(model[0].weight.shape)
    with torch.no_grad():
        model.eval()(torch.randn(2, 64, dtype=torch.bfloat16))
    assert tuple(model[0].weight.shape) == shape  # not repacked into the CPU inference layout
    assert not getattr(model[0].weight.quant_state, "packing_format_for_cpu", False)
