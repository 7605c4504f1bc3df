"""How fast the command answers a wrong argument: each refused invocation and `--help` beside `import torch`.

    python bench/cli_startup.py [--repeats 5] [--json bench/results/cli_startup.json]

Every invocation runs `python -m mmpreproj_cli ...` (the console script's code, this checkout) in a fresh
interpreter; all of them and `python -c "import torch"` take turns, `--repeats` rounds, and the table gives each
one's median and range in seconds and its median over `import torch`'s (the floor a command pays once it loads
the library: before the arguments were checked without it, every refusal below cost at least that). Each refusal
is also checked to exit 1 or 2 (a run that does not is reported, not timed). Reports the 1-minute load average
before and after: the figures scale with the cores a loaded machine leaves.
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
TORCH = "python -c 'import torch'"
COMMANDS: dict[str, list[str]] = {  # name -> the interpreter's arguments
    TORCH: ["-c", "import torch"],
    "--help": ["-m", "mmpreproj_cli", "--help"],
    "train --expansion -1": ["-m", "mmpreproj_cli", "train", "--expansion", "-1"],
    "eval --adapter /nonexistent": ["-m", "mmpreproj_cli", "eval", "--adapter", "/nonexistent"],
    "train --method dora": ["-m", "mmpreproj_cli", "train", "--method", "dora"],
    "reproduce --preset nonsense": ["-m", "mmpreproj_cli", "reproduce", "--preset", "nonsense"],
    "eval --tasks ppl,bogus": ["-m", "mmpreproj_cli", "eval", "--tasks", "ppl,bogus"],
    "train --model ./no-such-model": ["-m", "mmpreproj_cli", "train", "--model", "./no-such-model"],
    "eval --model smollm2-136m": ["-m", "mmpreproj_cli", "eval", "--model", "smollm2-136m"],
    "train --steps -5": ["-m", "mmpreproj_cli", "train", "--steps", "-5"],
    "sweep --lrs 1e-3,x": ["-m", "mmpreproj_cli", "sweep", "--lrs", "1e-3,x"],
}


def time_command(args: list[str]) -> tuple[float, int]:
    """(seconds for a fresh interpreter to run `args`, its exit code); interpreter start included, alike for all."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - start, done.returncode


def main(argv: list[str] | None = None) -> dict:
    """Time every command `--repeats` times, taking turns; print the table and return (and write) the figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="rounds, each timing every command once (default 5)")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    codes: dict[str, set[int]] = {name: set() for name in COMMANDS}
    for _ in range(args.repeats):
        for name, command in COMMANDS.items():  # interleaved, so load drifts hit all of them alike
            seconds, code = time_command(command)
            times[name].append(seconds)
            codes[name].add(code)
    load_after = os.getloadavg()
    medians = {name: statistics.median(t) for name, t in times.items()}
    wrong = {n: sorted(c) for n, c in codes.items() if n not in (TORCH, "--help") and not c <= {1, 2}}
    print(f"{'command':<32} {'median s':>9} {'range s':>13} {'/ import torch':>15}  exit")
    for name, t in times.items():
        spread = f"{min(t):.2f}-{max(t):.2f}"
        ratio = medians[name] / medians[TORCH]
        print(f"{name:<32} {medians[name]:9.2f} {spread:>13} {ratio:15.3f}  {','.join(map(str, sorted(codes[name])))}")
    print(f"load average (1, 5, 15 min): {_load(load_before)} before, {_load(load_after)} after; {len(t)} runs each")
    if wrong:
        print(f"NOT REFUSED (exit code other than 1 or 2): {wrong}")
    result = {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "repeats": args.repeats,
        "seconds": times,
        "median_s": medians,
        "over_import_torch": {name: medians[name] / medians[TORCH] for name in COMMANDS},
        "exit_codes": {name: sorted(c) for name, c in codes.items()},
        "loadavg": {"before": list(load_before), "after": list(load_after)},
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


def _load(avg: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.1f}" for x in avg)


if __name__ == "__main__":
    main()
