"""`reproduce`: the paper's Table 2 for one preset — baseline plus every frozen-probe method, per seed, with
spread and paired intervals, figures and a `report.md`.

    rows = reproduce("mini", out="runs/demo")                      # offline, CPU, one seed, ~10 minutes
    rows = reproduce("mini", out="runs/mini-3seeds", seeds=3)      # seeds 42, 43, 44 (the preset's seed + i)
    rows = reproduce("pythia-160m", out="runs/160m")               # online, GPU, the paper's protocol

Steps: load the base once and evaluate it; for each seed and method train a fresh copy of the base (the seed
drives the adapter init and the data order), evaluate it with per-item scores, read its skip norms and
routing ratios. Each arm is recorded in `out/<method>/seed-<s>/eval.json` beside its run folder, so a stopped
reproduction restarts where it was: finished arms are read back, not recomputed (`mmpreproj.experiments.arms`).
Writes under `out`: results.json, table.md, report.md, loss_curves.png, results.png, skip_norms.png,
skip_growth.png, and loss_curve.png in every run folder.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mmpreproj_tables.tables import METHODS, PAPER_METHODS
from mmpreproj_tables.values import parse_seeds  # light: the command checks --seeds with it

from ..analysis import PAPER_SKIP_NORMS, plot_loss_curves, plot_results, plot_skip_growth, plot_skip_norms
from ..analysis.plot import read_losses
from ..analysis.stats import Comparison, mean_std
from ..data import wikitext_lines
from ..method.config import PreProjConfig
from ..train import get_preset
from ..train.config import TrainConfig
from ..train.methods import check_methods
from ..train.sizes import SIZE_FIELDS
from .arms import arm_seconds, compute_seconds
from .compare import paired_comparisons
from .paper import PAPER_TABLE2
from .report_md import (
    METRIC_LABELS,
    _comparison_rows,
    _figure_lines,
    format_comparisons,
    format_summary_table,
    noise_sentences,
)
from .runner import ArmRunner, eval_settings_for, preset_grid

log = logging.getLogger("mmpreproj.reproduce")

DEFAULT_METHODS = METHODS  # every method (train/methods.py)
DEMO_METHODS = PAPER_METHODS  # the paper's five: `demo` stays ~10 min
# What the offline demo evaluates: train on WikiText valid lines, so PPL is measured on test rows.
DEMO_EVAL: dict[str, Any] = {"tasks": ("ppl", "lambada", "hellaswag"), "ppl_split": "test", "limit": None}
PAPER_EVAL: dict[str, Any] = {
    "tasks": ("ppl", "lambada", "hellaswag", "arc_easy"),
    "ppl_split": "validation",
    "limit": None,
}
METRICS = ("lambada.acc", "hellaswag.acc", "arc_easy.acc", "ppl.ppl", "lambada.ppl")
REFERENCES = ("baseline", "lora", "lora_matched")  # every method is compared with these (when present)
COMPARED = ("ppl.ppl", "lambada.ppl", "hellaswag.acc", "lambada.acc", "arc_easy.acc")  # in the comparisons' order
# Paper Figure-2 widths, to divide its norms by their init value (std 1e-4 * d for a d x d weight).
PAPER_WIDTHS = {"pythia-160m": 768, "pythia-410m": 1024}
# The training config fields report.md names.
_TRAIN_FACTS = (
    "model",
    "data",
    "num_lines",
    "max_len",
    "steps",
    "warmup_steps",
    "lr",
    "schedule",
    "batch_size",
    "grad_accum",
    "precision",
    "max_grad_norm",
)


def format_table(rows: list[dict[str, Any]], preset: str) -> str:
    """The Table-2 layout for one row per method (one seed), paper figures in brackets for paper presets."""
    summary = {
        r["method"]: {
            "params": r.get("params"),
            **{m: (r[m], 0.0, 1) if r.get(m) is not None else None for m in METRICS},
        }
        for r in rows
    }
    return format_summary_table(summary, preset)


def summarize(rows: list[dict[str, Any]], methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """{method: {"params", metric: (mean, std, n) or None}} over the seeds of each method (baseline first)."""
    out: dict[str, dict[str, Any]] = {}
    for method in ("baseline", *methods):
        mine = [r for r in rows if r["method"] == method]
        if not mine:
            continue
        entry: dict[str, Any] = {"params": mine[0].get("params")}
        for m in METRICS:
            vals = [r[m] for r in mine if r.get(m) is not None]
            entry[m] = mean_std(vals) if vals else None
        out[method] = entry
    return out


def comparisons(
    rows: list[dict[str, Any]], items: dict[tuple[str, int | None], dict], methods: Sequence[str]
) -> list[Comparison]:
    """Every method against baseline and the LoRA arms, on every metric with per-item scores."""
    pairs = []
    for method in methods:
        # a reference arm meets only the references before it (lora_matched - lora, not also lora - lora_matched)
        refs = REFERENCES[: REFERENCES.index(method)] if method in REFERENCES else REFERENCES
        pairs += [(method, ref) for ref in refs if ref == "baseline" or ref in methods]
    # a metric absent, or the same for every arm (mini's LAMBADA accuracy is 0 everywhere), has nothing to compare
    metrics = [m for m in COMPARED if len({r.get(m) for r in rows if r.get(m) is not None}) >= 2]
    return paired_comparisons(pairs, metrics, {(r["method"], r.get("seed")): r for r in rows}, items)


def _ratio_batches(tokenizer, texts: Sequence[str], max_len: int, device: torch.device) -> Iterator[dict]:
    for text in texts:
        enc = tokenizer(text, return_tensors="pt", truncation=True, max_length=max_len)
        yield {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}


def _ratio_texts(data_source: str, split: str, n: int = 32) -> list[str]:
    """A few evaluation rows (the PPL split) on which to measure ||W_skip x~|| / ||attn_out||."""
    return [line for line in wikitext_lines(split, data_source) if len(line.strip()) > 50][:n]


def reproduce(
    preset: str,
    out: str | Path,
    methods: Sequence[str] = DEFAULT_METHODS,
    *,
    seeds: str | int | Sequence[int] | None = None,
    eval_settings: dict[str, Any] | None = None,
    data_source: str = "local",
    protocol: str = "paper",
    train_overrides: dict[str, Any] | None = None,
    progress: bool = True,
    command: str | None = None,
) -> list[dict[str, Any]]:
    """Run baseline + `methods` x `seeds` for `preset`; write the tables, figures and report.md to `out`.

    Returns one row per arm (baseline first, then seed by seed). `command` is quoted in the report.
    """
    methods = check_methods(methods)
    out = Path(out)
    settings = eval_settings_for(preset, DEMO_EVAL if preset == "mini" else PAPER_EVAL, eval_settings)
    base_cfg = get_preset(preset, **{k: v for k, v in (train_overrides or {}).items() if k not in SIZE_FIELDS})
    seed_list = parse_seeds(seeds, base_cfg.seed)
    cfgs = preset_grid(preset, out, methods, "seed", seed_list, train_overrides or {}, progress)
    runner = ArmRunner.open(base_cfg, settings, data_source=data_source, protocol=protocol, progress=progress)
    runner.check(cfgs.values())  # OUT is made by the first result written (a refusal leaves no folder)
    device = next(runner.base.parameters()).device
    texts = _ratio_texts(data_source, settings["ppl_split"])
    runner.ratio_batches = lambda: _ratio_batches(runner.tokenizer, texts, base_cfg.max_len, device)
    t0 = time.time()
    row, its, reused = runner.baseline(out, base_cfg.model, seed=None)
    log.info("baseline: %s", "read back" if reused else "evaluated")
    rows, items, reused_arms = [row], {("baseline", None): its}, []
    for seed in seed_list:
        for method in methods:
            cfg = cfgs[(seed, method)]
            row, its, reused = runner.arm(cfg, f"{cfg.method}, seed {cfg.seed}, LR {cfg.lr:g}")
            if reused:
                reused_arms.append(f"{method}/seed-{seed}")
            log.info("%s seed %d: %s", method, seed, "read back" if reused else "trained and evaluated")
            rows.append(row)
            items[(method, seed)] = its
    _write_outputs(
        out,
        preset,
        rows,
        items,
        methods,
        seed_list,
        settings,
        base_cfg,
        runner.base,
        seconds=time.time() - t0,
        reused=reused_arms,
        command=command,
    )
    return rows


def _figures(
    out: Path,
    preset: str,
    rows: list[dict[str, Any]],
    methods: Sequence[str],
    summary: dict[str, dict[str, Any]],
    hidden: int,
    init_std: float,
) -> list[tuple[str, str]]:
    """Write the figures; returns (file name, caption) of each."""
    figs = []
    curves = {
        m: [
            read_losses(out / m / f"seed-{r['seed']}")
            for r in rows
            if r["method"] == m and (out / m / f"seed-{r['seed']}" / "log.jsonl").is_file()
        ]
        for m in methods
    }
    curves = {m: c for m, c in curves.items() if c}
    if curves:
        plot_loss_curves(
            curves, out / "loss_curves.png", title=f"train loss, 10-step mean ({preset}; one line per seed)"
        )
        figs.append(("loss_curves.png", "Train loss of every arm (10-step mean), one line per seed."))
    panels = {}
    for m in ("ppl.ppl", "lambada.ppl", "hellaswag.acc", "arc_easy.acc", "lambada.acc"):
        vals = {k: v[m][:2] for k, v in summary.items() if v.get(m) is not None}
        if vals and not (m == "lambada.acc" and all(v[0] == 0 for v in vals.values())):
            panels[METRIC_LABELS[m]] = vals
    paper = PAPER_TABLE2.get(preset, {})
    refs = {
        METRIC_LABELS[m]: {k: v[i] for k, v in paper.items() if v[i] is not None}
        for m, i in (("lambada.acc", 1), ("hellaswag.acc", 2), ("arc_easy.acc", 3), ("ppl.ppl", 4))
    }
    if panels:
        n = len({r.get("seed") for r in rows if r["method"] != "baseline"})
        plot_results(
            panels,
            out / "results.png",
            refs=refs,
            title=f"{preset}: mean over {n} seed(s), error bars = std over seeds"
            + ("; black ticks = paper" if paper else ""),
        )
        figs.append(("results.png", "Each metric per method; error bars are the standard deviation over seeds."))
    norms = {m: [r["skip_norms"] for r in rows if r["method"] == m and r.get("skip_norms")] for m in methods}
    norms = {m: [sum(col) / len(col) for col in zip(*v)] for m, v in norms.items() if v}
    if norms:
        series = dict(norms)
        if preset in PAPER_SKIP_NORMS:
            series["paper"] = PAPER_SKIP_NORMS[preset]
        plot_skip_norms(series, out / "skip_norms.png", title=f"||W_skip||_F per layer ({preset}, mean over seeds)")
        figs.append(("skip_norms.png", "||W_skip||_F per layer (mean over seeds)."))
        growth = {f"{m} ({preset})": [v / (init_std * hidden) for v in vals] for m, vals in norms.items()}
        for p, width in PAPER_WIDTHS.items():
            growth[f"paper {p.removeprefix('pythia-')}"] = [v / (1e-4 * width) for v in PAPER_SKIP_NORMS[p]]
        plot_skip_growth(growth, out / "skip_growth.png")
        figs.append(
            (
                "skip_growth.png",
                f"||W_skip||_F per layer divided by its value at init (std x d = "
                f"{init_std:g} x {hidden}; the paper's: 1e-4 x 768 and 1e-4 x 1024), against relative depth.",
            )
        )
    return figs


def _arm_times(rows: list[dict[str, Any]]) -> str:
    """ "baseline eval 1.0 min; a trained arm 2.1-2.6 min" (train + eval wall per arm)."""
    base = next((r for r in rows if r["method"] == "baseline"), {})
    arms = [arm_seconds(r) for r in rows if r["method"] != "baseline"]
    text = f"baseline eval {(base.get('eval_seconds') or 0) / 60:.1f} min"
    return text + (f"; a trained arm {min(arms) / 60:.1f}-{max(arms) / 60:.1f} min" if arms else "")


def _write_outputs(
    out: Path,
    preset: str,
    rows: list[dict[str, Any]],
    items: dict,
    methods: Sequence[str],
    seeds: list[int],
    settings: dict[str, Any],
    base_cfg: TrainConfig,
    base: nn.Module,
    *,
    seconds: float,
    reused: list[str],
    command: str | None,
) -> None:
    """table.md, results.json, the figures and report.md under `out`."""
    summary = summarize(rows, methods)
    comps = comparisons(rows, items, methods)
    table = format_summary_table(summary, preset)
    reading = [f"- {s}" for s in noise_sentences(comps)]
    _write_table(out, table, reading)
    compute_s = compute_seconds(rows)
    results = {
        "preset": preset,
        "seeds": seeds,
        "methods": list(methods),
        "eval": settings,
        "seconds": seconds,
        "compute_seconds": compute_s,
        "reused": reused,
        "command": command,
        "rows": rows,
        "summary": summary,
        "comparisons": _comparison_rows(comps),
    }
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    init_std = PreProjConfig().skip_init_std
    figs = _figures(out, preset, rows, methods, summary, int(base.config.hidden_size), init_std)
    lines = _setting_lines(preset, seeds, rows, settings, base_cfg, seconds, compute_s, reused, command)
    lines += ["## Table", "", table, ""]
    if comps:
        lines += _noise_lines(comps, reading)
    if figs:
        lines += ["## Figures", "", *_figure_lines(figs)]
    lines += _skip_lines(rows)
    lines += [
        "Each run folder (`<method>/seed-<s>/`) holds the adapter, `log.jsonl`, `metrics.json`, `eval.json` "
        "(metrics and per-item scores) and `loss_curve.png`.",
        "",
    ]
    (out / "report.md").write_text("\n".join(lines))


def _write_table(out: Path, table: str, reading: list[str]) -> None:
    """table.md: the table, and the differences larger than the noise under it."""
    (out / "table.md").write_text(
        table
        + (
            "\n\nLarger than the noise (95% paired intervals, see report.md):\n" + "\n".join(reading)
            if reading
            else ""
        )
        + "\n"
    )


def _setting_lines(
    preset: str,
    seeds: list[int],
    rows: list[dict[str, Any]],
    settings: dict[str, Any],
    base_cfg: TrainConfig,
    seconds: float,
    compute_s: float,
    reused: list[str],
    command: str | None,
) -> list[str]:
    """report.md's title and setting: the command, the seeds, the time, the training and evaluation settings."""
    train = {k: v for k, v in base_cfg.to_dict().items() if k in _TRAIN_FACTS}
    return [
        f"# Reproduction: {preset}, {len(seeds)} seed(s)",
        "",
        f"Command: `{command or f'mmpreproj reproduce --preset {preset}'}`",
        "",
        f"Seeds: {', '.join(map(str, seeds))} (each seed drives the adapter init and the data order; the "
        "untrained baseline does not depend on it).",
        "",
        f"Time: {compute_s / 60:.1f} min summed over the arms' own train + eval wall times ({_arm_times(rows)}); "
        f"{seconds / 60:.1f} min wall for this invocation"
        + (f", which read {len(reused)} arm(s) back from an earlier run" if reused else "")
        + ".",
        "",
        "Training: " + ", ".join(f"{k}={v}" for k, v in train.items()) + ".",
        "",
        "Evaluation: " + ", ".join(f"{k}={v}" for k, v in settings.items()) + " (the paper's evaluators).",
        "",
    ]


def _noise_lines(comps: list[Comparison], reading: list[str]) -> list[str]:
    """report.md's differences and noise: how the intervals are made, the reading, the comparisons table."""
    return [
        "## Differences and noise",
        "",
        "Intervals are 95%: over seeds, a Student-t interval of the per-seed paired differences (none with "
        "one seed); over items, a paired bootstrap over the evaluation items within each seed (2,000 "
        "replicates). A difference is called beyond the noise when every interval excludes zero.",
        "",
        *reading,
        "",
        format_comparisons(comps),
        "",
    ]


def _skip_lines(rows: list[dict[str, Any]]) -> list[str]:
    """report.md's table of skip norms and routing ratios per arm, for arms with a skip (none: no lines)."""
    skips = [r for r in rows if r.get("skip_norms")]
    if not skips:
        return []
    lines = [
        "## Skip norms and routing ratios (per seed)",
        "",
        "| method | seed | ||W_skip||_F per layer | ||W_skip x~|| / ||attn_out|| |",
        "|---|---|---|---|",
    ]
    for r in skips:
        ratios = ", ".join(f"{v:.2f}" for v in r.get("routing_ratios", []))
        lines.append(f"| {r['method']} | {r['seed']} | {', '.join(f'{v:.3f}' for v in r['skip_norms'])} | {ratios} |")
    return [*lines, ""]
