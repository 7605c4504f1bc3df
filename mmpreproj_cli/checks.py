"""The command's argument checks that need no library: empty values, counts, names from the tables, output paths.

They run before the library loads, so a wrong argument answers at once; the checks that read the library's
facts (an adapter folder, a model or data path, learning rates, sizes) follow in `mmpreproj.cli`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from .tables import BUDGET_METHODS, METHODS, TASKS


def _count(flag: str, value: int | None, minimum: int) -> None:
    if value is not None and value < minimum:
        raise ValueError(f"{flag} {value}; must be an integer >= {minimum}")


def check_names(flag: str, value: str | None, allowed: Sequence[str]) -> list[str] | None:
    """A comma-separated list of distinct names from `allowed` (None when the flag was not given)."""
    if value is None:
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if not names or unknown:
        raise ValueError(
            f"{flag} {value!r}: {'unknown ' + str(unknown) if unknown else 'empty'}; allowed: {', '.join(allowed)}"
        )
    twice = [n for i, n in enumerate(names) if n in names[:i]]
    if twice:
        raise ValueError(f"{flag} {value!r}: names {twice[0]!r} twice; each name once, from {', '.join(allowed)}")
    return names


# what a path option takes, for the message when it is given empty (`--out ''` is never read as the default)
_PATH_OPTIONS = {
    "out": "a folder",
    "model": "a hub id or a local folder",
    "data": "a hub dataset id or a local text file",
    "json": "a file name",
    "adapter": "a run folder or an adapter folder",
    "runs": "a run folder",
}


def _refuse_empty(args: argparse.Namespace) -> None:
    """Every string option given as '' (or blanks) is refused by name, never read as its default."""
    for dest, value in vars(args).items():
        values = value if isinstance(value, list) else [value]
        if not any(isinstance(v, str) and not v.strip() for v in values):
            continue
        flag = "run folder" if dest == "runs" else "--" + dest.replace("_", "-")
        if dest in _PATH_OPTIONS:
            raise ValueError(f"{flag}: empty path; pass {_PATH_OPTIONS[dest]}")
        if dest not in (
            "tasks",
            "methods",
            "lrs",
            "seeds",
            "budgets",
            "seed_methods",
        ):  # lists: their own check names the allowed values
            raise ValueError(f"{flag}: empty value; pass a value or leave the option out")


def _output_file(flag: str, value: str | None) -> None:
    """A file the command will write: not an existing folder, and its folder not an existing file."""
    if value is None:
        return
    p = Path(value)
    if p.is_dir():
        raise ValueError(f"{flag} {value}: is a folder; pass a file name")
    parent = next((a for a in p.parents if a.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"{flag} {value}: {parent} is a file, not a folder")


def _output_folder(flag: str, value: str | None) -> None:
    if value is not None and Path(value).exists() and not Path(value).is_dir():
        raise ValueError(f"{flag} {value}: is a file; pass a folder")


def check_exists(flag: str, value: str | None) -> None:
    if value is not None and not Path(value).exists():
        raise ValueError(f"{flag} {value}: no such file or folder")


def adapter_list(values: list[str] | None) -> list[str]:
    """The adapters of repeated and/or comma-separated --adapter options, in order; ValueError on a repeat."""
    names = [a.strip() for v in values or [] for a in v.split(",") if a.strip()]
    empty = [v for v in values or [] if not v.replace(",", "").strip()]
    if empty:
        raise ValueError(f"--adapter {empty[0]!r}: empty path; pass a run folder or an adapter folder")
    if len(set(names)) != len(names):
        raise ValueError(f"--adapter {','.join(names)}: names one adapter twice")
    return names


def check_args(args: argparse.Namespace) -> None:
    """The checks of `args` that need no library (each names the option and what it takes); ValueError."""
    _refuse_empty(args)
    command = args.command
    if command in ("train", "reproduce", "demo", "sweep", "budget"):  # train's counts: TrainConfig names them
        _output_folder("--out", args.out)
    if command in ("reproduce", "demo", "sweep", "budget"):
        _count("--steps", args.steps, 1)
    if command == "eval":
        check_names("--tasks", args.tasks, TASKS)
        _output_file("--json", args.json)
        adapter_list(args.adapter)
        _count("--batch-size", args.batch_size, 1)
        _count("--limit", args.limit, 1)
    elif command == "analyze":
        _output_folder("--out", args.out)
        _count("--texts", args.texts, 0)
    elif command == "sweep":
        check_names("--methods", args.methods, METHODS)
        _count("--seed", args.seed, 0)
        _count("--limit", args.limit, 1)
    elif command == "budget":
        methods = check_names("--methods", args.methods, BUDGET_METHODS)
        check_names("--seed-methods", args.seed_methods, methods)
        _count("--seeds", args.seeds, 1)
        _count("--max-extend", args.max_extend, 0)
    elif command in ("reproduce", "demo"):
        check_names("--methods", args.methods, METHODS)
        _count("--limit", args.limit, 1)
