"""Import time of `import mmpreproj` beside `import peft` (and `import torch`), and `mmpreproj --help` beside
`python -c pass`, side by side in one run.

    python bench/bench_import.py [--repeats 5] [--json OUT]

Each command runs in a fresh interpreter (`python -X importtime` is not used: it slows the import itself); the
five take turns, `--repeats` rounds, and the script prints each one's median and range in seconds and two
ratios: mmpreproj / peft (`import mmpreproj` imports peft, the method is a peft tuner, so it is at least 1; the
issue's target is within 10%) and `mmpreproj --help` / `python -c pass` (the light entry point, `mmpreproj_cli`,
loads no torch: the price of the parser over a bare interpreter). `--help` runs `python -m mmpreproj_cli`, the
console script's code. Reports the 1-minute load average before and after: the figures scale with the cores a
loaded machine leaves.
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
COMMANDS: dict[str, list[str]] = {  # name -> the interpreter's arguments
    "import torch": ["-c", "import torch"],
    "import peft": ["-c", "import peft"],
    "import mmpreproj": ["-c", "import mmpreproj"],
    "python -c pass": ["-c", "pass"],
    "mmpreproj --help": ["-m", "mmpreproj_cli", "--help"],
}
RATIOS = {
    "mmpreproj / peft": ("import mmpreproj", "import peft"),
    "--help / pass": ("mmpreproj --help", "python -c pass"),
}


def time_command(args: list[str]) -> float:
    """Seconds for a fresh interpreter to run `args` (interpreter start included, the same for all)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    """Time every command `--repeats` times, taking turns; print and return the medians and ratios."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="rounds, each timing every command once (default 5)")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    load_before = os.getloadavg()[0]
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.repeats):
        for name, command in COMMANDS.items():  # interleaved, so load drifts hit all of them alike
            times[name].append(time_command(command))
    load_after = os.getloadavg()[0]
    medians = {name: statistics.median(t) for name, t in times.items()}
    ratios = {name: medians[a] / medians[b] for name, (a, b) in RATIOS.items()}
    for name, t in times.items():
        spread = f"range {min(t):.2f}-{max(t):.2f} s"
        print(f"{name:<18} median {medians[name]:6.2f} s   {spread}   ({len(t)} runs)")
    print("   ".join(f"{name}: {r:.3f}" for name, r in ratios.items()))
    print(f"1-min load average {load_before:.1f} before, {load_after:.1f} after")
    result = {
        "seconds": times,
        "median_s": medians,
        "ratios": ratios,
        "loadavg_1min": [load_before, load_after],
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
