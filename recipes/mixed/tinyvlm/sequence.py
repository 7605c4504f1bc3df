"""Build one decoder input from text ids with image/video markers and the visual tokens, then left-pad a batch.

    [t0 t1 <image> t2]  +  image tokens (h*w, D)  ->
    [t0 t1 <vision_start> v(0,0) .. v(h-1,w-1) <vision_end> t2]
    positions (multimodal_positions): text 1D on all three axes, the image its (0, row, column) grid offset
    by the position after the preceding text, Qwen2-VL semantics; `position_mode="1d"` counts every token.

Axis legend: b - batch, s - padded sequence, n - tokens of one sample, d - decoder width.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from mmpreproj.rope import multimodal_positions

from .markers import MarkerIds

__all__ = ["IMAGE", "PAD", "POSITION_MODES", "TEXT", "VIDEO", "MixedBatch", "MixedSequence", "Visual",
           "build_sequence", "check_marker_count", "collate"]  # fmt: skip

TEXT, IMAGE, VIDEO, PAD = 0, 1, 2, -1  # modality codes of MixedSequence.modality
POSITION_MODES = ("mrope", "1d")


@dataclass
class Visual:
    """Tokens of one image or video in decoder space: features (t*h*w, D) t-major row-major, grid (t, h, w)."""

    features: torch.Tensor
    grid: tuple[int, int, int]


@dataclass
class MixedSequence:
    """One sample, unpadded: embeds (N, D), token_ids (N,) (visual slots hold the marker id), positions
    (N, 3), modality (N,) codes TEXT/IMAGE/VIDEO, labels (N,) (-100 = no loss), delta (next position - N)."""

    embeds: torch.Tensor
    token_ids: torch.Tensor
    positions: torch.Tensor
    modality: torch.Tensor
    labels: torch.Tensor
    delta: int


@dataclass
class MixedBatch:
    """A left-padded batch of `MixedSequence`s, each tensor (B, S, ...).

    `next_position` (B,) is where sample b's first generated token sits on all three axes
    (its unpadded length + its delta); generated token k is at next_position + k.
    """

    inputs_embeds: torch.Tensor  # (B, S, D)
    attention_mask: torch.Tensor  # (B, S) long, 0 = left padding
    position_ids: torch.Tensor  # (B, S, 3) long
    token_ids: torch.Tensor  # (B, S)
    modality: torch.Tensor  # (B, S) TEXT / IMAGE / VIDEO / PAD
    labels: torch.Tensor  # (B, S), -100 = no loss
    next_position: torch.Tensor  # (B,)

    def decoder_inputs(self) -> dict[str, torch.Tensor]:
        """The keyword arguments of `MixedModel.forward`."""
        return {"inputs_embeds": self.inputs_embeds, "attention_mask": self.attention_mask,
                "position_ids": self.position_ids}  # fmt: skip

    def to(self, device: torch.device | str) -> MixedBatch:
        return MixedBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def check_marker_count(kind: str, n_visuals: int, n_markers: int, marker: int) -> None:
    """Raise unless a prompt has exactly one `kind` marker per `kind` visual."""
    if n_visuals == n_markers:
        return
    what = f"{n_markers} {kind} marker(s) (id {marker})"
    if n_visuals < n_markers:
        raise ValueError(f"{what} but only {n_visuals} {kind}(s): marker {n_visuals + 1} has no {kind}")
    raise ValueError(f"{n_visuals} {kind}(s) but only {what}: {kind} {n_markers + 1} has no marker")


def _check_visuals(kind: str, visuals: Sequence[Visual], n_markers: int, marker: int) -> None:
    check_marker_count(kind, len(visuals), n_markers, marker)
    for i, v in enumerate(visuals):
        grid = tuple(v.grid)
        if len(grid) != 3 or any(not isinstance(g, int) or g <= 0 for g in grid):
            raise ValueError(f"{kind} {i}: grid must be 3 positive ints (t, h, w), got {v.grid!r}")
        if kind == "image" and grid[0] != 1:
            raise ValueError(f"image {i}: grid must have t = 1, got {grid}")
        n = grid[0] * grid[1] * grid[2]
        if v.features.ndim != 2 or v.features.shape[0] != n:
            raise ValueError(
                f"{kind} {i}: grid {grid} means {n} tokens, but features have shape {tuple(v.features.shape)} "
                f"(expected ({n}, D))"
            )


def build_sequence(
    input_ids: Sequence[int] | torch.Tensor,
    embed: Callable[[torch.Tensor], torch.Tensor],
    markers: MarkerIds,
    images: Sequence[Visual] = (),
    videos: Sequence[Visual] = (),
    target_ids: Sequence[int] | torch.Tensor = (),
    position_mode: str = "mrope",
    device: torch.device | str | None = None,
) -> MixedSequence:
    """Expand each image/video marker of `input_ids` into begin marker + visual tokens + end marker.

    Args:
        input_ids: the prompt, with one `markers.image` per image and one `markers.video` per video, in order.
        embed: the decoder's token embedding, (n,) ids -> (n, D).
        markers: the marker ids.
        images, videos: visual tokens, consumed in the order of their markers.
        target_ids: tokens appended after the prompt that carry the loss (labels), e.g. an answer.
        position_mode: "mrope" (text 1D, images 2D, video 3D) or "1d" (every token counts up, an ablation).
        device: where the token ids are made (the embedding's device; default CPU).

    Raises ValueError naming the problem: a marker without a visual, a visual without a marker, a grid that
    does not match its features, begin/end markers written by hand.
    """
    if position_mode not in POSITION_MODES:
        raise ValueError(f"position_mode must be one of {POSITION_MODES}, got {position_mode!r}")
    ids = [int(t) for t in (input_ids.tolist() if isinstance(input_ids, torch.Tensor) else input_ids)]
    target = [int(t) for t in (target_ids.tolist() if isinstance(target_ids, torch.Tensor) else target_ids)]
    for name in ("vision_start", "vision_end"):
        if getattr(markers, name) in ids:
            raise ValueError(f"input_ids contain the {name} marker (id {getattr(markers, name)}); write only the "
                             "image/video marker, the builder adds begin/end markers")  # fmt: skip
    if markers.image in target or markers.video in target:
        raise ValueError("target_ids must be text: they contain an image or video marker")
    if not ids:
        raise ValueError("input_ids is empty")
    _check_visuals("image", images, ids.count(markers.image), markers.image)
    _check_visuals("video", videos, ids.count(markers.video), markers.video)

    queue = {markers.image: (iter(images), IMAGE), markers.video: (iter(videos), VIDEO)}
    tokens, kinds, feats, segments = [], [], [], []  # per token / per visual / per segment
    run = 0  # length of the current text run
    for tok in ids:
        if tok not in queue:
            tokens.append(tok)
            kinds.append(TEXT)
            run += 1
            continue
        source, code = queue[tok]
        visual = next(source)
        t, h, w = visual.grid
        segments.append(("text", run + 1))  # the text so far and the begin marker
        segments.append(("image", (h, w)) if code == IMAGE else ("video", (t, h, w)))
        tokens += [markers.vision_start] + [tok] * (t * h * w) + [markers.vision_end]
        kinds += [TEXT] + [code] * (t * h * w) + [TEXT]
        feats.append(visual.features)
        run = 1  # the end marker starts the next text run
    tokens += target
    kinds += [TEXT] * len(target)
    run += len(target)
    if run:
        segments.append(("text", run))

    device = torch.device(device) if device is not None else torch.device("cpu")
    token_ids = torch.tensor(tokens, device=device)  # (N,)
    modality = torch.tensor(kinds, device=device, dtype=torch.int8)  # (N,)
    embeds = embed(token_ids)  # (N, D); visual slots are overwritten next
    for kind, visuals in (("image", images), ("video", videos)):
        for i, v in enumerate(visuals):
            if v.features.shape[1] != embeds.shape[-1]:
                raise ValueError(f"{kind} {i}: features have width {v.features.shape[1]}, the decoder has "
                                 f"{embeds.shape[-1]}")  # fmt: skip
    if feats:
        slots = (modality != TEXT).nonzero().squeeze(-1)  # visual token indices, in order
        embeds = embeds.index_put((slots,), torch.cat(feats).to(embeds.dtype))
    if position_mode == "mrope":
        positions, delta = multimodal_positions(segments)
    else:
        positions, delta = torch.arange(len(tokens))[:, None].expand(-1, 3), 0
    labels = torch.full((len(tokens),), -100, dtype=torch.long, device=device)
    if target:
        labels[-len(target) :] = torch.tensor(target, device=device)
    return MixedSequence(embeds, token_ids, positions.to(device), modality, labels, delta)


def collate(sequences: Sequence[MixedSequence], pad_id: int = 0) -> MixedBatch:
    """Left-pad sequences to one batch (padding: zero embeds, mask 0, position 1, modality PAD)."""
    if not sequences:
        raise ValueError("collate needs at least one sequence")
    s = max(len(x.token_ids) for x in sequences)
    b, d = len(sequences), sequences[0].embeds.shape[-1]
    ref = sequences[0].embeds
    mask = torch.zeros(b, s, dtype=torch.long, device=ref.device)
    positions = torch.ones(b, s, 3, dtype=torch.long, device=ref.device)
    token_ids = torch.full((b, s), pad_id, dtype=torch.long, device=ref.device)
    modality = torch.full((b, s), PAD, dtype=torch.int8, device=ref.device)
    labels = torch.full((b, s), -100, dtype=torch.long, device=ref.device)
    rows = []
    for i, x in enumerate(sequences):
        n = len(x.token_ids)
        mask[i, s - n :] = 1
        positions[i, s - n :] = x.positions
        token_ids[i, s - n :] = x.token_ids
        modality[i, s - n :] = x.modality
        labels[i, s - n :] = x.labels
        if x.embeds.shape[-1] != d:
            raise ValueError(f"sequence {i} has width {x.embeds.shape[-1]}, sequence 0 has {d}")
        rows.append(F.pad(x.embeds, (0, 0, s - n, 0)))  # (S, D), keeps the graph to the visual features
    embeds = torch.stack(rows)  # (B, S, D)
    next_position = torch.tensor([len(x.token_ids) + x.delta for x in sequences], device=ref.device)
    return MixedBatch(embeds, mask, positions, token_ids, modality, labels, next_position)
