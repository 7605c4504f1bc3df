"""The special token ids a mixed text/image/video sequence uses."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MarkerIds"]


@dataclass(frozen=True)
class MarkerIds:
    """Token ids of the markers (ids of the text decoder's vocabulary).

    Args:
        image: placeholder written once per image in the prompt; the builder replaces it by
            `vision_start, <h*w image tokens>, vision_end`.
        video: the same for a video (`t*h*w` tokens).
        vision_start, vision_end: the begin/end markers around every image or video (text tokens).
        pad: id used for left padding (never attended to).
    """

    image: int
    video: int
    vision_start: int
    vision_end: int
    pad: int = 0

    def __post_init__(self) -> None:
        named = {
            "image": self.image,
            "video": self.video,
            "vision_start": self.vision_start,
            "vision_end": self.vision_end,
        }
        for name, value in (*named.items(), ("pad", self.pad)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"MarkerIds.{name} must be a non-negative int, got {value!r}")
        if len(set(named.values())) != len(named):
            raise ValueError(f"MarkerIds image/video/vision_start/vision_end must be distinct, got {named}")
