"""`reproduce --seeds` and `sweep` on a tiny model: a stopped reproduction restarts without recomputing
finished arms, and the tables, figures and report.md are written."""

from __future__ import annotations

import json

import pytest

import mmpreproj.experiments.arms as arms
from mmpreproj.experiments.reproduce import reproduce
from mmpreproj.experiments.sweep import lr_sweep

REAL_TRAIN = arms.train
FAST = {"steps": 2, "warmup_steps": 1, "max_len": 32, "batch_size": 2, "num_lines": 16, "save_every": 1}
EVAL = {"limit": 6}


class Killed(Exception):
    """Stands in for a kill in the middle of a reproduction."""


def _spy(monkeypatch, fail_after: int | None = None) -> list[tuple[str, int]]:
    """Record (method, seed) of every training run; raise `Killed` after `fail_after` runs."""
    calls: list[tuple[str, int]] = []
    real = REAL_TRAIN

    def train(cfg, **kw):
        if fail_after is not None and len(calls) == fail_after:
            raise Killed
        calls.append((cfg.method, cfg.seed))
        return real(cfg, **kw)

    monkeypatch.setattr(arms, "train", train)
    return calls


def _is_png(path) -> bool:
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000


def test_stopped_reproduction_resumes_without_recomputing(tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "rep"
    kw = dict(
        methods=("skip", "lora_matched"),
        seeds="0,1",
        eval_settings=EVAL,
        progress=False,
        train_overrides={"model": str(tiny_model_dir), **FAST},
    )
    calls = _spy(monkeypatch, fail_after=3)
    with pytest.raises(Killed):  # killed while training the 4th arm
        reproduce("mini", out, **kw)
    assert calls == [("skip", 0), ("lora_matched", 0), ("skip", 1)]
    done = out / "skip" / "seed-0" / "eval.json"
    stamp = done.stat().st_mtime_ns
    saved = json.loads(done.read_text())["row"]
    assert not (out / "lora_matched" / "seed-1" / "eval.json").exists()

    evals = []
    real_eval = arms.evaluate
    monkeypatch.setattr(arms, "evaluate", lambda *a, **k: evals.append(1) or real_eval(*a, **k))
    calls = _spy(monkeypatch)
    rows = reproduce("mini", out, **kw)
    assert calls == [("lora_matched", 1)]  # only the unfinished arm trains again
    assert len(evals) == 1  # the baseline and the three finished arms are read back, not evaluated
    assert done.stat().st_mtime_ns == stamp and rows[1] == saved
    assert [(r["method"], r["seed"]) for r in rows] == [
        ("baseline", None),
        ("skip", 0),
        ("lora_matched", 0),
        ("skip", 1),
        ("lora_matched", 1),
    ]
    results = json.loads((out / "results.json").read_text())
    assert results["seeds"] == [0, 1] and len(results["reused"]) == 3
    skip = results["summary"]["skip"]["ppl.ppl"]
    ppls = [r["ppl.ppl"] for r in rows if r["method"] == "skip"]
    assert skip[0] == pytest.approx(sum(ppls) / 2) and skip[2] == 2
    comp = [
        c
        for c in results["comparisons"]
        if c["method"] == "skip" and c["reference"] == "lora_matched" and c["metric"] == "ppl.ppl"
    ]
    assert len(comp) == 1 and comp[0]["seeds"] is not None and comp[0]["items"] is not None

    report = (out / "report.md").read_text()
    assert "Seeds: 0, 1" in report and "| method | vs | Δ PPL | 95% over seeds | 95% over items | reading |" in report
    for name in ("loss_curves.png", "results.png", "skip_norms.png", "skip_growth.png"):
        assert f"]({name})" in report and _is_png(out / name), name
    for method in ("skip", "lora_matched"):
        for seed in (0, 1):
            assert _is_png(out / method / f"seed-{seed}" / "loss_curve.png")
            assert not (out / method / f"seed-{seed}" / "checkpoint.pt").exists()  # removed once recorded
    assert "± " in (out / "table.md").read_text()

    key = json.loads(done.read_text())["key"]
    assert arms.read_arm(done.parent, key)["row"] == saved
    changed = {**key, "train": {**key["train"], "steps": 3}}
    assert arms.read_arm(done.parent, changed) is None  # a changed setting is recomputed, never mixed in


def test_sweep_writes_plot_and_reads_points_back(tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "sweep"
    kw = dict(
        methods=("skip",),
        lrs=(1e-4, 1e-2),
        eval_settings=EVAL,
        progress=False,
        train_overrides={"model": str(tiny_model_dir), **FAST},
    )
    points = lr_sweep("mini", out, **kw)
    assert sorted(points["skip"]) == [1e-4, 1e-2] and all(r["ppl.ppl"] > 1 for r in points["skip"].values())
    assert _is_png(out / "lr_sweep.png") and _is_png(out / "skip" / "lr-0.01" / "loss_curve.png")
    assert "LR 0.0001" in (out / "sweep.md").read_text() and "](lr_sweep.png)" in (out / "report.md").read_text()
    calls = _spy(monkeypatch)
    assert lr_sweep("mini", out, **kw) == points and calls == []
