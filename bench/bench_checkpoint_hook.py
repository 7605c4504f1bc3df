"""What the input-embedding hook costs a frozen-probe step under non-reentrant checkpointing (transformers hosts).

    python bench/bench_checkpoint_hook.py [--shape 160m|410m] [--seq 512] [--repeats 20] [--json out.json]

With every base weight frozen, reentrant checkpointing gives the injected weights no gradient unless the block
inputs require grad, so `mmpreproj.inject` hooks the input embeddings to make their output require grad while some
block may be checkpointed reentrantly (`hosts/checkpointing.py`). Which variant a transformers model uses is a
private attribute (`_gradient_checkpointing_func`); mmpreproj no longer reads it (docs/private-touchpoints.md), so
the hook is on under either variant there, as transformers' and peft's own input-grad hooks are. This script
measures what that costs where it was off before: non-reentrant checkpointing, as the trainer runs by default
(`mmpreproj.train.enable_checkpointing(model, reentrant=False)`). Two deep copies of one random-weight GPT-NeoX of
a Pythia shape, both injected with the default `PreProjConfig()`: "hook on" as inject leaves it, "hook off" with
one more hook after it that hands the blocks a detached embedding output (what reading the variant gave). Each
step is forward + backward at `--seq` tokens, batch 1, per precision (fp32, and bf16 autocast: the trainer's
default), the two taking turns (`common.interleaved_times`); the ratio is the median over repeats of on / off.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import warnings

import torch
import transformers as tf
from common import PYTHIA_SHAPES, interleaved_times, machine, write_json

import mmpreproj
from mmpreproj.train.models import enable_checkpointing


def build(hook_on: bool, base: tf.GPTNeoXForCausalLM) -> tf.GPTNeoXForCausalLM:
    """An injected, non-reentrantly checkpointed copy of `base`; without `hook_on`, the blocks get the embedding
    output detached (no input-grad hook of ours or transformers' has any effect)."""
    model = mmpreproj.inject(copy.deepcopy(base)).train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        enable_checkpointing(model, reentrant=False)
    if not hook_on:
        model.get_input_embeddings().register_forward_hook(lambda m, args, out: out.detach())
    return model


def step_fn(model: tf.GPTNeoXForCausalLM, ids: torch.Tensor, precision: str):
    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(ids, labels=ids).loss
        loss.backward()
        for p in model.parameters():
            p.grad = None

    return step


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(PYTHIA_SHAPES), default="160m")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()

    torch.manual_seed(0)
    cfg = tf.GPTNeoXConfig(vocab_size=50304, rotary_pct=0.25, **PYTHIA_SHAPES[args.shape])
    base = tf.GPTNeoXForCausalLM(cfg)
    models = {"hook off": build(False, base), "hook on": build(True, base)}
    ids = torch.randint(0, cfg.vocab_size, (1, args.seq), generator=torch.Generator().manual_seed(1))
    result = {"machine": machine(), "load_avg_before": list(os.getloadavg()), "shape": args.shape, "seq": args.seq}
    result["repeats"] = args.repeats
    print(f"non-reentrant checkpointing, {args.shape} shape, seq {args.seq}, {args.repeats} repeats, {machine()}")
    print("| precision | hook off, s | hook on, s | on / off, median (min-max) |")
    print("|---|---|---|---|")
    for precision in ("fp32", "bf16"):
        times = interleaved_times({k: step_fn(m, ids, precision) for k, m in models.items()}, args.repeats)
        ratios = [on / off for on, off in zip(times["hook on"], times["hook off"], strict=True)]
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = statistics.median(ratios)
        result[precision] = {"seconds": times, "ratio": ratio, "ratio_min": min(ratios), "ratio_max": max(ratios)}
        print(
            f"| {precision} | {med['hook off']:.3f} | {med['hook on']:.3f} | "
            f"{ratio:.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |"
        )
    result["load_avg_after"] = list(os.getloadavg())
    print(f"load avg {result['load_avg_before']} -> {result['load_avg_after']}")
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
