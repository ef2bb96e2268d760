"""The training objectives: SFT's next-token loss and DPO's preference loss, behind one `micro_loss` call.

DPO (Rafailov et al. 2023) learns from (prompt, chosen, rejected) pairs against a frozen reference model. A pair's
implicit reward for an answer is beta x (log p_model(answer) - log p_ref(answer)), summed over the answer's tokens;
the loss pushes the chosen answer's reward above the rejected one's:

    sigmoid  -(1-e) log s(beta d) - e log s(-beta d)            d = chosen log-ratio - rejected log-ratio (cDPO at e>0)
    robust   (-(1-e) log s(beta d) + e log s(-beta d)) / (1-2e)  (rDPO: unbiased under flipped labels at rate e)
    ipo      (d' - 1/(2 beta))^2                                 d' on log-ratios divided by answer lengths

These are TRL's formulas (trl/trainer/dpo_trainer.py `_compute_loss`, checked by tests/test_train_dpo.py), except
that TRL 1.16's `sigmoid` ignores label smoothing: ours is the conservative DPO it computed before.

The reference: with LoRA or QLoRA, the same module with its adapters switched off (no second copy in memory);
for a full fine-tune, log-probabilities computed once from the starting weights (training.dpo_reference).
"""

from __future__ import annotations

IGNORE_INDEX = -100
# The per-step sums a DPO step all-reduces with its loss; their means over pairs are the logged metrics.
STAT_NAMES = ("pairs", "rewards_chosen", "rewards_rejected", "reward_accuracy", "reward_margin", "logps_chosen",
              "logps_rejected")


def sequence_logps(logits, labels):
    """(sum of the labelled tokens' log-probabilities, their count) per row, after the causal shift.
    In float32 whatever the compute dtype: bf16 logits would round a sum of hundreds of terms."""
    import torch.nn.functional as F

    # The labels shift left (the last position predicts nothing), not the logits: slicing [B, L, vocab] logits
    # would copy them. The fused cross-entropy kernel (the op HF's own loss runs) gives each label's
    # log-probability without materialising the log-softmax; ignored positions come back as 0.
    targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
    rows, positions = targets.shape
    token_logps = -F.cross_entropy(logits.float().reshape(rows * positions, -1), targets.reshape(-1),
                                   ignore_index=IGNORE_INDEX, reduction="none").view(rows, positions)
    return token_logps.sum(dim=1), (targets != IGNORE_INDEX).sum(dim=1)


def dpo_losses(policy_chosen, policy_rejected, ref_chosen, ref_rejected, *, beta: float, loss_type: str,
               label_smoothing: float = 0.0, chosen_tokens=None, rejected_tokens=None):
    """(per-pair losses, chosen rewards, rejected rewards); the rewards are detached."""
    import torch.nn.functional as F

    chosen_ratio = policy_chosen - ref_chosen
    rejected_ratio = policy_rejected - ref_rejected
    e = label_smoothing
    if loss_type == "ipo":
        delta = chosen_ratio / chosen_tokens.clamp(min=1) - rejected_ratio / rejected_tokens.clamp(min=1)
        losses = (delta - 1 / (2 * beta)) ** 2
    elif loss_type == "sigmoid":
        delta = chosen_ratio - rejected_ratio
        losses = -F.logsigmoid(beta * delta) * (1 - e) - F.logsigmoid(-beta * delta) * e
    elif loss_type == "robust":
        delta = chosen_ratio - rejected_ratio
        losses = (-(1 - e) * F.logsigmoid(beta * delta) + e * F.logsigmoid(-beta * delta)) / (1 - 2 * e)
    else:
        raise ValueError(f"unknown DPO loss type {loss_type!r}; use sigmoid, ipo or robust")
    return losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach()


class SftObjective:
    """The next-token loss on the answer tokens: what every run did before objectives existed."""

    stat_names: tuple[str, ...] = ()

    def micro_loss(self, model, mb, device: str, split: str = "train"):
        out = model(input_ids=mb.input_ids.to(device), attention_mask=mb.attention_mask.to(device),
                    labels=mb.labels.to(device))
        if mb.loss_tokens == 0:
            return out.logits.sum() * 0.0, None  # nothing to learn here; the model's mean over zero labels is NaN
        return out.loss, None


class DpoObjective:
    """The DPO loss of a micro batch of pairs (rows: the chosen answers, then the rejected ones)."""

    stat_names = STAT_NAMES

    def __init__(self, dpo, reference) -> None:
        self.beta, self.loss_type, self.label_smoothing = dpo.beta, dpo.loss_type, dpo.label_smoothing
        self.reference = reference  # .logps(model, mb, device, split) -> tensor [2m], no gradient

    def micro_loss(self, model, mb, device: str, split: str = "train"):
        import torch

        labels = mb.labels.to(device)
        out = model(input_ids=mb.input_ids.to(device), attention_mask=mb.attention_mask.to(device))
        logps, tokens = sequence_logps(out.logits, labels)
        ref = self.reference.logps(model, mb, device, split).to(logps.device, logps.dtype)
        m = len(mb.sample_ids)
        losses, chosen_r, rejected_r = dpo_losses(
            logps[:m], logps[m:], ref[:m], ref[m:], beta=self.beta, loss_type=self.loss_type,
            label_smoothing=self.label_smoothing, chosen_tokens=tokens[:m], rejected_tokens=tokens[m:])
        with torch.no_grad():
            stats = torch.stack([torch.tensor(float(m), dtype=torch.float64), chosen_r.double().sum().cpu(),
                                 rejected_r.double().sum().cpu(), (chosen_r > rejected_r).double().sum().cpu(),
                                 (chosen_r - rejected_r).double().sum().cpu(), logps[:m].detach().double().sum().cpu(),
                                 logps[m:].detach().double().sum().cpu()])
        return losses.mean(), stats


class AdaptersOff:
    """The reference of a LoRA or QLoRA run: the same module with its adapters disabled, without gradients."""

    def logps(self, model, mb, device: str, split: str):
        import torch

        module = model if hasattr(model, "disable_adapter") else model.module  # the peft model, bare or in DeepSpeed
        was_training = module.training
        module.eval()  # no dropout in the reference, as in TRL's reference model
        try:
            with torch.no_grad(), module.disable_adapter():
                out = module(input_ids=mb.input_ids.to(device), attention_mask=mb.attention_mask.to(device))
                return sequence_logps(out.logits, mb.labels.to(device))[0]
        finally:
            module.train(was_training)


def objective_for(t, reference=None):
    """The objective a `train:` section asks for; DPO runs pass their reference source."""
    if t.objective == "dpo":
        return DpoObjective(t.dpo, reference if reference is not None else AdaptersOff())
    return SftObjective()


def step_metrics(stats, names: tuple[str, ...]) -> dict[str, float]:
    """Means over the step's pairs (every rank's) of the summed DPO statistics."""
    if not names:
        return {}
    pairs = float(stats[0]) or 1.0
    return {f"dpo_{name}": float(value) / pairs for name, value in zip(names[1:], stats[1:], strict=True)}
