"""One arm: what trains beside the projector, the training loop (per-step times), scoring, save and reload.

| method | trains | in the LM |
|---|---|---|
| `proj` | the projector | nothing (the LM frozen) |
| `proj+preproj_skip` | projector + pre-projection + skip | `inject(lm, PreProjConfig.for_budget(lm, budget))` |
| `proj+lora` | projector + LoRA on q, k, v, o | peft LoRA, rank matched to the adapter's trainable count |

Training: AdamW (no weight decay), linear warmup then cosine decay to 0, gradient norm clipped at 1, loss =
cross-entropy over the answer tokens (the answer and `<|im_end|>`). Every step appends one line
({"kind": "train", "cpu_s", "wall_s", ...}) to a JSONL file, so a run cut short still counts in the CPU-hours.
Scoring: answer cross-entropy per item (teacher forced) and exact match of the greedy answer (KV cache).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import peft
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.train.methods import host_shape, lora_per_rank, lora_targets
from mmpreproj.train.sizes import budget_params

from .model import VLM, answer_text
from .tasks import Encoder, Item

log = logging.getLogger("vlm-dinov2-smollm2")
METHODS = ("proj", "proj+preproj_skip", "proj+lora")
MAX_NEW_TOKENS = 4  # the longest answer is 2 tokens + <|im_end|>


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or inf (the LR is too large)."""


@dataclass
class Arm:
    """A VLM ready to train: `peft_model` is peft's wrapper around `vlm.lm` for LoRA (it saves the LoRA)."""

    vlm: VLM
    method: str
    params: dict[str, int]
    peft_model: nn.Module | None = None


def adapter_config(lm: nn.Module, budget: float) -> PreProjConfig:
    """Pre-projection + a low-rank skip at `budget` of the LM's parameters, base frozen."""
    return PreProjConfig.for_budget(lm, budget, freeze_base=True)


def matched_lora_rank(lm: nn.Module, budget: float) -> int:
    """The LoRA rank (q, k, v, o) whose trainable count is nearest the adapter's at `budget`."""
    cfg = adapter_config(lm, budget)
    dim, layers = host_shape(lm)
    sizes = {"expansion": cfg.expansion, "skip_rank": cfg.skip_rank}
    return max(1, round(budget_params(sizes, "preproj_skip", dim=dim, layers=layers) / lora_per_rank(lm)))


def build_arm(lm: nn.Module, vision_dim: int, method: str, *, budget: float, layout: str, seed: int) -> Arm:
    """The VLM of `method` on `lm` (a fresh copy of the base: it is changed in place), initialised from `seed`."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    torch.manual_seed(seed)
    lm.requires_grad_(False)
    vlm = VLM(lm, vision_dim, layout=layout)
    peft_model = None
    if method == "proj+preproj_skip":
        mmpreproj.inject(lm, adapter_config(lm, budget))
    elif method == "proj+lora":
        r = matched_lora_rank(lm, budget)
        lora = peft.LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=lora_targets(lm), bias="none")
        peft_model = peft.get_peft_model(lm, lora)  # LoRA layers go into `lm` in place
    projector = sum(p.numel() for p in vlm.projector.parameters())
    adapter = sum(p.numel() for p in lm.parameters() if p.requires_grad)
    return Arm(vlm, method, {"projector": projector, "adapter": adapter}, peft_model)


def save_arm(arm: Arm, folder: str | Path) -> None:
    """`projector.safetensors` and, for an adapter arm, `adapter/` (ours by `mmpreproj.save_adapter`, LoRA by
    peft's `save_pretrained`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = {k: v.contiguous() for k, v in arm.vlm.projector.state_dict().items()}
    save_file(weights, str(folder / "projector.safetensors"))
    if arm.method == "proj+preproj_skip":
        mmpreproj.save_adapter(arm.vlm.lm, folder / "adapter")
    elif arm.method == "proj+lora":
        arm.peft_model.save_pretrained(folder / "adapter")


def load_arm(lm: nn.Module, vision_dim: int, method: str, folder: str | Path, *, layout: str) -> Arm:
    """A saved arm onto `lm` (a fresh copy of the base), frozen, for inference."""
    folder = Path(folder)
    lm.requires_grad_(False)
    vlm = VLM(lm, vision_dim, layout=layout)
    vlm.projector.load_state_dict(load_file(str(folder / "projector.safetensors")))
    vlm.projector.requires_grad_(False)
    peft_model = None
    if method != "proj":
        loaded = mmpreproj.load_adapter(lm, folder / "adapter")  # ours in place; LoRA: a PeftModel around lm
        peft_model = loaded if loaded is not lm else None
    return Arm(vlm, method, {}, peft_model)


def trainable(arm: Arm) -> list[nn.Parameter]:
    return [p for p in arm.vlm.parameters() if p.requires_grad]


def lr_at(step: int, steps: int, warmup: int) -> float:
    """Linear warmup over `warmup` steps, then cosine decay to 0 at `steps` (a factor of the peak LR)."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


class Times:
    """Appends one JSON line per timed piece of work, tagged with this invocation (host, pid, start time)."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = None if path is None else Path(path)
        self.run = f"{os.uname().nodename}-{os.getpid()}-{int(time.time())}"

    def write(self, kind: str, cpu_s: float, wall_s: float, **extra: Any) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps({"run": self.run, "kind": kind, "cpu_s": cpu_s, "wall_s": wall_s, **extra}) + "\n")


def train_arm(
    arm: Arm,
    encoder: Encoder,
    feats: torch.Tensor,
    stream: Iterator[Item],
    *,
    steps: int,
    batch: int,
    lr: float,
    warmup: int,
    times: Times,
) -> list[float]:
    """Train `arm` for `steps` steps of `batch` items from `stream`; returns the per-step losses."""
    params = trainable(arm)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, steps, warmup))
    arm.vlm.train()
    device = params[0].device  # batches are built on the CPU and go where the arm is
    losses = []
    for step in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        b = encoder.batch([next(stream) for _ in range(batch)], feats, with_answer=True).to(device)
        loss = arm.vlm.loss(b)
        if not torch.isfinite(loss):
            raise NonFiniteLoss(f"loss {loss.item()} at step {step} (LR {lr:g})")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        times.write("train", time.process_time() - c0, time.perf_counter() - t0, step=step, loss=losses[-1])
        if (step + 1) % 50 == 0 or step + 1 == steps:
            log.info("step %d/%d loss %.4f (%.2f CPU s/step)", step + 1, steps, losses[-1], time.process_time() - c0)
    arm.vlm.eval()
    return losses


@torch.no_grad()
def score(
    arm: Arm,
    encoder: Encoder,
    feats: torch.Tensor,
    items: Sequence[Item],
    *,
    batch: int,
    times: Times,
    kind: str,
    with_loss: bool = True,
) -> dict[str, Any]:
    """Per item: exact match of the greedy answer (KV cache) and, `with_loss`, the answer cross-entropy
    (teacher forced), in the order of `items`; `acc` and `answer_ppl` (exp of the mean item loss) over them."""
    vlm = arm.vlm.eval()
    device = next(vlm.parameters()).device
    eos = encoder.end[0]
    loss = [0.0] * len(items)
    text = [""] * len(items)
    for i in range(0, len(items), batch):
        t0, c0 = time.perf_counter(), time.process_time()
        chunk = list(range(i, min(i + batch, len(items))))
        if with_loss:
            b = encoder.batch([items[j] for j in chunk], feats, with_answer=True).to(device)
            for j, v in zip(chunk, vlm.loss(b, per_item=True).tolist()):
                loss[j] = v
        by_len: dict[int, list[int]] = {}  # generation takes unpadded prompts: one batch per prompt length
        for j in chunk:
            by_len.setdefault(encoder.prompt_length(items[j]), []).append(j)
        for group in by_len.values():
            p = encoder.batch([items[j] for j in group], feats, with_answer=False).to(device)
            for j, t in zip(group, answer_text(encoder.tok, vlm.generate(p, MAX_NEW_TOKENS, eos), eos)):
                text[j] = t
        times.write(kind, time.process_time() - c0, time.perf_counter() - t0, n=len(chunk))
    correct = [float(t == it.answer) for t, it in zip(text, items)]
    res: dict[str, Any] = {"acc": sum(correct) / len(items), "items": {"item_correct": correct, "generated": text}}
    if with_loss:
        res["answer_ppl"] = math.exp(sum(loss) / len(items))
        res["items"]["item_loss"] = loss
    return res
