"""A newcomer's first hour, timed: a fresh clone, its set-up, the demo, one recipe per user group, the tests.

    python bench/first_hour.py [--clone DIR] [--demo-repeats 3] [--skip-tests] [--json bench/results/first_hour.json]

Clones this repository's HEAD into a new folder (a fresh checkout: no venv, no caches of ours) and runs there,
one after another, what the README and the guides tell a new user to run, each step's wall time, the CPU time
of its processes and the 1-minute load average before and after written to the JSON (a step's time scales with
the cores it gets: the load says how quiet the machine was). The demo runs `--demo-repeats` times from an empty
output folder each time (a second run would read the first one's arms back); the docs' sentence on the demo's
time is generated from the median of those runs (`recipes/headline.py`, block `demo-time`). Offline flags as
`make` sets them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (step, the command a newcomer types in the clone), in the order the README and the guides give them
STEPS: tuple[tuple[str, str], ...] = (
    ("set-up", "make .venv/.installed"),
    ("demo", ".venv/bin/mmpreproj demo --no-progress --out runs/fh-demo"),
    ("text: train the mini preset", ".venv/bin/mmpreproj train --preset mini --steps 20 --out runs/fh-text"),
    ("vision: mini-ViT frozen probe", ".venv/bin/python recipes/vision/mini_vit_probe.py --quick --out runs/fh-vis"),
    ("mixed: VQA, per-modality RoPE", ".venv/bin/python recipes/mixed/cifar_vqa.py --quick --out runs/fh-mixed"),
    ("tests", ".venv/bin/pytest -p no:cacheprovider --durations=30"),
)


def _cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_step(name: str, command: str, cwd: Path) -> dict:
    """Run one step in `cwd`; its wall and CPU seconds, the load around it, its exit code and last lines."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)
    print(f"$ {command}", flush=True)
    load_before, cpu_before, t0 = os.getloadavg()[0], _cpu_children(), time.perf_counter()
    done = subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = (done.stdout + done.stderr).strip().splitlines()
    row = {
        "step": name,
        "command": command,
        "exit": done.returncode,
        "wall_s": wall,
        "cpu_s": _cpu_children() - cpu_before,
        "load_1min_before": load_before,
        "load_1min_after": os.getloadavg()[0],
        "last_lines": lines[-40:] if name == "tests" else lines[-3:],
    }
    print(f"  {name}: exit {done.returncode}, {wall / 60:.1f} min wall, {row['cpu_s'] / 60:.1f} CPU-min, load "
          f"{load_before:.1f} -> {row['load_1min_after']:.1f}", flush=True)  # fmt: skip
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clone", help="where to clone (default: a new temporary folder, kept for inspection)")
    ap.add_argument("--skip-tests", action="store_true", help="leave out the test suite (the longest step)")
    ap.add_argument("--demo-repeats", type=int, default=3, help="runs of the demo, each from scratch (default: 3)")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "first_hour.json"), help="where to write")
    args = ap.parse_args(argv)
    clone = Path(args.clone or tempfile.mkdtemp(prefix="mmpreproj-first-hour-")) / "mmpreproj"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    if args.demo_repeats < 1:
        ap.error(f"--demo-repeats: {args.demo_repeats}; allowed values: an integer >= 1")
    steps = [s for s in STEPS if not (args.skip_tests and s[0] == "tests")]
    rows = []
    for name, command in steps:
        for repeat in range(args.demo_repeats if name == "demo" else 1):
            shutil.rmtree(clone / "runs" / "fh-demo", ignore_errors=True)  # each demo run trains from scratch
            rows.append({**run_step(name, command, clone), **({"repeat": repeat} if name == "demo" else {})})
        if rows[-1]["exit"] != 0 and name == "set-up":
            break
    result = {
        "commit": head,
        "clone": str(clone),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "steps": rows,
        "total_wall_s": sum(r["wall_s"] for r in rows),
        # a newcomer runs the demo once: the first hour counts the first demo run only
        "newcomer_wall_s": sum(r["wall_s"] for r in rows if r.get("repeat", 0) == 0),
    }
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"first hour: {result['newcomer_wall_s'] / 60:.1f} min as a newcomer runs it (one demo run), "
          f"{result['total_wall_s'] / 60:.1f} min in all -> {args.json}")  # fmt: skip
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
