"""Import time of `import mmpreproj` beside `import peft` (and `import torch`), side by side in one run.

    python bench/bench_import.py [--repeats 5] [--json OUT]

Each import runs in a fresh interpreter (`python -X importtime` is not used: it slows the import itself); the
three statements take turns, `--repeats` rounds, and the script prints each one's median and range in seconds
and the ratio mmpreproj / peft. `import mmpreproj` imports peft (the method is a peft tuner), so the ratio is
at least 1; the issue's target is within 10%. Reports the 1-minute load average before and after: the figures
scale with the cores a loaded machine leaves.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATEMENTS = {"torch": "import torch", "peft": "import peft", "mmpreproj": "import mmpreproj"}


def time_import(statement: str) -> float:
    """Seconds for a fresh interpreter to run `statement` (interpreter start included, the same for all)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", statement],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="rounds, each timing every import once (default 5)")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    load_before = os.getloadavg()[0]
    times: dict[str, list[float]] = {name: [] for name in STATEMENTS}
    for _ in range(args.repeats):
        for name, statement in STATEMENTS.items():  # interleaved, so load drifts hit all three alike
            times[name].append(time_import(statement))
    load_after = os.getloadavg()[0]
    medians = {name: statistics.median(t) for name, t in times.items()}
    ratio = medians["mmpreproj"] / medians["peft"]
    for name, t in times.items():
        spread = f"range {min(t):.2f}-{max(t):.2f} s"
        print(f"import {name:<10} median {medians[name]:6.2f} s   {spread}   ({len(t)} runs)")
    load = f"1-min load average {load_before:.1f} before, {load_after:.1f} after"
    print(f"mmpreproj / peft: {ratio:.3f}   ({load})")
    result = {
        "seconds": times,
        "median_s": medians,
        "ratio_mmpreproj_over_peft": ratio,
        "loadavg_1min": [load_before, load_after],
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
