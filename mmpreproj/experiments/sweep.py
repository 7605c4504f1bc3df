"""`sweep`: final PPL against the peak learning rate, per method, for one preset (one seed per point).

    points = lr_sweep("mini", "runs/lr-sweep", methods=("preproj_skip", "lora"), lrs=(1e-5, 1e-4, 1e-3, 1e-2))

The paper trains at 1e-5 and reports that 1e-3 "causes catastrophic degradation" (Pythia-160M, 500 steps);
the mini preset trains at 1e-3. Every point is an arm (`mmpreproj.experiments.arms`): `out/<method>/lr-<lr>/` holds the
run folder, `eval.json` and `loss_curve.png`, and a restarted sweep reads finished points back. Writes
sweep.json, sweep.md, lr_sweep.png and report.md under `out`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmpreproj_tables.tables import DEFAULT_LRS
from mmpreproj_tables.values import check_lrs  # light: the command checks --lrs with the same rule

from ..analysis import plot_lr_sweep
from ..train import get_preset
from ..train.config import TrainConfig
from ..train.methods import check_methods
from ..train.sizes import SIZE_FIELDS
from .arms import compute_seconds
from .report_md import format_sweep_table
from .runner import ArmRunner, eval_settings_for, preset_grid

log = logging.getLogger("mmpreproj.sweep")

SWEEP_EVAL: dict[str, Any] = {"tasks": ["ppl"], "ppl_split": "test", "limit": None}


def lr_sweep(
    preset: str,
    out: str | Path,
    methods: Sequence[str] = ("preproj_skip", "lora"),
    lrs: Sequence[float] = DEFAULT_LRS,
    *,
    seed: int | None = None,
    eval_settings: dict[str, Any] | None = None,
    data_source: str = "local",
    train_overrides: dict[str, Any] | None = None,
    progress: bool = True,
    command: str | None = None,
) -> dict[str, dict[float, dict[str, Any]]]:
    """Train every method at every LR (all else the preset's) and score PPL; returns {method: {lr: row}}.

    Every method, LR and arm config is checked before anything is written or trained."""
    methods = check_methods(methods)
    lrs = check_lrs(lrs)
    out = Path(out)
    settings = eval_settings_for(preset, SWEEP_EVAL, eval_settings)
    overrides = dict(train_overrides or {})
    if seed is not None:
        overrides["seed"] = seed
    base_cfg = get_preset(preset, **{k: v for k, v in overrides.items() if k not in SIZE_FIELDS})
    cfgs = preset_grid(preset, out, methods, "lr", lrs, overrides, progress)
    runner = ArmRunner.open(base_cfg, settings, data_source=data_source, progress=progress)
    runner.check(cfgs.values())  # OUT is made by the first result written (a refusal leaves no folder)
    t0 = time.time()
    base_row, _, _ = runner.baseline(out, base_cfg.model)
    points: dict[str, dict[float, dict[str, Any]]] = {}
    reused_n = 0
    for lr in lrs:  # LR-major: a sweep cut short still compares the methods at the LRs it reached
        for method in methods:
            cfg = cfgs[(lr, method)]
            title = f"{cfg.method}, LR {cfg.lr:g}, seed {cfg.seed}"
            row, _, reused = runner.arm(cfg, title, diverged={"method": cfg.method, "lr": cfg.lr})
            log.info("%s lr %g: %s", cfg.method, cfg.lr, "read back" if reused else "trained and evaluated")
            reused_n += reused
            points.setdefault(method, {})[lr] = row
    points = {m: dict(sorted(points[m].items())) for m in methods}
    seconds = time.time() - t0
    _write(out, preset, lrs, points, base_row, base_cfg, settings, seconds=seconds, reused=reused_n, command=command)
    return points


def _write(
    out: Path,
    preset: str,
    lrs: Sequence[float],
    points: dict[str, dict[float, dict[str, Any]]],
    base_row: dict[str, Any],
    base_cfg: TrainConfig,
    settings: dict[str, Any],
    *,
    seconds: float,
    reused: int,
    command: str | None,
) -> None:
    """sweep.md, sweep.json, lr_sweep.png (each method's PPL against the LR, with the paper's and the preset's LR
    marked) and report.md under `out`."""
    baseline_ppl, ppl_split, preset_lr = base_row.get("ppl.ppl"), settings["ppl_split"], get_preset(preset).lr
    table = format_sweep_table(points, baseline_ppl)
    (out / "sweep.md").write_text(table + "\n")
    compute_s = compute_seconds(r for by_lr in points.values() for r in by_lr.values())
    doc = {
        "preset": preset,
        "seed": base_cfg.seed,
        "lrs": list(lrs),
        "seconds": seconds,
        "compute_seconds": compute_s,
        "command": command,
        "baseline": base_row,
        "points": {m: {f"{lr:g}": r for lr, r in p.items()} for m, p in points.items()},
    }
    (out / "sweep.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot_lr_sweep(
        {m: [(lr, r["ppl.ppl"]) for lr, r in p.items() if r.get("ppl.ppl") is not None] for m, p in points.items()},
        out / "lr_sweep.png",
        baseline=baseline_ppl,
        marks={"paper's LR (1e-5)": 1e-5, f"preset's LR ({preset_lr:g})": preset_lr},
        title=f"{preset}: final line PPL ({ppl_split}) vs peak LR, {base_cfg.steps} steps, seed {base_cfg.seed}",
    )
    report = [
        f"# Learning-rate sweep: {preset}",
        "",
        f"Command: `{command or 'mmpreproj sweep --preset ' + preset}`",
        "",
        f"Time: {seconds / 60:.1f} min wall for this invocation ({reused} point(s) read back); "
        f"{compute_s / 60:.1f} min summed over the points' own train + eval wall times.",
        "",
        f"Settings: the {preset} preset ({base_cfg.steps} steps, warmup {base_cfg.warmup_steps}, "
        f"{base_cfg.schedule} schedule, batch {base_cfg.effective_batch} x {base_cfg.max_len} tokens, "
        f"seed {base_cfg.seed}), only the peak LR changes; PPL = the paper's line PPL on {ppl_split} "
        "rows.",
        "",
        table,
        "",
        "![lr_sweep.png](lr_sweep.png)",
        "",
        "Each point's run folder (`<method>/lr-<lr>/`) holds its `loss_curve.png`.",
        "",
    ]
    (out / "report.md").write_text("\n".join(report))
