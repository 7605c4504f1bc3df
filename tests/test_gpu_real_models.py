"""recipes/gpu_real_models.py (issue 43, item 5) and the device option it added to the two recipes it runs: the
keys of their default settings are the ones the CPU studies wrote (finished cells stay finished, on any device),
a time guard stops a part and says so, and the whole script's CPU dry run writes a summary of the three parts."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mmpreproj.experiments.study import Step
from recipes import gpu_real_models as grm
from recipes.mixed.dinov2_smollm2.study import GROUPS, VlmStudy
from recipes.mixed.dinov2_smollm2.study import Config as VlmConfig
from recipes.vision import dinov2_probe as probe
from tests.helpers.gguf_tiny import write_tiny_llama_gguf
from tests.helpers.procs import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[1]


def digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


# The features and linear keys computed from the code before the device option existed (main at 248b682): a
# change there would make the running CPU studies redo their finished cells. The adapter arms' keys hold their
# head's LR since the head trains at the linear arm's pick (here given, 0.03, as the linear grid picked).
PROBE_KEYS = {
    probe.FEATURES: "7d4f1fab406b87b6",
    probe.Cell("linear", "grid", 1e-2, 0): "d9480e4e8f50ce43",
    probe.Cell("preproj_skip", "grid", 1e-3, 0): "503cdeff56413b14",
    probe.Cell("lora", "seed", 3e-4, 1): "0befc51a72d16716",
    probe.Cell("preproj_skip_timm", "seed", 1e-3, 2): "83593c40ce725769",
    probe.Cell("lora_1pct", "grid", 1e-3, 0): "ccb4e2492b703276",
}
VLM_KEYS = {  # group: (select key of (lr 1e-3, seed 1), full key of (lr 3e-4, seed 0))
    "class/proj": ("62a1ab6fe6103ae8", "75f6c606b4356c08"),
    "class/proj+preproj_skip": ("74404701c951c130", "377707f43c821208"),
    "where/2d+preproj_skip": ("94b1fe38c202a329", "87eb44cb7f2de573"),
    "where/1d+preproj_skip": ("af22e50d65d99d4e", "a7ac982499a086c2"),
    "where/2d-il+preproj_skip": ("2f385709bfa351a3", "0896928ce3a637dc"),
    "mosaic/2d+preproj_skip": ("482608e6a4484300", "f9d291c8aa173f94"),
    "mosaic/1d+preproj_skip": ("4fbd9a7daa1d4485", "3ba3a02eac443a50"),
    "class/proj+lora": ("1f1a651af81c0c58", "d91042cf85e57cc1"),
    "mosaic/2d-il+preproj_skip": ("aaf865dbfd9472fd", "e036c333de3cade4"),
    "mosaic/2d": ("a731ea896396ddb5", "8fbb8fabc7ec2578"),  # the projector alone: its finished cells stay valid
}


@pytest.mark.parametrize("device", ["cpu", "cuda", "auto"])
def test_probe_cell_keys_of_the_defaults_are_unchanged_and_hold_no_device(device):
    cfg = probe.Config(device=device, head_lr=0.03)
    assert {c: digest(probe.cell_key(cfg, c)) for c in PROBE_KEYS} == PROBE_KEYS
    assert "device" not in probe.command(probe.Config())  # the rerun command of a CPU study is unchanged


def test_probe_cells_finished_by_the_cpu_study_are_still_finished():
    out = REPO / "docs/evidence/dinov2-probe"
    finished = sorted(out.rglob("metrics.json"))
    if not finished:
        pytest.skip("no finished cell of the CPU study in this checkout")
    cfg = probe.Config(out=str(out))
    for path in finished:
        m = json.loads(path.read_text())
        cell = probe.Cell(m["arm"], m["kind"], m["lr"], m["seed"])
        assert probe.folder(cfg, cell) == path.parent
        assert probe.read_cell(cfg, cell) is not None, f"{path} is no longer recognised as finished"


def test_vlm_step_keys_of_the_defaults_are_unchanged():
    s = VlmStudy(VlmConfig(), Path("/o"), Path("/r"), GROUPS, "dinov2-small-0123456789ab-s112-p2")
    got = {
        g.label: (digest(s.select_key(Step("select", g, 1e-3, 1))), digest(s.full_key(Step("full", g, 3e-4, 0))))
        for g in GROUPS
    }
    assert got == VLM_KEYS
    assert "device" not in VlmConfig.__dataclass_fields__  # where it runs is the LM's device, never the key


def test_on_the_cpu_nothing_is_copied():
    prepare = lambda x, g: x  # noqa: E731
    assert probe.on_device(prepare, torch.device("cpu")) is prepare
    from recipes.mixed.dinov2_smollm2.tasks import Batch

    t = torch.zeros(1, 2)
    b = Batch(t.long(), t.bool(), t[..., None], t.long()[None], t.long(), t.long(), t[0].long(), ["a"])
    assert b.to(torch.device("cpu")) is b


def test_a_spent_share_stops_the_probe_before_its_first_cell_and_says_so(tmp_path):
    cfg = grm.Config(dry_run=True, out=str(tmp_path))
    part = grm.run_probe(cfg, tmp_path, grm.Guard(time.monotonic() - 1))
    assert part.status.startswith("stopped past its share") and part.extra["ran"] == []
    assert "linear/features" in part.extra["left"]
    assert not list((tmp_path / "probe").rglob("metrics.json"))


def test_config_refuses_unknown_parts_and_malformed_picks():
    with pytest.raises(ValueError, match="parts: unknown"):
        grm.Config(parts=("probe", "video"))
    with pytest.raises(ValueError, match="ARM=LR"):
        grm.Config(probe_picks=("lora:3e-4",))
    assert grm.Config(probe_picks=("lora=3e-4",)).picks() == {"lora": 3e-4}
    assert grm.Config(dry_run=True).device == "cpu"


def test_the_device_command_is_one_line_the_tool_takes():
    cmd = grm.DEVICE_COMMAND
    assert "\n" not in cmd and len(cmd) <= 2000
    assert "recipes/gpu_real_models.py" in cmd and "--export $OUT/" in cmd


@pytest.mark.slow
def test_dry_run_writes_the_three_parts(tmp_path):
    pytest.importorskip("gguf")
    model = write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    out, export = tmp_path / "run", tmp_path / "export"
    cmd = [sys.executable, str(REPO / "recipes/gpu_real_models.py"), "--dry-run", "--model", str(model)]
    cmd += ["--out", str(out), "--export", str(export)]
    env = {"MMPREPROJ_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    summary = (out / "summary.md").read_text()
    for title in grm.TITLES.values():
        assert f"## {title}" in summary
    for part in ("(a) probe | done", "(b) vlm | done", "(c) smollm2 | done"):
        assert part in summary
    assert "Device: cpu" in summary and "Dry run" in summary
    assert "| preproj_skip |" in summary and "| class/proj+preproj_skip |" in summary
    assert "Learning-rate search" in summary  # (c)'s held-out pick
    metrics = json.loads((out / "probe/preproj_skip/seed0/metrics.json").read_text())
    assert metrics["device"] == "cpu" and "device" not in json.dumps(metrics["key"])
    assert {p.name for p in export.iterdir()} == {"summary.md", "summary.json", "smollm2.log", "evidence.tar.gz"}
