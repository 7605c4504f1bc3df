"""Questions about CIFAR images, as chat turns of SmolLM2, and their batches with (t, h, w) positions.

Two tasks, both answered by generation:

| task | the user turn (after the image tokens) | answer |
|---|---|---|
| class | What is in the picture? Answer with one word. | the CIFAR class name ("dog") |
| mosaic | Where is the ship: top left, top right, bottom left or bottom right? | "top left", ... |
| where | Where is the picture: top left, top right, bottom left or bottom right? | "top left", ... |

A mosaic is four images of four different classes, each encoded alone by the tower (as LLaVA-NeXT's AnyRes
tiles), pooled to g x g tokens and laid out as one 2g x 2g grid: where a tile is can only come from the
positions the language model gives its tokens. `where` is the same grid with one image and three empty tiles
(zero features): the answer is where the content is, with no class to bind to a place (the mosaic asks both).
The turn is SmolLM2's chat format without the system prompt:

    <|im_start|>user\\n[image tokens]\\n{question}<|im_end|>\\n<|im_start|>assistant\\n{answer}<|im_end|>

Positions ("2d"): `multimodal_positions` of [text, image (H, W), text] (Qwen2-VL's rule: image tokens on
(row, column) offset by the text before, text after at start + max(H, W)); "1d": every token counts up
(raster order over the image), the same on all three axes.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mmpreproj.rope import multimodal_positions

TASKS = ("class", "mosaic", "where")
POSITIONS = ("2d", "1d")
WHERE = ("top left", "top right", "bottom left", "bottom right")  # tile order in a mosaic item
USER, ASSISTANT, END = "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>"
CLASS_QUESTION = "What is in the picture? Answer with one word."
WHERE_QUESTION = "Where is the picture: top left, top right, bottom left or bottom right?"


def mosaic_question(name: str) -> str:
    return f"Where is the {name}: top left, top right, bottom left or bottom right?"


@dataclass(frozen=True)
class Item:
    """One question: `images` index the split's features (1 for class and where; 4 for a mosaic, in `WHERE` order)."""

    images: tuple[int, ...]
    question: str
    answer: str

    @property
    def tile(self) -> int:
        """Where a `where` item's one image sits (its answer's index in `WHERE`)."""
        return WHERE.index(self.answer)


def class_items(labels: torch.Tensor, indices: Sequence[int], classes: Sequence[str]) -> list[Item]:
    return [Item((i,), CLASS_QUESTION, classes[int(labels[i])]) for i in indices]


def mosaic_item(
    labels: torch.Tensor, by_class: list[list[int]], classes: Sequence[str], rng: random.Random, where: int
) -> Item:
    """Four images of four different classes; the asked class sits at tile `where`."""
    picked = rng.sample(range(len(classes)), 4)  # picked[where] is the asked class
    images = tuple(rng.choice(by_class[c]) for c in picked)
    return Item(images, mosaic_question(classes[picked[where]]), WHERE[where])


def _by_class(labels: torch.Tensor, indices: Sequence[int], n_classes: int) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(n_classes)]
    for i in indices:
        out[int(labels[i])].append(i)
    return out


def mosaic_items(
    labels: torch.Tensor, indices: Sequence[int], classes: Sequence[str], n: int, seed: int
) -> list[Item]:
    """A fixed set of `n` mosaics from `indices`, each answer n / 4 times (held-out and test sets)."""
    rng, by_class = random.Random(seed), _by_class(labels, indices, len(classes))
    return [mosaic_item(labels, by_class, classes, rng, i % 4) for i in range(n)]


def where_items(indices: Sequence[int], n: int, seed: int) -> list[Item]:
    """A fixed set of `n` `where` items from `indices`, each place n / 4 times (held-out and test sets)."""
    rng = random.Random(seed)
    return [Item((rng.choice(list(indices)),), WHERE_QUESTION, WHERE[i % 4]) for i in range(n)]


def item_stream(
    task: str, labels: torch.Tensor, indices: Sequence[int], classes: Sequence[str], seed: int
) -> Iterator[Item]:
    """Training questions forever: class items in shuffled epochs, or fresh random mosaics / `where` items."""
    rng = random.Random(seed)
    if task == "class":
        order = list(indices)
        while True:
            rng.shuffle(order)
            yield from class_items(labels, order, classes)
    if task == "where":
        while True:
            yield Item((rng.choice(list(indices)),), WHERE_QUESTION, WHERE[rng.randrange(4)])
    by_class = _by_class(labels, indices, len(classes))
    while True:
        yield mosaic_item(labels, by_class, classes, rng, rng.randrange(4))


def image_tokens(task: str, feats: torch.Tensor, item: Item, tile: int) -> torch.Tensor:
    """(H, W, D) image tokens of an item: the image's own grid, or the 2 x 2 tiles pooled to `tile` x `tile`
    (`where`: the image's tile at its place, zeros in the three others)."""
    if task == "class":
        return feats[item.images[0]]
    g = feats.shape[1]
    if g % tile:
        raise ValueError(f"tile {tile} must divide the cached grid {g}")
    tiles = F.avg_pool2d(feats[list(item.images)].permute(0, 3, 1, 2), g // tile).permute(0, 2, 3, 1)  # (k, t, t, D)
    if task == "where":  # one image at its place, three empty tiles
        empty = torch.zeros(4, *tiles.shape[1:], dtype=tiles.dtype)
        empty[item.tile] = tiles[0]
        tiles = empty  # (4, t, t, D)
    top, bottom = torch.cat([tiles[0], tiles[1]], 1), torch.cat([tiles[2], tiles[3]], 1)  # (t, 2t, D)
    return torch.cat([top, bottom], 0)  # (2t, 2t, D)


@dataclass
class Batch:
    """Right-padded sequences: ids (B, N) (image slots and padding hold `pad`), image_mask (B, N), image
    (B, H*W, D) tokens in raster order, position_ids (3, B, N), attention_mask (B, N), targets (B, N) (the next
    token where it is an answer token, else -100), next_position (B,): where generated token 0 sits (prompt
    batches), answers."""

    ids: torch.Tensor
    image_mask: torch.Tensor
    image: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor
    next_position: torch.Tensor
    answers: list[str]

    def to(self, device: torch.device) -> Batch:
        """The same batch with every tensor on `device` (itself when they are there already)."""
        if self.ids.device == device:
            return self
        moved = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return Batch(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in moved.items()})


class Encoder:
    """Token ids of the chat pieces (cached per question), and batches of items."""

    def __init__(self, tokenizer, task: str, positions: str, tile: int = 2) -> None:
        if task not in TASKS or positions not in POSITIONS:
            raise ValueError(f"task must be one of {TASKS} and positions one of {POSITIONS}, got {task}, {positions}")
        self.tok, self.task, self.positions, self.tile = tokenizer, task, positions, tile
        self.end = self._ids(END)
        self.pad = self.end[0]
        self.pre = self._ids(USER)
        self._cache: dict[str, list[int]] = {}

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def ids(self, text: str) -> list[int]:
        if text not in self._cache:
            self._cache[text] = self._ids(text)
        return self._cache[text]

    def answer_ids(self, answer: str) -> list[int]:
        return self.ids(answer) + self.end

    def prompt_length(self, item: Item) -> int:
        """Text tokens of the prompt (its image tokens, as many for every item of a task, not counted)."""
        return len(self.pre) + len(self.ids("\n" + item.question + ASSISTANT))

    def batch(self, items: Sequence[Item], feats: torch.Tensor, with_answer: bool) -> Batch:
        grids = [image_tokens(self.task, feats, it, self.tile) for it in items]  # (H, W, D) each
        h, w, _ = grids[0].shape
        seqs, pos, starts, nexts = [], [], [], []
        for it in items:
            post = self.ids("\n" + it.question + ASSISTANT)
            ans = self.answer_ids(it.answer) if with_answer else []
            n_pre, n_img = len(self.pre), h * w
            seqs.append(self.pre + [self.pad] * n_img + post + ans)
            if self.positions == "2d":
                p, delta = multimodal_positions([("text", n_pre), ("image", (h, w)), ("text", len(post) + len(ans))])
            else:
                p, delta = torch.arange(len(seqs[-1]))[:, None].expand(-1, 3), 0
            pos.append(p)  # (n, 3)
            starts.append(n_pre + n_img + len(post))  # first answer token
            nexts.append(len(seqs[-1]) + delta)
        n = max(map(len, seqs))
        b = len(items)
        ids = torch.full((b, n), self.pad, dtype=torch.long)
        mask = torch.zeros(b, n, dtype=torch.long)
        targets = torch.full((b, n), -100, dtype=torch.long)
        position_ids = torch.zeros(3, b, n, dtype=torch.long)
        image_mask = torch.zeros(b, n, dtype=torch.bool)
        for i, (s, p) in enumerate(zip(seqs, pos)):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
            position_ids[:, i, : len(s)] = p.T
            position_ids[:, i, len(s) :] = p[-1, 0] + 1 + torch.arange(n - len(s))  # padding: never attended
            image_mask[i, len(self.pre) : len(self.pre) + h * w] = True
            if with_answer:
                targets[i, starts[i] - 1 : len(s) - 1] = ids[i, starts[i] : len(s)]
        image = torch.stack([g.reshape(h * w, -1) for g in grids])  # (B, H*W, D)
        return Batch(
            ids, image_mask, image, position_ids, mask, targets, torch.tensor(nexts), [it.answer for it in items]
        )
