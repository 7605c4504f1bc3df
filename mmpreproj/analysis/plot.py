"""A Figure-2-style plot of per-layer skip norms (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_skip_norms"]


def plot_skip_norms(
    series: dict[str, list[float]], path: str | Path, title: str = "||W_skip||_F per layer",
    ylabel: str = "Frobenius norm",
) -> Path:
    """Plot one line per named series (x = relative depth when depths differ) and save a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    for name, values in series.items():
        ax.plot(range(len(values)), values, marker="o", label=name)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
