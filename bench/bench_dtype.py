"""A bf16 host: forward and decode time over the base, for three ways of running the injected modules.

    python bench/bench_dtype.py [--shape 160m|410m] [--seq 512] [--decode 16] [--repeats 7] [--json out.json]

Variants, side by side in one process (interleaved repeats, medians), random weights, no downloads:
- "fp32 modules": fp32 weights computing in fp32 (`PreProjConfig(compute_dtype="float32")`, the old behaviour);
- "host dtype": fp32 weights computing in the host's dtype (`compute_dtype="input"`, bf16 weight casts cached);
- "bf16 modules": the paper authors' setting, the injected weights themselves cast to bf16.
The forward is one pass over `seq` tokens; decode is `--decode` single-token steps after a 128-token prefill
with the KV cache (each variant times the same steps). Beside them: the matmul FLOP ratio of the forward and
the memory of a frozen-probe training step (bytes autograd saves + grads + AdamW state), per token and layer.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import statistics
import time

import torch
from bench_train import saved_activation_bytes
from common import PYTHIA_SHAPES, count_flops, machine, write_json
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

import mmpreproj
from mmpreproj import PreProjConfig

HAS_COMPUTE_DTYPE = "compute_dtype" in {f.name for f in dataclasses.fields(PreProjConfig)}


def variants(base: torch.nn.Module) -> dict[str, torch.nn.Module]:
    out = {"base": base}
    if HAS_COMPUTE_DTYPE:
        out["fp32 modules"] = mmpreproj.inject(copy.deepcopy(base), PreProjConfig(compute_dtype="float32"))
        out["host dtype"] = mmpreproj.inject(copy.deepcopy(base), PreProjConfig(compute_dtype="input"))
    else:  # the code before compute_dtype: fp32 compute only
        out["fp32 modules"] = mmpreproj.inject(copy.deepcopy(base))
    authors = mmpreproj.inject(copy.deepcopy(base))
    for w in mmpreproj.injected_modules(authors):
        for part in w.slots():
            part.to(base.dtype)
    out["bf16 modules"] = authors
    return out


def decode_seconds(model, prompt: torch.Tensor, steps: int) -> float:
    """Wall time of `steps` greedy single-token steps after a prefill of `prompt` (the prefill is not timed)."""
    out = model(prompt, use_cache=True)
    cache, tok = out.cache, out.logits[:, -1:].argmax(-1)
    t0 = time.perf_counter()
    for _ in range(steps):
        out = model(tok, cache=cache, use_cache=True)
        cache, tok = out.cache, out.logits[:, -1:].argmax(-1)
    return time.perf_counter() - t0


def interleaved(fns: dict, repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            r = fn()
            times[k].append(r if isinstance(r, float) else time.perf_counter() - t0)
    return times


def saved_bytes(model, ids, autocast: bool) -> int:
    """Bytes autograd saves for backward during one training forward (each storage once; weights excluded)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        return saved_activation_bytes(
            model, lambda backward=False: model(input_ids=ids, labels=ids, use_cache=False).loss
        )


def train_memory(cfg: GPTNeoXConfig, seqs: tuple[int, int] = (128, 256)) -> dict:
    """Frozen-probe step memory of the injected model over the frozen base (whose embedding output requires
    grad), for an fp32 host under bf16 autocast (the trainer's default) and a bf16 host. Saved bytes are
    measured at two sequence lengths: the slope is the activation memory per token (per injected layer
    here), the rest is per step (weight casts autograd keeps for backward)."""
    L, (s1, s2) = cfg.num_hidden_layers, seqs
    confs = (
        {"float32": PreProjConfig(compute_dtype="float32"), "input": PreProjConfig()}
        if HAS_COMPUTE_DTYPE
        else {"float32": PreProjConfig()}
    )
    rows = {}
    for host_dtype, autocast in ((torch.float32, True), (torch.bfloat16, False)):
        torch.manual_seed(0)
        base = GPTNeoXForCausalLM(cfg).to(host_dtype).train().requires_grad_(False)
        base.get_input_embeddings().register_forward_hook(lambda m, a, o: o.requires_grad_(True))
        ids = {s: torch.randint(0, cfg.vocab_size, (1, s)) for s in seqs}
        ref = {s: saved_bytes(base, ids[s], autocast) for s in seqs}
        for name, pc in confs.items():
            inj = mmpreproj.inject(copy.deepcopy(base), pc).train()
            extra = {s: saved_bytes(inj, ids[s], autocast) - ref[s] for s in seqs}
            per_token = (extra[s2] - extra[s1]) / (s2 - s1)
            trainable = sum(p.numel() * p.element_size() for p in inj.parameters() if p.requires_grad)
            key = f"{'fp32 host + bf16 autocast' if autocast else 'bf16 host'}, compute {name}"
            rows[key] = {
                "activation_bytes_per_token_layer": per_token / L,
                "per_step_saved_mb": (extra[s1] - per_token * s1) / 2**20,
                "grads_adam_mb": 3 * trainable / 2**20,
            }
    return rows


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(PYTHIA_SHAPES), default="160m")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--no-memory", action="store_true", help="skip the training-memory measurement")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=50304, rotary_pct=0.25, **PYTHIA_SHAPES[args.shape])
    base = GPTNeoXForCausalLM(cfg).to(torch.bfloat16).eval()
    models = variants(base)
    ids = torch.randint(0, cfg.vocab_size, (1, args.seq))
    prompt = ids[:, :128]
    load_before = os.getloadavg()
    with torch.no_grad():
        flops = {k: count_flops(lambda m=m: m(ids, use_cache=False)) for k, m in models.items()}
        fwd = interleaved({k: (lambda m=m: m(ids, use_cache=False)) for k, m in models.items()}, args.repeats)
        dec = interleaved(
            {k: (lambda m=m: decode_seconds(m, prompt, args.decode)) for k, m in models.items()}, args.repeats
        )
    load_after = os.getloadavg()

    def summary(times):  # ratio: median over repeats of (variant / base) timed back to back in that repeat
        ratios = {k: [t / b for t, b in zip(v, times["base"])] for k, v in times.items()}
        return {
            k: {
                "ms": 1e3 * statistics.median(times[k]),
                "ratio": statistics.median(ratios[k]),
                "ratio_min": min(ratios[k]),
                "ratio_max": max(ratios[k]),
            }
            for k in times
        }

    result = {
        "shape": args.shape,
        "seq": args.seq,
        "decode_steps": args.decode,
        "repeats": args.repeats,
        "machine": machine(),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in load_after],
        "flop_ratio": flops[next(k for k in models if k != "base")] / flops["base"],
        "forward": summary(fwd),
        "decode": summary(dec),
    }
    print(
        f"bf16 GPT-NeoX {args.shape} shape, seq {args.seq}, decode {args.decode} steps after 128, "
        f"{result['machine']}, load avg {result['load_avg_before']} -> {result['load_avg_after']}"
    )
    print(f"matmul FLOP ratio (forward) {result['flop_ratio']:.3f}")
    print("| variant | forward ms | forward / base (min-max over repeats) | decode ms | decode / base |")
    print("|---|---|---|---|---|")
    for k in models:
        f, d = result["forward"][k], result["decode"][k]
        print(
            f"| {k} | {f['ms']:.0f} | {f['ratio']:.3f} ({f['ratio_min']:.2f}-{f['ratio_max']:.2f}) | "
            f"{d['ms']:.0f} | {d['ratio']:.3f} ({d['ratio_min']:.2f}-{d['ratio_max']:.2f}) |"
        )
    if not args.no_memory:
        result["train_memory"] = train_memory(cfg)
        print(f"frozen-probe step memory over the frozen base (d = {cfg.hidden_size}):")
        for k, r in result["train_memory"].items():
            b = r["activation_bytes_per_token_layer"]
            print(
                f"  {k:<42} activations {b:.0f} B/token/layer (= {b / cfg.hidden_size:.1f} bytes x d), "
                f"per step {r['per_step_saved_mb']:.0f} MB saved casts + {r['grads_adam_mb']:.0f} MB grads+AdamW"
            )
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
