"""The paper's protocol for the paper's five methods on SmolLM2-135M-Instruct, on one GPU, in one script.

    make smollm2 && python recipes/smollm2/gpu_table2.py                 # ~10 min on one H100/H200-class GPU
    python recipes/smollm2/gpu_table2.py --dry-run --model tiny.gguf     # CPU check of the whole path

Protocol (`smollm2-135m` preset = the paper's, Sec. 3.2): frozen base in bf16, injected weights fp32, AdamW,
LR 1e-5 for every method, cosine with 50 warmup steps, 500 steps, effective batch 16 (4 x accum 4), 512
tokens, gradient checkpointing, seed 42, one run each. Two differences from the paper, said in the report:
the training lines are the first 1,500 WikiText-103 *validation* lines longer than 50 characters (the train
split is not shipped; the machine may be offline), so line PPL is measured on the first 300 *test* rows; and
ARC-Easy is scored only when its data can be reached (`--data-source hub`). LAMBADA and HellaSwag take the
first 500 examples, as the paper. Writes `--out` (default runs/smollm2-135m-gpu): table.md, report.md,
results.json and figures, through `mmpreproj.experiments.reproduce` (each arm restartable).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VALID_LINES = "assets/data/wikitext-103-raw/wiki.valid.raw.gz"


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/smollm2-135m-gpu", help="(default: %(default)s)")
    ap.add_argument("--model", default="smollm2-135m", help="model name, .gguf file or folder (default: %(default)s)")
    ap.add_argument("--data-source", choices=("local", "hub"), default="local")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="2 steps of 2 x 32 tokens, fp32, 8 examples per task: checks the path on a CPU in minutes",
    )
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(ROOT))
    from mmpreproj.experiments.reproduce import DEMO_METHODS, reproduce

    overrides = {"model": args.model, "data": str(ROOT / VALID_LINES), "data_config": None, "num_lines": 1500}
    eval_settings = {"ppl_split": "test", "tasks": ["ppl", "lambada", "hellaswag", "arc_easy"]}
    if args.dry_run:
        overrides.update(
            steps=2,
            warmup_steps=1,
            batch_size=2,
            grad_accum=1,
            max_len=32,
            precision="fp32",
            model_dtype="float32",
            gradient_checkpointing=False,
            device="cpu",
        )
        eval_settings["limit"] = 8
    t0 = time.time()
    reproduce(
        "smollm2-135m",
        args.out,
        DEMO_METHODS,
        eval_settings=eval_settings,
        data_source=args.data_source,
        train_overrides=overrides,
        progress=not args.dry_run,
        command="python recipes/smollm2/gpu_table2.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    )
    report = Path(args.out) / "report.md"
    print((Path(args.out) / "table.md").read_text())
    print(f"{time.time() - t0:.0f} s -> {report}")
    return report


if __name__ == "__main__":
    main()
