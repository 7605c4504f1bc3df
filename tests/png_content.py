"""Checks that a saved PNG figure shows its data, not just that the file is a PNG (a blank figure, or axes
with a title and a legend but no data drawn, passes a magic-bytes or file-size check)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def load_rgb(path: str | Path) -> np.ndarray:
    """The decoded image as (H, W, 3) uint8 (PNG magic checked first)."""
    from PIL import Image

    path = Path(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def colour_mask(img: np.ndarray, colour: str, tol: int = 24) -> np.ndarray:
    """(H, W) bool: pixels within `tol` (0-255, every channel) of a matplotlib colour ("C0", "tab:blue")."""
    import matplotlib.colors

    rgb = np.round(np.array(matplotlib.colors.to_rgb(colour)) * 255).astype(int)  # (3,)
    return (np.abs(img.astype(int) - rgb) <= tol).all(axis=-1)


def assert_draws(
    path: str | Path, colours: list[str], *, min_pixels: int = 300, min_span: float = 0.3
) -> np.ndarray:
    """The PNG at `path` is drawn on, and every colour in `colours` (one per series or bar set) covers at least
    `min_pixels` pixels spread over at least `min_span` of the image width: a data line or a row of bars across
    the axes, not only a legend swatch (a legend entry is ~2 px high and ~5% of the width). Returns the image."""
    img = load_rgb(path)
    h, w, _ = img.shape
    assert h >= 200 and w >= 300, (path, img.shape)
    background = (img >= 250).all(axis=-1)
    assert 0.01 < 1 - background.mean() < 0.9, (path, "blank or solid", 1 - background.mean())
    for colour in colours:
        mask = colour_mask(img, colour)
        cols = np.flatnonzero(mask.any(axis=0))
        assert mask.sum() >= min_pixels, (path, colour, "too few pixels of this colour", int(mask.sum()))
        assert (cols.max() - cols.min()) / w >= min_span, (path, colour, "drawn only in a narrow strip")
    return img
