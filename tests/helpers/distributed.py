"""Two-process training tests: the worker script `torch.distributed.run` starts, its data and configs."""

from __future__ import annotations

import socket
from pathlib import Path

from mmpreproj.train import LMExamples

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
