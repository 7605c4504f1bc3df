"""The data order: shuffled epochs, sharded by rank, addressable by position (so a resume lands exactly).

Every rank draws the same permutation for epoch e (a generator seeded with `seed + e`), pads it to a
multiple of the world size by repeating its head (like `DistributedSampler`), and keeps `perm[rank::world]`.
The epochs are chained into one endless stream per rank; micro-batch k is stream items
`[k * B, (k + 1) * B)`, crossing epoch borders, so every batch is full and no example is dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass
class ShardedOrder:
    """Endless, epoch-wise shuffled example indices for one rank.

    Args:
        num_examples: size of the data set.
        seed: epoch e is shuffled with `torch.Generator().manual_seed(seed + e)`.
        rank, world_size: this process's shard.
        shuffle: False keeps the file order (still sharded and padded).
    """

    num_examples: int
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    shuffle: bool = True
    _cache: dict[int, list[int]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.num_examples <= 0:
            raise ValueError(f"ShardedOrder: num_examples must be positive, got {self.num_examples}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"ShardedOrder: rank {self.rank} is outside world_size {self.world_size}")

    @property
    def per_rank(self) -> int:
        """Items per rank and epoch."""
        return math.ceil(self.num_examples / self.world_size)

    def epoch(self, e: int) -> list[int]:
        """This rank's indices for epoch `e`."""
        if e not in self._cache:
            if self.shuffle:
                perm = torch.randperm(
                    self.num_examples, generator=torch.Generator().manual_seed(self.seed + e)
                ).tolist()
            else:
                perm = list(range(self.num_examples))
            total = self.per_rank * self.world_size
            perm = (perm * math.ceil(total / len(perm)))[:total]  # pad by repeating the head
            self._cache = {e: perm[self.rank :: self.world_size]}  # keep one epoch
        return self._cache[e]

    def batch(self, position: int, batch_size: int) -> list[int]:
        """Indices of micro-batch number `position` (0-based) of size `batch_size`."""
        start = position * batch_size
        out = []
        for j in range(start, start + batch_size):
            e, i = divmod(j, self.per_rank)
            out.append(self.epoch(e)[i])
        return out
