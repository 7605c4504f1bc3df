"""Two-process training tests: the worker script `torch.distributed.run` starts, its data and configs."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from mmpreproj.train import LMExamples
from tests.helpers.procs import HANG_GUARD_S

WORKER = Path(__file__).with_name("ddp_worker.py")  # run as a script, never imported

DATA = LMExamples.random(40, 12, 128, seed=0)
CONFIG = dict(
    method="preproj_skip",
    model="tiny",
    steps=3,
    warmup_steps=0,
    lr=1e-3,
    batch_size=2,
    grad_accum=2,
    precision="fp32",
    gradient_checkpointing=False,
    save_every=3,
    progress=False,
    device="cpu",
)
# FSDP: no checkpoints (refused), non-reentrant activation checkpointing on a frozen base
FSDP_CONFIG = {**CONFIG, "parallel": "fsdp", "save_every": 0, "gradient_checkpointing": True}


def run_two_ranks(worker: Path, *args: object) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --standalone --nproc_per_node 2 worker *args`, one thread per process,
    offline; AssertionError unless it exits 0, with each rank's own stderr tail (kept apart by `--tee`, so the rank
    that failed first is named with its traceback, not buried under the other's "connection closed") and the
    launcher's. Waits for the work (three processes import torch on a shared CPU); `HANG_GUARD_S` only turns a
    hang (e.g. a collective one rank never joins) into a failure."""
    with tempfile.TemporaryDirectory(prefix="two-ranks-") as logs:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",  # the rendezvous store binds a port of its own: none picked ahead, none to race for
            "--nproc_per_node",
            "2",
            "--log-dir",
            logs,
            "--tee",
            "3",
            str(worker),
            *map(str, args),
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
        if proc.returncode != 0:
            ranks = sorted(Path(logs).rglob("stderr.log"))
            tails = [f"--- rank {f.parent.name} stderr ---\n{f.read_text(errors='replace')[-2000:]}" for f in ranks]
            raise AssertionError("\n".join([*tails, f"--- launcher stderr ---\n{proc.stderr[-1500:]}"]))
    return proc
