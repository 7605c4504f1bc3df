#!/usr/bin/env bash
# Data-parallel training under `accelerate launch`, two processes on CPU (gloo), offline:
#   1. our own trainer (`python -m mmpreproj train`) on the mini preset: mini-pythia + WikiText from assets/;
#   2. the transformers Trainer recipe (recipes/integrations/hf_trainer.py).
# Both read the launcher's RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR; nothing in them knows accelerate.
#
#   bash recipes/integrations/accelerate_launch.sh runs/accelerate [both|ours|hf]   # both: 63 s on 2 CPU cores
#
# Why `--multi_gpu` on a CPU machine: in accelerate 1.x, `--cpu --num_processes 2` without an MPI hostfile
# starts ONE process (its simple launcher); `--multi_gpu` starts N through torch.distributed.run, and
# with no GPU each process uses gloo on CPU. With GPUs: `accelerate launch --num_processes N ...`.
# Knobs (environment): NPROC, STEPS, NUM_LINES, MAX_LEN, BATCH (per process), PORT, PYTHON.
set -euo pipefail

OUT=${1:-runs/accelerate}
WHAT=${2:-both}
NPROC=${NPROC:-2}
STEPS=${STEPS:-40}
NUM_LINES=${NUM_LINES:-512}
MAX_LEN=${MAX_LEN:-128}
BATCH=${BATCH:-4}
PYTHON=${PYTHON:-python}
LAUNCH=("$PYTHON" -m accelerate.commands.launch --multi_gpu --num_processes "$NPROC" --num_machines 1
        --mixed_precision no --dynamo_backend no --main_process_port "${PORT:-29517}")
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

if [[ $WHAT == both || $WHAT == ours ]]; then
    "${LAUNCH[@]}" -m mmpreproj train --preset mini --device cpu --precision fp32 --no-progress \
        --steps "$STEPS" --warmup-steps 0 --num-lines "$NUM_LINES" --max-len "$MAX_LEN" --batch-size "$BATCH" \
        --save-every 0 --out "$OUT/mmpreproj"
fi

if [[ $WHAT == both || $WHAT == hf ]]; then
    "${LAUNCH[@]}" "$(dirname "$0")/hf_trainer.py" --out "$OUT/hf-trainer" \
        --steps "$STEPS" --num-lines "$NUM_LINES" --max-len "$MAX_LEN" --batch-size "$BATCH" --save-steps "$STEPS"
fi
