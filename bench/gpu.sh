#!/usr/bin/env bash
# One prepared GPU measurement (one NVIDIA GPU, random weights, no downloads; a few minutes on an H100/H200):
# base vs injected at the Pythia-160M and 410M shapes: bf16 forward and batch-1 decode, and the frozen-probe
# training step (bf16 autocast) beside peft LoRA, with ms, tokens/s, MFU and peak memory, medians with ranges
# (bench/gpu_probe.py). Writes OUT_DIR/gpu.json and OUT_DIR/gpu.log.
# Usage: bash bench/gpu.sh [--dry-run] [OUT_DIR]   (--dry-run: tiny shapes on the CPU in seconds, a smoke test)
# Without a CUDA GPU (and without --dry-run) it stops at once with one line on stderr, exit status 2.
set -euo pipefail
cd "$(dirname "$0")/.."
dry=()
if [[ "${1:-}" == "--dry-run" ]]; then dry=(--dry-run); shift; fi
out="${1:-${OUT:-bench/results}}"
py="${PYTHON:-python}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if [[ ${#dry[@]} -eq 0 ]]; then
  if ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "bench/gpu.sh: no CUDA GPU visible to torch ($py); run it on a machine with one, or pass --dry-run" >&2
    exit 2
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
mkdir -p "$out"
timeout 540 "$py" bench/gpu_probe.py "${dry[@]}" --json "$out/gpu.json" 2>&1 | tee "$out/gpu.log"
