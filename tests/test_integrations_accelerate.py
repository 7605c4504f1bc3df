"""`accelerate launch` with two CPU processes (gloo): recipes/integrations/accelerate_launch.sh runs our
trainer and the transformers Trainer recipe; ours ends bit-identical to the same run under torchrun, the
Trainer's equal to one process with twice the batch."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("accelerate")
pytest.importorskip("datasets")

from mmpreproj.method.files import read_adapter  # noqa: E402
from tests.helpers.adamw import assert_adamw_runs_agree  # noqa: E402
from tests.helpers.procs import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "recipes" / "integrations" / "accelerate_launch.sh"
KNOBS = dict(STEPS="3", NUM_LINES="32", MAX_LEN="32", BATCH="2")
# what the script passes to `mmpreproj train`, for the torchrun run to repeat
TRAIN_ARGS = [
    "train", "--preset", "mini", "--device", "cpu", "--precision", "fp32", "--no-progress", "--steps", "3",
    "--warmup-steps", "0", "--num-lines", "32", "--max-len", "32", "--batch-size", "2", "--save-every", "0",
]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict[str, str]:
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", **extra)


def _run(cmd: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _launch(out: Path, what: str) -> None:
    _run(["bash", str(SCRIPT), str(out), what], _env(PYTHON=sys.executable, PORT=str(_free_port()), **KNOBS))


@pytest.mark.slow
def test_accelerate_launch_runs_our_trainer_bit_identical_to_torchrun(tmp_path):
    out = tmp_path / "acc"
    _launch(out, "ours")
    ref = tmp_path / "torchrun"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                "127.0.0.1", "--master_port", str(_free_port()), "-m", "mmpreproj"]  # fmt: skip
    _run([*torchrun, *TRAIN_ARGS, "--out", str(ref)], _env())
    acc_metrics = json.loads((out / "mmpreproj" / "metrics.json").read_text())
    ref_metrics = json.loads((ref / "metrics.json").read_text())
    assert acc_metrics["world_size"] == ref_metrics["world_size"] == 2  # two processes, not one
    assert acc_metrics["final_loss"] == ref_metrics["final_loss"]
    _, got = read_adapter(out / "mmpreproj" / "adapter")
    _, want = read_adapter(ref / "adapter")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.slow
def test_accelerate_launch_runs_the_trainer_recipe_like_one_process_with_twice_the_batch(tmp_path):
    out = tmp_path / "acc"
    _launch(out, "hf")
    # 2 ranks x batch 2 = one process with batch 4, up to float summation order
    spec = importlib.util.spec_from_file_location("recipe_hf_trainer", SCRIPT.with_name("hf_trainer.py"))
    recipe = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = recipe
    spec.loader.exec_module(recipe)
    single = recipe.main([
        "--out", str(tmp_path / "single"), "--steps", "3", "--num-lines", "32", "--max-len", "32",
        "--batch-size", "4", "--save-steps", "3",
    ])  # fmt: skip
    two = json.loads((out / "hf-trainer" / "summary.json").read_text())
    steps, lr, eps = int(KNOBS["STEPS"]), recipe.RecipeConfig().lr, torch.finfo(torch.float32).eps
    m = 2 * int(KNOBS["BATCH"]) * (int(KNOBS["MAX_LEN"]) - 1)  # next-token terms in one step's loss: 4 x 31
    assert two["steps"] == single["steps"] == steps
    # The train loss is the mean of n = steps * m next-token losses, all >= 0: regrouping a float32 sum of n
    # same-sign terms moves it by at most ~n * eps relatively (Higham), here 4.4e-5; seen 1 ulp (7e-8), while
    # a 10% lr change moves it by 1.4e-3.
    assert abs(two["train_loss"] - single["train_loss"]) <= steps * m * eps * single["train_loss"]
    _, got = read_adapter(out / "hf-trainer" / "final")
    _, want = read_adapter(tmp_path / "single" / "final")
    assert_adamw_runs_agree(got, want, steps=steps, lr=lr, terms=m)  # (2 ranks x batch 2 vs batch 4)
