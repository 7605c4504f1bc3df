"""Spread over seeds and paired intervals of differences, for `reproduce --seeds K`.

Two sources of noise are measured apart, both on differences paired by seed (a method and its reference
trained with the same seed, scored on the same evaluation items):

- seeds: a Student-t 95% interval of the per-seed differences (needs 2+ seeds; quantiles from `scipy.stats.t`);
- items: a paired bootstrap over evaluation items: every replicate draws the same item indices for the method
  and its reference within each seed, recomputes the metric (e.g. PPL = exp(mean row loss)) and averages the
  difference over seeds; the 2.5/97.5 percentiles are the interval. (`scipy.stats.bootstrap(paired=True)` draws
  one index set for all samples at once, so it cannot resample each seed's items apart and average over seeds;
  the percentile bootstrap is written out here instead.)

A difference is called larger than the noise when every interval available excludes zero.

    summary = mean_std([227.5, 230.1, 224.0])             # (mean, std with ddof=1, n)
    lo, hi = t_interval([-10.7, -9.1, -12.0])              # 95% interval of the mean difference
    lo, hi = paired_bootstrap([(losses_a, losses_b)], "ppl.ppl")
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _scipy_stats


def _exp_mean(x: np.ndarray) -> np.ndarray:
    return np.exp(x.mean(axis=-1))


def _exp_neg_mean(x: np.ndarray) -> np.ndarray:
    return np.exp(-x.mean(axis=-1))


def _mean(x: np.ndarray) -> np.ndarray:
    return x.mean(axis=-1)


# metric -> (task, per-item key written by `evaluate(per_item=True)`, metric from items along the last axis)
ITEM_METRICS: dict[str, tuple[str, str, Callable[[np.ndarray], np.ndarray]]] = {
    "ppl.ppl": ("ppl", "row_loss", _exp_mean),  # line PPL = exp(mean row loss)
    "lambada.ppl": ("lambada", "item_logprob", _exp_neg_mean),  # exp(-mean target log-likelihood)
    "lambada.acc": ("lambada", "item_correct", _mean),
    "hellaswag.acc": ("hellaswag", "item_correct", _mean),
    "arc_easy.acc": ("arc_easy", "item_correct", _mean),
    "image.acc": ("image", "item_correct", _mean),  # image classification (the vision frozen probe)
    "video.acc": ("video", "item_correct", _mean),  # clip classification (recipes/video)
}
LOWER_IS_BETTER = frozenset({"ppl.ppl", "lambada.ppl"})


def t_quantile(df: int, level: float = 0.95) -> float:
    """Student's t quantile for a two-sided `level` interval at `df` degrees of freedom (`scipy.stats.t.ppf`):
    12.706 at df 1, 4.303 at df 2, 2.040 at df 31, toward the normal's 1.960 as df grows."""
    if isinstance(df, bool) or not isinstance(df, (int, np.integer)) or df < 1:
        raise ValueError(f"df={df!r}; must be an int >= 1")
    if not 0 < level < 1:
        raise ValueError(f"level={level!r}; must be in (0, 1)")
    return float(_scipy_stats.t.ppf(0.5 + level / 2, df))


def mean_std(values: Sequence[float]) -> tuple[float, float, int]:
    """(mean, sample standard deviation with ddof=1 (0.0 for one value), n). A non-finite value (a diverged seed's
    inf or NaN PPL) passes through as numpy computes it, so the table shows it (`inf ± nan`) rather than hide it."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("mean_std of no values")
    return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else 0.0, int(x.size)


def t_interval(diffs: Sequence[float]) -> tuple[float, float] | None:
    """95% Student-t interval of the mean of `diffs` (paired per-seed differences); None for fewer than 2.
    ValueError for a non-finite difference (no interval means anything there; `compare` gives none)."""
    _finite(diffs, "t_interval: diffs")
    mean, std, n = mean_std(diffs)
    if n < 2:
        return None
    half = t_quantile(n - 1) * std / math.sqrt(n)
    return mean - half, mean + half


def paired_bootstrap(
    pairs: Sequence[tuple[Sequence[float], Sequence[float]]],
    metric: str,
    *,
    n_boot: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """95% percentile interval of mean over seeds of metric(method items) - metric(reference items).

    `pairs`: one `(method_items, reference_items)` per seed, both over the same evaluation items in the
    same order; `metric` names the statistic in `ITEM_METRICS` (e.g. "ppl.ppl"). ValueError for an unknown
    metric, `n_boot` < 1 or a non-finite item.
    """
    if not pairs:
        raise ValueError("paired_bootstrap needs at least one (method, reference) pair")
    if metric not in ITEM_METRICS:
        raise ValueError(f"paired_bootstrap: metric={metric!r} is not one of {sorted(ITEM_METRICS)}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"paired_bootstrap: n_boot={n_boot!r}; must be an int >= 1")
    for i, (a, b) in enumerate(pairs):
        _finite(a, f"paired_bootstrap: pairs[{i}] method items")
        _finite(b, f"paired_bootstrap: pairs[{i}] reference items")
    stat = ITEM_METRICS[metric][2]
    rng = np.random.default_rng(seed)
    total = np.zeros(n_boot)
    for a, b in pairs:
        a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        if a.shape != b.shape or a.size == 0:
            raise ValueError(f"paired items must be non-empty and of one length, got {a.shape} and {b.shape}")
        idx = rng.integers(0, a.size, size=(n_boot, a.size))  # (replicate, item)
        total += stat(a[idx]) - stat(b[idx])
    lo, hi = np.percentile(total / len(pairs), [2.5, 97.5])
    return float(lo), float(hi)


def _finite(values: Sequence[float], what: str) -> None:
    """ValueError naming the first non-finite value of `values` and its position."""
    x = np.asarray(values, dtype=float)
    bad = np.flatnonzero(~np.isfinite(x))
    if bad.size:
        raise ValueError(f"{what}[{int(bad[0])}] is {x.flat[bad[0]]}; every value must be finite (a diverged run?)")


@dataclass(frozen=True)
class Comparison:
    """`method` minus `reference` on `metric`: mean paired difference, its intervals and the verdict."""

    method: str
    reference: str
    metric: str
    diff: float
    seeds: tuple[float, float] | None  # Student-t over per-seed differences (None with one seed)
    items: tuple[float, float] | None  # paired bootstrap over evaluation items (None without item scores)

    @property
    def beyond_noise(self) -> bool:
        """Every available interval excludes zero (False when none is available)."""
        ivs = [iv for iv in (self.seeds, self.items) if iv is not None]
        return bool(ivs) and all(lo > 0 or hi < 0 for lo, hi in ivs)

    @property
    def better(self) -> bool:
        return self.diff < 0 if self.metric in LOWER_IS_BETTER else self.diff > 0

    def words(self) -> str:
        """e.g. "better than lora, beyond the noise" or "within the noise of baseline"; "not comparable with ..."
        when the difference is not finite (a diverged run)."""
        if not math.isfinite(self.diff):
            return f"not comparable with {self.reference} (a non-finite value: a diverged run?)"
        if not self.beyond_noise:
            return f"within the noise of {self.reference}"
        return f"{'better' if self.better else 'worse'} than {self.reference}, beyond the noise"


def compare(
    values: Mapping[int, float],
    ref_values: Mapping[int, float],
    *,
    method: str,
    reference: str,
    metric: str,
    items: Mapping[int, Sequence[float]] | None = None,
    ref_items: Mapping[int, Sequence[float]] | None = None,
    n_boot: int = 2000,
) -> Comparison:
    """Compare a method with a reference over the seeds both have ({seed: value}; a seed-free reference
    such as the untrained baseline is passed as the same value under every seed). A non-finite value (a diverged
    run) gives no interval (`beyond_noise` False, `words` "not comparable"); non-finite items, no bootstrap."""
    seeds = sorted(set(values) & set(ref_values))
    if not seeds:
        raise ValueError(f"{method} and {reference} share no seed")
    diffs = [values[s] - ref_values[s] for s in seeds]
    if not np.isfinite(diffs).all():  # a diverged run: no interval, and `words` says so
        return Comparison(method, reference, metric, float(np.mean(diffs)), None, None)
    boot = None
    if items is not None and ref_items is not None and all(s in items and s in ref_items for s in seeds):
        pairs = [(items[s], ref_items[s]) for s in seeds]
        if all(np.isfinite(np.asarray(p, dtype=float)).all() for pair in pairs for p in pair):
            boot = paired_bootstrap(pairs, metric, n_boot=n_boot)
    return Comparison(method, reference, metric, float(np.mean(diffs)), t_interval(diffs), boot)
