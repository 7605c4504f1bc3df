"""The report of a `study` (experiments/study.py): read back every finished step, write study.json, report.md
and the figures (LR search, skip norms per layer against the paper's Figure 2, routing ratios per layer).

Nothing is trained here, so it can run while workers are still going: unfinished groups are listed as such.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..analysis import PAPER_SKIP_NORMS, plot_lr_sweep, plot_results, plot_skip_growth, plot_skip_norms
from ..analysis.stats import Comparison, mean_std
from .compare import paired_comparisons
from .report_md import METRIC_LABELS, _comparison_rows, _figure_lines, format_comparisons, noise_sentences, stats_cell
from .runner import best_lr
from .study import Step, Study, read_baseline

METRICS = ("lambada.acc", "lambada.ppl", "hellaswag.acc", "ppl.ppl")
# The paper's Table 2 at Pythia-160M (500-sample evaluations, one run): relative changes over its baseline.
PAPER_CLAIMS = {
    "lambada.acc": "+40.6% (0.128 -> 0.180)",
    "ppl.ppl": "-39% (78.4 -> 47.9)",
    "hellaswag.acc": "+3.7% (0.326 -> 0.338)",
}
PAPER_160M = {
    "baseline": (0.128, 0.326, 78.4),
    "preproj": (0.154, 0.318, 73.0),
    "lora": (0.126, 0.326, 63.8),
    "preproj_lora": (0.162, 0.324, 60.8),
    "preproj_skip": (0.180, 0.338, 47.9),
}


def gather(s: Study) -> dict[str, Any]:
    """{"baseline": row, "groups": [{group facts, "tried", "best_lr", "seeds": {seed: merged row}}]}, and the
    per-item scores keyed (label, seed) for the paired intervals."""
    base = read_baseline(s)
    groups, items = [], {}
    if base is not None:
        items[("baseline", None)] = base["items"]
    for g in s.groups:
        tried, settled = s.selected(g)
        curve = {}
        for lr in sorted(tried):
            sel = s.read(Step("select", g, lr, s.seeds[0]))
            curve[lr] = {"heldout": sel["row"].get("select.ppl")} if sel else None
        best = best_lr(tried) if settled else None
        seeds: dict[int, dict[str, Any]] = {}
        if best is not None:
            for seed in s.seeds[: g.seeds]:
                sel, full = s.read(Step("select", g, best, seed)), s.read(Step("full", g, best, seed))
                if sel is None or full is None:
                    continue
                seeds[seed] = {**sel["row"], **full["row"]}
                items[(g.label, seed)] = {**sel["items"], **full["items"]}
        groups.append(
            {
                "label": g.label,
                "method": g.method,
                "sizes": dict(g.sizes),
                "budget": g.budget,
                "want_seeds": g.seeds,
                "settled": settled,
                "best_lr": best,
                "edge": best is not None and best in (min(tried), max(tried)),
                "curve": {f"{lr:g}": v for lr, v in curve.items()},
                "seeds": seeds,
            }
        )
    return {"baseline": base["row"] if base else None, "groups": groups, "items": items}


def comparisons(data: dict[str, Any]) -> list[Comparison]:
    """Each finished group against the baseline, the paper-size groups against LoRA and LoRA matched, and
    each budget group against LoRA at the same budget; paired by seed, bootstrapped over items."""
    done = [g for g in data["groups"] if g["seeds"]]
    labels = [g["label"] for g in done]
    pairs = []
    for g in done:
        refs = ["baseline"]
        if g["budget"] is None and g["method"] not in ("lora", "lora_matched"):
            refs += [r for r in ("lora", "lora_matched") if r in labels]
        elif g["budget"] is None and g["method"] == "lora_matched" and "lora" in labels:
            refs.append("lora")
        elif g["budget"] is not None and g["method"] != "lora":
            refs += [r for r in (g["label"].rsplit("/", 1)[0] + "/lora",) if r in labels]
        pairs += [(g["label"], r) for r in refs]
    rows = {(g["label"], seed): r for g in data["groups"] for seed, r in g["seeds"].items()}
    if data["baseline"] is not None:
        rows[("baseline", None)] = data["baseline"]
    return paired_comparisons(pairs, METRICS, rows, data["items"])


def summary_table(data: dict[str, Any], base_params: int) -> str:
    """Baseline and each group at its best LR: params, LR, seeds, the four metrics (mean ± std over seeds)."""
    fmts = {"lambada.acc": ".3f", "lambada.ppl": ".2f", "hellaswag.acc": ".3f", "ppl.ppl": ".2f"}
    lines = [
        "| method | trainable | LR (held-out pick) | seeds | LAMBADA acc | LAMBADA target PPL | HellaSwag acc "
        "| line PPL (test) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    b = data["baseline"] or {}
    lines.append(
        "| baseline (untrained) | - | - | - | "
        + " | ".join(format(b[m], fmts[m]) if b.get(m) is not None else "n/a" for m in METRICS)
        + " |"
    )
    for g in data["groups"]:
        rows = list(g["seeds"].values())
        params = rows[0].get("params") if rows else None
        size = f"{params / 1e6:.2f}M ({100 * params / base_params:.2f}%)" if params else "-"
        if not g["settled"]:
            lr = f"searching ({len([v for v in g['curve'].values() if v])} tried)"
        elif g["best_lr"] is None:
            lr = "every LR diverged"
        else:
            lr = f"{g['best_lr']:g}" + (" (edge)" if g["edge"] else "")
        values = {m: [r[m] for r in rows if r.get(m) is not None] for m in METRICS}
        cells = [stats_cell(mean_std(values[m]) if values[m] else None, fmts[m]) for m in METRICS]
        lines.append(f"| {g['label']} | {size} | {lr} | {len(rows)}/{g['want_seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def lr_table(data: dict[str, Any]) -> str:
    lines = ["| group | LR | held-out line PPL |", "|---|---|---|"]
    for g in data["groups"]:
        for lr, v in g["curve"].items():
            if v is not None:
                star = " **(picked)**" if g["best_lr"] is not None and float(lr) == g["best_lr"] else ""
                held = "diverged" if v["heldout"] is None else f"{v['heldout']:.2f}"
                lines.append(f"| {g['label']} | {lr}{star} | {held} |")
    return "\n".join(lines)


def _per_layer(data: dict[str, Any], key: str) -> dict[str, list[float]]:
    """{group: mean over its seeds of the per-layer list `key`} for groups that have it."""
    out = {}
    for g in data["groups"]:
        vals = [r[key] for r in g["seeds"].values() if r.get(key)]
        if vals:
            out[g["label"]] = [sum(col) / len(col) for col in zip(*vals)]
    return out


def compute_seconds(s: Study) -> dict[str, float]:
    """Seconds the finished steps took, summed from their files: training, evaluation, the baseline.

    Training counts every invocation of a resumed arm: its `metrics.json` `train_seconds` is the sum of the
    per-step times in `log.jsonl`, carried through each checkpoint (a step a killed process ran after its last
    checkpoint is lost with it). The row's `train_wall_seconds` covers the last invocation only, the fallback.
    """
    out = {"train": 0.0, "eval": 0.0, "baseline": 0.0}
    for _, seconds in _eval_seconds(s):
        out["eval"] += seconds or 0.0
    for arm in sorted({f.parent for f in (s.out / "arms").glob("**/select.json")}):
        try:
            out["train"] += float(json.loads((arm / "metrics.json").read_text())["train_seconds"])
        except (OSError, ValueError, KeyError, TypeError):
            row = json.loads((arm / "select.json").read_text()).get("row", {})
            out["train"] += row.get("train_wall_seconds") or 0.0
    base = read_baseline(s)
    out["baseline"] = (base or {}).get("row", {}).get("eval_seconds") or 0.0
    return out


def _eval_seconds(s: Study) -> list[tuple[str, float | None]]:
    """(file under `arms/`, its evaluation's seconds, None where the file records none) of every finished step."""
    out = []
    for f in sorted((s.out / "arms").glob("**/*.json")):
        try:
            row = json.loads(f.read_text()).get("row", {})
        except (OSError, ValueError):
            continue
        if isinstance(row, dict) and f.name != "metrics.json":
            seconds = row.get("eval_seconds") or row.get("select_seconds")
            out.append((f.relative_to(s.out / "arms").as_posix(), seconds))
    return out


def untimed_steps(s: Study) -> list[str]:
    """The finished evaluations whose files record no time (written before times were kept), relative to `arms/`:
    `compute_seconds` cannot count them, so its sum is then a lower bound."""
    return [name for name, seconds in _eval_seconds(s) if not seconds]


def setting_lines(s: Study) -> list[str]:
    """What was trained and measured, from the preset (and the evaluation settings in the steps' keys)."""
    c = s.base_cfg
    full = s.full_eval
    return [
        f"Model: `{c.model}`, {s.base_params / 1e6:.1f}M parameters, width {s.hidden}. Training (preset "
        f"`{s.preset}`): {c.steps} steps of {c.batch_size * c.grad_accum} lines x {c.max_len} tokens, warmup "
        f"{c.warmup_steps}, {c.schedule}, AdamW (weight decay {c.weight_decay}), clip {c.max_grad_norm}, "
        f"{c.precision}, base frozen; data: the first {c.num_lines} lines longer than {c.min_chars} characters "
        f"of `{Path(c.data).name}`.",
        f"Learning rates: each group's own, the lowest held-out line PPL (WikiText validation rows 3,240 on, "
        f"never trained on nor tested) among a ladder search from its start LRs, {s.max_extend} rung(s) past an "
        "edge at most. Seeds train at the picked LR; the untrained baseline has no seed.",
        "Evaluation (the paper's evaluators): line PPL on the first "
        f"{full['limits']['ppl']} WikiText test rows (rows under 50 characters or 10 tokens skipped), LAMBADA "
        f"accuracy and target PPL on the first {full['limits']['lambada']}, HellaSwag on the first "
        f"{full['limits']['hellaswag']}; the routing ratio on {full['routing_rows']} test rows.",
    ]


GPU_RUN = "gpu"  # the folder under the study's `out` where recipes/smollm2/gpu_table2.py's run is kept


def gpu_run(out: Path) -> dict[str, Any]:
    """The paper's-protocol GPU run kept under `out/gpu/` (its results.json, as `reproduce` wrote it), or {}."""
    path = out / GPU_RUN / "results.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def gpu_section(out: Path, run: dict[str, Any]) -> list[str]:
    """The report's section on the GPU run: its table (the rows of its table.md) and where it is described."""
    rows = run.get("rows", [])
    if not rows:
        return []
    base = next(r for r in rows if r["method"] == "baseline")
    seeds = ", ".join(str(s) for s in run.get("seeds", []))
    lines = [
        f"## The paper's protocol on one GPU (seeds: {seeds})",
        "",
        f"`{run.get('command', 'recipes/smollm2/gpu_table2.py')}`; the machine, the setting, the timings and every "
        f"difference from the paper are in [{GPU_RUN}/README.md]({GPU_RUN}/README.md), and the run's own report, "
        f"with paired intervals, is [{GPU_RUN}/report.md]({GPU_RUN}/report.md).",
        "",
        *[line for line in _text(out / GPU_RUN / "table.md").splitlines() if line.startswith("|")],
        "",
    ]
    for r in rows:
        if r["method"] != "baseline":
            lines.append(
                f"- {r['method']}: LAMBADA {r['lambada.acc'] / base['lambada.acc'] - 1:+.1%}, "
                f"line PPL {r['ppl.ppl'] / base['ppl.ppl'] - 1:+.1%} over the baseline"
            )
    return [*lines, ""]


def _text(path: Path) -> str:
    """A file's text, or "" when it is not there (a run folder copied without it)."""
    return path.read_text() if path.is_file() else ""


def write_report(s: Study, notes: Sequence[str] = (), rerun: str | None = None) -> Path:
    """Write study.json, report.md and the figures under `s.out`; returns the report's path. `notes`: lines
    said under the setting (how the run differs from the paper's); `rerun`: the command that continues the study."""
    data = gather(s)
    gpu = gpu_run(s.out)
    comps = comparisons(data)
    doc = {
        "preset": s.preset,
        "baseline": data["baseline"],
        "groups": data["groups"],
        "comparisons": _comparison_rows(comps),
    }
    (s.out / "study.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    figs = [*_results_figure(s, data), *_lr_figure(s, data), *_skip_figures(s, data, gpu), *_routing_figure(s, data)]
    lines = [*_head_lines(s, notes, rerun), *_table_lines(s, data)]
    if comps:
        lines += [
            "## Differences and noise",
            "",
            *[f"- {t}" for t in noise_sentences(comps)],
            "",
            format_comparisons(comps),
            "",
        ]
    lines += gpu_section(s.out, gpu)
    lines += _figure_lines(figs)
    lines += [
        "Paper's claims at Pythia-160M for comparison: "
        + "; ".join(f"{METRIC_LABELS.get(m, m)} {v}" for m, v in PAPER_CLAIMS.items())
        + ".",
        "",
    ]
    path = s.out / "report.md"
    path.write_text("\n".join(lines))
    return path


def _results_figure(s: Study, data: dict[str, Any]) -> list[tuple[str, str]]:
    """results.png: each metric per finished group at its picked LR (mean, std over seeds) beside the baseline."""
    done = [g for g in data["groups"] if g["seeds"]]
    panels = {}
    for metric in METRICS:
        values = {g["label"]: mean_std([r[metric] for r in g["seeds"].values()])[:2] for g in done}
        if data["baseline"] and data["baseline"].get(metric) is not None:
            values = {"baseline": (data["baseline"][metric], 0.0), **values}
        if len(values) > 1 and not (metric == "lambada.acc" and all(m == 0 for m, _ in values.values())):
            panels[METRIC_LABELS[metric]] = values
    if not panels:
        return []
    seeds = max(len(g["seeds"]) for g in done)
    title = f"{s.preset}: each group at its picked LR, mean over up to {seeds} seed(s), error bars = std"
    plot_results(panels, s.out / "results.png", title=title)
    return [("results.png", "Each metric per group at its held-out-picked LR; error bars: std over seeds.")]


def _lr_figure(s: Study, data: dict[str, Any]) -> list[tuple[str, str]]:
    """lr_search.png (held-out PPL against the LR, each group's first seed); none before a first point."""
    curves = {
        g["label"]: [(float(lr), v["heldout"]) for lr, v in g["curve"].items() if v and v["heldout"]]
        for g in data["groups"]
    }
    curves = {k: v for k, v in curves.items() if v}
    if not curves:
        return []
    plot_lr_sweep(
        curves,
        s.out / "lr_search.png",
        baseline=(data["baseline"] or {}).get("select.ppl"),
        title=f"{s.preset}: held-out line PPL vs peak LR (seed {s.seeds[0]})",
    )
    return [("lr_search.png", f"Held-out line PPL against the peak LR, seed {s.seeds[0]} of each group.")]


def _skip_figures(s: Study, data: dict[str, Any], gpu: dict[str, Any]) -> list[tuple[str, str]]:
    """skip_norms.png and skip_growth.png (the full d x d skips against the paper's Figure 2 and the GPU run)."""
    norms = {k: v for k, v in _per_layer(data, "skip_norms").items() if "/" not in k}  # full d x d skips
    if not norms:
        return []
    init = 1e-4 * s.hidden  # ||N(0, 1e-4)||_F of a d x d matrix
    plot_skip_norms(norms, s.out / "skip_norms.png", title=f"||W_skip||_F per layer ({s.preset}, mean over seeds)")
    model = Path(s.base_cfg.model).name
    growth = {f"{k} ({model}, CPU study)": [v / init for v in vals] for k, vals in norms.items()}
    growth.update(
        {
            f"paper {p.removeprefix('pythia-')}": [v / (1e-4 * w) for v in PAPER_SKIP_NORMS[p]]
            for p, w in (("pythia-160m", 768), ("pythia-410m", 1024))
        }
    )
    for r in gpu.get("rows", []):
        if r.get("skip_norms") and r["method"] in norms:
            growth[f"{r['method']} (SmolLM2-135M, paper's protocol, GPU)"] = [v / init for v in r["skip_norms"]]
    plot_skip_growth(growth, s.out / "skip_growth.png")
    return [
        ("skip_norms.png", "||W_skip||_F per layer after training (mean over seeds)."),
        (
            "skip_growth.png",
            f"The same divided by its value at init (1e-4 x d = {init:g}), against relative "
            "depth, beside the paper's Figure 2 (Pythia-160M and 410M, divided by 1e-4 x 768 and x 1024) and, "
            "where it is kept, the GPU run at the paper's protocol (LR 1e-5, 500 steps of 16 x 512).",
        ),
    ]


def _routing_figure(s: Study, data: dict[str, Any]) -> list[tuple[str, str]]:
    """routing.png (the routing ratio per layer), for groups that measured it."""
    ratios = _per_layer(data, "routing_ratios")
    if not ratios:
        return []
    plot_skip_norms(
        ratios, s.out / "routing.png", title="||W_skip x~|| / ||attn_out|| per layer", ylabel="routing ratio"
    )
    return [("routing.png", "Routing ratio per layer on 32 test rows (mean over seeds).")]


def _head_lines(s: Study, notes: Sequence[str], rerun: str | None) -> list[str]:
    """report.md's title, how to continue the study, the setting, the notes and the compute so far."""
    spent = compute_seconds(s)
    hours = sum(spent.values()) / 3600
    untimed = untimed_steps(s)
    lower = (
        f" {len(untimed)} evaluation(s) recorded no time ({', '.join(untimed)}: written before times were kept) and "
        "are not counted, so this is a lower bound."
        if untimed
        else ""
    )
    return [
        f"# Table 2 on {s.preset}",
        "",
        "Written by `mmpreproj.experiments.study_report` from the finished steps "
        f"under `arms/`. Continue the study with {f'`{rerun}`' if rerun else 'the command that ran it'} (finished "
        "steps are read back, never trained again); rewrite this report alone with `--report`. Unfinished groups are "
        "marked as such in the table.",
        "",
        "## Setting",
        "",
        *setting_lines(s),
        "",
        *[f"- {n}" for n in notes],
        "",
        f"Compute so far: {hours:.2f} CPU-hours of wall time on one thread per worker (training "
        f"{spent['train'] / 3600:.2f} h, evaluation {spent['eval'] / 3600:.2f} h, baseline "
        f"{spent['baseline'] / 3600:.2f} h), summed over the finished steps; training counts every invocation of a "
        f"resumed arm (the per-step times in its log.jsonl).{lower}",
        "",
    ]


def _table_lines(s: Study, data: dict[str, Any]) -> list[str]:
    """report.md's table at each group's best LR and the LR search behind it."""
    return [
        "## Table",
        "",
        summary_table(data, s.base_params),
        "",
        f"## Learning-rate search (seed {s.seeds[0]}; the pick is the lowest held-out PPL)",
        "",
        lr_table(data),
        "",
    ]
