"""Supervised fine-tuning of the pre-projection with TRL's `SFTTrainer` on chat data, offline, on CPU.

The method, top to bottom:
  1. load the frozen base (`assets/mini-pythia`, fp32) and its tokenizer; give the tokenizer a plain chat
     template (the mini model was trained without one);
  2. build a chat dataset in code from the shipped HellaSwag subset (`assets/data`): the user turn is
     the activity and context, the assistant turn the correct ending;
  3. the method is TRL's `peft_config=PreProjConfig()` (or `--method preproj_lora`: a peft LoRA on top of
     an injection, passed in as the model);
  4. train with TRL's own `SFTTrainer`, with TRL's defaults (bf16 autocast, activation checkpointing) and
     the loss on the assistant's tokens only; checkpoints hold the adapter, `--resume` continues;
  5. save the final adapter to OUT/final (for preproj_lora peft's LoRA and, by the same
     `save_pretrained`, our injection in OUT/final/preproj), rebuild
     the model from a fresh base (`mmpreproj.load_adapter`), check the outputs.

    python recipes/integrations/sft_trainer.py --out runs/sft   # 60 steps: 141 CPU-s (measured, 2 cores)
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.kit`

import mmpreproj  # noqa: E402
from mmpreproj.data import hellaswag_examples  # noqa: E402
from mmpreproj.train import apply_method  # noqa: E402
from recipes.kit.recipe import parse_config  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
# One turn per line, each closed by eos; `{% generation %}` marks what TRL's assistant_only_loss trains on.
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<|assistant|> {% generation %}{{ m['content'] }}"
    "{{ eos_token }}{% endgeneration %}\n{% else %}<|{{ m['role'] }}|> {{ m['content'] }}{{ eos_token }}\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


@dataclass
class RecipeConfig:
    """Every knob of the run; the CLI is generated from these fields."""

    out: str = str(REPO / "runs" / "sft")
    model: str = str(REPO / "assets" / "mini-pythia")
    method: str = "preproj_skip"  # or "preproj_lora"
    lora_r: int = 8
    num_examples: int = 256  # HellaSwag rows turned into chats
    max_len: int = 128
    steps: int = 60
    batch_size: int = 8
    lr: float = 1e-3
    save_steps: int = 20
    seed: int = 0
    resume: bool = False  # continue from the last OUT/checkpoint-N


def build_chats(config: RecipeConfig) -> Dataset:
    rows = [
        {"messages": [
            {"role": "user", "content": f"{ex['activity_label']}: {ex['ctx']}"},
            {"role": "assistant", "content": ex["endings"][ex["label"]]},
        ]}
        for ex in hellaswag_examples(config.num_examples)
    ]  # fmt: skip
    return Dataset.from_list(rows)


def run(config: RecipeConfig) -> dict:
    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(config.model)
    tokenizer.chat_template = CHAT_TEMPLATE
    base = AutoModelForCausalLM.from_pretrained(config.model, dtype=torch.float32)
    if config.method == "preproj_skip":
        model, peft_config = base, mmpreproj.PreProjConfig()  # TRL wraps it: get_peft_model(base, peft_config)
    else:
        model, peft_config = apply_method(base, config.method, lora_r=config.lora_r), None
    args = SFTConfig(
        output_dir=config.out, max_steps=config.steps, per_device_train_batch_size=config.batch_size,
        learning_rate=config.lr, lr_scheduler_type="cosine", save_steps=config.save_steps,
        logging_steps=max(1, config.steps // 10), seed=config.seed, max_length=config.max_len,
        assistant_only_loss=True, report_to=[], use_cpu=not torch.cuda.is_available(), disable_tqdm=True,
    )  # fmt: skip
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=build_chats(config),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    model = trainer.model  # the PeftModel TRL built
    result = trainer.train(resume_from_checkpoint=True if config.resume else None)
    final = Path(config.out) / "final"
    trainer.save_model(str(final))  # preproj_lora: peft's LoRA, the injection a fresh base needs in preproj/
    summary = {"steps": trainer.state.global_step, "train_loss": result.training_loss, "final": str(final)}
    if trainer.is_world_process_zero():
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Baking cookies: A woman pours flour into a bowl. She"}],
            add_generation_prompt=True, return_dict=True,
        )  # fmt: skip
        x = torch.tensor([prompt["input_ids"]], device=model.device)
        fresh = AutoModelForCausalLM.from_pretrained(config.model, dtype=torch.float32).to(model.device)
        reloaded = mmpreproj.load_adapter(fresh, final).eval()
        model.eval()
        with torch.no_grad(), torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=args.bf16):
            # the trained model's forward still runs under the Trainer's autocast: compare like with like
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
