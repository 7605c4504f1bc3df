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
    path: str | Path,
    colours: list[str],
    *,
    min_pixels: int = 300,
    min_span: float = 0.3,
    all_visible: bool = True,
) -> np.ndarray:
    """The PNG at `path` is decoded, is drawn on (not blank, not one solid colour), and shows its data: each
    colour in `colours` (one per series or bar set, in drawing order) covers at least `min_pixels` pixels spread
    over at least `min_span` of the image width, i.e. a data line or a row of bars across the axes, not only a
    legend swatch (a legend entry is ~120 px in ~5% of the width; a 3-point line at 120 dpi is ~1200 px).

    all_visible=False, for series whose values may coincide (the later line then covers the earlier): only the
    last colour, drawn on top, must show a line; the earlier ones need only appear (in the legend).
    Returns the image, (H, W, 3) uint8."""
    img = load_rgb(path)
    h, w, _ = img.shape
    assert h >= 200 and w >= 300, (path, img.shape)
    drawn = 1 - (img >= 250).all(axis=-1).mean()  # share of pixels that are not white background
    assert 0.01 < drawn < 0.9, (path, "blank or solid", drawn)
    for i, colour in enumerate(colours):
        mask = colour_mask(img, colour)
        if not all_visible and i < len(colours) - 1:
            assert mask.any(), (path, colour, "series colour absent")
            continue
        cols = np.flatnonzero(mask.any(axis=0))
        assert mask.sum() >= min_pixels, (path, colour, "too few pixels of this colour", int(mask.sum()))
        assert (cols.max() - cols.min()) / w >= min_span, (path, colour, "drawn only in a narrow strip")
    return img
