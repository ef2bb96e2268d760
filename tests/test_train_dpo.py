"""DPO (train.objective=dpo): the loss and its gradients against TRL's DPOTrainer on the same batch, runs on a
preference snapshot with LoRA (adapters off as the reference) and full fine-tuning (a precomputed reference),
bitwise resume after a kill, and the inputs refused before any compute."""

from __future__ import annotations

import copy

import pytest

from mlops.config import load_config
from mlops.errors import ConfigError
from mlops.lineage import Tag
from training.testing import check_bitwise_resume, run_tiny

trl = pytest.importorskip("trl", reason="TRL is the parity reference: pip install -e .[dev]")


def _batch(pairs: int = 3, length: int = 12):
    """Rows: the chosen answers, then the rejected ones; a shared prompt length, ragged padding."""
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(100, 400, (2 * pairs, length), generator=g)
    attention = torch.ones_like(ids)
    attention[1, -3:] = 0
    attention[pairs + 1, -2:] = 0
    completion = torch.zeros_like(ids)
    completion[:, 5:] = 1
    return ids, attention, completion * attention


def _close(ours, theirs) -> bool:
    """Float tolerance for a gradient: every element within 1e-5 of the tensor's largest magnitude (summation
    order differs between the two implementations, so near-zero elements differ relatively, not absolutely)."""
    import torch

    scale = float(theirs.abs().max()) or 1.0
    return torch.allclose(ours, theirs, rtol=1e-4, atol=1e-5 * scale)


def _micro(ids, attention, completion):
    from training.data_loader import MicroBatch

    labels = ids.masked_fill(completion == 0, -100)
    pairs = ids.shape[0] // 2
    return MicroBatch(ids, attention, labels, int(attention.sum()), [f"p{i}" for i in range(pairs)],
                      int((labels[:, 1:] != -100).sum()), pair_indices=list(range(pairs)))


class _Fixed:
    """A reference whose log-probabilities were computed beforehand (as training.dpo_reference stores them)."""

    def __init__(self, logps) -> None:
        self.values = logps

    def logps(self, model, mb, device, split):
        return self.values


def _perturbed(model, seed: int = 7, scale: float = 0.02):
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


def _trainer(model, ref_model, tmp_path, tokenizer, *, loss_type, beta, smoothing, peft_config=None):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(output_dir=str(tmp_path / "trl"), beta=beta, loss_type=[loss_type], label_smoothing=smoothing,
                     report_to=[], use_cpu=True, per_device_train_batch_size=2)
    data = Dataset.from_list([{"prompt": "a b", "chosen": " c", "rejected": " d"}] * 2)
    return DPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=data, processing_class=tokenizer,
                      peft_config=peft_config)


@pytest.mark.parametrize(("loss_type", "smoothing"), [("sigmoid", 0.0), ("ipo", 0.0), ("robust", 0.1)])
def test_dpo_loss_rewards_and_gradients_match_trl_on_the_same_batch(tiny_model, tmp_path, loss_type, smoothing):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.config import DpoSection
    from training.dpo import DpoObjective, sequence_logps

    base = AutoModelForCausalLM.from_pretrained(tiny_model["path"], dtype=torch.float32)
    policy = _perturbed(copy.deepcopy(base))  # the reference and the policy must differ for the loss to mean much
    ours = copy.deepcopy(policy)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model["path"])
    trainer = _trainer(policy, base, tmp_path, tokenizer, loss_type=loss_type, beta=0.2, smoothing=smoothing)
    ids, attention, completion = _batch()
    trainer.model.train()
    theirs = trainer._compute_loss(trainer.model, {"input_ids": ids, "attention_mask": attention,
                                                   "completion_mask": completion}, False)
    theirs.backward()

    mb = _micro(ids, attention, completion)
    with torch.no_grad():
        ref = sequence_logps(base(input_ids=ids, attention_mask=attention).logits, mb.labels)[0]
    objective = DpoObjective(DpoSection(beta=0.2, loss_type=loss_type, label_smoothing=smoothing), _Fixed(ref))
    ours.train()
    loss, stats = objective.micro_loss(ours, mb, "cpu")
    loss.backward()

    assert torch.allclose(loss, theirs, rtol=1e-5, atol=1e-6), (float(loss), float(theirs))
    assert float(loss.detach()) != pytest.approx(0.6931, abs=1e-3)  # not the trivial log 2 of policy == reference
    logged = trainer._metrics["train"]
    pairs = float(stats[0])
    assert float(stats[1]) / pairs == pytest.approx(logged["rewards/chosen"][-1], rel=1e-4, abs=1e-6)
    assert float(stats[2]) / pairs == pytest.approx(logged["rewards/rejected"][-1], rel=1e-4, abs=1e-6)
    assert float(stats[3]) / pairs == pytest.approx(logged["rewards/accuracies"][-1])
    grads = dict(trainer.model.named_parameters())
    compared = 0
    for name, p in ours.named_parameters():
        assert _close(p.grad, grads[name].grad), name
        compared += 1
    assert compared == len(grads)


def test_lora_reference_is_the_model_with_its_adapters_off_as_in_trl(tiny_model, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.config import DpoSection
    from training.dpo import AdaptersOff, DpoObjective

    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    base = AutoModelForCausalLM.from_pretrained(tiny_model["path"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model["path"])
    # A new adapter (TRL's reference for it is the model with adapters off, as ours), then trained a little: B
    # starts at zero, and a policy equal to its reference would make any two implementations agree on log 2.
    trainer = _trainer(copy.deepcopy(base), None, tmp_path, tokenizer, loss_type="sigmoid", beta=0.1, smoothing=0.0,
                       peft_config=lora)
    adapters = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in adapters.values():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    ours = get_peft_model(copy.deepcopy(base), lora)
    with torch.no_grad():
        for n, p in ours.named_parameters():
            if p.requires_grad:
                p.copy_(adapters[n])
    ids, attention, completion = _batch()
    trainer.model.train()
    theirs = trainer._compute_loss(trainer.model, {"input_ids": ids, "attention_mask": attention,
                                                   "completion_mask": completion}, False)
    theirs.backward()
    ours.train()
    loss, _ = DpoObjective(DpoSection(beta=0.1), AdaptersOff()).micro_loss(ours, _micro(ids, attention, completion),
                                                                             "cpu")
    loss.backward()
    assert torch.allclose(loss, theirs, rtol=1e-5, atol=1e-6), (float(loss), float(theirs))
    assert float(loss.detach()) != pytest.approx(0.6931, abs=1e-3)
    grads = {n: p.grad for n, p in trainer.model.named_parameters() if p.requires_grad}
    trained = [(n, p.grad) for n, p in ours.named_parameters() if p.requires_grad]
    assert trained and len(trained) == len(grads)
    for name, grad in trained:
        assert _close(grad, grads[name]), name


@pytest.fixture
def dpo_cfg(mlops_home, tiny_model, tmp_path):
    from training.testing import make_pair_snapshot, tiny_overrides

    snapshot = make_pair_snapshot()

    def build(ckpt: str = "a", **extra):
        extra = {"train.objective": "dpo", "train.lr": 5e-3, "train.checkpoint.dir": str(tmp_path / ckpt), **extra}
        return load_config(None, tiny_overrides(snapshot, base_model=tiny_model["path"], **extra))

    return build


@pytest.mark.slow  # ~40 s under load: CI runs it; the default run keeps the full-DPO run and the parity tests
def test_dpo_with_lora_learns_the_preference_and_logs_rewards(dpo_cfg):
    result, tracker = run_tiny(dpo_cfg(**{"train.mode": "lora", "train.max_steps": 8, "train.final_model": False}))
    assert result.status == "FINISHED"
    assert tracker.tags[Tag.TRAIN_OBJECTIVE] == "dpo" and tracker.tags[Tag.TRAIN_MODE] == "lora"
    logged = {name for _, metrics in tracker.metrics for name in metrics}
    assert {"dpo_rewards_chosen", "dpo_rewards_rejected", "dpo_reward_margin", "dpo_reward_accuracy",
            "dpo_logps_chosen", "dpo_logps_rejected", "val_reward_accuracy", "val_loss"} <= logged
    assert result.metrics["loss_last"] < result.metrics["loss_first"]


@pytest.mark.slow  # three trainings (~20 s): the default run keeps the refused resume below; CI runs this
def test_full_dpo_precomputes_its_reference_once_and_resumes_bitwise_after_a_kill(dpo_cfg, tmp_path):
    from training.dpo_reference import FILE

    check_bitwise_resume(dpo_cfg, tmp_path, **{"train.mode": "full", "train.final_model": False})
    assert (tmp_path / "cut" / FILE).exists()


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_a_resume_without_its_reference_is_refused_naming_the_file(dpo_cfg, tmp_path):
    from mlops.errors import MLOpsError
    from training.dpo_reference import FILE
    from training.trainer import SimulatedCrash

    common = {"train.mode": "full", "train.final_model": False}
    with pytest.raises(SimulatedCrash):
        run_tiny(dpo_cfg("k", **common, **{"train.debug.crash_after_step": 2}))
    (tmp_path / "k" / FILE).unlink()
    with pytest.raises(MLOpsError, match=r"reference log-probabilities .* is missing.*resume=never"):
        run_tiny(dpo_cfg("k", **common))


def test_mode_dpo_is_shorthand_for_the_dpo_objective_with_lora():
    t = load_config(None, ["train.mode=dpo"]).train
    assert (t.objective, t.mode, t.dpo_reference()) == ("dpo", "lora", "adapters_off")
    assert load_config(None, ["train.objective=dpo", "train.mode=full"]).train.dpo_reference() == "precomputed"


@pytest.mark.parametrize(("overrides", "message"), [
    (["train.objective=dpo", "train.dpo.beta=0"], r"train\.dpo\.beta"),
    (["train.objective=dpo", "train.dpo.beta=-0.1"], r"train\.dpo\.beta"),
    (["train.objective=dpo", "train.mode=full", "train.dpo.reference=adapters_off"], "no reference is possible"),
    (["train.dpo.loss_type=ipo", "train.dpo.label_smoothing=0.1"], "no meaning for loss_type=ipo"),
    (["train.mode=dpo", "train.objective=sft"], "contradicts"),
])
def test_dpo_settings_that_cannot_run_are_refused_naming_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_a_chat_snapshot_handed_to_dpo_and_a_pair_snapshot_handed_to_sft_are_refused_before_compute(
        dpo_cfg, make_train_cfg, tmp_path):
    from training.prepare import prepare

    with pytest.raises(ConfigError, match=r"train\.objective=dpo needs a preference snapshot"):
        prepare(make_train_cfg("chat", **{"train.objective": "dpo"}))
    with pytest.raises(ConfigError, match=r"is a preference snapshot .* Fix: set train\.objective=dpo"):
        prepare(dpo_cfg("pairs", **{"train.objective": "sft"}))
    assert not (tmp_path / "chat").exists() and not (tmp_path / "pairs").exists()


@pytest.mark.slow  # ZeRO-3 engines are slow to build on CPU: CI runs it
@pytest.mark.parametrize("mode", ["lora", "full"])
def test_dpo_at_zero3_resumes_bitwise_after_a_kill(dpo_cfg, tmp_path, mode):
    check_bitwise_resume(dpo_cfg, tmp_path, **{"train.mode": mode, "train.zero_stage": 3, "train.final_model": False})


def test_the_plan_counts_two_sequences_a_pair_and_the_reference_forward(tmp_path):
    import json

    from training import hardware
    from training.planner import plan_job

    folder = tmp_path / "llama-like"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816,
        "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 32000,
        "max_position_embeddings": 2048, "tie_word_embeddings": False}))

    def plan(*extra):
        cfg = load_config(None, [f"base_model={folder}", "train.snapshot=null", "train.max_steps=100",
                                 "train.micro_batch_size=4", *extra])
        return plan_job(cfg, hw=hardware.named("a100-80gb"), gpus=1, seq_len=1024, base_path=str(folder))

    sft, lora = plan("train.mode=lora"), plan("train.mode=dpo")
    assert lora["tokens"] == 2 * sft["tokens"] and lora["steps"] == sft["steps"] == 100
    # LoRA's step: the frozen weights' forward and input-gradient backward (4 FLOPs a weight) plus the reference
    # forward with the adapters off (2 more): about 1.5x SFT's per token
    assert 1.4 < lora["flops_per_token"] / sft["flops_per_token"] < 1.6
    assert lora["memory_activations_bytes"] > sft["memory_activations_bytes"]
    assert lora["dpo_reference_s"] == 0.0
    full_sft, full = plan("train.mode=full"), plan("train.objective=dpo", "train.mode=full")
    assert full["flops_per_token"] == full_sft["flops_per_token"]  # the reference is not in the steps...
    assert full["dpo_reference_s"] > 0 and full["wall_time_s"] > 2 * full_sft["wall_time_s"]  # ...it runs up front


@pytest.mark.slow  # two processes, killed and resumed: CI runs it
def test_the_two_process_kill_drill_passes_for_dpo_at_zero3(mlops_home, tiny_model):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MLOPS_HOME": str(mlops_home),
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
           "MLFLOW_TRACKING_URI": f"sqlite:///{mlops_home / '.mlops' / 'mlflow.db'}"}
    cmd = [sys.executable, "-m", "mlops", "train", "drill", "--config", str(repo / "configs/train/tiny.yaml"),
           "--nproc", "2", "--steps", "8", f"base_model={tiny_model['path']}", "train.mode=dpo", "train.zero_stage=3"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200, cwd=repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("PASS: killed at step")
