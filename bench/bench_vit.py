"""Forward latency of a ViT-B/16-shaped timm model with and without the pre-projection + skip and 2D RoPE (CPU).

    python bench/bench_vit.py [--batch 8] [--size 224] [--repeats 7] [--warmup 2] [--json out.json]

`timm.create_model("vit_base_patch16_224", pretrained=False)`: random weights, no downloads. Four variants
of one model, timed side by side (round-robin repeats, medians; see common.interleaved_medians):
    base              the timm model as built
    preproj_skip      + `mmpreproj.inject` (pre-projection + content skip in all 12 blocks)
    rope2d            + `mmpreproj.timm_rope.add_rope` (our RoPE2D on the patch tokens, absolute table kept)
    rope2d_preproj    both
Each latency ratio is printed beside the matmul FLOP ratio from torch's flop counter (RoPE adds no matmul).
"""

from __future__ import annotations

import argparse
import copy
import json
import os

import timm
import torch
from common import count_flops, interleaved_medians, machine

import mmpreproj
from mmpreproj.timm_rope import add_rope


def variants(base: torch.nn.Module) -> dict[str, torch.nn.Module]:
    preproj = mmpreproj.inject(copy.deepcopy(base))
    rope = add_rope(copy.deepcopy(base))
    both = mmpreproj.inject(add_rope(copy.deepcopy(base)))
    return {"base": base, "preproj_skip": preproj, "rope2d": rope, "rope2d_preproj": both}


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_base_patch16_224")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()

    torch.manual_seed(0)
    base = timm.create_model(args.model, pretrained=False, img_size=args.size).eval()
    models = variants(base)
    images = torch.randn(args.batch, 3, args.size, args.size)

    def fwd(m):
        return lambda: m(images)

    with torch.inference_mode():
        flops = {k: count_flops(fwd(m)) for k, m in models.items()}
        times = interleaved_medians({k: fwd(m) for k, m in models.items()}, repeats=args.repeats, warmup=args.warmup)
    result = {
        "model": args.model,
        "batch": args.batch,
        "size": args.size,
        "repeats": args.repeats,
        "machine": machine(),
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "ms": {k: 1e3 * t for k, t in times.items()},
        "latency_ratio": {k: t / times["base"] for k, t in times.items()},
        "flop_ratio": {k: f / flops["base"] for k, f in flops.items()},
        "gflops": {k: f / 1e9 for k, f in flops.items()},
    }
    print(
        f"{args.model} (pretrained=False), batch {args.batch} x {args.size}x{args.size}, {result['machine']}, "
        f"load avg {result['load_avg_1_5_15']}"
    )
    print("| variant | forward ms (median) | latency ratio | matmul GFLOPs | FLOP ratio |")
    print("|---|---|---|---|---|")
    for k in models:
        print(
            f"| {k} | {result['ms'][k]:.0f} | {result['latency_ratio'][k]:.3f} | {result['gflops'][k]:.1f} | "
            f"{result['flop_ratio'][k]:.3f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
