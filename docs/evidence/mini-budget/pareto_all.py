"""Draw pareto-all.png: every budget of this folder's two runs in one figure (PPL against trainable parameters).

    python docs/evidence/mini-budget/pareto_all.py

The 1% points were trained in an earlier run (budget-1pct.json, its arm folders are gone); the 3%, 10% and 30%
points and the paper-size point in the later one (budget.json). Both ran the `mini` preset with the same code
for training and evaluation, so their summary rows (mean and std over seeds at each method's best LR) sit on
one axis. Reads the two JSON files only.
"""

from __future__ import annotations

import json
from pathlib import Path

from mmpreproj.analysis.plot import plot_pareto

HERE = Path(__file__).resolve().parent


def main() -> Path:
    series: dict[str, list[tuple[float, float, float]]] = {}
    baseline = None
    for name in ("budget-1pct.json", "budget.json"):
        doc = json.loads((HERE / name).read_text())
        baseline = doc["baseline"].get("ppl.ppl")
        for row in doc["summary"]:
            if row["mean"] is None:
                continue
            label = "preproj_skip, paper size" if row["budget"] == "paper" else row["method"]
            series.setdefault(label, []).append((row["params"], row["mean"], row["std"] or 0.0))
    return plot_pareto(
        series,
        HERE / "pareto-all.png",
        title=f"mini: PPL at each method's best LR vs trainable parameters (untrained base {baseline:.0f})",
    )


if __name__ == "__main__":
    print(main())
