"""Reading a trained adapter (skip norms per layer, how much each layer routes around attention), the statistics
of a multi-seed reproduction (`stats`) and the figures (`plot`)."""

from .plot import plot_loss_curve, plot_loss_curves, plot_lr_sweep, plot_results, plot_skip_growth, plot_skip_norms
from .skip_norms import PAPER_SKIP_NORMS, routing_ratios, skip_norms, skip_norms_from_adapter

__all__ = [
    "PAPER_SKIP_NORMS",
    "plot_loss_curve",
    "plot_loss_curves",
    "plot_lr_sweep",
    "plot_results",
    "plot_skip_growth",
    "plot_skip_norms",
    "routing_ratios",
    "skip_norms",
    "skip_norms_from_adapter",
]
