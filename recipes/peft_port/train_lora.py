"""Fine-tune the shipped mini Pythia on WikiText with a plain transformers `Trainer` and a peft adapter.

`train_lora.py` (LoRA) and `train_preproj.py` (pre-projection + content skip, mmpreproj) are the same script
but for the config line and its import (`diff train_lora.py train_preproj.py` in this folder).

    python recipes/peft_port/train_lora.py --max-steps 60   # OUT = runs/peft-port/<script name>
"""

import argparse  # noqa: I001  (the config class is imported on a line of its own: the port changes that line)
import gzip
from pathlib import Path

import torch
from datasets import Dataset
from peft import LoraConfig
from peft import get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "assets" / "mini-pythia"
WIKITEXT = REPO / "assets" / "data" / "wikitext-103-raw" / "wiki.valid.raw.gz"


def wikitext_blocks(tokenizer, num_lines: int, max_len: int) -> Dataset:
    """The first `num_lines` WikiText validation lines of over 50 characters (no headings), each followed by
    EOS, joined and cut into blocks of `max_len` tokens; every position is a label."""
    with gzip.open(WIKITEXT, "rt", encoding="utf-8") as f:
        lines = [s.strip() for s in f if len(s.strip()) > 50 and not s.strip().startswith("=")][:num_lines]
    ids = [t for line in lines for t in tokenizer(line)["input_ids"] + [tokenizer.eos_token_id]]
    rows = [ids[i : i + max_len] for i in range(0, len(ids) - max_len + 1, max_len)]  # (N, max_len)
    return Dataset.from_dict({"input_ids": rows, "labels": rows})


def positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    if not text.strip().isdecimal() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be an integer >= 1")
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "runs" / "peft-port" / Path(__file__).stem), help="run folder")
    parser.add_argument("--max-steps", type=positive, default=60, help="optimizer steps (default: %(default)s)")
    parser.add_argument("--num-lines", type=positive, default=512, help="WikiText lines (default: %(default)s)")
    parser.add_argument("--max-len", type=positive, default=128, help="tokens per block (default: %(default)s)")
    args = parser.parse_args()

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["query_key_value"], task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    model.print_trainable_parameters()

    training = TrainingArguments(
        output_dir=args.out, max_steps=args.max_steps, per_device_train_batch_size=8, learning_rate=1e-3,
        lr_scheduler_type="cosine", logging_steps=max(1, args.max_steps // 10),
        save_steps=max(1, args.max_steps // 3), report_to=[], seed=0, use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
    )  # fmt: skip
    data = wikitext_blocks(tokenizer, args.num_lines, args.max_len)
    trainer = Trainer(model=model, args=training, train_dataset=data)
    trainer.train()
    model.save_pretrained(Path(args.out) / "final")  # adapter_config.json + adapter_model.safetensors


if __name__ == "__main__":
    main()
