"""recipes/vision/dinov2_probe.py on tiny random DINOv2 backbones: cells written and skipped on restart, the LR
picked on held-out images only, CPU time of every invocation counted, the report made from the files."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mmpreproj
from recipes.vision import dinov2_probe as probe
from recipes.vision.dinov2_probe_report import acc_cell
from recipes.vision.dinov2_random import random_dinov2
from tests.helpers.procs import HANG_GUARD_S

TINY = ["--backbone", "random-dinov2-tiny", "--timm-backbone", "timm:random-dinov2-tiny"]
ARMS3 = ["--arms", "linear", "preproj_skip", "preproj_skip_timm"]


def run(tmp: Path, *extra: str) -> dict:
    return probe.main(["--quick", *TINY, "--out", str(tmp / "ev"), "--runs", str(tmp / "runs"), *extra])


def cells(out: Path) -> dict[str, dict]:
    return {str(p.parent.relative_to(out)): json.loads(p.read_text()) for p in sorted(out.rglob("metrics.json"))}


def steps(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]


def test_random_hosts_compute_the_same_function():
    a, b = random_dinov2("random-dinov2-tiny"), random_dinov2("timm:random-dinov2-tiny")
    x = torch.randn(2, 3, a.img_size, a.img_size)
    with torch.no_grad():
        torch.testing.assert_close(a.model(x), b.model(x), rtol=0, atol=1e-5)
    for bb in (a, b):
        mmpreproj.inject(bb.host, mmpreproj.PreProjConfig(freeze_base=True))
    pa = [p for p in a.model.parameters() if p.requires_grad]
    pb = [p for p in b.model.parameters() if p.requires_grad]
    assert [p.shape for p in pa] == [p.shape for p in pb] and len(pa) == 2 * 3  # 2 blocks: W_up, W_down, W_skip
    torch.manual_seed(0)
    with torch.no_grad():
        for p, q in zip(pa, pb):  # the same injected weights, off their init (W_down starts at zero)
            q.copy_(p.normal_(0, 0.05))
        moved = (a.model(x) - random_dinov2("random-dinov2-tiny").model(x)).abs().max()
        torch.testing.assert_close(a.model(x), b.model(x), rtol=0, atol=1e-5)
    assert moved > 1e-3 and a.dim == b.dim == 64


def test_quick_run_writes_every_cell_and_a_restart_trains_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "INVOCATION", "first")
    first = run(tmp_path)
    out = tmp_path / "ev"
    found = cells(out)
    assert set(first["ran"]) == set(found)
    for arm in probe.ARMS:
        for seed in (0, 1):
            m = found[f"{arm}/seed{seed}"]
            items = json.loads((out / arm / f"seed{seed}" / "items.json").read_text())["test_correct"]
            assert len(items) == 30 and m["test_accuracy"] == pytest.approx(sum(items) / 30)
        if not probe.ARMS[arm].lr_from:  # seed 0 at the pick is the grid's run, scored on test
            assert found[f"{arm}/seed0"]["from_grid"] == f"{arm}/grid/lr-{found[f'{arm}/seed0']['lr']:g}"
            assert {s["phase"] for s in steps(out / arm / "seed0")} <= {"test", "routing"}
    grid = out / "preproj_skip" / "grid" / "lr-0.0003"
    assert [s["phase"] for s in steps(grid)].count("train") == 3  # one line per step
    assert json.loads((grid / "items.json").read_text()).keys() == {"heldout_correct"}
    assert found["lora/seed1"]["trainable_params"] == found["preproj_skip/seed1"]["trainable_params"]  # matched
    assert found["preproj_skip/seed1"]["skip_norms"] and found["preproj_skip/seed1"]["routing_ratios"]

    assert run(tmp_path)["ran"] == []  # every finished cell is skipped
    (out / "preproj_skip" / "seed1" / "metrics.json").unlink()  # as if killed before its end
    monkeypatch.setattr(probe, "INVOCATION", "second")
    assert run(tmp_path)["ran"] == ["preproj_skip/seed1"]
    lines = steps(out / "preproj_skip" / "seed1")
    assert {s["inv"] for s in lines} == {"first", "second"}  # the killed attempt's time still counts
    report = (out / "report.md").read_text()
    total = sum(s["cpu"] for p in out.rglob("steps.jsonl") for s in steps(p.parent)) / 3600
    assert f"CPU-hours: **{total:.3f}**" in report and "2 invocation(s)" in report


def test_settings_changed_redo_the_cell_not_mix_it_in(tmp_path):
    run(tmp_path, *ARMS3)
    again = run(tmp_path, *ARMS3, "--weight-decay", "0.01")["ran"]  # --quick keeps other options
    assert set(again) == set(cells(tmp_path / "ev")) - {"linear/features"}  # every trained cell again
    assert all(m["key"]["train"][3] == 0.01 for m in cells(tmp_path / "ev").values() if "train" in m["key"])


def test_pick_is_the_heldout_best_smaller_on_ties_and_extends_past_an_edge():
    assert probe.pick_lr({1e-3: 0.5, 3e-3: 0.7, 1e-2: 0.7}) == 3e-3
    assert probe.pick_lr({1e-3: None, 3e-3: float("nan")}) is None
    assert probe.search((1e-3, 3e-3), {1e-3: 0.5}, 1) == ([3e-3], None)
    assert probe.search((1e-3, 3e-3), {1e-3: 0.5, 3e-3: 0.6}, 1) == ([1e-2], None)  # best at the top edge
    assert probe.search((1e-3, 3e-3), {1e-3: 0.5, 3e-3: 0.6, 1e-2: 0.4}, 1) == ([], 3e-3)
    assert probe.search((1e-3, 3e-3), {1e-3: 0.5, 3e-3: 0.6}, 0) == ([], 3e-3)


def test_lr_grid_never_reads_test(tmp_path, monkeypatch):
    run(tmp_path / "a", *ARMS3)
    real = probe.load_data

    def other_test_labels(cfg):
        data = real(cfg)
        x, y = data["test"]
        return {**data, "test": (x, (y + 1) % 10)}

    monkeypatch.setattr(probe, "load_data", other_test_labels)
    run(tmp_path / "b", *ARMS3)
    a, b = cells(tmp_path / "a" / "ev"), cells(tmp_path / "b" / "ev")
    grid = [c for c in a if "/grid/" in c]
    assert grid and all(a[c]["heldout_accuracy"] == b[c]["heldout_accuracy"] for c in grid)
    assert all(a[c]["lr"] == b[c]["lr"] for c in a if "/seed" in c)  # the same picks
    assert any(a[c]["test_accuracy"] != b[c]["test_accuracy"] for c in a if "/seed" in c)  # test did change


def test_report_numbers_are_the_files(tmp_path):
    run(tmp_path, *ARMS3)
    out = tmp_path / "ev"

    def rows() -> dict[str, list[str]]:
        lines = (out / "report.md").read_text().splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("| arm | host"))
        return {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[1:-1]] for r in lines[start + 2 :][:3]}

    for arm in ("linear", "preproj_skip", "preproj_skip_timm"):
        ms = [json.loads((out / arm / f"seed{s}" / "metrics.json").read_text()) for s in (0, 1)]
        row = rows()[arm]
        assert row[5] == acc_cell([m["test_accuracy"] for m in ms])
        assert row[4].startswith(f"{ms[0]['lr']:g}") and row[3] == f"{ms[0]['trainable_params']:,}"
    path = out / "linear" / "seed1" / "metrics.json"
    m = json.loads(path.read_text())
    m["test_accuracy"] = 0.9
    path.write_text(json.dumps(m))
    probe.main(["--report", "--quick", *TINY, *ARMS3, "--out", str(out), "--runs", str(tmp_path / "runs")])
    assert rows()["linear"][5] == acc_cell(
        [json.loads((out / "linear/seed0/metrics.json").read_text())["test_accuracy"], 0.9]
    )


def test_commit_names_each_finished_cell(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(probe, "commit", lambda paths, message: calls.append((paths, message)))
    ran = run(tmp_path, "--arms", "linear", "--commit")["ran"]
    assert [m for _, m in calls] == [f"dinov2 probe: {c}" for c in ran] + ["dinov2 probe: report"]
    assert calls[0][0] == [tmp_path / "ev" / "linear" / "features"]


def test_measure_projects_the_study(tmp_path):
    result = run(tmp_path, "--measure", "1", "--arms", "linear", "preproj_skip", "preproj_skip_timm")
    times = result["times"]
    assert set(times) == {"preproj_skip", "preproj_skip_timm", "eval_batch"}
    cfg = probe.Config(quick=True, arms=("preproj_skip", "preproj_skip_timm"))
    p = probe.projection(cfg, times, {"train": 40, "heldout": 20, "test": 30})
    ps, timm = times["preproj_skip"]["s_per_step"], times["preproj_skip_timm"]["s_per_step"]
    runs = cfg.steps * (3 * ps + 2 * timm)  # 2 grid points + seed 1; the timm arm's 2 seeds
    batches = 2 * 2 + 2 * 2 * 2  # 2 grid points x 2 held-out batches, 2 arms x 2 seeds x 2 test batches
    assert p["cpu_hours"] == pytest.approx((runs + batches * times["eval_batch"]["s_per_batch"]) / 3600)
    assert json.loads((tmp_path / "ev" / "step_times.json").read_text())["projection"] == result["projection"]


@pytest.mark.slow
def test_two_workers_split_the_cells(tmp_path):
    out = tmp_path / "ev"
    cmd = [sys.executable, str(probe.__file__), "--quick", *TINY, *ARMS3, "--workers", "2", "--poll-seconds", "1"]
    done = subprocess.run([*cmd, "--out", str(out), "--runs", str(tmp_path / "runs")], timeout=HANG_GUARD_S)
    assert done.returncode == 0
    invs = {c: {s["inv"] for s in steps(out / c)} for c in cells(out)}
    assert all(len(v) == 1 for v in invs.values())  # no cell run twice
    # Cells were finished by at most the two workers; which one finishes which cell is the scheduler's (on an
    # idle machine one worker can take every cell while the adapter arms wait for the linear arm's pick).
    assert invs and len(set().union(*invs.values())) <= 2
    assert re.search(r"CPU-hours: \*\*[0-9.]+\*\*", (out / "report.md").read_text())


def test_the_head_trains_at_its_own_lr_beside_the_adapter():
    """`fit_classifier(head=, head_lr=)`: the head's parameters follow head_lr, the rest lr (here 0: unchanged)."""
    from torch import nn

    from recipes.kit import fit_classifier

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 3))
    body, head = (
        [p.detach().clone() for p in model[0].parameters()],
        [p.detach().clone() for p in model[1].parameters()],
    )
    data = (torch.randn(16, 4), torch.randint(0, 3, (16,)))
    same = lambda x, g: x  # noqa: E731
    fit_classifier(model, data, None, steps=2, batch_size=8, lr=0.0, prepare_train=same, prepare_test=same,
                   warmup_steps=1, head=model[1], head_lr=0.1, score_train=False, progress=False)  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(body, model[0].parameters(), strict=True))
    assert not any(torch.equal(a, b) for a, b in zip(head, model[1].parameters(), strict=True))
