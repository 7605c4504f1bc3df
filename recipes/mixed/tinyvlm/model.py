"""`MixedModel`: a vision tower + projector feeding a text decoder, LLaVA-style, with M-RoPE positions.

    batch = model.prepare([MixedSample([t0, t1, IMAGE, t2], images=[img])])   # (3, H, W), any H, W
    logits, _ = model(**batch.decoder_inputs())                             # (B, S, vocab)

`prepare` runs the tower on every image and video frame (grouped by size), merges and projects the patch
features to decoder tokens, builds each sample with `build_sequence` and left-pads the batch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .markers import MarkerIds
from .sequence import POSITION_MODES, MixedBatch, Visual, build_sequence, check_marker_count, collate
from .tower import check_image_size

__all__ = ["MixedModel", "MixedSample"]


@dataclass
class MixedSample:
    """One prompt: token ids with one marker per image/video, the pixels, and optional answer ids (the loss).

    images: (3, H, W) float tensors; videos: (T, 3, H, W); any size that is a multiple of patch x merge.
    """

    input_ids: Sequence[int]
    images: Sequence[torch.Tensor] = field(default_factory=list)
    videos: Sequence[torch.Tensor] = field(default_factory=list)
    target_ids: Sequence[int] = field(default_factory=list)


class MixedModel(nn.Module):
    """Vision tower -> `VisionProjector` -> decoder tokens between begin/end markers -> text decoder.

    Args:
        tower: images (B, 3, H, W) -> (B, h, w, C), with `patch_size` and `width` (see `tower`).
        projector: (..., h, w, C) -> (..., h/m, w/m, D) (`VisionProjector`).
        decoder: a `NativeDecoder` (or anything with its `embed`, `new_cache`, `host` and call).
        markers: the marker token ids.
        position_mode: "mrope" (text 1D, image 2D, video 3D) or "1d" (every token counts up: the ablation).
    """

    def __init__(self, tower: nn.Module, projector: nn.Module, decoder: nn.Module, markers: MarkerIds,
                 position_mode: str = "mrope") -> None:  # fmt: skip
        super().__init__()
        if position_mode not in POSITION_MODES:
            raise ValueError(f"position_mode must be one of {POSITION_MODES}, got {position_mode!r}")
        self.tower = tower
        self.projector = projector
        self.decoder = decoder
        self.markers = markers
        self.position_mode = position_mode

    @property
    def pixel_multiple(self) -> int:
        """Image sides must be multiples of this (patch size x merge)."""
        return self.tower.patch_size * getattr(self.projector, "merge", 1)

    def encode(self, frames: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Decoder tokens (h, w, D) of each (3, H, W) frame; frames of equal size go through the tower together."""
        groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for i, f in enumerate(frames):
            if f.ndim != 3 or f.shape[0] != 3:
                raise ValueError(f"an image or frame must be (3, H, W), got shape {tuple(f.shape)}")
            check_image_size(f.shape, self.pixel_multiple)
            groups[tuple(f.shape)].append(i)
        out: list[torch.Tensor] = [None] * len(frames)  # type: ignore[list-item]
        for idx in groups.values():
            feats = self.projector(self.tower(torch.stack([frames[i] for i in idx])))  # (G, h, w, D)
            for j, i in enumerate(idx):
                out[i] = feats[j]
        return out

    def prepare(self, samples: Sequence[MixedSample]) -> MixedBatch:
        """Encode every visual, build each sequence, left-pad: a `MixedBatch` on the decoder's device.

        Every sample is checked (marker counts, pixel shapes) before the tower runs.
        """
        frames, spans = [], []  # all frames; per sample, per visual: (kind, first frame, T)
        device = next(self.decoder.parameters()).device
        for k, s in enumerate(samples):
            self._check_sample(k, s)
            mine = []
            for img in s.images:
                mine.append(("image", len(frames), 1))
                frames.append(img.to(device))
            for vid in s.videos:
                mine.append(("video", len(frames), vid.shape[0]))
                frames += list(vid.to(device))
            spans.append(mine)
        tokens = self.encode(frames)  # (h, w, D) per frame
        sequences = []
        for k, (s, mine) in enumerate(zip(samples, spans)):
            visuals: dict[str, list[Visual]] = {"image": [], "video": []}
            for kind, first, t in mine:
                clip = torch.stack(tokens[first : first + t])  # (T, h, w, D)
                visuals[kind].append(Visual(clip.flatten(0, 2), tuple(clip.shape[:3])))
            try:
                sequences.append(build_sequence(s.input_ids, self.decoder.embed, self.markers,
                                                visuals["image"], visuals["video"], s.target_ids,
                                                self.position_mode, device))  # fmt: skip
            except ValueError as e:
                raise ValueError(f"sample {k}: {e}") from None
        return collate(sequences, self.markers.pad)

    def _check_sample(self, k: int, s: MixedSample) -> None:
        ids = [int(t) for t in s.input_ids]
        try:
            check_marker_count("image", len(s.images), ids.count(self.markers.image), self.markers.image)
            check_marker_count("video", len(s.videos), ids.count(self.markers.video), self.markers.video)
        except ValueError as e:
            raise ValueError(f"sample {k}: {e}") from None
        for kind, items, ndim, shape in (
            ("image", s.images, 3, "(3, H, W)"),
            ("video", s.videos, 4, "(T, 3, H, W)"),
        ):
            for i, x in enumerate(items):
                if not isinstance(x, torch.Tensor) or x.ndim != ndim or x.shape[-3] != 3 or 0 in x.shape:
                    got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                    raise ValueError(f"sample {k} {kind} {i}: expected a {shape} tensor, got {got}")
                check_image_size(x.shape, self.pixel_multiple, f"sample {k} {kind} {i}")

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor,
                cache: Any | None = None) -> tuple[torch.Tensor, Any]:  # fmt: skip
        """logits (B, S, vocab) and the cache (extended in place), from `MixedBatch.decoder_inputs()`."""
        return self.decoder(inputs_embeds, attention_mask, position_ids, cache)
