"""`budget`: at a trainable-parameter budget, which method wins, each at its own tuned LR.

    budget_study("mini", "runs/mini-budget", budgets=(0.01, 0.1), methods=("lora", "preproj_skip"), seeds=3)

For every budget (a fraction of the base's parameters) and method, `train.sizes.sizes_for_budget` picks the
LoRA rank, skip rank or pre-projection width. The LR search starts at `start_lrs` (2x apart), and while the
best PPL sits at an edge of what was tried it adds the next LR by 2x on that side (at most `max_extend`
times), so the best LR found has tried neighbours at most 2x away on both sides. The other seeds then train
at the best LR (only for `seed_methods`, all by default). Every point is an arm (`mmpreproj.experiments.arms`):
`out/b<budget>/<method>/lr-<lr>-seed-<seed>/`, read back on a restart. Writes budget.json, report.md,
pareto.png and lr-b<budget>.png under `out` after every (budget, method), so a cut-short study reports what
it reached. `read_only=True` trains nothing: it reads back the finished points (the ones the search would
visit) and writes the report, listing each (budget, method) with no finished point as not run; that is how
several processes, each given a share of the grid with the same `out`, end in one report.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmpreproj_tables.tables import BUDGET_METHODS, DEFAULT_BUDGETS
from mmpreproj_tables.values import check_lrs, parse_budgets  # light: the command checks --budgets with them

from ..analysis import plot_lr_sweep
from ..analysis.plot import plot_pareto
from ..analysis.stats import mean_std
from ..train import get_preset
from ..train.config import TrainConfig
from ..train.methods import host_shape, lora_per_rank
from ..train.sizes import sizes_for_budget
from .arms import compute_seconds, finished_arm
from .compare import paired_comparisons
from .report_md import format_budget_table
from .runner import ArmRunner, best_lr, doubling_step, eval_settings_for, point_config, search_lrs
from .sweep import SWEEP_EVAL

log = logging.getLogger("mmpreproj.budget")

# Where each method's search starts on mini: 2x around its best LR at the full size (0.5.0's six-LR sweep on mini:
# LoRA 3e-3, pre-projection + skip 1e-2, skip 3e-2; pre-projection alone unmeasured, started as preproj_skip).
START_LRS: Mapping[str, tuple[float, ...]] = {
    "lora": (1.5e-3, 3e-3, 6e-3),
    "preproj_skip": (5e-3, 1e-2, 2e-2),
    "preproj": (5e-3, 1e-2, 2e-2),
    "skip": (1.5e-2, 3e-2, 6e-2),
}


def budget_study(
    preset: str,
    out: str | Path,
    budgets: Sequence[float] = DEFAULT_BUDGETS,
    methods: Sequence[str] = BUDGET_METHODS,
    *,
    seeds: int = 3,
    seed_methods: Sequence[str] | None = None,
    start_lrs: Sequence[float] | None = None,
    max_extend: int = 3,
    paper_point: bool = True,
    eval_settings: dict[str, Any] | None = None,
    data_source: str = "local",
    train_overrides: dict[str, Any] | None = None,
    progress: bool = True,
    command: str | None = None,
    read_only: bool = False,
) -> dict[str, Any]:
    """Run the study (see the module docstring); returns what budget.json holds."""
    budgets = parse_budgets(budgets)
    seed_methods = _checked_seed_methods(methods, seed_methods, seeds, max_extend)
    if start_lrs is not None:
        start_lrs = check_lrs(start_lrs, "start_lrs")
    out = Path(out)
    overrides = dict(train_overrides or {})
    base_cfg = get_preset(preset, **overrides)
    settings = eval_settings_for(preset, SWEEP_EVAL, eval_settings)
    runner = ArmRunner.open(base_cfg, settings, data_source=data_source, progress=progress)
    dim, layers = host_shape(runner.base)
    per_rank = lora_per_rank(runner.base)
    t0 = time.time()
    base_row, _, _ = runner.baseline(out, base_cfg.model)
    state = {  # what budget.json holds before the first point: the setting, the host's shape and the baseline
        "preset": preset,
        "command": command,
        "dim": dim,
        "layers": layers,
        "base_params": sum(p.numel() for p in runner.base.parameters()),
        "baseline": base_row,
        "seeds": [base_cfg.seed + i for i in range(seeds)],
        "ppl_split": settings["ppl_split"],
        "points": [],
        "unreachable": [],
        "not_run": [],
        "reused": 0,
    }
    study = _Search(preset, out, overrides, base_cfg, runner, seed_methods, max_extend, progress, read_only, t0, state)
    for b in budgets:
        target = round(b * study.state["base_params"])
        for method in methods:
            sizes = sizes_for_budget(method, target, dim=dim, layers=layers, lora_per_rank=per_rank)
            if sizes is None:
                log.info("b%g %s: out of reach (a skip rank would reach d=%d)", b, method, dim)
                study.state["unreachable"].append(f"b{b:g} {method}")
                continue
            study.search(f"b{b:g}", method, sizes, start_lrs or START_LRS[method])
    if paper_point:  # the paper's full-size modules, at their own budget
        study.search("paper", "preproj_skip", {}, start_lrs or START_LRS["preproj_skip"])
    study.write()
    return json.loads((out / "budget.json").read_text())


def _checked_seed_methods(
    methods: Sequence[str], seed_methods: Sequence[str] | None, seeds: int, max_extend: int
) -> list[str]:
    """The methods whose other seeds train (all by default), once the methods and counts are checked."""
    bad = [m for m in methods if m not in BUDGET_METHODS]
    if bad or not methods or len(set(methods)) != len(methods):
        raise ValueError(f"methods={list(methods)!r}: distinct names from {list(BUDGET_METHODS)}")
    seed_methods = list(methods if seed_methods is None else seed_methods)
    if any(m not in methods for m in seed_methods):
        raise ValueError(f"seed_methods={seed_methods!r}: must be among methods={list(methods)!r}")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds={seeds!r}; must be an int >= 1 (the preset's seed and the next seeds-1)")
    if isinstance(max_extend, bool) or not isinstance(max_extend, int) or max_extend < 0:
        raise ValueError(f"max_extend={max_extend!r}; must be an int >= 0")
    return seed_methods


@dataclass
class _Search:
    """One study's points (trained, or read back into `state` and `items`) and the LR search over them."""

    preset: str
    out: Path
    overrides: dict[str, Any]
    base_cfg: TrainConfig
    runner: ArmRunner
    seed_methods: list[str]
    max_extend: int
    progress: bool
    read_only: bool
    t0: float
    state: dict[str, Any]
    items: dict[tuple, dict] = field(default_factory=dict)

    def search(self, label: str, method: str, sizes: dict[str, Any], first: Sequence[float]) -> None:
        """Search the LR from `first` on the first seed (2x steps past an edge), train the other seeds at the best
        one, rewrite the report."""
        seed = self.state["seeds"][0]
        point = lambda lr: self.point(label, method, sizes, lr, seed)  # noqa: E731
        tried, _ = search_lrs(first, point, "ppl.ppl", max_extend=self.max_extend, step=doubling_step)
        if not tried:  # read_only, nothing finished
            self.state["not_run"].append(f"{label} {method}")
            return
        best = best_lr(tried)
        if best is not None and method in self.seed_methods:
            for seed in self.state["seeds"][1:]:
                self.point(label, method, sizes, best, seed)
        self.write()

    def point(self, label: str, method: str, sizes: dict[str, Any], lr: float, seed: int) -> dict[str, Any] | None:
        """The point's row (trained, or read back); None when `read_only` and it has not finished."""
        cfg = self._config(label, method, sizes, lr, seed)
        if self.read_only:
            got = finished_arm(cfg.out, self.runner.key(cfg))
        else:
            title = f"{method} {sizes}, LR {lr:g}, seed {seed}"
            got = self.runner.arm(cfg, title, diverged={"method": method, "lr": lr, "seed": seed})
        if got is None:
            return None
        row, its, reused = got
        self.state["reused"] += reused
        row = {**row, "budget": label, "sizes": sizes}
        self.state["points"].append(row)
        self.items[(label, method, lr, seed)] = its
        log.info("%s %s lr %g seed %d: %s", label, method, lr, seed, "read back" if reused else "trained")
        return row

    def _config(self, label: str, method: str, sizes: dict[str, Any], lr: float, seed: int) -> TrainConfig:
        """The point's training config: the preset, the overrides, then the point's method, LR, seed and sizes."""
        run = self.out / label / method / f"lr-{lr:g}-seed-{seed}"
        point = dict(method=method, lr=lr, seed=seed, **sizes)
        return point_config(self.preset, self.overrides, run, progress=self.progress, **point)

    def write(self) -> None:
        """budget.json, report.md and the figures of what the study has reached."""
        _write(self.out, self.state, self.items, self.base_cfg, time.time() - self.t0)


def _summary(state: dict[str, Any], items: dict[tuple, dict]) -> list[dict[str, Any]]:
    """One row per (budget, method): sizes, params, LRs tried, best LR, PPL over seeds, interval against LoRA."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in state["points"]:
        groups.setdefault((r["budget"], r["method"]), []).append(r)
    rows = []
    for (label, method), pts in groups.items():
        first = state["seeds"][0]
        curve = {r["lr"]: r.get("ppl.ppl") for r in pts if r["seed"] == first}
        best = best_lr(curve)
        at_best = {r["seed"]: r["ppl.ppl"] for r in pts if r["lr"] == best and r.get("ppl.ppl") is not None}
        mean, std, n = mean_std(list(at_best.values())) if at_best else (None, None, 0)
        params = next((r.get("params") for r in pts if r.get("params")), None)
        rows.append(
            {
                "budget": label,
                "method": method,
                "sizes": pts[0]["sizes"],
                "params": params,
                "percent": 100 * params / state["base_params"] if params else None,
                "curve": {f"{lr:g}": v for lr, v in sorted(curve.items())},
                "best_lr": best,
                "ppl": at_best,
                "mean": mean,
                "std": std,
                "n": n,
                "edge": best is not None and best in (min(curve), max(curve)),
            }
        )
    for row in rows:  # paired by seed against LoRA at the same budget, each at its own best LR
        lora = next((r for r in rows if r["budget"] == row["budget"] and r["method"] == "lora"), None)
        if lora is None or row["method"] == "lora":
            continue
        arms, its = {}, {}  # each at its best LR, keyed (method, seed)
        for r in (row, lora):
            for s, v in r["ppl"].items():
                arms[(r["method"], s)] = {"ppl.ppl": v}
                its[(r["method"], s)] = items.get((r["budget"], r["method"], r["best_lr"], s), {})
        for c in paired_comparisons([(row["method"], "lora")], ["ppl.ppl"], arms, its):
            row["vs_lora"] = {"diff": c.diff, "seeds": c.seeds, "items": c.items, "reading": c.words()}
    return rows


def _write(out: Path, state: dict[str, Any], items: dict[tuple, dict], base_cfg: TrainConfig, seconds: float) -> None:
    """budget.json, report.md, pareto.png and lr-<budget>.png of what the study has reached."""
    rows = _summary(state, items)
    compute_s = compute_seconds(state["points"])
    doc = {k: v for k, v in state.items() if k != "points"}
    doc.update(seconds=seconds, compute_seconds=compute_s, summary=rows, points=state["points"])
    (out / "budget.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    baseline = state["baseline"].get("ppl.ppl")
    by_method: dict[str, list[tuple[float, float, float]]] = {}
    for r in rows:
        if r["mean"] is not None and r["budget"] != "paper":
            by_method.setdefault(r["method"], []).append((r["params"], r["mean"], r["std"] or 0.0))
    extra = {
        "preproj_skip, paper size": [
            (r["params"], r["mean"], r["std"] or 0.0) for r in rows if r["budget"] == "paper" and r["mean"] is not None
        ]
    }
    plot_pareto(
        {**by_method, **{k: v for k, v in extra.items() if v}},
        out / "pareto.png",  # no base line: it
        title=f"{state['preset']}: PPL at each method's best LR vs trainable parameters "  # flattens the rest
        f"(untrained base {baseline:.0f})",
    )
    figures = []
    for label in dict.fromkeys(r["budget"] for r in rows):
        series = {
            r["method"]: [(float(lr), v) for lr, v in r["curve"].items() if v is not None]
            for r in rows
            if r["budget"] == label
        }
        name = f"lr-{label}.png"
        plot_lr_sweep(
            series,
            out / name,
            baseline=baseline,
            title=f"{state['preset']} {label}: PPL vs peak LR, seed {state['seeds'][0]}",
        )
        figures.append(name)
    table = format_budget_table(rows, state["base_params"])
    lines = [
        f"# Parameter budget study: {state['preset']}",
        "",
        f"Command: `{state['command'] or 'mmpreproj budget --preset ' + state['preset']}`",
        "",
        f"Time: {seconds / 60:.1f} min wall for the last invocation ({state['reused']} point(s) read back); "
        f"{compute_s / 60:.1f} min summed over the points' own train + eval wall times.",
        "",
        f"Settings: the {state['preset']} preset ({base_cfg.steps} steps, warmup {base_cfg.warmup_steps}, "
        f"{base_cfg.schedule}, batch {base_cfg.effective_batch} x {base_cfg.max_len} tokens), base "
        f"{state['base_params']:,} parameters (d={state['dim']}, {state['layers']} blocks); only the sizes, the "
        f"peak LR and the seed change. PPL = the paper's line PPL on {state['ppl_split']} rows; "
        f"untrained base {baseline:.1f}.",
        "",
        table,
        "",
        *(
            [
                f"Out of reach (a skip rank would reach d={state['dim']}, where the full d x d skip is cheaper): "
                + ", ".join(state["unreachable"])
                + ".",
                "",
            ]
            if state["unreachable"]
            else []
        ),
        *([f"Not run (no finished point): {', '.join(state['not_run'])}.", ""] if state.get("not_run") else []),
        "![pareto.png](pareto.png)",
        "",
        *[f"![{f}]({f})" for f in figures],
        "",
    ]
    (out / "report.md").write_text("\n".join(lines))
