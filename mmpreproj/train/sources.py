"""Where training text comes from: a local text file (plain or .gz), or a hub dataset streamed with `datasets`."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

from mmpreproj_tables.sources import looks_like_data_path as looks_like_path

from ..data import hub
from ..data.assets import resolve_path  # the one locator (honours MMPREPROJ_ASSETS)
from ..data.hub import DataUnavailableError


def read_lines(
    source: str, config: str | None = None, *, split: str = "train", text_field: str = "text"
) -> Iterator[str]:
    """Lines of a local text file (kept as stored, newline included; `.gz` read transparently), or the text
    rows of a hub split.

    A hub dataset is streamed, so only the rows actually consumed are downloaded. Offline, or when the
    id does not exist, a one-line `DataUnavailableError` says to pass a local file instead.
    """
    local = resolve_path(source)
    if local is not None:
        if not local.is_file():
            raise DataUnavailableError(f"data path {source!r} is not a file; pass a text file, one example per line")
        yield from _file_lines(local)
        return
    if looks_like_path(source):
        raise DataUnavailableError(f"data file not found: {source}")
    yield from _hub_rows(source, config, split, text_field)


def _file_lines(path: Path) -> Iterator[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    n = 0  # lines read so far, to say where the file stops being text
    try:
        with opener(path, "rt", encoding="utf-8-sig") as f:
            for line in f:
                n += 1
                yield line
    except UnicodeDecodeError as e:
        raise DataUnavailableError(
            f"data file {path} is not UTF-8 text (byte {e.object[e.start : e.start + 1]!r} after line {n} cannot be "
            "decoded); convert it to UTF-8"
        ) from None
    except (gzip.BadGzipFile, EOFError, OSError) as e:
        raise DataUnavailableError(f"cannot read data file {path}: {e}") from None


def _hub_rows(name: str, config: str | None, split: str, text_field: str) -> Iterator[str]:
    label = f"{name} ({config}, split {split})" if config else f"{name} (split {split})"
    hint = "pass a local file with --data PATH"
    if not hub.hub_offline() and not hub.hub_reachable():
        raise DataUnavailableError(f"cannot download {label} (no network?); {hint}")
    try:
        import datasets

        rows = iter(datasets.load_dataset(name, config, split=split, streaming=True))
        first = next(rows, None)
    except ImportError:
        raise DataUnavailableError(f"cannot read {label}: the `datasets` package is not installed; {hint}") from None
    except Exception as err:  # offline, datasets raises ConnectionError, FileNotFoundError, ValueError, ...
        why = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise DataUnavailableError(f"cannot download {label} (no network?): {why}; {hint}") from None
    if first is None:
        return
    if text_field not in first:
        raise DataUnavailableError(f"{label} has no column {text_field!r}; columns: {sorted(first)}")
    yield first[text_field]
    for row in rows:
        yield row[text_field]
