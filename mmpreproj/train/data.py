"""The paper's training data: the first N long-enough lines, one padded example each (or packed blocks).

    lines = select_lines(read_lines("wikitext", "wikitext-103-raw-v1"), num_lines=2000, min_chars=50)
    data = pad_lines(lines, tokenizer, max_len=512)        # (2000, 512) ids / mask / labels
    batch = data.batch([3, 1, 4, 1], trim=True)             # dict for model(**batch)

Labels are the input ids with padding masked (-100). Padding is found from each line's length, never by
token id: the pad token is eos, and a real eos inside a line keeps its label. The first pad position gets
no label either (the model is not taught to end a line), which is what the paper's collator did.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..data.hub import DataUnavailableError
from .sources import read_lines

IGNORE_INDEX = -100


def select_lines(lines: Iterable[str], num_lines: int = 2000, min_chars: int = 50) -> list[str]:
    """The first `num_lines` lines whose stripped text is longer than `min_chars` characters (unstripped)."""
    out = []
    for line in lines:
        if len(line.strip()) > min_chars:
            out.append(line)
            if len(out) == num_lines:
                break
    return out


@dataclass
class LMExamples:
    """Causal-LM examples as three aligned (N, L) int64 tensors.

    Args:
        input_ids: token ids, right-padded with the pad (eos) id.
        attention_mask: 1 on real tokens, 0 on padding.
        labels: input ids with every padding position set to `IGNORE_INDEX` (the model shifts them).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        shapes = {tuple(t.shape) for t in (self.input_ids, self.attention_mask, self.labels)}
        if len(shapes) != 1 or self.input_ids.dim() != 2:
            raise ValueError(
                f"LMExamples: input_ids, attention_mask, labels must share one (N, L) shape, got {shapes}"
            )

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def max_len(self) -> int:
        return self.input_ids.shape[1]

    def batch(self, indices: Sequence[int], *, trim: bool = True) -> dict[str, torch.Tensor]:
        """Rows `indices` as `{input_ids, attention_mask, labels}`, each (B, L'); `trim` cuts L' to the longest row.

        With right padding and causal attention, trimming changes no real token's logits or loss.
        """
        idx = torch.as_tensor(list(indices), dtype=torch.long)
        mask = self.attention_mask[idx]  # (B, L)
        width = int(mask.sum(1).max()) if trim else self.max_len
        return {
            "input_ids": self.input_ids[idx, :width],
            "attention_mask": mask[:, :width],
            "labels": self.labels[idx, :width],
        }

    @classmethod
    def random(cls, n: int, max_len: int, vocab_size: int, *, seed: int = 0, min_len: int | None = None) -> LMExamples:
        """Random token lines of random length in [min_len, max_len], padded with token 0 (for tests)."""
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab_size, (n, max_len), generator=g)
        lengths = torch.randint(min_len or max(2, max_len // 2), max_len + 1, (n,), generator=g)
        mask = (torch.arange(max_len)[None, :] < lengths[:, None]).long()
        return _masked(ids.masked_fill(mask == 0, 0), mask)


def _masked(ids: torch.Tensor, mask: torch.Tensor) -> LMExamples:
    return LMExamples(ids, mask, ids.masked_fill(mask == 0, IGNORE_INDEX))


def _eos_id(tokenizer: Any) -> int:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        eos = getattr(tokenizer, "pad_token_id", None)
    if eos is None:
        raise ValueError("the tokenizer has neither an eos nor a pad token; cannot pad or separate lines")
    return int(eos)


def _encode(lines: Sequence[str], tokenizer: Any, max_len: int | None = None) -> list[list[int]]:
    cut = {"truncation": True, "max_length": max_len} if max_len else {"verbose": False}  # no "too long" warning
    return tokenizer(list(lines), add_special_tokens=True, **cut)["input_ids"]


def pad_lines(lines: Sequence[str], tokenizer: Any, max_len: int = 512) -> LMExamples:
    """Each line tokenized alone, truncated and right-padded to `max_len` with pad = eos; padding unlabelled."""
    eos = _eos_id(tokenizer)
    encoded = [ids[:max_len] for ids in _encode(lines, tokenizer, max_len)]
    encoded = [ids for ids in encoded if ids]
    if not encoded:
        raise ValueError("no non-empty lines to train on")
    ids = torch.full((len(encoded), max_len), eos, dtype=torch.long)  # (N, L)
    mask = torch.zeros((len(encoded), max_len), dtype=torch.long)
    for i, row in enumerate(encoded):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return _masked(ids, mask)


def pack_lines(lines: Sequence[str], tokenizer: Any, max_len: int = 512) -> LMExamples:
    """Lines joined as `line eos line eos ...` and cut into full `max_len` blocks (the tail is dropped).

    Every position is a real token with a label, eos separators included; attention crosses line borders.
    """
    eos = _eos_id(tokenizer)
    stream: list[int] = []
    for ids in _encode(lines, tokenizer):
        stream.extend(ids)
        stream.append(eos)
    n = len(stream) // max_len
    if n == 0:
        raise ValueError(f"packing: {len(stream)} tokens do not fill one block of {max_len}")
    ids = torch.tensor(stream[: n * max_len], dtype=torch.long).view(n, max_len)  # (N, L)
    return _masked(ids, torch.ones_like(ids))


def build_examples(config: Any, tokenizer: Any) -> LMExamples:
    """Read, select and tokenize the training lines a `TrainConfig` names."""
    lines = select_lines(
        read_lines(config.data, config.data_config, split=config.data_split, text_field=config.text_field),
        config.num_lines,
        config.min_chars,
    )
    if not lines:
        raise DataUnavailableError(f"no line of {config.data!r} is longer than {config.min_chars} characters")
    make = pack_lines if config.packing else pad_lines
    return make(lines, tokenizer, config.max_len)
