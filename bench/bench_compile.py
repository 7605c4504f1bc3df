"""torch.compile (inductor) vs eager for the injected models: GPT-NeoX 160M shape and a timm ViT (CPU).

    python bench/bench_compile.py [--seq 256] [--repeats 5]

Random weights, no downloads. Compile time is reported apart; the ratio is steady-state forward latency.
Outputs of the compiled and eager models are checked to agree before timing.
"""

from __future__ import annotations

import argparse
import json
import time

import timm
import torch
from common import PYTHIA_SHAPES, interleaved_medians, machine
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

import mmpreproj


def _case(name: str, model: torch.nn.Module, x: torch.Tensor, call, repeats: int) -> dict:
    compiled = torch.compile(model)
    t0 = time.perf_counter()
    with torch.no_grad():
        torch.testing.assert_close(call(compiled, x), call(model, x), atol=1e-3, rtol=1e-3)
    compile_s = time.perf_counter() - t0
    with torch.no_grad():
        t = interleaved_medians({"eager": lambda: call(model, x), "compiled": lambda: call(compiled, x)}, repeats)
    return {
        "model": name,
        "eager_ms": 1e3 * t["eager"],
        "compiled_ms": 1e3 * t["compiled"],
        "compiled_vs_eager": t["compiled"] / t["eager"],
        "compile_s": compile_s,
    }


def run(seq: int = 256, repeats: int = 5) -> dict:
    torch.manual_seed(0)
    neox = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=50304, rotary_pct=0.25, **PYTHIA_SHAPES["160m"])).eval()
    mmpreproj.inject(neox)
    vit = mmpreproj.inject(timm.create_model("vit_small_patch16_224", pretrained=False).eval())
    rows = [
        _case(
            "GPT-NeoX 160M shape + preproj_skip",
            neox,
            torch.randint(0, 50304, (1, seq)),
            lambda m, x: m(x).logits,
            repeats,
        ),
        _case("ViT-S/16 + preproj_skip", vit, torch.randn(4, 3, 224, 224), lambda m, x: m(x), repeats),
    ]
    return {"machine": machine(), "seq": seq, "rows": rows}


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    res = run(a.seq, a.repeats)
    print(f"torch.compile (inductor) vs eager, {res['machine']}")
    print("| model | eager ms | compiled ms | compiled / eager | compile s |")
    print("|---|---|---|---|---|")
    for r in res["rows"]:
        print(
            f"| {r['model']} | {r['eager_ms']:.0f} | {r['compiled_ms']:.0f} | "
            f"{r['compiled_vs_eager']:.3f} | {r['compile_s']:.0f} |"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    return res


if __name__ == "__main__":
    main()
