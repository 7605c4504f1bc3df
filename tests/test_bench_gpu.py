"""bench/gpu.sh: its CPU dry run goes through every case, and without a GPU it stops at once with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.procs import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # every test here runs bench/gpu.sh in a subprocess


def _gpu_sh(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=HANG_GUARD_S)  # fmt: skip


def test_dry_run_measures_every_case_on_the_cpu(tmp_path):
    run = _gpu_sh("--dry-run", str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    res = json.loads((tmp_path / "gpu.json").read_text())
    assert res["device"] == "cpu (dry run)" and list(res["shapes"]) == ["160m"]
    row = res["shapes"]["160m"]
    assert set(row["forward"]) == set(row["decode"]) == {"base", "injected", "bf16 modules"}
    assert set(row["train"]) == {"base", "preproj_skip", "lora"}
    for case in row.values():
        for r in case.values():
            assert r["ms_min"] <= r["ms"] <= r["ms_max"] and r["ratio_min"] <= r["ratio"] <= r["ratio_max"]
            assert r["tokens_per_s"] > 0 and r["peak_gb"] is None  # no CUDA memory counter on the CPU
    assert all(r["mfu"] > 0 for case in ("forward", "train") for r in row[case].values())
    assert "frozen-probe step" in (tmp_path / "gpu.log").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: gpu.sh would run the real measurement")
def test_without_a_gpu_it_stops_at_once_with_one_line(tmp_path):
    run = _gpu_sh(str(tmp_path / "out"), env={"CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU" in lines[0] and "--dry-run" in lines[0]
    assert not (tmp_path / "out").exists()  # nothing written, nothing started
