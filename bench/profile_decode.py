"""Where a batch-1 decode step's extra time goes: torch.profiler op counts and self CPU time, injected vs base.

    python bench/profile_decode.py [--shape 160m|410m|llama1b] [--layers N] [--dtype bfloat16] [--steps 8] [--top 25]

Prefills 128 tokens, then profiles `--steps` single-token steps of the base and of the injected model (default
`PreProjConfig`), and prints, per aten op, the calls per step and self CPU microseconds per step of each model
and the difference, sorted by the difference; then the per-step totals (op calls, self CPU time, wall time).
Counts are exact; times on a shared machine are not (run it twice, or read them beside bench_decode.py).
"""

from __future__ import annotations

import argparse
import collections
import copy
import time

import torch
from bench_decode import DTYPES, build_base
from torch.profiler import ProfilerActivity, profile

import mmpreproj


def profile_steps(model, prompt: torch.Tensor, steps: int) -> tuple[dict[str, list[float]], float]:
    """{op name: [calls, self CPU us]} summed over `steps` decode steps, and their wall seconds."""
    with torch.no_grad():
        out = model(prompt, use_cache=True)
        cache, tok = out.cache, out.logits[:, -1:].argmax(-1)
        model(tok, cache=cache, use_cache=True)  # one warm step (casts made, first-call checks done)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            for _ in range(steps):
                out = model(tok, cache=cache, use_cache=True)
                cache, tok = out.cache, out.logits[:, -1:].argmax(-1)
            wall = time.perf_counter() - t0
    ops: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.key_averages():
        ops[e.key][0] += e.count
        ops[e.key][1] += e.self_cpu_time_total
    return dict(ops), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="160m", choices=["160m", "410m", "llama1b"])
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    base = build_base(a.shape, a.layers, DTYPES[a.dtype])
    inj = mmpreproj.inject(copy.deepcopy(base))
    prompt = torch.randint(0, base.config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(1))
    (b_ops, b_wall), (i_ops, i_wall) = profile_steps(base, prompt, a.steps), profile_steps(inj, prompt, a.steps)
    n = a.steps
    rows = []
    for k in set(b_ops) | set(i_ops):
        bc, bt = b_ops.get(k, (0, 0.0))
        ic, it = i_ops.get(k, (0, 0.0))
        rows.append((k, bc / n, ic / n, bt / n, it / n))
    rows.sort(key=lambda r: r[4] - r[3], reverse=True)
    print(
        f"{a.shape} {a.dtype} decode, per step ({n} steps after 128): op | calls base -> injected | self CPU us "
        "base -> injected (diff)"
    )
    for k, bc, ic, bt, it in rows[: a.top]:
        print(f"  {k:<42} {bc:7.0f} -> {ic:7.0f} | {bt:9.0f} -> {it:9.0f} ({it - bt:+8.0f})")
    tot = lambda ops, i: sum(v[i] for v in ops.values()) / n  # noqa: E731
    print(
        f"total op calls per step {tot(b_ops, 0):.0f} -> {tot(i_ops, 0):.0f}; self CPU ms per step "
        f"{tot(b_ops, 1) / 1e3:.1f} -> {tot(i_ops, 1) / 1e3:.1f}; wall ms per step (profiled) "
        f"{1e3 * b_wall / n:.1f} -> {1e3 * i_wall / n:.1f}"
    )


if __name__ == "__main__":
    main()
