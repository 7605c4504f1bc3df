"""What the method costs on a real shape: SmolLM2-135M (30 layers, d=576), side by side in one run.

    make smollm2 && python bench/bench_smollm2.py [--batch 4] [--seq 128] [--repeats 3] [--dtypes fp32,bf16]
    python bench/bench_smollm2.py --model tiny.gguf --repeats 1          # any model name, .gguf or folder
    python bench/bench_smollm2.py --dtypes bf16 --batch 1 --seq 64       # bf16 on a CPU without AMX (~20x fp32)

Printed, for each dtype (fp32; bf16 = the base in bfloat16 under autocast, injected weights fp32, as the
paper's protocol), one frozen-probe training step (forward + backward + AdamW on what trains, base frozen) of:
- "base": the frozen base's forward + backward alone (gradients reach the input embeddings, nothing steps),
  the floor every frozen-probe method pays;
- "preproj_skip": the paper's size (expansion 1.25, full d x d skip);
- "preproj_skip@1%": pre-projection + rank-r skip at 1% of the base's parameters (`train.sizes`);
- "lora r=64" and "lora@1%": peft LoRA on the row's attention targets;
each as a ratio over "base" (medians of interleaved repeats, `common.interleaved_medians`). Then greedy decode
time per new token with the KV cache (prompt 64 tokens) over the base, in each dtype, and the peak resident memory of a
training step: each variant in its own subprocess, the peak RSS of two steps (VmHWM, reset after loading)
minus the RSS before them (Linux).
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
from common import interleaved_medians, machine, write_json
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mmpreproj.train import load_model  # noqa: E402
from mmpreproj.train.methods import apply_method, host_shape, lora_per_rank  # noqa: E402
from mmpreproj.train.sizes import sizes_for_budget  # noqa: E402

VARIANTS = ("base", "preproj_skip", "preproj_skip@1%", "lora r=64", "lora@1%")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def build(base: nn.Module, variant: str) -> nn.Module:
    """A deep copy of `base` with `variant` applied (the base frozen)."""
    model = copy.deepcopy(base)
    if variant == "base":
        return model.requires_grad_(False)
    dim, layers = host_shape(base)
    budget = round(0.01 * sum(p.numel() for p in base.parameters()))
    if variant == "preproj_skip":
        return apply_method(model, "preproj_skip")
    if variant == "preproj_skip@1%":
        return apply_method(
            model, "preproj_skip", sizes=sizes_for_budget("preproj_skip", budget, dim=dim, layers=layers)
        )
    if variant == "lora r=64":
        return apply_method(model, "lora", lora_r=64, lora_alpha=128)
    r = sizes_for_budget("lora", budget, dim=dim, layers=layers, lora_per_rank=lora_per_rank(base))["lora_r"]
    return apply_method(model, "lora", lora_r=r, lora_alpha=2 * r)


def step_fn(model: nn.Module, ids: torch.Tensor, dtype: str) -> Callable[[], None]:
    """One training step: forward + backward + AdamW on the trainable weights (for "base", backward to the
    input embeddings and no optimizer)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4) if params else None
    embed = model.get_input_embeddings()
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else nullcontext()

    def run() -> None:
        with cast:
            if opt is None:
                x = embed(ids).detach().requires_grad_(True)  # (B, N, d): the floor, backward through every layer
                loss = model(inputs_embeds=x, labels=ids).loss
            else:
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)

    return run


def decode_fn(model: nn.Module, prompt: torch.Tensor, new_tokens: int) -> Callable[[], None]:
    def run() -> None:
        with torch.no_grad():
            model.generate(
                prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0
            )

    return run


def peak_memory(args: argparse.Namespace, variant: str, dtype: str) -> float:
    """MB of resident memory a training step adds over the loaded model, measured in a fresh process."""
    cmd = [
        sys.executable,
        __file__,
        "--model",
        args.model,
        "--batch",
        str(args.batch),
        "--seq",
        str(args.seq),
        "--one",
        variant,
        "--dtypes",
        dtype,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["mb"]


def _status_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, in MB (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to clear_refs), so loading's peak is not counted."""
    Path("/proc/self/clear_refs").write_text("5")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--no-memory", action="store_true", help="skip the per-variant memory subprocesses")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one variant's peak memory
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dtypes = args.dtypes.split(",")
    if args.one:  # a child of peak_memory: load, measure, two steps, measure
        base = load_model(args.model, DTYPES[dtypes[0]])
        model = build(base, args.one)
        del base
        ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq))
        fn = step_fn(model, ids, dtypes[0])
        _reset_peak()
        before = _status_mb("VmRSS")
        fn()
        fn()
        print(json.dumps({"mb": _status_mb("VmHWM") - before}))
        return
    result: dict = {
        "machine": machine(),
        "model": args.model,
        "batch": args.batch,
        "seq": args.seq,
        "repeats": args.repeats,
        "train_step": {},
        "decode_per_token": {},
        "peak_mb": {},
    }
    for dtype in dtypes:
        base = load_model(args.model, DTYPES[dtype]).eval()
        ids = torch.randint(
            0, base.config.vocab_size, (args.batch, args.seq), generator=torch.Generator().manual_seed(0)
        )
        models = {v: build(base, v) for v in VARIANTS}
        times = interleaved_medians({v: step_fn(m, ids, dtype) for v, m in models.items()}, args.repeats, warmup=1)
        result["train_step"][dtype] = times
        print(f"\n{dtype}: training step, {args.batch} x {args.seq} tokens ({machine()})")
        print("| variant | trainable | seconds | over base |\n|---|---|---|---|")
        for v in VARIANTS:
            n = sum(p.numel() for p in models[v].parameters() if p.requires_grad) if v != "base" else 0
            print(f"| {v} | {n / 1e6:.2f}M | {times[v]:.2f} | {times[v] / times['base']:.2f}x |")
        prompt = ids[:1, :64]
        dec = {v: models[v] for v in ("base", "preproj_skip", "lora r=64")}
        dt = interleaved_medians(
            {v: decode_fn(m.eval(), prompt, args.decode_tokens) for v, m in dec.items()}, args.repeats, warmup=1
        )
        per = {v: t / args.decode_tokens for v, t in dt.items()}
        result["decode_per_token"][dtype] = per
        print(f"\n{dtype}: greedy decode, KV cache, prompt 64, {args.decode_tokens} new tokens")
        print("| variant | ms / token | over base |\n|---|---|---|")
        for v, t in per.items():
            print(f"| {v} | {1e3 * t:.1f} | {t / per['base']:.2f}x |")
        del models, base
        if not args.no_memory:
            mem = {v: peak_memory(args, v, dtype) for v in VARIANTS}
            result["peak_mb"][dtype] = mem
            print(f"\n{dtype}: resident memory a training step adds over the loaded model (own process each)")
            print("| variant | MB | over base |\n|---|---|---|")
            for v, mb in mem.items():
                ratio = f"{mb / mem['base']:.2f}x" if mem["base"] > 0 else "n/a"
                print(f"| {v} | {mb:.0f} | {ratio} |")
    write_json(args.json, result)


if __name__ == "__main__":
    main()
