"""Frozen probe of a pretrained VLM: train only the injected pre-projection + skip on CIFAR-10 "what is it?" chats.

The method, top to bottom:
  1. load the model and its processor from a hub id (`Qwen/Qwen2-VL-2B-Instruct`) or a local folder; offline, or
     when the id is neither cached nor a folder, say so in one line and exit with status 2;
  2. build the data from the shipped `assets/cifar10/{train,test}.zip`: one chat per image, the user turn an image
     and "What is in the image? Answer with one word.", the assistant turn the class name (rendered by the
     processor's own chat template, images through its own image processor);
  3. `mmpreproj.inject` with the base frozen (`PreProjConfig(freeze_base=True, parts=...)`; default parts: the
     row's, both towers for Qwen2-VL); only the injected modules train (AdamW, constant LR after a short warmup);
  4. evaluate before and after on held-out test-split chats: mean cross-entropy over the answer tokens and the
     exact match of the greedy answer (argmax at every answer position = what greedy decoding would write);
  5. save the adapter (`mmpreproj.save_adapter`) and results.json under --out.

    .venv/bin/python recipes/vlm/frozen_probe.py --model Qwen/Qwen2-VL-2B-Instruct --dtype bfloat16 --out runs/vlm
    .venv/bin/python recipes/vlm/tiny_qwen2vl.py /tmp/tiny && \\
        .venv/bin/python recipes/vlm/frozen_probe.py --model /tmp/tiny --steps 20 --out /tmp/probe   # offline proof
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.kit`

import mmpreproj  # noqa: E402
from mmpreproj import PreProjConfig  # noqa: E402
from mmpreproj.data.assets import asset_path  # noqa: E402
from mmpreproj.data.model_source import pretrained_source  # noqa: E402
from mmpreproj.train.errors import ModelUnavailableError  # noqa: E402
from mmpreproj.train.models import unavailable_error  # noqa: E402  (offline check, one-line message)
from recipes.kit.data import load_image_zip  # noqa: E402
from recipes.kit.recipe import parse_config  # noqa: E402

__all__ = ["ProbeConfig", "build_chats", "evaluate", "load_vlm", "main"]

QUESTION = "What is in the image? Answer with one word."
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
HELP = {
    "model": "hub id or local folder holding the model and its processor",
    "data": "folder holding CIFAR-10 {train,test}.zip",
    "out": "run folder: adapter/ and results.json",
    "parts": "comma-separated host parts to inject, e.g. vision,language; empty = the host row's default",
    "dtype": "dtype of the frozen base: float32 or bfloat16 (injected weights stay float32)",
    "train_per_class": "training images per class (train split)",
    "test_per_class": "held-out images per class (test split) for the before/after evaluation",
    "steps": "optimizer steps",
}


@dataclass
class ProbeConfig:
    """Every knob of the run; the CLI is generated from these fields."""

    model: str = "Qwen/Qwen2-VL-2B-Instruct"  # hub id or local folder (model + processor)
    data: str = str(asset_path("cifar10"))  # a folder holding {train,test}.zip
    out: str = "runs/vlm-probe"
    parts: str = ""  # comma-separated host parts ("vision,language"); empty = the host row's default
    dtype: str = "float32"  # of the frozen base: float32 | bfloat16 (injected weights stay fp32)
    device: str = "cpu"
    seed: int = 0
    threads: int = 1
    train_per_class: int = 20
    test_per_class: int = 5
    steps: int = 100
    batch_size: int = 8
    lr: float = 3e-3
    warmup: int = 10

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"--dtype {self.dtype!r}; allowed values: {sorted(_DTYPES)}")
        for name in ("steps", "batch_size", "train_per_class", "test_per_class"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")


def load_vlm(name: str, dtype: str) -> tuple[torch.nn.Module, Any]:
    """(model, processor) from a hub id or folder; a one-line `ModelUnavailableError` when they cannot be reached."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    try:
        source, kwargs = pretrained_source(name)
        processor = AutoProcessor.from_pretrained(source, **kwargs)
        model = AutoModelForImageTextToText.from_pretrained(source, dtype=_DTYPES[dtype], **kwargs)
    except (OSError, ValueError) as err:
        raise unavailable_error("vision-language model", name, err) from None
    return model.eval(), processor


def build_chats(processor: Any, images: torch.Tensor, labels: torch.Tensor, classes: list[str]) -> list[dict]:
    """One chat per image: {"prompt": the rendered user turn + assistant header, "answer": class + end of turn,
    "image": uint8 (3, H, W), "label": int}."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    mark = "@@answer@@"
    end = processor.apply_chat_template(
        [*messages, {"role": "assistant", "content": mark}], add_generation_prompt=False
    ).rsplit(mark, 1)[-1]  # what the template writes after an assistant turn ("<|im_end|>\n" for ChatML)
    end = end.rstrip("\n")
    return [{"prompt": prompt, "answer": classes[int(y)] + end, "image": x, "label": int(y)}
            for x, y in zip(images, labels)]  # fmt: skip


def collate(processor: Any, chats: list[dict]) -> dict[str, torch.Tensor]:
    """Processor outputs for prompt + answer, right-padded, with `labels` = answer ids (-100 elsewhere)."""
    tok = processor.tokenizer
    side, tok.padding_side = tok.padding_side, "right"
    try:
        full = processor(text=[c["prompt"] + c["answer"] for c in chats], images=[c["image"] for c in chats],
                         padding=True, return_tensors="pt")  # fmt: skip
        prompts = processor(text=[c["prompt"] for c in chats], images=[c["image"] for c in chats],
                            padding=True, return_tensors="pt")  # fmt: skip
    finally:
        tok.padding_side = side
    n_prompt = prompts["attention_mask"].sum(1)  # (B,)
    ids, mask = full["input_ids"], full["attention_mask"]
    for b, n in enumerate(n_prompt.tolist()):
        if not torch.equal(ids[b, :n], prompts["input_ids"][b, :n]):
            raise ValueError(f"the tokenizer merges the prompt's end with the answer {chats[b]['answer']!r}")
    pos = torch.arange(ids.shape[1])[None]
    labels = torch.where((pos >= n_prompt[:, None]) & mask.bool(), ids, torch.full_like(ids, -100))
    return {**full, "labels": labels}


def _answer_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits predicting each answer token (N, vocab), the answer tokens (N,)) over the batch."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    logits = model(**inputs, use_cache=False).logits[:, :-1]  # (B, S-1, vocab): position s predicts s+1
    target = batch["labels"][:, 1:]
    keep = target != -100
    return logits[keep].float(), target[keep]


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Mean answer-token cross-entropy and the exact match of the greedy answer over `batches`."""
    model.eval()
    loss_sum, tokens, hits, chats = 0.0, 0, 0, 0
    for batch in batches:
        logits, target = _answer_logits(model, batch)
        loss_sum += F.cross_entropy(logits, target, reduction="sum").item()
        tokens += len(target)
        right = torch.zeros_like(batch["labels"][:, 1:], dtype=torch.bool)
        right[batch["labels"][:, 1:] != -100] = logits.argmax(-1) == target
        hits += int(((right | (batch["labels"][:, 1:] == -100)).all(1)).sum())
        chats += len(batch["labels"])
    return {"answer_loss": loss_sum / tokens, "exact_match": hits / chats}


def train(model: torch.nn.Module, cfg: ProbeConfig, processor: Any, chats: list[dict]) -> list[float]:
    """AdamW on the trainable (injected) parameters, linear warmup then constant; random batches of chats."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup)))
    rng, losses = random.Random(cfg.seed + 1), []
    model.train()
    for step in range(cfg.steps):
        batch = collate(processor, rng.sample(chats, min(cfg.batch_size, len(chats))))
        logits, target = _answer_logits(model, {k: v.to(cfg.device) for k, v in batch.items()})
        loss = F.cross_entropy(logits, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if (step + 1) % max(1, cfg.steps // 10) == 0:
            print(f"  step {step + 1:5d}  answer loss {loss.item():.4f}", flush=True)
    return losses


def run(cfg: ProbeConfig) -> dict:
    """The whole probe; raises `ModelUnavailableError` (one line) when the model cannot be loaded."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out)
    start, load = time.time(), os.getloadavg()
    train_x, train_y, classes = load_image_zip(Path(cfg.data) / "train.zip", cfg.train_per_class)  # before the model:
    test_x, test_y, _ = load_image_zip(Path(cfg.data) / "test.zip", cfg.test_per_class)  # a bad --data says so first
    model, processor = load_vlm(cfg.model, cfg.dtype)
    model.to(cfg.device)
    train_chats = build_chats(processor, train_x, train_y, classes)
    test_chats = build_chats(processor, test_x, test_y, classes)
    test = [{k: v.to(cfg.device) for k, v in collate(processor, test_chats[i : i + cfg.batch_size]).items()}
            for i in range(0, len(test_chats), cfg.batch_size)]  # fmt: skip
    print(f"{cfg.model}: {type(model).__name__}; {len(train_chats)} train / {len(test_chats)} test chats")

    before = evaluate(model, test)
    print(f"before: {before}", flush=True)
    parts = [p for p in cfg.parts.split(",") if p] or None
    mmpreproj.inject(model, PreProjConfig(freeze_base=True, parts=parts))
    report = mmpreproj.trainable_report(model)
    print(report, flush=True)
    t0 = time.time()
    losses = train(model, cfg, processor, train_chats)
    train_s = time.time() - t0
    after = evaluate(model, test)
    print(f"after:  {after}", flush=True)
    mmpreproj.save_adapter(model, out / "adapter")
    result = {"config": dataclasses.asdict(cfg), "before": before, "after": after, "train_losses": losses,
              "trainable": report.trainable, "injected_by_part": report.parts, "total_params": report.total,
              "train_s": train_s, "wall_s": time.time() - start, "loadavg_start": load}  # fmt: skip
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> dict:
    cfg = parse_config(ProbeConfig, argv, __doc__, help=HELP)
    try:
        return run(cfg)
    except ModelUnavailableError as err:
        print(f"frozen_probe: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.command`
    from recipes.command import run_main  # a refusal in one line naming its flags

    run_main(main)
