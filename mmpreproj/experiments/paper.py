"""The paper's published figures (arXiv 2604.10791, Table 2), to print beside a reproduction."""

from __future__ import annotations

# (task, metric) read from each evaluation result, in the paper's column order.
TABLE_METRICS = (("lambada", "acc"), ("hellaswag", "acc"), ("arc_easy", "acc"), ("ppl", "ppl"))

# preset -> method -> (params, LAMBADA, HellaSwag, ARC-E, PPL); 500-sample evals, line-level PPL.
PAPER_TABLE2: dict[str, dict[str, tuple]] = {
    "pythia-160m": {
        "baseline": (None, 0.128, 0.326, 0.358, 78.4),
        "preproj": ("17.7M", 0.154, 0.318, 0.342, 73.0),
        "lora": ("26.5M", 0.126, 0.326, 0.346, 63.8),
        "preproj_lora": ("21.2M", 0.162, 0.324, 0.352, 60.8),
        "preproj_skip": ("24.8M", 0.180, 0.338, 0.348, 47.9),
    },
    "pythia-410m": {
        "baseline": (None, 0.466, 0.396, 0.436, 29.2),
        "preproj": ("62.9M", 0.470, 0.392, 0.452, 25.1),
        "lora": ("94.4M", 0.488, 0.400, 0.446, 17.7),
        "preproj_lora": ("72.4M", 0.470, 0.400, 0.450, 19.2),
        "preproj_skip": ("88.1M", 0.484, 0.398, 0.432, 17.0),
    },
}
