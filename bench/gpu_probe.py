"""GPU measurements (run by bench/gpu.sh): base vs injected at the Pythia-160M and 410M shapes, random weights.

    python bench/gpu_probe.py [--repeats 7] [--peak-tflops 989] [--json out.json] [--dry-run]

Per shape, each row the median over `--repeats` timed repeats with its range (min-max), base and injected
taking turns so drift hits both alike:
- forward, bf16 host (bf16 weights, no autocast), batch 8 x 512: ms, tokens/s, MFU, peak memory;
  injected = default `PreProjConfig` (fp32 masters computing in bf16) and `bf16 modules` (weights cast to bf16);
- decode, bf16 host, batch 1, 32 greedy tokens after a 128-token prompt: ms per token, tokens/s, ratio;
- frozen-probe training step (fp32 host under bf16 autocast, the trainer's default; AdamW on the trainable
  weights, gradient checkpointing), paper micro-batch x 512: tokens/s, MFU, peak memory; `preproj_skip`
  beside peft LoRA at the paper's rank and the frozen base's forward + backward.
MFU = matmul FLOPs of one call (torch's flop counter) x calls/s / peak dense bf16 FLOP/s (989 TFLOP/s: H100/H200
SXM). Peak memory is `torch.cuda.max_memory_allocated` over the timed calls of that variant alone.
`--dry-run` runs every case once on the CPU at one tiny shape in seconds (a smoke test of this script: its figures mean
nothing, its memory column is empty); without it and without a CUDA GPU the script stops at once with one line.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch
from common import PYTHIA_SHAPES
from torch.utils.flop_counter import FlopCounterMode
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

import mmpreproj
from mmpreproj.train.methods import apply_method

# name: (GPTNeoXConfig dims, training micro-batch (paper)); --dry-run uses TINY for both
SHAPES = {"160m": (PYTHIA_SHAPES["160m"], 4), "410m": (PYTHIA_SHAPES["410m"], 2)}
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256)
FULL = dict(vocab=50304, batch=8, seq=512, prompt=128, new=32)
DRY = dict(vocab=512, batch=2, seq=32, prompt=8, new=4)
NO_GPU = ("bench/gpu_probe.py: no CUDA GPU visible to torch (torch.cuda.is_available() is False); run it on a "
          "machine with one, or pass --dry-run for the CPU smoke run")  # fmt: skip


class Clock:
    """Milliseconds of one call: CUDA events on a GPU (device time), perf_counter on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], object]) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return 1e3 * (time.perf_counter() - t0)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)


def peak_gb(device: torch.device, fn: Callable[[], object]) -> float | None:
    """Peak allocated GiB while `fn()` runs (None on the CPU)."""
    if device.type != "cuda":
        fn()
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**30


def side_by_side(fns: dict[str, Callable[[], object]], clock: Clock, repeats: int, warmup: int = 2) -> dict:
    """Each function's ms per repeat (round-robin), summarised: median, min, max, and the ratio to "base"."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    ms: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            ms[k].append(clock(fn))
    out = {}
    for k, v in ms.items():
        ratios = [a / b for a, b in zip(v, ms["base"])]
        out[k] = {"ms": statistics.median(v), "ms_min": min(v), "ms_max": max(v), "ratio": statistics.median(ratios),
                  "ratio_min": min(ratios), "ratio_max": max(ratios)}  # fmt: skip
    return out


def flops_of(fn: Callable[[], object]) -> int:
    with FlopCounterMode(display=False) as fc:
        fn()
    return fc.get_total_flops()


def build(dims: dict, vocab: int, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=vocab, rotary_pct=0.25, **dims)
    return GPTNeoXForCausalLM(cfg).to(device=device, dtype=dtype).eval()


def inference_variants(base: torch.nn.Module) -> dict[str, torch.nn.Module]:
    authors = mmpreproj.inject(copy.deepcopy(base))
    for w in mmpreproj.injected_modules(authors):
        for part in w.slots():
            part.to(base.dtype)
    return {"base": base, "injected": mmpreproj.inject(copy.deepcopy(base)), "bf16 modules": authors}


def forward_case(models: dict, ids: torch.Tensor, clock: Clock, repeats: int, peak: float) -> dict:
    calls = {k: (lambda m=m: m(ids, use_cache=False)) for k, m in models.items()}
    with torch.no_grad():
        rows = side_by_side(calls, clock, repeats)
        for k, fn in calls.items():
            rows[k].update(tokens_per_s=ids.numel() / (rows[k]["ms"] / 1e3),
                           mfu=flops_of(fn) / (rows[k]["ms"] / 1e3) / peak,
                           peak_gb=peak_gb(ids.device, fn))  # fmt: skip
    return rows


def decode_case(models: dict, prompt: torch.Tensor, new: int, clock: Clock, repeats: int) -> dict:
    def generate(m):
        o = m(prompt, use_cache=True)
        for _ in range(new):
            o = m(o.logits[:, -1:].argmax(-1), cache=o.cache, use_cache=True)

    calls = {k: (lambda m=m: generate(m)) for k, m in models.items()}
    with torch.no_grad():
        rows = side_by_side(calls, clock, repeats, warmup=1)  # prefill included: the same for all
        for k, fn in calls.items():
            rows[k].update(ms_per_token=rows[k]["ms"] / new, tokens_per_s=new / (rows[k]["ms"] / 1e3),
                           peak_gb=peak_gb(prompt.device, fn))  # fmt: skip
    return rows


def train_case(base: torch.nn.Module, ids: torch.Tensor, clock: Clock, repeats: int, peak: float) -> dict:
    device = ids.device
    steps: dict[str, Callable[[], object]] = {}
    for method in ("base", "preproj_skip", "lora"):
        if method == "base":  # the frozen base's forward + backward to its input embeddings (no optimizer)
            model = copy.deepcopy(base).train().requires_grad_(False)
            model.get_input_embeddings().register_forward_hook(lambda mod, a, o: o.requires_grad_(True))
            opt = None
        else:
            model = apply_method(copy.deepcopy(base), method).train()
            opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

        def step(model=model, opt=opt):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)

        steps[method] = step
    rows = side_by_side(steps, clock, repeats, warmup=1)
    for k, fn in steps.items():
        rows[k].update(tokens_per_s=ids.numel() / (rows[k]["ms"] / 1e3),
                       mfu=flops_of(fn) / (rows[k]["ms"] / 1e3) / peak, peak_gb=peak_gb(device, fn))  # fmt: skip
    return rows


def fmt_row(name: str, r: dict) -> str:
    mem = f"{r['peak_gb']:.2f} GiB" if r.get("peak_gb") is not None else "-"
    extra = f"  MFU {100 * r['mfu']:.1f}%" if "mfu" in r else ""
    per_tok = f" ({r['ms_per_token']:.2f} ms/token)" if "ms_per_token" in r else ""
    return (f"  {name:<14} {r['ms']:8.2f} ms ({r['ms_min']:.2f}-{r['ms_max']:.2f}){per_tok}  "
            f"{r['tokens_per_s']:>10.0f} tok/s"
            f"{extra}  peak {mem}  / base {r['ratio']:.3f} ({r['ratio_min']:.3f}-{r['ratio_max']:.3f})")  # fmt: skip


def run(dry: bool, repeats: int, peak_tflops: float) -> dict:
    device = torch.device("cpu" if dry else "cuda")
    clock, peak, size = Clock(device), peak_tflops * 1e12, DRY if dry else FULL
    res = {"device": "cpu (dry run)" if dry else torch.cuda.get_device_name(), "torch": torch.__version__,
           "repeats": repeats, "sizes": size, "shapes": {}}  # fmt: skip
    g = torch.Generator().manual_seed(1)
    for shape, (dims, micro) in list(SHAPES.items())[: 1 if dry else None]:  # a dry run: one tiny shape
        dims = TINY if dry else dims
        ids = torch.randint(0, size["vocab"], (size["batch"], size["seq"]), generator=g).to(device)
        models = inference_variants(build(dims, size["vocab"], device, torch.bfloat16))
        row = {"forward": forward_case(models, ids, clock, repeats, peak),
               "decode": decode_case(models, ids[:1, : size["prompt"]], size["new"], clock, repeats)}  # fmt: skip
        del models
        fp32 = build(dims, size["vocab"], device, torch.float32)
        row["train"] = train_case(fp32, ids[:micro], clock, repeats, peak)
        del fp32
        if device.type == "cuda":
            torch.cuda.empty_cache()
        res["shapes"][shape] = row
        for case, what in (("forward", f"bf16 forward {size['batch']}x{size['seq']}"),
                           ("decode", f"bf16 decode, {size['new']} tokens after {size['prompt']}"),
                           ("train", f"frozen-probe step {micro}x{size['seq']} (autocast bf16)")):  # fmt: skip
            print(f"{shape} {what}:", flush=True)
            for k, r in row[case].items():
                print(fmt_row(k, r), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="peak dense bf16 TFLOP/s of the GPU (for MFU)")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU, seconds: checks the script runs")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if not a.dry_run and not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        sys.exit(2)
    res = run(a.dry_run, 1 if a.dry_run else a.repeats, a.peak_tflops)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
