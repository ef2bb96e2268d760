"""`mlops train plan` on the cards users own (24, 40 and 48 GB, H100 at 80 and 94 GB) and on any other card
described by --gpu-memory and --gpu-tflops; its refusals of bad input (an MFU above 1, an architecture
transformers does not know); and the linear learning-rate rule when the planned global batch moves."""

from __future__ import annotations

import json
import math
import shlex

import pytest
import yaml
from typer.testing import CliRunner

from mlops.config import load_config
from mlops.errors import ConfigError
from tests.test_train_plan import LLAMA_7B
from training import hardware
from training.planner import describe, plan_job


@pytest.fixture(scope="module")
def llama_7b(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama-7b")
    (folder / "config.json").write_text(json.dumps(LLAMA_7B))
    return folder


def seven_b(llama_7b, mode: str, checkpointing: bool, *extra: str):
    return load_config(None, [f"base_model={llama_7b}", f"train.mode={mode}", "train.snapshot=null",
                              "train.precision=bf16", f"train.activation_checkpointing={str(checkpointing).lower()}",
                              "train.global_batch_size=32", "train.micro_batch_size=1", *extra])


def plan_7b(llama_7b, hw, mode: str, checkpointing: bool, **kwargs) -> dict:
    return plan_job(seven_b(llama_7b, mode, checkpointing), hw=hw, tokens=1e6, seq_len=4096,
                    base_path=str(llama_7b), **kwargs)


def fixes(plan: dict) -> list[list[str]]:
    return [f["overrides"] for f in plan["fixes"]]


# --------------------------------------------------------------------------- the cards users own


@pytest.mark.parametrize("card", ["l4", "a10g", "rtx4090"])
def test_one_24gb_card_trains_a_7b_as_lora_or_qlora_with_checkpointing_but_not_as_a_full_finetune(card, llama_7b):
    hw = hardware.named(card)
    assert 22 * hardware.GIB < hw.memory_bytes <= 24 * hardware.GIB  # "24 GB" as the card reports it
    assert plan_7b(llama_7b, hw, "qlora", True)["fits"]
    lora = plan_7b(llama_7b, hw, "lora", False)
    assert not lora["fits"]  # a 13.5 GB bf16 base and 4096-token activations kept whole
    assert ["train.activation_checkpointing=true"] in fixes(lora)  # the guides' advice, and it fits
    full = plan_7b(llama_7b, hw, "full", True)
    assert not full["fits"] and full["memory_total_bytes"] > 5 * full["memory_limit_bytes"]


@pytest.mark.parametrize("card", ["a100-40gb", "l40s", "a6000"])
def test_40_and_48gb_cards_hold_a_7b_lora_without_checkpointing_but_not_its_full_finetune(card, llama_7b):
    hw = hardware.named(card)
    lora = plan_7b(llama_7b, hw, "lora", False)
    assert lora["fits"] and lora["memory_limit_bytes"] == pytest.approx(hw.memory_bytes * hardware.USABLE)
    full = plan_7b(llama_7b, hw, "full", False)
    assert not full["fits"] and full["fixes"]  # offload or LoRA: each fix named with the memory it would take


def test_wall_time_follows_each_cards_dense_bf16_peak(llama_7b):
    l4 = plan_7b(llama_7b, hardware.named("l4"), "qlora", True)
    a100 = plan_7b(llama_7b, hardware.named("a100-40gb"), "qlora", True)
    nvl = plan_7b(llama_7b, hardware.named("h100-94gb"), "qlora", True)
    # Datasheet dense figures, not the 2:4-sparse ones printed beside them: 121, 312 and 835.5 TFLOPS.
    assert l4["peak_flops_per_device"] == 121e12 and nvl["peak_flops_per_device"] == 835.5e12
    assert l4["wall_time_s"] / a100["wall_time_s"] == pytest.approx(312 / 121)
    assert a100["wall_time_s"] / nvl["wall_time_s"] == pytest.approx(835.5 / 312)


def test_the_old_card_names_still_plan_and_an_unknown_one_is_told_the_nearest():
    assert {"a100-80gb", "h100-80gb", "h200"} <= set(hardware.TABLE)
    assert hardware.named("h100-80gb").peak("bf16") == 989e12
    assert hardware.named("h100-94gb").memory_bytes > hardware.named("h100-80gb").memory_bytes
    with pytest.raises(ConfigError, match=r"--gpu 'l40' .*did you mean 'l40s'\?.*available: .*rtx4090"):
        hardware.named("l40")


@pytest.mark.parametrize(("device", "gib", "card"), [
    ("NVIDIA L4", 22.5, "l4"), ("NVIDIA A10G", 22.5, "a10g"), ("NVIDIA GeForce RTX 4090", 24, "rtx4090"),
    ("NVIDIA A100-SXM4-40GB", 40, "a100-40gb"), ("NVIDIA A100 80GB PCIe", 80, "a100-80gb"),
    ("NVIDIA L40S", 45, "l40s"), ("NVIDIA RTX A6000", 48, "a6000"), ("NVIDIA H100 80GB HBM3", 79.6, "h100-80gb"),
    ("NVIDIA H100 NVL", 93.6, "h100-94gb"), ("NVIDIA H200", 140.4, "h200"),
    # Not table cards: measured, never mistaken for a neighbour's figures.
    ("NVIDIA H100 PCIe", 79.6, None), ("NVIDIA L40", 45, None), ("NVIDIA RTX 6000 Ada Generation", 48, None),
])
def test_a_training_machines_cuda_device_is_matched_to_its_table_card(device, gib, card):
    found = hardware.match(device, gib * hardware.GIB)
    assert (found and found.name) == card
    if found:
        assert found.memory_bytes == gib * hardware.GIB  # what the device reports wins over the table's figure


# --------------------------------------------------------------------------- any other card


def test_gpu_memory_and_gpu_tflops_plan_a_card_the_table_does_not_hold(llama_7b, mlops_home):
    args = ["plan", "--gpu", "rtx3090", "--gpu-memory", "16", "--gpu-tflops", "71", "--tokens", "1e6",
            "--seq-len", "4096", "--json", f"base_model={llama_7b}", "train.mode=lora", "train.snapshot=null",
            "train.precision=bf16", "train.activation_checkpointing=true", "train.micro_batch_size=1"]
    out = CliRunner().invoke(app(), args)
    assert out.exit_code == 3, out.output  # a 7B LoRA (16.2 GiB) on a 16 GiB card: not with a bf16 base
    plan = json.loads(out.output)
    assert plan["hardware"] == "rtx3090 (16 GiB, 71 TFLOPS bf16)" and plan["peak_flops_per_device"] == 71e12
    assert plan["memory_limit_bytes"] == 16 * hardware.GIB * hardware.USABLE
    assert ["train.mode=qlora"] in fixes(plan)
    assert CliRunner().invoke(app(), [*args, "train.mode=qlora"]).exit_code == 0


def test_one_figure_alone_overrides_a_table_card_and_describes_no_other():
    smaller = hardware.described("a100-80gb", memory_gib=40)
    assert smaller.memory_bytes == 40 * hardware.GIB and smaller.peak("bf16") == 312e12
    assert smaller.name == "a100-80gb (40 GiB)"
    with pytest.raises(ConfigError, match=r"--gpu-memory alone .*'rtx3090' is not in the table .*did you mean "
                                          r"'rtx4090'.*Fix: pass --gpu-tflops too"):
        hardware.described("rtx3090", memory_gib=24)
    with pytest.raises(ConfigError, match=r"--gpu-tflops alone .*no table card is named.*Fix: pass --gpu-memory"):
        hardware.described("cpu", tflops=100)
    with pytest.raises(ConfigError, match=r"--gpu-tflops 1.21e\+14 .*Fix: pass the figure in TFLOPS, e\.g\. "
                                          r"--gpu-tflops 121"):
        hardware.described("cpu", memory_gib=24, tflops=121e12)  # FLOP/s where TFLOPS were asked for


def test_a_card_described_by_its_bf16_rate_refuses_to_guess_an_fp32_jobs_time(llama_7b):
    card = hardware.described("cpu", memory_gib=24, tflops=100)
    assert card.name == "custom (24 GiB, 100 TFLOPS bf16)"
    cfg = seven_b(llama_7b, "qlora", True, "train.precision=fp32")
    with pytest.raises(ConfigError, match=r"train\.precision=fp32 on custom .*Fix: plan with train\.precision=bf16"):
        plan_job(cfg, hw=card, tokens=1e6, seq_len=4096, base_path=str(llama_7b))


def test_the_mlproject_plan_entry_point_runs_without_the_new_options(llama_7b, mlops_home):
    entry = yaml.safe_load(open("mlproject/MLproject"))["entry_points"]["plan"]
    params = {k: str(v.get("default", "")) for k, v in entry["parameters"].items()}
    params.update(gpu="a100-80gb", overrides=f"base_model={llama_7b} train.snapshot=null train.max_seq_len=512")
    argv = shlex.split(entry["command"].format(**{k: shlex.quote(v) for k, v in params.items()}))  # as MLflow does
    assert argv[:3] == ["mlops", "train", "plan"]
    out = CliRunner().invoke(app(), argv[2:])
    assert out.exit_code == 0, out.output
    assert "devices  1 x a100-80gb" in out.output and "warning" not in out.output


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("mfu", [1.5, 0.0, -0.2, math.nan])
def test_an_mfu_outside_0_to_1_is_refused_by_the_python_api(mfu, llama_7b):
    with pytest.raises(ConfigError, match=r"--mfu .* lies in \(0, 1\]\. Fix: pass e\.g\. --mfu 0\.4"):
        plan_7b(llama_7b, hardware.named("l4"), "qlora", True, mfu=mfu)
    assert plan_7b(llama_7b, hardware.named("l4"), "qlora", True, mfu=1.0)["mfu"] == 1.0


def test_plan_cli_refuses_mfu_1_5_instead_of_printing_a_plan(llama_7b, mlops_home):
    out = CliRunner().invoke(app(), ["plan", "--gpu", "l4", "--mfu", "1.5", "--seq-len", "4096",
                                     f"base_model={llama_7b}", "train.snapshot=null"])
    assert isinstance(out.exception, ConfigError) and "--mfu 1.5" in str(out.exception)
    assert "verdict" not in out.output


@pytest.mark.parametrize(("config", "said"), [
    ({"model_type": "not-a-real-arch", "hidden_size": 64}, r"model_type='not-a-real-arch', an architecture "
                                                           r"transformers does not know"),
    ({"model_type": "not-a-real-arch", "auto_map": {"AutoConfig": "x.Config"}}, r"trust_remote_code stays off"),
    ({"model_type": "t5"}, r"model_type='t5', an architecture with no causal-LM class"),
    ({"hidden_size": 64}, r"config\.json names no model_type"),
])
def test_an_architecture_transformers_cannot_build_is_refused_naming_model_type_folder_and_fix(config, said,
                                                                                               tmp_path):
    folder = tmp_path / "odd-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    cfg = load_config(None, [f"base_model={folder}", "train.snapshot=null", "train.mode=lora"])
    with pytest.raises(ConfigError, match=rf"base model {folder}: .*{said}.*Fix: point base_model at a causal LM "
                                          r"whose model_type transformers knows .*pip install -U transformers"):
        plan_job(cfg, hw=hardware.named("l4"), seq_len=512, base_path=str(folder))


# --------------------------------------------------------------------------- the learning-rate rule


def lr_cfg(llama_7b, *extra: str):
    return load_config(None, [f"base_model={llama_7b}", "train.mode=qlora", "train.snapshot=null",
                              "train.precision=bf16", "train.lr=2e-4", "train.micro_batch_size=4",
                              "train.grad_accum=2", *extra])


def test_a_global_batch_moved_by_the_device_count_names_the_linear_lr_rule(llama_7b):
    def plan(cfg, gpus):
        return plan_job(cfg, hw=hardware.named("h100-80gb"), gpus=gpus, tokens=1e6, seq_len=512,
                        base_path=str(llama_7b))

    assert plan(lr_cfg(llama_7b), 1)["warnings"] == []  # the layout train.lr was set for: micro 4 x accum 2 = 8
    eight = plan(lr_cfg(llama_7b), 8)
    assert eight["global_batch"] == 64
    assert eight["warnings"] == [
        "global batch 64 != 8 the learning rate was set for; by the linear scaling rule scale train.lr by 8x "
        "(train.lr=0.0016) (or set train.global_batch_size=8 train.micro_batch_size=1 to keep the batch)"]
    assert "warning  global batch 64 != 8" in describe(eight)
    # The suggested overrides keep the batch on 8 devices, and the warning goes.
    kept = plan(lr_cfg(llama_7b, "train.global_batch_size=8", "train.micro_batch_size=1"), 8)
    assert kept["global_batch"] == 8 and kept["warnings"] == []
    odd = plan(lr_cfg(llama_7b), 16)
    assert "scale train.lr by 16x" in odd["warnings"][0]
    assert "the batch of 8 cannot be kept on 16 devices" in odd["warnings"][0]


def app():
    from training.cli import app

    return app
