"""Two-process training tests: the worker script `torch.distributed.run` starts, its data and configs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for `--master_port`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(worker: Path, *args: object) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --nproc_per_node 2 worker *args` on 127.0.0.1, one thread per process,
    offline; AssertionError with the tail of stderr unless it exits 0. Waits for the work (three processes
    import torch on a shared CPU); `HANG_GUARD_S` only turns a hang (e.g. a collective one rank never joins)
    into a failure."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        str(worker),
        *map(str, args),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc
