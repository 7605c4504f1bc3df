"""Per-token coordinates: grids (row-major, t-major) and Qwen2-VL multimodal sequences."""

from __future__ import annotations

from collections.abc import Sequence

import torch

SEGMENT_KINDS: tuple[str, ...] = ("text", "image", "video")
"""The segment kinds `multimodal_positions` places: text runs, image grids, video grids."""
_GRID_AXES = {"image": ("h", "w"), "video": ("t", "h", "w")}


def _is_positive_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def grid_positions(*sizes: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Integer coordinates of a grid, flattened row-major (t-major for video).

    `grid_positions(h, w)` -> LongTensor `(h*w, 2)` of (row, column);
    `grid_positions(t, h, w)` -> LongTensor `(t*h*w, 3)` of (t, row, column).
    """
    if not sizes or not all(_is_positive_int(s) for s in sizes):
        raise ValueError(f"grid_positions needs positive integer sizes, e.g. (h, w) or (t, h, w), got {sizes}")
    axes = torch.meshgrid(*[torch.arange(s, device=device) for s in sizes], indexing="ij")
    return torch.stack(axes, dim=-1).reshape(-1, len(sizes))  # (prod(sizes), A)


def _check_segments(segments: Sequence[tuple[str, object]]) -> None:
    if isinstance(segments, (str, bytes)) or not isinstance(segments, Sequence) or len(segments) == 0:
        raise ValueError(f"segments must be a non-empty list of (kind, size), kind in {SEGMENT_KINDS}")
    for i, seg in enumerate(segments):
        if not isinstance(seg, (tuple, list)) or len(seg) != 2:
            raise ValueError(f"segments[{i}] must be a (kind, size) pair, got {seg!r}")
        kind, size = seg
        if kind not in SEGMENT_KINDS:
            raise ValueError(f"segments[{i}] kind must be one of {SEGMENT_KINDS}, got {kind!r}")
        if kind == "text":
            if not _is_positive_int(size):
                raise ValueError(f"segments[{i}] ('text', n_tokens): n_tokens must be a positive int, got {size!r}")
            continue
        axes = _GRID_AXES[kind]
        ok = isinstance(size, (tuple, list)) and len(size) == len(axes) and all(map(_is_positive_int, size))
        if not ok:
            raise ValueError(
                f"segments[{i}] ({kind!r}, ({', '.join(axes)})): size must be {len(axes)} positive ints "
                f"(tokens after patch merging), got {size!r}"
            )


def multimodal_positions(segments: Sequence[tuple[str, object]]) -> tuple[torch.LongTensor, int]:
    """(t, h, w) positions of a sequence of text runs and image/video grids, Qwen2-VL M-RoPE semantics.

    Args:
        segments: [("text", n_tokens) | ("image", (h, w)) | ("video", (t, h, w)), ...], grids counted in
            tokens as they enter the sequence (after patch merging). Vision start/end markers are text.

    Returns:
        positions: LongTensor (N, 3). Text tokens count up on all three axes; a grid gets its own (t, h, w)
            coordinates offset by the position after the preceding text.
        delta: max(positions) + 1 - N; generated token k (0-based, after the N-token prompt) is at
            N + k + delta on all three axes.

    Follows transformers 5.x `Qwen2VLModel.get_rope_index`: after an image OR video block, text continues at
    start + max(h, w) -- the number of frames is not counted, so a video with more frames than max(h, w) has
    temporal positions that overlap the text after it (transformers 4.51 continued at start + max(t, h, w)).
    """
    _check_segments(segments)
    chunks = []  # (n_i, 3) each
    start = 0
    for kind, size in segments:  # one step per segment, never per token
        if kind == "text":
            chunks.append(torch.arange(start, start + size).unsqueeze(-1).expand(-1, 3))  # (n, 3)
            start += size
            continue
        t, h, w = (1, *size) if kind == "image" else size
        chunks.append(grid_positions(t, h, w) + start)  # (t*h*w, 3)
        start += max(h, w)
    positions = torch.cat(chunks)  # (N, 3)
    delta = int(positions.max()) + 1 - positions.shape[0]
    return positions, delta
