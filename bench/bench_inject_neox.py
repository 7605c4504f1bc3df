"""Forward latency and KV-cache bytes of an injected Pythia-160M-shaped GPT-NeoX over the base (CPU).

    python bench/bench_inject_neox.py [--seq 512] [--batch 1] [--repeats 7] [--shape 160m|410m]

Random weights, no downloads. Prints the measured latency ratio beside the matmul FLOP ratio
(counted by torch's flop counter on the same forward) and the KV-cache byte ratio.
"""

from __future__ import annotations

import argparse
import copy
import json

import torch
from common import PYTHIA_SHAPES, count_flops, interleaved_medians, machine
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

import mmpreproj


def kv_bytes(model: torch.nn.Module, ids: torch.Tensor) -> int:
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(PYTHIA_SHAPES), default="160m")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()

    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=50304, rotary_pct=0.25, **PYTHIA_SHAPES[args.shape])
    base = GPTNeoXForCausalLM(cfg).eval()
    injected = mmpreproj.inject(copy.deepcopy(base))
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq))

    def fwd(m):
        return lambda: m(ids, use_cache=False)

    with torch.no_grad():
        flops = {k: count_flops(fwd(m)) for k, m in (("base", base), ("injected", injected))}
        times = interleaved_medians({"base": fwd(base), "injected": fwd(injected)}, repeats=args.repeats)
    result = {
        "shape": args.shape,
        "seq": args.seq,
        "batch": args.batch,
        "machine": machine(),
        "base_ms": 1e3 * times["base"],
        "injected_ms": 1e3 * times["injected"],
        "latency_ratio": times["injected"] / times["base"],
        "flop_ratio": flops["injected"] / flops["base"],
        "kv_bytes_ratio": kv_bytes(injected, ids) / kv_bytes(base, ids),
    }
    print(f"GPT-NeoX {args.shape} shape, batch {args.batch} x seq {args.seq}, {result['machine']}")
    print(f"  forward  base {result['base_ms']:.1f} ms | injected {result['injected_ms']:.1f} ms")
    print(
        f"  latency ratio {result['latency_ratio']:.3f} | matmul FLOP ratio {result['flop_ratio']:.3f}"
        f" | KV-cache bytes ratio {result['kv_bytes_ratio']:.3f}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
