"""Comparing two AdamW training runs that should differ only by float32 rounding."""

from __future__ import annotations

import torch


def assert_adamw_runs_agree(got: dict, want: dict, *, steps: int, lr: float, terms: int) -> None:
    """Two AdamW runs (betas 0.9/0.999, no decay) from the same init that should differ only by float32
    rounding: other processes, another batch split, other thread counts. `terms`: the loss terms (tokens)
    summed into each weight gradient per step.

    - any element: Adam's step t is lr_t * |m_hat / sqrt(v_hat)| <= lr * c_t, c_t = sqrt(sum_i w_i^2 / u_i)
      (Cauchy-Schwarz over the bias-corrected moment weights w_i, u_i of the t gradients; c_3 = 1.0036), so
      two runs differ by at most 2 * steps * lr * max(c_t). A gradient that nearly cancels gets close to it:
      Adam divides its rounding noise by its own tiny second moment (seen: 1.6e-5 = 0.016 lr).
    - a typical element: rounding changes its gradient by a relative ~eps * sqrt(terms); Adam's step is
      scale-free in the gradient, so it changes by ~lr * eps * sqrt(terms): each tensor's median diff is
      within steps * lr * eps * sqrt(terms) (seen <= 12% of it; a 1% lr change gives over 1e3 times it).
    - all but 0.1% of the elements (those whose gradient rounding perturbs by more than 0.1%) are within
      1e-3 of the total update, steps * lr * 1e-3 (seen <= 1.3% of it; a 10% lr change gives 150 times it).
    """
    assert got.keys() == want.keys()
    diffs = {k: (got[k].float() - want[k].float()).abs().flatten() for k in want}
    diff = torch.cat(list(diffs.values()))
    eps = torch.finfo(torch.float32).eps
    b1, b2 = 0.9, 0.999
    c = max(
        sum(((1 - b1) * b1**i / (1 - b1**t)) ** 2 / ((1 - b2) * b2**i / (1 - b2**t)) for i in range(t)) ** 0.5
        for t in range(1, steps + 1)
    )
    assert diff.max() <= 2 * steps * lr * c, f"max diff {float(diff.max()):.3g}"
    for k, d in diffs.items():
        assert d.median() <= steps * lr * eps * terms**0.5, f"{k}: median diff {float(d.median()):.3g}"
    q999 = float(diff.quantile(0.999))
    assert q999 <= steps * lr * 1e-3, f"99.9th percentile diff {q999:.3g}"
