"""`mlops train plan` and the fit check of `mlops train run`: costs from config.json on the meta device, the
guides' 7B example, the memory levers, the verdict, and a job that cannot fit refused before compute."""

from __future__ import annotations

import json

import pytest

from mlops.config import load_config
from mlops.errors import ConfigError
from training import hardware
from training.planner import MARGIN, parse_deadline, plan_job
from training.testing import make_snapshot, tiny_overrides

LLAMA_7B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096,
            "tie_word_embeddings": False}


@pytest.fixture
def llama_7b(tmp_path):
    folder = tmp_path / "llama-7b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_7B))
    return folder


def seven_b(llama_7b, *extra: str):
    return load_config(None, [f"base_model={llama_7b}", "train.mode=full", "train.snapshot=null",
                              "train.global_batch_size=32", "train.micro_batch_size=1", *extra])


def test_the_guides_7b_full_finetune_on_32_a100s_takes_about_29_hours(llama_7b):
    cfg = seven_b(llama_7b, "train.zero_stage=2")
    plan = plan_job(cfg, hw=hardware.named("a100-80gb"), gpus=32, tokens=10e9, seq_len=4096, base_path=str(llama_7b))
    assert 6.6e9 < plan["params_total"] < 6.8e9 and plan["params_trainable"] == plan["params_total"]
    assert plan["precision"] == "bf16"  # the GPU default
    hours = plan["wall_time_s"] / 3600
    assert 29 * 0.9 <= hours <= 29 * 1.1, hours
    assert plan["wall_time_with_margin_s"] == pytest.approx(plan["wall_time_s"] * MARGIN)
    assert plan["fits"] and plan["grad_accum"] == 1 and plan["steps"] == 76294


def test_a_plan_that_does_not_fit_names_the_changes_that_would(llama_7b):
    cfg = seven_b(llama_7b, "train.zero_stage=0")
    plan = plan_job(cfg, hw=hardware.named("a100-80gb"), gpus=32, tokens=10e9, seq_len=4096, base_path=str(llama_7b))
    assert not plan["fits"]  # 16 bytes per parameter on every rank: ~119 GiB of an 80 GiB card
    assert ["train.zero_stage=1"] in [f["overrides"] for f in plan["fixes"]]
    one = plan_job(cfg, hw=hardware.named("a100-80gb"), gpus=1, tokens=10e9, seq_len=4096, base_path=str(llama_7b))
    # Alone on one card no ZeRO stage partitions anything: offload, LoRA or more devices are what is left.
    assert not one["fits"] and all("train.zero_stage=1" != " ".join(f["overrides"]) for f in one["fixes"])


def test_deadline_verdict_says_how_many_devices_would_make_it(llama_7b):
    cfg = seven_b(llama_7b, "train.zero_stage=2")
    plan = plan_job(cfg, hw=hardware.named("h100-80gb"), gpus=8, tokens=10e9, seq_len=4096,
                    base_path=str(llama_7b), deadline_s=parse_deadline("1d"))
    assert plan["meets_deadline"] is False
    assert plan["gpus_for_deadline"] > 8
    assert parse_deadline("90m") == 5400 and parse_deadline("1970-01-02T00:00", now=0.0) == 86400
    with pytest.raises(ConfigError, match="--deadline 'soon'"):
        parse_deadline("soon")


def test_each_memory_lever_lowers_what_it_should():
    from training.metrics import ParamCounts, memory_plan

    counts = ParamCounts(1_000_000, 1_000_000, 900_000, 0)
    shape = {"world": 4, "micro": 2, "seq_len": 512, "layers": 4, "hidden": 256, "heads": 4, "vocab": 1000}
    fp32 = memory_plan(counts, zero_stage=0, **shape)
    # The fp32 ZeRO-0 figures the in-run plan logged before precision existed.
    # Gradients twice at 4 ranks: their own and the flat all-reduce bucket DeepSpeed copies them into.
    assert fp32["weights"] == 4e6 and fp32["gradients"] == 4e6 + 4e6 and fp32["optimizer"] == 8e6
    alone = memory_plan(counts, zero_stage=0, **{**shape, "world": 1})
    assert alone["gradients"] == 4e6
    assert fp32["activations"] == 2 * 512 * 256 * 4 * (34 + 5 * 4 * 512 / 256) * 2 + 4 * 2 * 512 * 1000 * 4
    bf16 = memory_plan(counts, zero_stage=0, precision="bf16", **shape)
    assert bf16["weights"] == 2e6 and bf16["optimizer"] == 12e6
    zero3 = memory_plan(counts, zero_stage=3, precision="bf16", layer_params=200_000, **shape)
    # A shard each, plus what is gathered at the peak: the LM head (vocab x hidden) and the prefetched layer.
    assert zero3["weights"] == 2e6 / 4 + (1000 * 256 + 200_000) * 2 and zero3["optimizer"] == 12e6 / 4
    # With DeepSpeed's own 1e9 reuse distance (an override) a model under 1e9 weights stays wholly gathered.
    whole = memory_plan(counts, zero_stage=3, precision="bf16", layer_params=200_000,
                        zero_overrides={"stage3_max_reuse_distance": 1_000_000_000}, **shape)
    assert whole["weights"] == 2e6 / 4 + 1e6 * 2
    offloaded = memory_plan(counts, zero_stage=3, precision="bf16", offload="optimizer_and_params", **shape)
    # Host: the optimizer state and the weight shards, and the step's flat fp32 gradients and AdamW temporaries.
    assert offloaded["optimizer"] == 0 and offloaded["host"] == 12e6 / 4 + 2e6 / 4 + (4 + 2 * 4) * 1e6 / 4
    ckpt = memory_plan(counts, zero_stage=0, checkpointing=True, **shape)
    assert ckpt["activations"] < fp32["activations"] / 2


def test_the_optimizer_step_is_planned_where_zero_and_mixed_precision_peak():
    from training.metrics import ParamCounts, memory_plan

    counts = ParamCounts(10**8, 10**8, 10**8, 0, largest_trainable=10**7)
    shape = {"world": 2, "micro": 1, "seq_len": 64, "layers": 2, "hidden": 256, "heads": 4, "vocab": 1000}
    part = 10**8 / 2
    z2 = memory_plan(counts, zero_stage=2, **shape)
    # The flat fp32 gradient partition, and on a CPU two AdamW temporaries of it (single-tensor path).
    assert z2["step"] == 4 * part + 2 * 4 * part
    assert z2["total"] == z2["weights"] + z2["optimizer"] + z2["step"]  # above the backward's figure
    assert z2["total"] > z2["weights"] + z2["gradients"] + z2["optimizer"] + z2["activations"]
    on_gpu = memory_plan(counts, zero_stage=2, gpu=True, **shape)
    assert on_gpu["step"] == 4 * part + 4 * part  # foreach: one temporary for the whole group
    z3 = memory_plan(counts, zero_stage=3, layer_params=10**6, **shape)
    # ZeRO-3 releases the gathered weights before its step, and keeps its gradient partition for the run.
    assert z3["step"] == 4 * part + 4 * part + 2 * 4 * part
    assert z3["total"] == 4 * part + z3["optimizer"] + z3["step"]
    z0 = memory_plan(counts, zero_stage=0, **shape)  # the module's gradients; AdamW steps one weight at a time
    assert z0["step"] == 4e8 + 2 * 4 * 10**7
    bf16 = memory_plan(counts, zero_stage=0, precision="bf16", **shape)  # bf16 gradients and their fp32 copies
    assert bf16["step"] == 2e8 + 4e8 + 2 * 4 * 10**7


def test_zero_buffers_are_sized_from_the_model_and_the_plan_counts_the_same_sizes():
    from mlops.config import load_config
    from training.engine import World, ds_config
    from training.metrics import MIN_BUCKET, ParamCounts, memory_plan, zero_sizes

    hidden, layer = 4096, 200_000_000  # a 7B decoder layer
    world = World(0, 8, 0, "cuda:0", "nccl")
    t = load_config(None, ["train.zero_stage=3"]).train
    zero = ds_config(t, world, micro=1, accum=1, shape=(hidden, layer))["zero_optimization"]
    assert zero["reduce_bucket_size"] == hidden * hidden and zero["stage3_max_reuse_distance"] == layer
    assert zero["stage3_max_live_parameters"] == 2 * layer and zero["stage3_param_persistence_threshold"] == 40960
    assert zero_sizes(2, 64, 1000) == {"reduce_bucket_size": MIN_BUCKET, "allgather_bucket_size": MIN_BUCKET}
    assert zero_sizes(0, hidden, layer) == {}  # ZeRO-0's all-reduce bucket is DeepSpeed's fixed 5e8
    # train.deepspeed.extra wins in the config and in the plan alike.
    extra = {"zero_optimization": {"reduce_bucket_size": 5e7}}
    t2 = load_config(None, ["train.zero_stage=2"]).train.model_copy(
        update={"deepspeed": t.deepspeed.model_copy(update={"extra": extra})})
    assert ds_config(t2, world, micro=1, accum=1, shape=(hidden, layer))["zero_optimization"][
        "reduce_bucket_size"] == 5e7
    counts = ParamCounts(10**8, 10**8, 10**8, 0)
    shape = {"world": 2, "micro": 1, "seq_len": 64, "layers": 2, "hidden": 256, "heads": 4, "vocab": 1000}
    sized = memory_plan(counts, zero_stage=2, **shape)
    overridden = memory_plan(counts, zero_stage=2, zero_overrides=extra["zero_optimization"], **shape)
    assert overridden["gradients"] - sized["gradients"] == (5e7 - MIN_BUCKET) * 4


def test_plan_on_the_meta_device_counts_what_training_builds(tiny_model):
    import torch

    from training.engine import build_model
    from training.metrics import count_params
    from training.planner import meta_model

    t = load_config(None, ["train.mode=lora"]).train
    meta = meta_model(tiny_model["path"], t)
    assert next(meta.parameters()).device == torch.device("meta")
    assert count_params(meta) == count_params(build_model(tiny_model["path"], t, 0))


def test_fp16_on_a_cpu_is_refused_naming_the_field(tiny_model):
    cfg = load_config(None, [f"base_model={tiny_model['path']}", "train.precision=fp16", "train.snapshot=null"])
    with pytest.raises(ConfigError, match=r"train\.precision=fp16 .*Fix: set train\.precision=bf16 or fp32"):
        plan_job(cfg, hw=hardware.cpu(measure=False), seq_len=64)


def test_plan_cli_prints_the_verdict_and_exits_3_when_it_does_not_fit(llama_7b, mlops_home):
    from typer.testing import CliRunner

    from training.cli import app

    args = ["plan", "--gpu", "a100-80gb", "--gpus", "32.0", "--tokens", "1e10", "--seq-len", "4096",
            f"base_model={llama_7b}", "train.mode=full", "train.snapshot=null", "train.global_batch_size=32",
            "train.micro_batch_size=1"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 3, out.output
    assert "does NOT fit" in out.output and "train.zero_stage=1" in out.output and "29.8 h" in out.output
    fits = CliRunner().invoke(app, [*args, "train.zero_stage=3", "--deadline", "40h"])
    assert fits.exit_code == 0, fits.output
    assert "verdict  fits" in fits.output and "deadline met" in fits.output


def test_train_run_refuses_a_job_that_cannot_fit_before_any_folder_or_run(mlops_home, tiny_model, tmp_path,
                                                                          monkeypatch):
    from training.prepare import prepare

    snapshot = make_snapshot()
    overrides = tiny_overrides(snapshot, base_model=tiny_model["path"], **{"train.checkpoint.dir": str(tmp_path / "c")})
    monkeypatch.setattr(hardware, "host_memory_bytes", lambda: 2.0**20)  # a 1 MiB machine
    with pytest.raises(ConfigError, match=r"does not fit 1 x cpu.*train\.allow_unfit=true"):
        prepare(load_config(None, overrides))
    assert not (tmp_path / "c").exists()
    prep = prepare(load_config(None, [*overrides, "train.allow_unfit=true"]))
    try:
        from mlops.lineage import Tag

        assert prep.lineage.as_tags()[Tag.PLAN_VERDICT].startswith("does not fit (run with train.allow_unfit=true)")
        assert prep.lineage.as_tags()[Tag.PRECISION] == "fp32"
    finally:
        prep.release()


def test_a_snapshot_tokenized_for_another_model_is_refused_naming_both_hashes(mlops_home, tiny_model, tmp_path):
    from mlops.data.format import write_snapshot
    from mlops.data.tokenize import tokenizer_info
    from training.prepare import prepare
    from training.synthetic import pattern_samples

    ours = tokenizer_info(tiny_model["path"])
    samples = {"train": pattern_samples(16, 32, seed=1), "validation": pattern_samples(4, 32, seed=2)}
    same = write_snapshot(samples, seq_len=32, tokenizer=ours, config_hash="same").name
    other = write_snapshot(samples, seq_len=32, config_hash="other",
                           tokenizer={**ours, "chat_template_hash": "f" * 64, "hash": "x"}).name

    def cfg(snapshot):
        return load_config(None, tiny_overrides(snapshot, base_model=tiny_model["path"],
                                                **{"train.checkpoint.dir": str(tmp_path / snapshot)}))

    prepare(cfg(same)).release()
    with pytest.raises(ConfigError, match=rf"chat template .* chat_template_hash ffffffffffffffff .*"
                                          rf"chat_template_hash {ours['chat_template_hash'][:16]}"):
        prepare(cfg(other))
    assert not (tmp_path / other).exists()


def test_ranks_with_different_packages_are_named():
    from training.consistency import compare, fingerprint

    mine = fingerprint()
    assert {"python", "torch", "cuda", "deepspeed", "transformers", "peft", "bitsandbytes", "image"} <= set(mine)
    assert compare([mine, dict(mine)]) is None
    problem = compare([mine, mine, {**mine, "deepspeed": "0.18.0"}])
    assert problem == f"deepspeed: {mine['deepspeed']} on ranks 0,1, 0.18.0 on rank 2"


def card(gib: int):
    """A single GPU of `gib` GiB (the guides' one-card advice), A100 speeds."""
    return hardware.Hardware(f"gpu-{gib}gb", hardware.TABLE["a100-80gb"].peak_flops, gib * hardware.GIB, 0.4)


def test_qlora_keeps_the_7b_base_in_about_half_a_byte_per_weight_and_fits_one_24gb_card(llama_7b):
    from training.planner import NF4_BYTES

    def plan(mode):
        cfg = seven_b(llama_7b, f"train.mode={mode}", "train.precision=bf16", "train.activation_checkpointing=true")
        return plan_job(cfg, hw=card(24), tokens=1e6, seq_len=4096, base_path=str(llama_7b))

    lora, qlora = plan("lora"), plan("qlora")
    assert qlora["params_trainable"] == lora["params_trainable"] < lora["params_total"] / 100
    # Everything but the weights is the LoRA plan's: the same adapters, their gradients and AdamW state.
    for part in ("gradients", "optimizer", "activations"):
        assert qlora[f"memory_{part}_bytes"] == lora[f"memory_{part}_bytes"]
    # The decoder's ~6.5B Linear weights at NF4 + double quantization; the unquantized embeddings and LM head
    # (2 x 131M) upcast to fp32: about 4.4 GB in all, against 2 bytes a weight (13.5 GB) for LoRA's bf16 base.
    decoder = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    assert 0.51 < NF4_BYTES < 0.52
    assert decoder * NF4_BYTES < qlora["memory_weights_bytes"] < decoder * NF4_BYTES + 2 * 131e6 * 4 + 0.5e9
    assert qlora["memory_weights_bytes"] < lora["memory_weights_bytes"] / 2.5
    assert qlora["fits"]


def test_a_lora_job_too_big_for_its_card_is_told_that_qlora_would_fit(llama_7b):
    cfg = seven_b(llama_7b, "train.mode=lora", "train.precision=bf16", "train.activation_checkpointing=true")
    plan = plan_job(cfg, hw=card(16), tokens=1e6, seq_len=4096, base_path=str(llama_7b))
    assert not plan["fits"]  # a 13.5 GB bf16 base plus activations on a 16 GiB card
    assert ["train.mode=qlora"] in [f["overrides"] for f in plan["fixes"]]


def test_qlora_keeps_deepspeeds_zero_sizes_and_takes_only_overrides():
    from training.metrics import zero_sizes

    assert zero_sizes(3, 64, 1000, mode="qlora") == {}
    assert zero_sizes(3, 64, 1000, {"reduce_bucket_size": 7, "stage3_max_live_parameters": 9}, mode="qlora") == \
        {"reduce_bucket_size": 7, "stage3_max_live_parameters": 9}
    assert zero_sizes(2, 64, 1000, {"stage3_max_live_parameters": 9}, mode="qlora") == {}
