"""Every figure function writes a PNG of a sensible size that shows its data: each series' colour is drawn
across the axes (axes, title and legend with no data drawn fail)."""

from __future__ import annotations

import json

import pytest

from mmpreproj.analysis import (
    PAPER_SKIP_NORMS,
    plot_loss_curve,
    plot_loss_curves,
    plot_lr_sweep,
    plot_results,
    plot_skip_growth,
)
from mmpreproj.analysis.plot import smooth
from tests.helpers.png_content import assert_draws


def _check_png(path, colours: list[str]) -> None:
    """Decoded, of a sensible size, and each of `colours` (one per series, in drawing order) drawn across it."""
    img = assert_draws(path, colours)
    assert img.shape[0] >= 300 and img.shape[1] >= 500, (path, img.shape)


def _on_white(colour: str, alpha: float) -> str:
    """The colour a line of `colour` drawn with `alpha` shows on the white background."""
    import matplotlib.colors

    return matplotlib.colors.to_hex([alpha * c + (1 - alpha) for c in matplotlib.colors.to_rgb(colour)])


def test_smooth_by_hand():
    assert smooth([1.0, 3.0, 5.0, 7.0], window=2) == [1.0, 2.0, 4.0, 6.0]


def test_loss_curve_in_the_run_folder(tmp_path):
    lines = [json.dumps({"step": s, "loss": 7.0 - s / 50 + (s % 3) * 0.1}) for s in range(1, 101)]
    (tmp_path / "log.jsonl").write_text("\n".join(lines) + "\n")
    path = plot_loss_curve(tmp_path, heldout=(100, 5.2))
    assert path == tmp_path / "loss_curve.png"
    _check_png(path, ["C0"])  # the smoothed curve (the raw one is drawn at alpha 0.3)


def test_summary_figures(tmp_path):
    steps = list(range(1, 51))
    curves = {
        "skip": [(steps, [5 - s / 25 for s in steps]), (steps, [5.1 - s / 25 for s in steps])],
        "lora": [(steps, [5 - s / 20 for s in steps])],
    }
    _check_png(plot_loss_curves(curves, tmp_path / "curves.png"), [_on_white(c, 0.85) for c in ("C0", "C1")])
    panels = {
        "PPL": {"baseline": (894.0, 0.0), "skip": (260.0, 4.0), "lora": (217.0, 3.0)},
        "HellaSwag acc": {"baseline": (0.21, 0.0), "skip": (0.228, 0.004), "lora": (0.214, 0.006)},
    }
    _check_png(plot_results(panels, tmp_path / "results.png", refs={"PPL": {"lora": 230.0}}), ["C0", "C1", "C2"])
    growth = {
        "preproj_skip (mini)": [380.0, 383.0, 396.0, 351.0],
        "paper 160m": [v / 0.0768 for v in PAPER_SKIP_NORMS["pythia-160m"]],
    }
    _check_png(plot_skip_growth(growth, tmp_path / "growth.png"), ["C0", "C1"])
    _check_png(
        plot_lr_sweep(
            {"lora": [(1e-5, 800.0), (1e-3, 217.0)], "skip": [(1e-5, 850.0), (1e-3, 260.0)]},
            tmp_path / "sweep.png",
            baseline=894.0,
            marks={"paper": 1e-5},
        ),
        ["C0", "C1"],
    )


def test_results_figure_needs_panels(tmp_path):
    with pytest.raises(ValueError):
        plot_results({}, tmp_path / "none.png")
