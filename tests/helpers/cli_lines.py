"""The command's stderr, read as a user reads it: its error lines, without the line that says the offline flags."""

from __future__ import annotations

import re

OFFLINE_LINE = re.compile(r"^mmpreproj \w+: (offline|online): ")


def error_lines(stderr: str) -> list[str]:
    """The lines of `stderr` other than the offline-flags line a command prints once its arguments pass."""
    return [line for line in stderr.strip().splitlines() if not OFFLINE_LINE.match(line)]
