"""The demo's time, measured as a newcomer runs it: `.venv/bin/mmpreproj demo` (the command `make demo` runs).

    python bench/demo_time.py [--out DIR] [--json bench/results/demo_time.json]

Runs the demo in a fresh process with the offline flags `make` sets and records its wall time, the CPU time of
the process and its children, the machine's cores and the 1-minute load average before and after (the time
scales with the cores it gets: a loaded machine is slower). The docs' sentence on the demo's time is generated
from the JSON this writes (`recipes/headline.py`, block `demo-time`), so it is a measurement, never a guess.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(out: Path) -> dict:
    """Run the demo once into `out`; its wall and CPU seconds, the load around it, its exit code."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "mmpreproj_cli", "demo", "--out", str(out), "--no-progress"]
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"demo failed ({done.returncode}): {done.stderr[-2000:]}")
    return {
        "command": "mmpreproj demo",
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "load_1min_before": load_before,
        "load_1min_after": os.getloadavg()[0],
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "last_lines": done.stdout.strip().splitlines()[-3:],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="the demo's run folder (default: a temporary folder, removed after)")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "demo_time.json"), help="where to write")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(Path(args.out) if args.out else Path(tmp) / "demo")
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"demo: {result['wall_s'] / 60:.1f} min wall, {result['cpu_s'] / 60:.1f} CPU-min on {result['cores']} cores "
        f"(1-min load {result['load_1min_before']:.1f} before, {result['load_1min_after']:.1f} after) -> {args.json}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
