"""Shipped vision data: CIFAR-10 JPEGs packed in a zip per split, and video frames decoded with PyAV.

images, labels, classes = load_image_zip(asset_path("cifar10", "train.zip"))   # uint8 (N, 3, 32, 32)
frames = read_video(asset_path("videos", "cockatoo.mp4"), size=(48, 85))      # uint8 (T, 3, 48, 85)
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import torch

__all__ = ["load_image_zip", "read_video"]


def load_image_zip(path: str | Path, per_class: int | None = None) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Decode every `<split>/<class>/<name>.jpg` of an image zip.

    Args:
        path: the zip (members sorted by class, then name).
        per_class: keep only the first n images of each class (None = all).

    Returns uint8 images (N, 3, H, W), int64 labels (N,) indexing `classes` (sorted folder names).
    """
    from PIL import Image

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image zip not found: {path}")
    with zipfile.ZipFile(path) as z:
        names = sorted(n for n in z.namelist() if n.lower().endswith((".jpg", ".jpeg", ".png")))
        classes = sorted({n.split("/")[-2] for n in names})
        kept: dict[str, int] = {}
        images, labels = [], []
        for name in names:
            cls = name.split("/")[-2]
            if per_class is not None and kept.get(cls, 0) >= per_class:
                continue
            kept[cls] = kept.get(cls, 0) + 1
            with Image.open(io.BytesIO(z.read(name))) as im:
                images.append(np.asarray(im.convert("RGB")))
            labels.append(classes.index(cls))
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()  # (N, 3, H, W)
    return x, torch.tensor(labels), classes


def read_video(path: str | Path, size: tuple[int, int] | None = None, max_frames: int | None = None) -> torch.Tensor:
    """Decode a video's frames with PyAV (`av`), resized to size=(H, W) by the decoder's scaler.

    Returns uint8 (T, 3, H, W), every frame in presentation order.
    """
    import av

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"video not found: {path}")
    frames = []
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            kw = {"width": size[1], "height": size[0]} if size is not None else {}
            frames.append(frame.to_ndarray(format="rgb24", **kw))
            if max_frames is not None and len(frames) >= max_frames:
                break
    if not frames:
        raise ValueError(f"no video frames decoded from {path}")
    return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous()  # (T, 3, H, W)
