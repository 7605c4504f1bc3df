"""Markdown for `reproduce` and `sweep`: the Table-2-style table (mean ± std over seeds, the paper's figures in
brackets), the paired-difference tables with their reading in words, and `report.md` around them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..analysis.stats import Comparison
from .paper import PAPER_TABLE2, TABLE_METRICS
from .runner import best_lr

METRIC_LABELS = {
    "lambada.acc": "LAMBADA acc",
    "hellaswag.acc": "HellaSwag acc",
    "arc_easy.acc": "ARC-E acc",
    "ppl.ppl": "PPL",
    "lambada.ppl": "LAMBADA ppl",
}
_COLUMNS = [f"{task}.{metric}" for task, metric in TABLE_METRICS] + ["lambada.ppl"]


def _fmt(metric: str) -> str:
    return {"ppl.ppl": ".1f", "lambada.ppl": ".4g"}.get(metric, ".3f")


def stats_cell(stats: tuple[float, float, int] | None, fmt: str) -> str:
    """A table cell of `mean_std`'s (mean, std, n): "mean ± std" (the std only for n > 1), or "n/a" for None."""
    if stats is None:
        return "n/a"
    mean, std, n = stats
    return format(mean, fmt) + (f" ± {format(std, fmt)}" if n > 1 else "")


def format_summary_table(summary: Mapping[str, Mapping[str, Any]], preset: str) -> str:
    """`summary[method]` = {"params": int, metric: (mean, std, n) or None}. Paper figures (Table 2) in brackets
    for the presets that have them; "± std" (over seeds) where there is more than one seed."""
    paper = PAPER_TABLE2.get(preset, {})
    lines = [
        "| model | method | params | LAMBADA | HellaSwag | ARC-E | PPL | LAMBADA ppl |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, s in summary.items():
        cells = [stats_cell(s.get(m), _fmt(m)) for m in _COLUMNS]
        params = f"{s['params'] / 1e6:.1f}M" if s.get("params") else "-"
        ref = paper.get(method)
        if ref:
            cells[:4] = [
                f"{c} ({'n/a' if p is None else format(p, _fmt(m))})" for c, p, m in zip(cells[:4], ref[1:], _COLUMNS)
            ]
            params += f" ({ref[0] or '-'})"
        lines.append(f"| {preset} | {method} | {params} | " + " | ".join(cells) + " |")
    if paper:
        lines.append("\nIn brackets: the paper's Table 2 (one run, 500-sample evaluations, line-level PPL).")
    return "\n".join(lines)


def _interval(iv: tuple[float, float] | None, metric: str) -> str:
    f = _fmt(metric) if metric != "lambada.ppl" else ".3g"
    return "n/a" if iv is None else f"[{format(iv[0], f)}, {format(iv[1], f)}]"


def format_comparisons(comparisons: Sequence[Comparison]) -> str:
    """One table per metric: method - reference, its 95% intervals over seeds and over items, and the reading."""
    blocks = []
    for metric in dict.fromkeys(c.metric for c in comparisons):
        label = METRIC_LABELS.get(metric, metric)
        f = _fmt(metric) if metric != "lambada.ppl" else ".3g"
        lines = [
            f"**{label}** (method minus reference; paired by seed)",
            "",
            f"| method | vs | Δ {label} | 95% over seeds | 95% over items | reading |",
            "|---|---|---|---|---|---|",
        ]
        for c in (c for c in comparisons if c.metric == metric):
            reading = c.words()
            lines.append(
                f"| {c.method} | {c.reference} | {format(c.diff, '+' + f)} | {_interval(c.seeds, metric)} | "
                f"{_interval(c.items, metric)} | {'**' + reading + '**' if c.beyond_noise else reading} |"
            )
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def noise_sentences(comparisons: Sequence[Comparison]) -> list[str]:
    """The table's reading in sentences, one per metric: what is beyond the noise, what is not."""
    out = []
    for metric in dict.fromkeys(c.metric for c in comparisons):
        cs = [c for c in comparisons if c.metric == metric]
        beyond = [f"{c.method} {c.words().split(',')[0]}" for c in cs if c.beyond_noise]
        within = [f"{c.method} vs {c.reference}" for c in cs if not c.beyond_noise]
        label = METRIC_LABELS.get(metric, metric)
        text = f"{label}: " + ("; ".join(beyond) if beyond else "no difference is larger than the noise")
        if within and beyond:
            text += f". Within the noise: {', '.join(within)}"
        out.append(text + ".")
    return out


def format_sweep_table(points: Mapping[str, Mapping[float, Mapping[str, Any]]], baseline: float | None) -> str:
    """`points[method][lr]` = row with "ppl.ppl" and "train_loss_mean10": PPL per LR, one column per LR."""
    lrs = sorted({lr for by_lr in points.values() for lr in by_lr})
    lines = [
        "| method | " + " | ".join(f"LR {lr:g}" for lr in lrs) + " | best LR |",
        "|---|" + "---|" * (len(lrs) + 1),
    ]
    for method, by_lr in points.items():
        ppl = {lr: by_lr[lr].get("ppl.ppl") for lr in lrs if lr in by_lr}
        best = best_lr(ppl)
        cells = ["n/a" if ppl.get(lr) is None else f"{ppl[lr]:.1f}" for lr in lrs]
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {'n/a' if best is None else f'{best:g}'} |")
    if baseline is not None:
        lines.append(f"\nUntrained base: PPL {baseline:.1f}.")
    return "\n".join(lines)


def _sizes_words(method: str, sizes: Mapping[str, Any], dim: int | None = None) -> str:
    if not sizes:
        return "paper (expansion 1.25, full skip)"
    parts = []
    if "lora_r" in sizes:
        parts.append(f"r={sizes['lora_r']}")
    if "expansion" in sizes:
        parts.append(f"expansion {sizes['expansion']:.4g}")
    if "skip_rank" in sizes:
        parts.append(f"skip rank {sizes['skip_rank']}")
    return ", ".join(parts)


def format_budget_table(rows: Sequence[Mapping[str, Any]], base_params: int) -> str:
    """One row per (budget, method): sizes, trainable params (% of base), LRs tried (seed 1), best LR, PPL mean ±
    std over the seeds at the best LR, and PPL minus LoRA's at the same budget with its 95% intervals."""
    lines = [
        "| budget | method | sizes | params | LRs tried: PPL (first seed) | best LR | PPL at best LR "
        "| vs LoRA (diff, seeds interval, items interval) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        curve = ", ".join(f"{lr}: {'diverged' if v is None else f'{v:.1f}'}" for lr, v in r["curve"].items())
        params = f"{r['params']:,} ({r['percent']:.2f}%)" if r.get("params") else "n/a"
        ppl = (
            "n/a"
            if r["mean"] is None
            else f"{r['mean']:.1f}" + (f" ± {r['std']:.1f} (n={r['n']})" if r["n"] > 1 else " (n=1)")
        )
        best = "n/a" if r["best_lr"] is None else f"{r['best_lr']:g}" + (" (edge)" if r["edge"] else "")
        v = r.get("vs_lora")
        if v is None:
            vs = "-" if r["method"] == "lora" else "n/a"
        else:
            iv = lambda x: "n/a" if x is None else f"[{x[0]:.1f}, {x[1]:.1f}]"  # noqa: E731
            vs = f"{v['diff']:+.1f}, {iv(v['seeds'])}, {iv(v['items'])}: {v['reading']}"
        lines.append(
            f"| {r['budget']} | {r['method']} | {_sizes_words(r['method'], r['sizes'])} | {params} | {curve} "
            f"| {best} | {ppl} | {vs} |"
        )
    lines.append("\n`(edge)`: the best LR is the highest or lowest tried (the search stopped at its limit).")
    return "\n".join(lines)


def _comparison_rows(comparisons: Sequence[Comparison]) -> list[dict[str, Any]]:
    """The comparisons as JSON rows: their fields, whether beyond the noise, and the reading in words."""
    return [{**c.__dict__, "beyond_noise": c.beyond_noise, "reading": c.words()} for c in comparisons]


def _figure_lines(figures: Sequence[tuple[str, str]]) -> list[str]:
    """Each (file name, caption) as a markdown image and its caption."""
    lines: list[str] = []
    for name, caption in figures:
        lines += [f"![{name}]({name})", "", caption, ""]
    return lines
