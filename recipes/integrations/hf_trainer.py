"""Train the pre-projection + content skip with transformers' `Trainer` on the shipped mini Pythia, offline.

The method, top to bottom:
  1. load the frozen base (`assets/mini-pythia`, fp32) and its tokenizer;
  2. add the modules: `peft.get_peft_model(base, PreProjConfig())`, the one line that differs from a peft
     LoRA script; `--method preproj_lora` puts a peft LoRA on top of an injection instead;
  3. cut WikiText lines (`assets/data`) into fixed blocks of `max_len` tokens;
  4. train with transformers' own `Trainer`: checkpoints under OUT/checkpoint-N hold the adapter (peft's
     path), not the base, and `--resume` continues from the last one (weights, optimizer, scheduler, RNG,
     data order);
  5. save the final adapter to OUT/final (for preproj_lora peft's LoRA and, by the same
     `save_pretrained`, our injection in OUT/final/preproj), rebuild
     the model from a fresh base and that folder (`mmpreproj.load_adapter`), check that it gives the
     trained model's outputs.

    python recipes/integrations/hf_trainer.py --out runs/hf-trainer   # 60 steps: 93 CPU-s (measured, 2 cores)
    accelerate launch --multi_gpu --num_processes 2 recipes/integrations/hf_trainer.py --out runs/hf-ddp
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from datasets import Dataset
from peft import get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.kit`

import mmpreproj  # noqa: E402
from mmpreproj.data import wikitext_lines  # noqa: E402
from mmpreproj.train import apply_method  # noqa: E402
from mmpreproj.train.data import pack_lines, select_lines  # noqa: E402
from mmpreproj_tables.sources import check_hub_model  # noqa: E402
from recipes.kit.recipe import parse_config  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@dataclass
class RecipeConfig:
    """Every knob of the run; the CLI is generated from these fields."""

    out: str = str(REPO / "runs" / "hf-trainer")
    model: str = str(REPO / "assets" / "mini-pythia")
    method: str = "preproj_skip"  # or "preproj_lora" (peft LoRA r=lora_r on top of the pre-projection)
    lora_r: int = 8
    num_lines: int = 512  # WikiText validation lines longer than 50 characters
    max_len: int = 128
    steps: int = 60
    batch_size: int = 8  # per process
    lr: float = 1e-3
    save_steps: int = 20
    seed: int = 0
    resume: bool = False  # continue from the last OUT/checkpoint-N


def build_model(config: RecipeConfig):
    base = AutoModelForCausalLM.from_pretrained(config.model, dtype=torch.float32)
    if config.method == "preproj_skip":
        return get_peft_model(base, mmpreproj.PreProjConfig())  # pre-projection + content skip, base frozen
    return apply_method(base, config.method, lora_r=config.lora_r)


def build_data(config: RecipeConfig, tokenizer) -> Dataset:
    lines = select_lines(wikitext_lines("validation"), config.num_lines, min_chars=50)
    blocks = pack_lines(lines, tokenizer, config.max_len)  # (N, max_len), every position a label
    return Dataset.from_dict({"input_ids": blocks.input_ids.tolist(), "labels": blocks.labels.tolist()})


def run(config: RecipeConfig) -> dict:
    check_hub_model(config.model, f"--model {config.model}")  # offline and not cached: one line, no retries
    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(config.model)
    model = build_model(config)
    args = TrainingArguments(
        output_dir=config.out, max_steps=config.steps, per_device_train_batch_size=config.batch_size,
        learning_rate=config.lr, lr_scheduler_type="cosine", warmup_steps=0, weight_decay=0.0,
        save_steps=config.save_steps, logging_steps=max(1, config.steps // 10), seed=config.seed,
        report_to=[], use_cpu=not torch.cuda.is_available(), disable_tqdm=True,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=build_data(config, tokenizer), processing_class=tokenizer)
    result = trainer.train(resume_from_checkpoint=True if config.resume else None)
    final = Path(config.out) / "final"
    trainer.save_model(str(final))  # the adapter (preproj_lora: peft's LoRA, ours in preproj/), the tokenizer
    summary = {"steps": trainer.state.global_step, "train_loss": result.training_loss, "final": str(final)}
    if trainer.is_world_process_zero():
        model.eval()
        x = torch.tensor([tokenizer("It was a dark and stormy night")["input_ids"]], device=model.device)
        fresh = AutoModelForCausalLM.from_pretrained(config.model, dtype=torch.float32).to(model.device)
        reloaded = mmpreproj.load_adapter(fresh, final).eval()
        with torch.no_grad():
            summary["reload_max_diff"] = float((reloaded(x).logits - model(x).logits).abs().max())
        (Path(config.out) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps(summary))
    return summary


def main(argv: list[str] | None = None) -> dict:
    return run(parse_config(RecipeConfig, argv, __doc__))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.command`
    from recipes.command import run_main  # a refusal in one line naming its flags

    run_main(main)
