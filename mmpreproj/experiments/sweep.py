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

from mmpreproj_cli.tables import DEFAULT_LRS
from mmpreproj_cli.values import check_lrs  # light: the command checks --lrs with the same rule

from ..analysis import plot_lr_sweep
from ..train import get_preset, load_model_and_tokenizer
from ..train.methods import check_methods
from ..train.presets import ppl_split_for
from ..train.sizes import SIZE_FIELDS, sizes_for_method
from .arms import arm_key, baseline_arm, eval_arm, finish_curve, run_arm, train_arm
from .report_md import format_sweep_table

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
    settings = dict(SWEEP_EVAL, ppl_split=ppl_split_for(preset), **(eval_settings or {}))
    overrides = dict(train_overrides or {})
    if seed is not None:
        overrides["seed"] = seed
    base_cfg = get_preset(preset, **{k: v for k, v in overrides.items() if k not in SIZE_FIELDS})
    cfgs = {
        (lr, method): get_preset(
            preset,
            method=method,
            lr=lr,
            out=str(out / method / f"lr-{lr:g}"),
            progress=progress,
            **sizes_for_method(method, overrides),
        )
        for lr in lrs
        for method in methods
    }
    out.mkdir(parents=True, exist_ok=True)
    base, tokenizer = load_model_and_tokenizer(base_cfg)
    eval_key = {**settings, "protocol": "paper", "data_source": data_source}
    t0 = time.time()

    def run_eval(model):
        return eval_arm(model, tokenizer, settings, data_source=data_source, protocol="paper", progress=progress)

    base_row = baseline_arm(out, base_cfg.model, base, eval_key, run_eval)
    points: dict[str, dict[float, dict[str, Any]]] = {}
    reused_n = 0
    for lr in lrs:  # LR-major: a sweep cut short still compares the methods at the LRs it reached
        for method in methods:
            cfg = cfgs[(lr, method)]
            run_dir = Path(cfg.out)

            def compute(fresh: bool, cfg=cfg, run_dir=run_dir):
                model, row = train_arm(cfg, base, tokenizer, fresh=fresh)
                metrics, its = run_eval(model)
                row.update(metrics)
                finish_curve(run_dir, row, cfg.steps, f"{cfg.method}, LR {cfg.lr:g}, seed {cfg.seed}")
                return row, its

            try:
                row, _, reused = run_arm(run_dir, arm_key(cfg, eval_key), compute)
            except Exception as err:  # a diverged point (NaN loss) is a result, not a crash of the sweep
                if type(err).__name__ != "NonFiniteLossError":
                    raise
                row, reused = {"method": method, "lr": lr, "ppl.ppl": None, "diverged": str(err)}, False
            reused_n += reused
            log.info("%s lr %g: %s", method, lr, "read back" if reused else "trained and evaluated")
            points.setdefault(method, {})[lr] = row
    points = {m: dict(sorted(points[m].items())) for m in methods}
    seconds = time.time() - t0
    baseline_ppl = base_row.get("ppl.ppl")
    table = format_sweep_table(points, baseline_ppl)
    (out / "sweep.md").write_text(table + "\n")
    compute_s = sum(
        (r.get("train_wall_seconds") or 0) + (r.get("eval_seconds") or 0)
        for by_lr in points.values()
        for r in by_lr.values()
    )
    (out / "sweep.json").write_text(
        json.dumps(
            {
                "preset": preset,
                "seed": base_cfg.seed,
                "lrs": list(lrs),
                "seconds": seconds,
                "compute_seconds": compute_s,
                "command": command,
                "baseline": base_row,
                "points": {m: {f"{lr:g}": r for lr, r in p.items()} for m, p in points.items()},
            },
            indent=2,
        )
        + "\n"
    )
    series = {
        m: [(lr, r["ppl.ppl"]) for lr, r in p.items() if r.get("ppl.ppl") is not None] for m, p in points.items()
    }
    marks = {"paper's LR (1e-5)": 1e-5, f"preset's LR ({get_preset(preset).lr:g})": get_preset(preset).lr}
    plot_lr_sweep(
        series,
        out / "lr_sweep.png",
        baseline=baseline_ppl,
        marks=marks,
        title=f"{preset}: final line PPL ({settings['ppl_split']}) vs peak LR, "
        f"{base_cfg.steps} steps, seed {base_cfg.seed}",
    )
    report = [
        f"# Learning-rate sweep: {preset}",
        "",
        f"Command: `{command or 'mmpreproj sweep --preset ' + preset}`",
        "",
        f"Time: {seconds / 60:.1f} min wall for this invocation ({reused_n} point(s) read back); "
        f"{compute_s / 60:.1f} min summed over the points' own train + eval wall times.",
        "",
        f"Settings: the {preset} preset ({base_cfg.steps} steps, warmup {base_cfg.warmup_steps}, "
        f"{base_cfg.schedule} schedule, batch {base_cfg.effective_batch} x {base_cfg.max_len} tokens, "
        f"seed {base_cfg.seed}), only the peak LR changes; PPL = the paper's line PPL on {settings['ppl_split']} "
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
    return points
