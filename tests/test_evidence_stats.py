"""Aggregation over seeds: mean/std, Student-t and paired-bootstrap intervals, verdicts, seeds, matched LoRA rank."""

from __future__ import annotations

import math

import pytest

from mmpreproj.analysis.stats import compare, mean_std, paired_bootstrap, t_interval, t_quantile
from mmpreproj.train.methods import expected_trainable, matched_lora_rank
from mmpreproj_tables.values import parse_seeds


def test_mean_std_by_hand():
    mean, std, n = mean_std([1.0, 2.0, 3.0, 4.0])
    assert (mean, n) == (2.5, 4)
    assert std == pytest.approx(math.sqrt((1.5**2 + 0.5**2 + 0.5**2 + 1.5**2) / 3))  # ddof=1: 1.29099
    assert mean_std([7.0]) == (7.0, 0.0, 1)
    with pytest.raises(ValueError):
        mean_std([])


def test_t_interval_by_hand():
    # diffs 1, 2, 3: mean 2, std 1, t(2) = 4.30265 -> 2 -/+ 4.30265 / sqrt(3) = 2 -/+ 2.48414
    lo, hi = t_interval([1.0, 2.0, 3.0])
    assert lo == pytest.approx(2 - 4.303 / math.sqrt(3), abs=1e-3) and hi == pytest.approx(
        2 + 4.303 / math.sqrt(3), abs=1e-3
    )
    assert lo == pytest.approx(-0.48414, abs=1e-5)
    assert t_interval([5.0]) is None  # one seed has no spread


@pytest.mark.parametrize(
    ("df", "printed"),
    [
        (1, 12.706),
        (2, 4.303),
        (4, 2.776),
        (10, 2.228),
        (30, 2.042),
        (31, 2.040),
        (40, 2.021),
        (60, 2.000),
        (120, 1.980),
    ],
)
def test_t_quantile_matches_printed_tables(df, printed):
    # three-decimal values of the standard two-sided 95% t table (df 31: 2.040, not the normal's 1.960)
    assert t_quantile(df) == pytest.approx(printed, abs=5e-4)


def test_t_quantile_beyond_30_df_is_not_the_normal():
    # 32 per-seed diffs with std 1: half-width t(31) / sqrt(32) = 2.0395 / 5.657, 4% wider than 1.960's
    diffs = [(-1.0) ** i * math.sqrt(31 / 32) for i in range(32)]  # mean 0, std (ddof=1) exactly 1
    lo, hi = t_interval(diffs)
    assert hi == pytest.approx(2.039513 / math.sqrt(32), abs=1e-5) and lo == pytest.approx(-hi)
    assert t_quantile(10**6) == pytest.approx(1.95996, abs=1e-4)
    assert t_quantile(1, level=0.90) == pytest.approx(6.314, abs=5e-4)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="df="):
            t_quantile(bad)
    with pytest.raises(ValueError, match="level="):
        t_quantile(3, level=1.0)


def test_paired_bootstrap_exact_cases():
    # every row loss 1 vs 2: every replicate gives exp(1) - exp(2)
    lo, hi = paired_bootstrap([([1.0] * 5, [2.0] * 5)], "ppl.ppl", n_boot=200)
    assert lo == pytest.approx(math.e - math.e**2) and hi == pytest.approx(math.e - math.e**2)
    # two seeds: accuracy 1 vs 0 on seed A and 0 vs 0 on seed B -> the mean over seeds is 0.5 in every replicate
    lo, hi = paired_bootstrap([([1, 1, 1], [0, 0, 0]), ([0, 0], [0, 0])], "hellaswag.acc", n_boot=100)
    assert (lo, hi) == (0.5, 0.5)


def test_paired_bootstrap_pairs_items():
    # the method is the reference plus 0.01 on every row: item difficulty varies a lot but cancels when paired
    ref = [0.5 + 0.3 * (i % 7) for i in range(200)]
    lo, hi = paired_bootstrap([([r + 0.01 for r in ref], ref)], "ppl.ppl", n_boot=500)
    shift = math.exp(sum(ref) / 200 + 0.01) - math.exp(sum(ref) / 200)
    assert 0 < lo < shift < hi and hi - lo < 0.5 * shift  # unpaired, the spread would dwarf the shift
    acc_lo, acc_hi = paired_bootstrap([([1, 0, 1, 0] * 25, [0] * 100)], "hellaswag.acc", n_boot=500)
    assert 0.35 < acc_lo < 0.5 < acc_hi < 0.65
    with pytest.raises(ValueError):
        paired_bootstrap([([1.0, 2.0], [1.0])], "ppl.ppl")


def test_compare_reads_the_noise():
    # PPL 10, 12, 11 against 20, 21, 22: diffs -10, -9, -11 (std 1): -10 -/+ 2.48414, lower PPL = better
    c = compare(
        {0: 10.0, 1: 12.0, 2: 11.0}, {0: 20.0, 1: 21.0, 2: 22.0}, method="a", reference="lora", metric="ppl.ppl"
    )
    assert c.diff == pytest.approx(-10.0) and c.seeds == pytest.approx((-10 - 2.48414, -10 + 2.48414), abs=1e-5)
    assert c.items is None and c.beyond_noise and c.words() == "better than lora, beyond the noise"
    # the same means with a spread that crosses zero
    c = compare(
        {0: 10.0, 1: 30.0, 2: 11.0}, {0: 20.0, 1: 21.0, 2: 22.0}, method="a", reference="lora", metric="ppl.ppl"
    )
    assert not c.beyond_noise and c.words() == "within the noise of lora"
    # higher accuracy is better; an item interval that crosses zero keeps it within the noise
    items = {0: [1, 0, 0, 1], 1: [0, 1, 0, 1], 2: [1, 1, 0, 0]}
    ref_items = {0: [0, 1, 0, 0], 1: [1, 0, 0, 0], 2: [0, 0, 1, 0]}
    c = compare(
        {0: 0.30, 1: 0.31, 2: 0.30},
        {0: 0.25, 1: 0.25, 2: 0.25},
        method="a",
        reference="baseline",
        metric="hellaswag.acc",
        items=items,
        ref_items=ref_items,
        n_boot=300,
    )
    assert c.better and c.seeds[0] > 0 and c.items[0] < 0 < c.items[1] and not c.beyond_noise
    # one seed, no items: nothing to judge with
    assert not compare({42: 1.0}, {42: 2.0}, method="a", reference="b", metric="ppl.ppl").beyond_noise


def test_parse_seeds():
    assert parse_seeds(None, 42) == [42]
    assert parse_seeds("3", 42) == [42, 43, 44] and parse_seeds(2, 0) == [0, 1]
    assert parse_seeds("0,3,7", 42) == [0, 3, 7]
    for bad in ("0", "1,1", ","):
        with pytest.raises(ValueError):
            parse_seeds(bad, 42)


@pytest.mark.parametrize(("d", "layers", "rank"), [(768, 12, 448), (1024, 24, 597), (256, 4, 149)])
def test_matched_lora_rank_matches_preproj_skip(d, layers, rank):
    assert matched_lora_rank(d, layers) == rank
    target = expected_trainable("preproj_skip", d, layers)
    assert abs(expected_trainable("lora_matched", d, layers) - target) <= 6 * d * layers / 2  # within half a rank step
    assert expected_trainable("lora", d, layers) > target  # the paper's rule gives LoRA more
