#!/usr/bin/env bash
# One prepared GPU measurement (NVIDIA): bf16 frozen-probe training tokens/s + MFU for the Pythia-160M and
# 410M shapes, inference overhead, and bf16-host forward/decode ratios of fp32 modules vs host-dtype compute vs
# bf16 modules, with and without autocast; random weights, no downloads, well under 8 minutes on an H100/H200.
# Usage: bash bench/gpu.sh [OUT_DIR]   (needs torch with CUDA, transformers, peft, einops, safetensors)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-bench/results}}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
timeout 470 python bench/gpu_probe.py --json "$out/gpu.json" 2>&1 | tee "$out/gpu.log"
