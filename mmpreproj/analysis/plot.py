"""Figures (matplotlib, headless): skip norms (Figure-2 style), loss curves, results with error bars, skip growth
relative to init, and PPL against learning rate.

Each is written to the path given: a PNG, or the format its suffix names where matplotlib writes it (`.pdf`,
`.svg`); a path without a suffix gets `.png`, and the path written is returned. A folder, an unknown suffix, or
x values a log axis cannot show (a learning rate or a parameter count <= 0; a skip growth <= 0) are refused
(ValueError) before anything is written, and a figure is closed whatever happens. A y value a log axis cannot show
(a diverged run's inf PPL, an accuracy of 0) is left out of the line by matplotlib.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., Path])


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _target(path: str | Path) -> Path:
    """The file a figure goes to (`.png` added to a path without a suffix), refused when it is a folder or names a
    format matplotlib does not write."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    path = Path(path)
    if path.is_dir():
        raise ValueError(f"figure path {str(path)!r} is a folder; give a file name such as {str(path / 'fig.png')!r}")
    path = path if path.suffix else path.with_suffix(".png")
    formats = FigureCanvasAgg.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:
        raise ValueError(f"figure path {str(path)!r}: unknown format {path.suffix!r}; one of {sorted(formats)}")
    return path


def _closing(plot: F) -> F:
    """Close the figures `plot` opened when it fails (its own `_save` closes them when it succeeds)."""

    @functools.wraps(plot)
    def wrapper(*args, **kwargs):
        plt = _pyplot()
        before = set(plt.get_fignums())
        try:
            return plot(*args, **kwargs)
        except BaseException:
            for number in set(plt.get_fignums()) - before:
                plt.close(number)
            raise

    return wrapper  # type: ignore[return-value]


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    _pyplot().close(fig)
    return path


def _positive(values: Sequence[float], what: str) -> None:
    """A log axis shows only finite values > 0: ValueError naming the first other."""
    bad = next((v for v in values if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0)), None)
    if bad is not None:
        raise ValueError(f"{what}: {bad!r} cannot be drawn on a log axis; every value must be finite and > 0")


@_closing
def plot_skip_norms(
    series: Mapping[str, Sequence[float] | Mapping[int, float]],
    path: str | Path,
    title: str = "||W_skip||_F per layer",
    ylabel: str = "Frobenius norm",
) -> Path:
    """One line per named series. A series given as `{block index: value}` (`skip_norms`, `routing_ratios`) is drawn
    at its block indices; one given as a list at positions 0, 1, ...; lists of different lengths (models of other
    depths, and no series by block index) at the relative depth i / (n - 1)."""
    import matplotlib.ticker

    empty = [name for name, values in series.items() if not len(values)]
    if not series or empty:
        raise ValueError(f"plot_skip_norms needs at least one series, each with a value (empty: {empty})")
    path = _target(path)
    by_block = any(isinstance(v, Mapping) for v in series.values())
    relative = not by_block and len({len(v) for v in series.values()}) > 1
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    for name, values in series.items():
        if isinstance(values, Mapping):
            xs, ys = [int(k) for k in values], list(values.values())
        else:
            n = len(values)
            xs, ys = [i / (n - 1) if relative and n > 1 else i for i in range(n)], list(values)
        ax.plot(xs, ys, marker="o", label=name)
    if not relative:
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("relative depth (layer / (L - 1))" if relative else "block" if by_block else "layer")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def read_losses(run_dir: str | Path) -> tuple[list[int], list[float]]:
    """(steps, train losses) from a run folder's log.jsonl."""
    steps, losses = [], []
    for line in (Path(run_dir) / "log.jsonl").read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            steps.append(int(rec["step"]))
            losses.append(float(rec["loss"]))
    return steps, losses


def smooth(values: Sequence[float], window: int = 10) -> list[float]:
    """Trailing moving average over up to `window` values (the first values average what exists)."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


@_closing
def plot_loss_curve(
    run_dir: str | Path,
    path: str | Path | None = None,
    *,
    heldout: tuple[int, float] | None = None,
    title: str | None = None,
) -> Path:
    """`run_dir/loss_curve.png`: train loss per step (raw and a 10-step average) and, when given, the held-out
    loss `(step, value)` measured after training (the line-PPL evaluator's mean row loss)."""
    target = _target(Path(run_dir) / "loss_curve.png" if path is None else path)
    steps, losses = read_losses(run_dir)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    ax.plot(steps, losses, color="C0", alpha=0.3, lw=0.8, label="train loss")
    ax.plot(steps, smooth(losses), color="C0", lw=1.6, label="train loss, 10-step mean")
    if heldout is not None:
        ax.plot([heldout[0]], [heldout[1]], "s", color="C3", label="held-out loss (mean row loss, end)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats / token)")
    ax.set_title(title or Path(run_dir).name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, target)


@_closing
def plot_loss_curves(
    curves: Mapping[str, Sequence[tuple[Sequence[int], Sequence[float]]]],
    path: str | Path,
    title: str = "train loss (10-step mean)",
) -> Path:
    """Every arm on one figure: `{label: [(steps, losses) per seed]}`, one colour per label, one line per seed."""
    path = _target(path)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for i, (label, runs) in enumerate(curves.items()):
        for j, (steps, losses) in enumerate(runs):
            ax.plot(steps, smooth(losses), color=f"C{i}", lw=1.2, alpha=0.85, label=label if j == 0 else None)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats / token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


@_closing
def plot_results(
    panels: Mapping[str, Mapping[str, tuple[float, float]]],
    path: str | Path,
    title: str | None = None,
    refs: Mapping[str, Mapping[str, float]] | None = None,
) -> Path:
    """One bar panel per metric: `{metric label: {method: (mean, std)}}`, error bars = std over seeds.
    `refs` (`{metric label: {method: value}}`) are drawn as black ticks (e.g. the paper's figures)."""
    path = _target(path)
    if not panels:
        raise ValueError("plot_results needs at least one metric panel")
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.8), dpi=120, squeeze=False)
    for ax, (label, values) in zip(axes[0], panels.items()):
        names = list(values)
        means = [values[n][0] for n in names]
        stds = [values[n][1] for n in names]
        ax.bar(range(len(names)), means, yerr=stds, capsize=4, color=[f"C{i}" for i in range(len(names))])
        for i, n in enumerate(names):
            ref = (refs or {}).get(label, {}).get(n)
            if ref is not None:
                ax.plot([i - 0.4, i + 0.4], [ref, ref], color="k", lw=2)
        ax.set_xticks(range(len(names)), names, rotation=40, ha="right", fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        lo = min(m - s for m, s in zip(means, stds))
        hi = max(m + s for m, s in zip(means, stds))
        if 0 < lo < hi < 3 * lo:  # zoom in when the bars would otherwise look equal
            ax.set_ylim(lo - 0.15 * (hi - lo), hi + 0.15 * (hi - lo))
        ax.ticklabel_format(axis="y", useOffset=False)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)


@_closing
def plot_skip_growth(
    series: Mapping[str, Sequence[float]], path: str | Path, title: str = "||W_skip||_F per layer / its value at init"
) -> Path:
    """Skip norm per layer divided by its init value, x = relative depth (layer / (L - 1)) so models of
    different depth share the axis; log y (a mini model grows its skip far more than the paper's 160M), so a value
    <= 0 is refused."""
    path = _target(path)
    for name, values in series.items():
        _positive(values, f"plot_skip_growth: series {name!r}")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=120)
    for name, values in series.items():
        n = len(values)
        xs = [i / (n - 1) if n > 1 else 0.0 for i in range(n)]
        ax.plot(
            xs, values, marker="o", ms=4, label=f"{name} ({n} layers)", ls="--" if name.startswith("paper") else "-"
        )
    ax.set_yscale("log")
    ax.set_xlabel("relative depth (layer / (L - 1))")
    ax.set_ylabel("norm / norm at init")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2))  # below: the curves span the box
    fig.set_figheight(3.8 + 0.17 * len(series))
    return _save(fig, path)


@_closing
def plot_lr_sweep(
    points: Mapping[str, Sequence[tuple[float, float]]],
    path: str | Path,
    *,
    baseline: float | None = None,
    ylabel: str = "PPL",
    title: str = "final PPL vs learning rate",
    marks: Mapping[str, float] | None = None,
) -> Path:
    """`{method: [(lr, value), ...]}` on log-log axes; `baseline` as a horizontal line, `marks` as vertical
    lines (e.g. {"paper LR": 1e-5, "mini preset": 1e-3}). A learning rate <= 0 is refused."""
    path = _target(path)
    for name, pts in points.items():
        _positive([p[0] for p in pts], f"plot_lr_sweep: {name!r} learning rate")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=120)
    for name, pts in points.items():
        pts = sorted(pts)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    if baseline is not None:
        ax.axhline(baseline, color="k", ls=":", label="untrained base")
    for i, (label, lr) in enumerate((marks or {}).items()):
        ax.axvline(lr, color=f"C{7 + i}", ls="--", lw=1, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _save(fig, path)


@_closing
def plot_pareto(
    series: Mapping[str, Sequence[tuple[float, float, float]]],
    path: str | Path,
    *,
    baseline: float | None = None,
    ylabel: str = "PPL",
    title: str = "PPL vs trainable parameters",
) -> Path:
    """`{method: [(trainable params, mean, std), ...]}`: one line per method, error bars = std over seeds, log x."""
    path = _target(path)
    for name, pts in series.items():
        _positive([p[0] for p in pts], f"plot_pareto: {name!r} trainable parameters")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for name, pts in series.items():
        pts = sorted(pts)
        ax.errorbar(
            [p[0] for p in pts],
            [p[1] for p in pts],
            yerr=[p[2] for p in pts],
            marker="o",
            capsize=3,
            label=name,
            ls="-" if len(pts) > 1 else "none",
        )
    if baseline is not None:
        ax.axhline(baseline, color="k", ls=":", label="untrained base")
    ax.set_xscale("log")
    ax.set_xlabel("trainable parameters")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _save(fig, path)
