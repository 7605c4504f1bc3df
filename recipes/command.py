"""A recipe as a command, without torch: a refusal is one line naming the options it concerns (`run_main`).

    if __name__ == "__main__":
        run_main(main)   # ValueError / OSError -> "script.py: error: --steps 0: ...", exit 1

Standard library only, so a script that imports the library inside `main` still answers a bad flag at once.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

TRACEBACK_ENV = "MMPREPROJ_TRACEBACK"  # =1: a recipe's refusal raises with its traceback instead of one line


def _given(argv: Sequence[str]) -> list[tuple[str, str]]:
    """(flag, value) of each option in `argv` as typed, "--x=v" or "--x v"; a switch has value ""."""
    given = []
    for i, word in enumerate(argv):
        if word.startswith("--"):
            flag, eq, value = word.partition("=")
            if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value = argv[i + 1]
            given.append((flag, value))
    return given


def flags_named(message: str, argv: Sequence[str]) -> str:
    """`message`'s first line, led by the options of `argv` it concerns: those whose name (`steps` for --steps,
    as a word) or whose value (3 characters or more) it mentions. "Config.steps=0; must be >= 1" with argv
    ["--steps", "0"] -> "--steps 0: Config.steps=0; must be >= 1"."""
    line = (message.strip().splitlines() or [""])[0]
    named = [
        f"{flag} {value}".strip()
        for flag, value in _given(argv)
        if re.search(rf"\b{re.escape(flag[2:].replace('-', '_'))}\b", line) or (len(value) >= 3 and value in line)
    ]
    return f"{', '.join(named)}: {line}" if named else line


_LOAD_ERRORS = (("mmpreproj.train.errors", "ModelUnavailableError"), ("recipes.kit.backbones", "BackboneUnavailable"))
OUTPUT_FLAGS = ("--out", "--runs")  # the folders a recipe writes: a refused run leaves no new empty one behind


def run_main(main: Callable[[], Any]) -> None:
    """Run a recipe's `main()` as a command: a refusal it raises (ValueError, OSError: a bad value, a missing file
    or model; the library's and the kit's "cannot load" errors) ends in one line on stderr led by the options it
    concerns (`flags_named`), exit 1, instead of a traceback, and an `--out` / `--runs` folder the run made and
    left empty is taken away again. `MMPREPROJ_TRACEBACK=1` shows the traceback."""
    argv = sys.argv[1:]
    folders = [Path(v) for f, v in _given(argv) if f in OUTPUT_FLAGS and v and not Path(v).exists()]
    try:
        main()
    except Exception as e:
        if not isinstance(e, _refusals()) or os.environ.get(TRACEBACK_ENV) == "1":
            raise
        for folder in folders:  # made by this run and holding no file: as if it had never started
            if folder.is_dir() and not any(p.is_file() for p in folder.rglob("*")):
                shutil.rmtree(folder)
        text = flags_named(str(e) or type(e).__name__, argv)
        print(f"{Path(sys.argv[0]).name}: error: {text} ({TRACEBACK_ENV}=1 shows the traceback)", file=sys.stderr)
        raise SystemExit(1) from None


def _refusals() -> tuple[type[BaseException], ...]:
    """What a recipe raises to refuse: ValueError, OSError, and the "cannot load" errors of the library and the
    kit (RuntimeErrors), where those modules are loaded (found in `sys.modules`, never imported here)."""
    kinds: list[type[BaseException]] = [ValueError, OSError]
    for module, name in _LOAD_ERRORS:
        if module in sys.modules:
            kinds.append(getattr(sys.modules[module], name))
    return tuple(kinds)
