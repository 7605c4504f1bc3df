"""The paper's protocol for the paper's five methods on SmolLM2-135M-Instruct, on one GPU, in one script.

    make smollm2 && python recipes/smollm2/gpu_table2.py                 # the paper's 4 x accum 4, checkpointed
    python recipes/smollm2/gpu_table2.py --micro-batch 16 --no-checkpointing   # the same batch of 16, faster
    python recipes/smollm2/gpu_table2.py --dry-run --model tiny.gguf     # CPU check of the whole path
    python recipes/smollm2/gpu_table2.py --methods preproj_skip,lora --lrs 1e-4,3e-4 --micro-batch 16 \
        --no-checkpointing --out runs/smollm2-gpu-lrs          # each method's LR picked on held-out rows

Protocol (`smollm2-135m` preset = the paper's, Sec. 3.2): frozen base in bf16, injected weights fp32, AdamW,
LR 1e-5 for every method, cosine with 50 warmup steps, 500 steps, effective batch 16 (4 x accum 4), 512
tokens, gradient checkpointing, seed 42, one run each. `--micro-batch 16 --no-checkpointing` takes the same 16
sequences a step in one pass (the paper accumulates only to fit its GPU's memory; checkpointing recomputes the
same values), so only the order of float additions differs. Two differences from the paper, said in the
report: the training lines are the first 1,500 WikiText-103 *validation* lines longer than 50 characters (the
train split is not shipped; the machine may be offline), so line PPL is measured on the first 300 *test* rows;
and ARC-Easy is scored only when its data can be reached (`--data-source hub`). LAMBADA takes its first 500
examples, as the paper; HellaSwag the first 500 of the offline copy (a random 1,000-example validation subset).
Writes `--out` (default runs/smollm2-135m-gpu): table.md, report.md, results.json and figures, through
`mmpreproj.experiments.reproduce` (each arm restartable). With `--lrs`, the protocol is the same but each method
trains at every listed LR, the LR with the best line PPL on held-out validation rows (never trained on, never
tested) is picked, and only the picked arm is scored on the test tasks: `mmpreproj.experiments.study` with
`--lrs` as the start LRs and no extension, writing report.md and study.json under `--out`. Run once (LR 1e-5)
on an H200, 7.5 min with `--micro-batch 16 --no-checkpointing`: docs/evidence/smollm2-135m/gpu/README.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from mmpreproj.train.presets import get_preset  # noqa: E402  (after the repository is on the path)

PRESET = "smollm2-135m"  # the paper's protocol on this model (mmpreproj_tables/tables.py)
VALID_LINES = "assets/data/wikitext-103-raw/wiki.valid.raw.gz"
_PAPER = get_preset(PRESET)
EFFECTIVE_BATCH = _PAPER.batch_size * _PAPER.grad_accum  # the paper's sequences per optimizer step (16)
MICRO_BATCHES = tuple(b for b in range(1, EFFECTIVE_BATCH + 1) if EFFECTIVE_BATCH % b == 0)


def train_overrides(args: argparse.Namespace) -> dict:
    """The `smollm2-135m` preset's fields this invocation changes (model, data, device, batch split, dry run)."""
    from mmpreproj.train.models import check_device_present, resolve_device

    check_device_present(args.device)  # `--device cuda` on a machine without one: one line, before anything loads
    overrides = {
        "model": args.model,
        "data": str(ROOT / VALID_LINES),
        "data_config": None,
        "num_lines": 1500,
        "device": args.device,
        "batch_size": args.micro_batch,
        "grad_accum": EFFECTIVE_BATCH // args.micro_batch,
    }
    if args.no_checkpointing:
        overrides["gradient_checkpointing"] = False
    if getattr(args, "steps", None):
        overrides["steps"] = args.steps
    if args.dry_run:
        overrides.update(steps=2, warmup_steps=1, batch_size=2, grad_accum=1, max_len=32)
        if resolve_device(args.device).type == "cpu":  # bf16 autocast is slow on a CPU; the dtype path is the GPU's
            overrides.update(precision="fp32", model_dtype="float32", gradient_checkpointing=False, device="cpu")
    return overrides


def build_parser() -> argparse.ArgumentParser:
    """The command line (`--help` prints the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/smollm2-135m-gpu", help="(default: %(default)s)")
    ap.add_argument("--model", default="smollm2-135m", help="model name, .gguf file or folder (default: %(default)s)")
    ap.add_argument(
        "--data-source",
        choices=("local", "hub"),
        default="local",
        help="evaluation data: the shipped files (local) or the Hugging Face Hub (default: %(default)s)",
    )
    ap.add_argument("--device", default="auto", help="'auto', 'cuda', 'cuda:N' or 'cpu' (default: %(default)s)")
    ap.add_argument(
        "--micro-batch",
        type=int,
        choices=MICRO_BATCHES,
        default=_PAPER.batch_size,
        help=f"sequences per forward pass; accumulation makes up {EFFECTIVE_BATCH} a step (default: %(default)s)",
    )
    ap.add_argument("--no-checkpointing", action="store_true", help="train without gradient checkpointing")
    ap.add_argument("--steps", type=int, default=None, help=f"optimizer steps (default: the paper's {_PAPER.steps})")
    ap.add_argument(
        "--methods",
        default=None,
        help="comma-separated methods, trained in this order (default: the paper's five)",
    )
    ap.add_argument(
        "--lrs",
        default=None,
        help="comma-separated LRs: each method trains at each, the best on held-out rows is tested "
        "(default: the paper's 1e-5 for every method)",
    )
    ap.add_argument("--no-progress", action="store_true", help="no progress bars (one log line an arm)")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="2 steps of 2 x 32 tokens, 8 examples per task (fp32 on a CPU): checks the path in minutes",
    )
    return ap


def main(argv: list[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from mmpreproj.experiments.reproduce import DEMO_METHODS, reproduce

    overrides = train_overrides(args)
    if args.lrs:
        return _lr_round(args, overrides)
    eval_settings = {"ppl_split": "test", "tasks": ["ppl", "lambada", "hellaswag", "arc_easy"]}
    if args.dry_run:
        eval_settings["limit"] = 8
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    t0 = time.time()
    reproduce(
        PRESET,
        args.out,
        args.methods.split(",") if args.methods else DEMO_METHODS,
        eval_settings=eval_settings,
        data_source=args.data_source,
        train_overrides=overrides,
        progress=not (args.dry_run or args.no_progress),
        command="python recipes/smollm2/gpu_table2.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    )
    report = Path(args.out) / "report.md"
    print((Path(args.out) / "table.md").read_text())
    print(f"{time.time() - t0:.0f} s -> {report}")
    return report


def parse_lrs(text: str) -> tuple[float, ...]:
    """`--lrs 1e-4,3e-4` -> (1e-4, 3e-4); a value that is not a positive number is refused naming it."""
    lrs = []
    for part in text.split(","):
        try:
            lr = float(part)
        except ValueError:
            lr = -1.0
        if not lr > 0:
            raise SystemExit(f"gpu_table2: --lrs: {part!r} is not a positive learning rate (e.g. --lrs 1e-4,3e-4)")
        lrs.append(lr)
    return tuple(lrs)


def _lr_round(args: argparse.Namespace, overrides: dict) -> Path:
    """Each method at each of `--lrs`, the held-out pick scored on the test tasks (`experiments.study`)."""
    from mmpreproj.experiments.study import Group, study
    from mmpreproj.experiments.study_report import write_report

    lrs = parse_lrs(args.lrs)
    methods = args.methods.split(",") if args.methods else ["preproj_skip", "lora"]
    groups = [Group(m, m, lrs, seeds=1) for m in methods]
    out = Path(args.out)
    t0 = time.time()
    s = study(PRESET, out, out / "runs", groups=groups, max_extend=0, overrides=overrides,
              limit=8 if args.dry_run else None, poll_seconds=1.0)  # fmt: skip
    report = write_report(s, (f"The paper's protocol (preset {PRESET}); each method's LR picked from {list(lrs)} "
                              "on held-out validation rows.",))  # fmt: skip
    print(f"{time.time() - t0:.0f} s -> {report}")
    return report


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.command`
    from recipes.command import run_main  # a refusal in one line naming its flags

    run_main(main)
