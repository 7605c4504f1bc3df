"""GPU measurements (run by bench/gpu.sh): bf16 frozen-probe training tokens/s and model FLOP utilisation
for the Pythia-160M and 410M shapes, inference overhead of the injected model, and (`dtype_case`) forward and
decode of the three ways to run the injected modules on a bf16 host, with bf16 weights and no autocast (the
common inference setup) as well as an fp32 host under autocast. Random weights.

    python bench/gpu_probe.py [--steps 10] [--peak-tflops 989] [--json out.json]

MFU = (FLOPs of one training step, counted by torch's flop counter: forward, backward to activations and to
the trainable weights) x steps/s / peak dense bf16 FLOP/s (989 TFLOP/s for H100/H200 SXM).
"""

from __future__ import annotations

import argparse
import copy
import json

import torch
from bench_dtype import variants
from common import PYTHIA_SHAPES
from torch.utils.flop_counter import FlopCounterMode
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

import mmpreproj
from mmpreproj.train.methods import apply_method

SHAPES = {name: (dims, micro) for (name, dims), micro in zip(PYTHIA_SHAPES.items(), (4, 2))}  # + paper micro-batch


def cuda_ms(fn, steps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def train_case(base, method: str, ids: torch.Tensor, steps: int, peak: float) -> dict:
    model = apply_method(copy.deepcopy(base), method).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    with FlopCounterMode(display=False) as fc:
        step()
    ms = cuda_ms(step, steps)
    tokens = ids.numel()
    return {"method": method, "tokens_per_s": tokens / (ms / 1e3), "step_ms": ms,
            "mfu": fc.get_total_flops() / (ms / 1e3) / peak, "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30}


def infer_case(base, ids: torch.Tensor, steps: int) -> dict:
    inj = mmpreproj.inject(copy.deepcopy(base))
    out = {}
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for name, m in (("base", base), ("injected", inj)):
            out[name] = cuda_ms(lambda m=m: m(ids), steps)
    return {"base_ms": out["base"], "injected_ratio": out["injected"] / out["base"]}


def dtype_case(dims: dict, steps: int) -> dict:
    """Forward (8 x 512) and decode (32 steps after 128) over the base: bf16 weights without autocast, and
    fp32 weights under bf16 autocast; fp32 modules vs host-dtype compute vs modules cast to bf16."""
    torch.manual_seed(0)
    ids = torch.randint(0, 50304, (8, 512), device="cuda")
    out = {}
    for setup, host_dtype, autocast in (("bf16 weights", torch.bfloat16, False), ("fp32 + autocast", torch.float32, True)):
        base = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=50304, rotary_pct=0.25, **dims)).cuda().to(host_dtype).eval()
        models = variants(base)

        def decode(m):
            o = m(ids[:1, :128], use_cache=True)
            for _ in range(32):
                o = m(o.logits[:, -1:].argmax(-1), cache=o.cache, use_cache=True)

        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            fwd = {k: cuda_ms(lambda m=m: m(ids, use_cache=False), steps) for k, m in models.items()}
            dec = {k: cuda_ms(lambda m=m: decode(m), max(2, steps // 4), warmup=1) for k, m in models.items()}
        out[setup] = {k: {"forward_ratio": fwd[k] / fwd["base"], "decode_ratio": dec[k] / dec["base"],
                          "forward_ms": fwd[k], "decode_ms": dec[k]} for k in models}
        for k, r in out[setup].items():
            print(f"{setup:<16} {k:<13} forward {r['forward_ratio']:.3f}  decode {r['decode_ratio']:.3f}", flush=True)
        del base, models
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    assert torch.cuda.is_available(), "bench/gpu_probe.py needs a CUDA GPU"
    torch.manual_seed(0)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}}
    res["dtype_160m"] = dtype_case(PYTHIA_SHAPES["160m"], a.steps)  # first: the cheapest, most wanted figure
    for shape, (dims, micro) in SHAPES.items():
        base = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=50304, rotary_pct=0.25, **dims)).cuda().eval()
        ids = torch.randint(0, 50304, (micro, 512), device="cuda")
        rows = [train_case(base, m, ids, a.steps, a.peak_tflops * 1e12) for m in ("preproj_skip", "lora")]
        inf = infer_case(base, torch.randint(0, 50304, (8, 512), device="cuda"), a.steps)
        res["shapes"][shape] = {"train": rows, "inference": inf}
        for r in rows:
            print(f"{shape} {r['method']:<13} {r['tokens_per_s']:>9.0f} tok/s  MFU {100 * r['mfu']:.1f}%  "
                  f"peak {r['peak_mem_gb']:.1f} GB", flush=True)
        print(f"{shape} inference (bf16, 8x512): injected/base {inf['injected_ratio']:.3f}", flush=True)
        del base
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
