"""Memory of a frozen probe on a float32, int8 (torchao) and 4-bit (bitsandbytes nf4) base, side by side.

    python bench/bench_quant.py [--shape 160m] [--batch 2] [--seq 128] [--repeats 3] [--json out.json]

The base is a GPT-NeoX of Pythia's shape (random weights, vocab 50304, no download); every linear layer but
the output head is quantized (`mmpreproj.integrations.quantized.quantize_frozen_base`), then the
pre-projection + content skip are injected (paper init, float32). Per variant:
- base bytes: what the base's parameters and buffers store (int8 data + scales; packed 4-bit + its state);
- steady RSS: the process's resident memory with the injected model built, before the step;
- step peak RSS: the high-water mark of one training step (forward + backward + AdamW step on the injected
  weights, `--batch` x `--seq` tokens), reset just before it (`/proc/self/clear_refs`), and peak - steady.
Each variant runs in its own child process (a fresh heap; glibc's mmap threshold is fixed so freed large
blocks go back to the OS), the variants interleaved over `--repeats` rounds; the medians are printed with
their ratios to float32 and the load average before and after (the machine may be shared).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

VARIANTS = ("float32", "int8", "nf4")
HERE = Path(__file__).resolve().parent


def _rss_kib(field: str) -> int:
    """`VmRSS` or `VmHWM` of this process in KiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def child(variant: str, shape: str, batch: int, seq: int) -> dict:
    """Build the injected model for `variant`, run one training step, return its memory figures (bytes)."""
    import torch
    from common import PYTHIA_SHAPES
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    import mmpreproj
    from mmpreproj.integrations.quantized import model_bytes, quantize_frozen_base

    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=50304, rotary_pct=0.25, max_position_embeddings=2048, **PYTHIA_SHAPES[shape])
    model = GPTNeoXForCausalLM(cfg).eval()
    if variant != "float32":
        quantize_frozen_base(model, variant)
    base = model_bytes(model)
    mmpreproj.inject(model)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-5)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))
    gc.collect()
    steady = _rss_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    loss = model(ids, labels=ids).loss
    loss.backward()
    opt.step()
    peak = _rss_kib("VmHWM")
    return {
        "base_param_bytes": base["parameters"],
        "base_buffer_bytes": base["buffers"],
        "trainable_params": sum(p.numel() for p in trainable),
        "steady_rss": steady * 1024,
        "step_peak_rss": peak * 1024,
        "step_extra_rss": (peak - steady) * 1024,
        "loss": loss.item(),
    }


def run_child(variant: str, args: argparse.Namespace) -> dict:
    env = dict(
        os.environ,
        MALLOC_MMAP_THRESHOLD_="131072",
        PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")]),
    )
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        variant,
        "--shape",
        args.shape,
        "--batch",
        str(args.batch),
        "--seq",
        str(args.seq),
        "--threads",
        str(args.threads),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"variant {variant} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="160m", choices=["160m", "410m"])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(child(args.child, args.shape, args.batch, args.seq)))
        return

    from common import write_json

    load_before = Path("/proc/loadavg").read_text().split()[:3]
    runs: dict[str, list[dict]] = {v: [] for v in args.variants}
    for _ in range(args.repeats):
        for v in args.variants:
            runs[v].append(run_child(v, args))
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    keys = ["base_param_bytes", "steady_rss", "step_peak_rss", "step_extra_rss"]
    med = {v: {k: statistics.median(r[k] for r in rs) for k in keys} for v, rs in runs.items()}
    ref = med.get("float32")
    mib = 2**20
    print(
        f"GPT-NeoX {args.shape} shape, frozen probe (pre-projection + skip, "
        f"{runs[args.variants[0]][0]['trainable_params']:,} "
        f"fp32 trainable), one step at {args.batch} x {args.seq} tokens, median of {args.repeats} child runs"
    )
    print("| base | base params MiB | steady RSS MiB | step peak RSS MiB | peak - steady MiB |")
    print("|---|---|---|---|---|")
    for v, m in med.items():
        cells = [f"{m[k] / mib:,.0f}" + (f" ({m[k] / ref[k]:.2f}x)" if ref and v != "float32" else "") for k in keys]
        print(f"| {v} | " + " | ".join(cells) + " |")
    print(
        f"load average (1/5/15 min): before {' '.join(load_before)}, after {' '.join(load_after)}; "
        f"{os.cpu_count()} CPUs, {args.threads} torch threads per child"
    )
    write_json(
        args.json,
        {
            "args": vars(args),
            "medians": med,
            "runs": runs,
            "loadavg_before": load_before,
            "loadavg_after": load_after,
        },
    )


if __name__ == "__main__":
    main()
