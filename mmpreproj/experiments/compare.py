"""The paired comparisons of every experiment's report (`analysis.stats.compare`: by seed, and bootstrapped over the
evaluation items); `reproduce`, `study_report` and `budget` each keep only their rule for which pairs to compare.

    comps = paired_comparisons([("lora", "baseline")], ["ppl.ppl"], rows, items)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..analysis.stats import ITEM_METRICS, Comparison, compare

ArmKey = tuple[str, int | None]  # (label, seed); the untrained baseline is ("baseline", None), under every seed


def paired_comparisons(
    pairs: Iterable[tuple[str, str]],
    metrics: Iterable[str],
    rows: Mapping[ArmKey, Mapping[str, Any]],
    items: Mapping[ArmKey, Mapping[str, Any]],
) -> list[Comparison]:
    """Metric by metric, each (label, reference) with a value at a seed both have: `compare` over those seeds,
    bootstrapped when each of them has the per-item scores (`items[key][task][key]`, `ITEM_METRICS`)."""
    pairs, seeds = list(pairs), {s for _, s in rows if s is not None}

    def values(label: str, metric: str) -> dict[int, float]:
        if label == "baseline":
            value = rows.get(("baseline", None), {}).get(metric)
            return dict.fromkeys(seeds, value) if value is not None else {}
        return {s: r[metric] for (lb, s), r in rows.items() if lb == label and r.get(metric) is not None}

    def scores(label: str, at: Iterable[int], task: str, key: str) -> dict[int, list[float]]:
        got = {s: items.get((label, None if label == "baseline" else s), {}).get(task, {}).get(key) for s in at}
        return {s: v for s, v in got.items() if v is not None}  # `compare` bootstraps only when no seed lacks

    out = []
    for metric in metrics:
        task, key, _ = ITEM_METRICS[metric]
        for label, ref in pairs:
            a, b = values(label, metric), values(ref, metric)
            if set(a) & set(b):
                its, ref_its = scores(label, a, task, key), scores(ref, b, task, key)
                out.append(compare(a, b, method=label, reference=ref, metric=metric, items=its, ref_items=ref_its))
    return out
