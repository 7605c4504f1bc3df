"""Shared helpers for the bench scripts: side-by-side timing and FLOP counting."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["PYTHIA_SHAPES", "interleaved_medians", "count_flops", "machine", "write_json"]

# GPTNeoXConfig kwargs of the paper's two Pythia shapes (random weights; vocab 50304, rotary_pct 0.25 added by users).
PYTHIA_SHAPES = {
    "160m": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "410m": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}


def interleaved_times(
    fns: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 2
) -> dict[str, list[float]]:
    """Every wall time (s) of each function, run round-robin so drift on a noisy machine hits all alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return times


def interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 2) -> dict[str, float]:
    """Median wall time (s) of each function (`interleaved_times`)."""
    return {k: statistics.median(v) for k, v in interleaved_times(fns, repeats, warmup).items()}


def count_flops(fn: Callable[[], object]) -> int:
    """Total FLOPs torch's flop counter attributes to matmul-like ops during `fn()`."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def machine() -> str:
    import platform

    return (
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    )


def write_json(path: str | None, result: dict) -> None:
    """Write a bench script's results to `path` (its `--json`), when given."""
    if path:
        import json

        with open(path, "w") as f:
            json.dump(result, f, indent=2)
