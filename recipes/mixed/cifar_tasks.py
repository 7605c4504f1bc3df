"""The data of the mixed-modality recipe: CIFAR-10 images, a word tokenizer built in code, four question types.

    class   "<image> what is this ?"                        -> "<class>"              one 32x32 image
    row     "<image> which row holds the object ?"          -> first | second | third
    column  "<image> which column holds the object ?"       -> first | second | third
            a picture of R x C cells of 16x16 pixels (R, C in 1..3 at random, the asked axis >= 2): one cell
            holds a CIFAR image (downscaled 2x), the others noise
    which   "<image> <image> which one is a <class> ?"      -> first | second         two images, two classes

"row" and "column" need the picture's 2D layout: with the picture's width varying per question, a token's index in the
sequence alone does not say which column it is in. Images come from the shipped `assets/cifar10/{train,test}.zip`;
train questions use train images only, test questions test images only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from recipes.kit import load_image_zip
from recipes.mixed.tinyvlm import MarkerIds, MixedSample

__all__ = [
    "CLASSES",
    "QUESTION_TYPES",
    "Question",
    "WordTokenizer",
    "load_cifar",
    "make_question",
    "make_questions",
]

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
QUESTION_TYPES = ("class", "row", "column", "which")
SPECIALS = ("<pad>", "<image>", "<video>", "<vision_start>", "<vision_end>", "<eos>")
ORDINALS = ("first", "second", "third")
WORDS = (*CLASSES, *ORDINALS, "what", "is", "this", "?", "which", "row", "column", "holds", "the", "object", "one",
         "a")  # fmt: skip
CELL = 16  # pixels per side of a "where" cell
MEAN, STD = 0.5, 0.25  # pixel normalisation


class WordTokenizer:
    """Whitespace word tokenizer over a fixed vocabulary: the specials first, then `WORDS`."""

    def __init__(self, words: Sequence[str] = WORDS) -> None:
        self.vocab = [*SPECIALS, *words]
        self.ids = {w: i for i, w in enumerate(self.vocab)}
        self.markers = MarkerIds(image=self.ids["<image>"], video=self.ids["<video>"],
                                 vision_start=self.ids["<vision_start>"], vision_end=self.ids["<vision_end>"],
                                 pad=self.ids["<pad>"])  # fmt: skip
        self.eos = self.ids["<eos>"]

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        unknown = [w for w in text.split() if w not in self.ids]
        if unknown:
            raise ValueError(f"words not in the vocabulary: {unknown}")
        return [self.ids[w] for w in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self.vocab[i] for i in ids)


def load_cifar(root: str | Path, split: str, per_class: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images (N, 3, 32, 32) and labels (N,) indexing `CLASSES`, from `<root>/<split>.zip`.

    The first `per_class` images of each class are kept (`recipes.kit.load_image_zip`).
    """
    images, labels, classes = load_image_zip(Path(root) / f"{split}.zip", per_class)
    if tuple(classes) != CLASSES:
        raise ValueError(f"{root}/{split}.zip has classes {classes}, expected the CIFAR-10 classes {CLASSES}")
    return images, labels


@dataclass
class Question:
    """One sample and what it asks (for per-type accuracy)."""

    sample: MixedSample
    kind: str
    answer: int  # token id of the answer word


def _pixels(img: torch.Tensor) -> torch.Tensor:
    return (img.float() / 255 - MEAN) / STD  # (3, H, W)


def make_question(kind: str, images: torch.Tensor, labels: torch.Tensor, tok: WordTokenizer,
                  rng: random.Random) -> Question:  # fmt: skip
    """One question of `kind` about images drawn from (images, labels) with `rng`."""
    i = rng.randrange(len(images))
    if kind == "class":
        prompt, pics, answer = "<image> what is this ?", [_pixels(images[i])], CLASSES[int(labels[i])]
    elif kind in ("row", "column"):
        axis = kind
        cells = [rng.randint(2, 3), rng.randint(1, 3)]  # (asked axis, other axis)
        rows, cols = cells if axis == "row" else cells[::-1]
        r, c = rng.randrange(rows), rng.randrange(cols)
        g = torch.Generator().manual_seed(rng.randrange(2**31))
        picture = torch.rand(3, rows * CELL, cols * CELL, generator=g) * 255
        small = torch.nn.functional.avg_pool2d(images[i][None].float(), 32 // CELL)[0]  # (3, 16, 16)
        picture[:, r * CELL : (r + 1) * CELL, c * CELL : (c + 1) * CELL] = small
        prompt, pics = f"<image> which {axis} holds the object ?", [_pixels(picture)]
        answer = ORDINALS[r if axis == "row" else c]
    elif kind == "which":
        j = rng.randrange(len(images))
        while int(labels[j]) == int(labels[i]):
            j = rng.randrange(len(images))
        first = rng.random() < 0.5
        pics = [_pixels(images[i]), _pixels(images[j])] if first else [_pixels(images[j]), _pixels(images[i])]
        prompt, answer = (
            f"<image> <image> which one is a {CLASSES[int(labels[i])]} ?",
            "first" if first else "second",
        )
    else:
        raise ValueError(f"kind must be one of {QUESTION_TYPES}, got {kind!r}")
    ids = tok.encode(prompt)
    return Question(MixedSample(ids, images=pics, target_ids=[tok.ids[answer], tok.eos]), kind, tok.ids[answer])


def make_questions(n: int, images: torch.Tensor, labels: torch.Tensor, tok: WordTokenizer, seed: int,
                   kinds: Sequence[str] = QUESTION_TYPES) -> list[Question]:  # fmt: skip
    """n questions, kinds in turn, reproducible from `seed`."""
    rng = random.Random(seed)
    return [make_question(kinds[k % len(kinds)], images, labels, tok, rng) for k in range(n)]


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each next token; logits (B, S, vocab), labels (B, S) with -100 = not scored."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)


def train_loop(
    model: torch.nn.Module,
    cfg,
    images,
    labels,
    tok: WordTokenizer,
    loss_of: Callable[[list[MixedSample]], torch.Tensor],
) -> list[dict]:
    """AdamW with linear warmup and cosine decay; fresh random questions every step (the same stream for every
    arm, whatever the model: `loss_of(samples)` batches them the model's way and returns the loss)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)

    def lr_at(step: int) -> float:
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        return 0.5 * (1 + math.cos(math.pi * (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    rng = random.Random(cfg.seed + 1)
    log, running = [], 0.0
    model.train()
    for step in range(cfg.steps):
        kinds = rng.choices(QUESTION_TYPES, k=cfg.batch_size)
        loss = loss_of([make_question(k, images, labels, tok, rng).sample for k in kinds])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        running += loss.item()
        if (step + 1) % cfg.log_every == 0:
            log.append({"step": step + 1, "loss": running / cfg.log_every})
            print(f"  step {step + 1:5d}  loss {running / cfg.log_every:.4f}", flush=True)
            running = 0.0
    return log
