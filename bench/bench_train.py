"""One frozen-probe training step: pre-proj + skip vs peft LoRA (paper rank) vs the base's forward/backward.

    python bench/bench_train.py [--shape 160m|410m] [--seq 512] [--batch 1] [--repeats 5]

Random weights, CPU fp32, no downloads. For each variant: tokens/s of forward + backward + AdamW step
(median of interleaved repeats) and training memory, counted exactly as the bytes of the tensors autograd
saves for backward plus gradients and AdamW state of the trainable weights (CPU has no allocator peak
counter; these are the terms that differ between methods). "base fwd/bwd" is the frozen base with the
input embeddings' output requiring grad: the floor every frozen-probe method pays.
"""

from __future__ import annotations

import argparse
import copy
import json

import torch
from common import PYTHIA_SHAPES, interleaved_medians, machine
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

from mmpreproj.train.methods import apply_method, paper_lora_rank


def saved_activation_bytes(model, step) -> int:
    """Bytes autograd saves for backward during one forward (each storage once; weights excluded)."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = step(backward=False)
    del loss
    return sum(seen.values())


def make_step(model, ids, opt):
    def step(backward: bool = True):
        loss = model(input_ids=ids, labels=ids).loss
        if backward:
            loss.backward()
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)
        return loss

    return step


def run(shape: str = "160m", seq: int = 512, batch: int = 1, repeats: int = 5) -> dict:
    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=50304, rotary_pct=0.25, **PYTHIA_SHAPES[shape])
    base = GPTNeoXForCausalLM(cfg).train()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    variants = {}
    frozen = copy.deepcopy(base).requires_grad_(False)
    frozen.get_input_embeddings().register_forward_hook(lambda m, a, o: o.requires_grad_(True))
    variants["base fwd/bwd"] = (frozen, None)
    for method in ("preproj_skip", "lora"):
        model = apply_method(copy.deepcopy(base), method).train()
        params = [p for p in model.parameters() if p.requires_grad]
        variants[method] = (model, torch.optim.AdamW(params, lr=1e-5))
    steps = {k: make_step(m, ids, opt) for k, (m, opt) in variants.items()}
    times = interleaved_medians(steps, repeats=repeats, warmup=1)
    rows = {}
    for k, (m, _) in variants.items():
        trainable = sum(p.numel() * p.element_size() for p in m.parameters() if p.requires_grad)
        rows[k] = {
            "trainable_params": sum(p.numel() for p in m.parameters() if p.requires_grad),
            "tokens_per_s": batch * seq / times[k],
            "step_ms": 1e3 * times[k],
            "memory_mb": (saved_activation_bytes(m, steps[k]) + 3 * trainable) / 2**20,  # acts + grad + 2 Adam
        }
    ref = rows["base fwd/bwd"]
    for r in rows.values():
        r["speed_vs_base"] = r["tokens_per_s"] / ref["tokens_per_s"]
        r["memory_vs_base"] = r["memory_mb"] / ref["memory_mb"]
    lora_r = paper_lora_rank(cfg.hidden_size, cfg.num_hidden_layers)
    return {"shape": shape, "seq": seq, "batch": batch, "lora_r": lora_r, "machine": machine(), "rows": rows}


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(PYTHIA_SHAPES), default="160m")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    res = run(a.shape, a.seq, a.batch, a.repeats)
    print(
        f"frozen-probe step, GPT-NeoX {a.shape} shape, {a.batch} x {a.seq} tokens, "
        f"LoRA r={res['lora_r']}, {res['machine']}"
    )
    print(f"  {'variant':<14} {'trainable':>11} {'tokens/s':>9} {'vs base':>8} {'memory MB':>10} {'vs base':>8}")
    for k, r in res["rows"].items():
        print(
            f"  {k:<14} {r['trainable_params']:>11,} {r['tokens_per_s']:>9.0f} {r['speed_vs_base']:>8.2f}"
            f" {r['memory_mb']:>10.0f} {r['memory_vs_base']:>8.2f}"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    return res


if __name__ == "__main__":
    main()
