"""The command's argument checks, all without the library: empty values, counts, numeric ranges, names from
the tables, lists, sizes, and what a path or model name points at (`path_checks.py`).

They run before torch loads, so a wrong argument answers at once, in one line naming the option and what it
takes. The ranges and lists are the library's own rules (`mmpreproj_tables`: `values.py`, `tables.py`), not
copies. `check_hub_cache` runs once the offline flags are set: a hub id that is not in the local hub cache while
downloads are off. Left to the library (`run.py`): `TrainConfig`'s rules that tie one field to the method
(`--skip-rank` with a method without a skip) or to torch (`--device`), and what needs the model (`--layers 99`
on a 4-block model), which `command.py` words with the flag's name.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from mmpreproj_tables.sources import check_hub_model, resolve_path
from mmpreproj_tables.tables import BUDGET_METHODS, METHODS, PRESETS, TASKS, unsized_module
from mmpreproj_tables.values import (
    TRAIN_BOUNDS,
    Bound,
    parse_budgets,
    parse_lrs,
    parse_seeds,
    split_items,
    warmup_bound,
)

from .parser import TRAIN_FLAGS
from .path_checks import check_adapter_folder, check_causal_lm, check_data, output_file, output_folder


def _count(flag: str, value: int | None, minimum: int) -> None:
    if value is not None and value < minimum:
        raise ValueError(f"{flag} {value}; must be an integer >= {minimum}")


def check_names(flag: str, value: str | None, allowed: Sequence[str]) -> list[str] | None:
    """A comma-separated list of distinct names from `allowed` (None when the flag was not given)."""
    if value is None:
        return None
    names = split_items(value, f"{flag} {value!r}", f"allowed: {', '.join(allowed)}")
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


def adapter_list(values: list[str] | None) -> list[str]:
    """The adapters of repeated and/or comma-separated --adapter options, in order; ValueError on a repeat."""
    names = [a.strip() for v in values or [] for a in v.split(",") if a.strip()]
    empty = [v for v in values or [] if not v.replace(",", "").strip()]
    if empty:
        raise ValueError(f"--adapter {empty[0]!r}: empty path; pass a run folder or an adapter folder")
    if len(set(names)) != len(names):
        raise ValueError(f"--adapter {','.join(names)}: names one adapter twice")
    return names


def _bounded(flag: str, value: float | None, bound: Bound) -> None:
    if value is not None and not bound.holds(value):
        raise ValueError(f"{flag} {value}; must be {bound.says}")


def size_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The size flags given, as TrainConfig fields (--layers 0,-1 -> [0, -1]); ValueError naming the flag."""
    out: dict[str, Any] = {}
    for name in ("expansion", "skip_rank"):
        value = getattr(args, name, None)
        if value is not None:
            _bounded("--" + name.replace("_", "-"), value, TRAIN_BOUNDS[name])
            out[name] = value
    if getattr(args, "layers", None) is not None:
        hint = "pass comma-separated block indices such as 0,1,-1"
        items = split_items(args.layers, f"--layers {args.layers!r}", hint)
        if not items or not all(t.removeprefix("-").isdecimal() for t in items):
            raise ValueError(f"--layers {args.layers!r}: {hint}")
        out["layers"] = [int(t) for t in items]
        if len(set(out["layers"])) != len(items):
            raise ValueError(f"--layers {args.layers!r}: a block named twice; {hint}")
    if getattr(args, "parts", None) is not None:
        out["parts"] = split_items(args.parts, f"--parts {args.parts!r}", "pass comma-separated part names")
        if len(set(out["parts"])) != len(out["parts"]):
            raise ValueError(f"--parts {args.parts!r}: a part named twice; pass comma-separated part names")
        if not out["parts"]:
            raise ValueError(f"--parts {args.parts!r}: pass comma-separated part names such as language")
    return out


def _train_numbers(args: argparse.Namespace) -> None:
    """`train`'s numeric flags against TrainConfig's ranges; --warmup-steps within the run's steps."""
    for field, kind in TRAIN_FLAGS.items():
        if kind in (int, float) and field in TRAIN_BOUNDS:
            _bounded("--" + field.replace("_", "-"), getattr(args, field), TRAIN_BOUNDS[field])
    if args.warmup_steps is not None:
        steps = args.steps if args.steps is not None else PRESETS[args.preset]["steps"]
        _bounded("--warmup-steps", args.warmup_steps, warmup_bound(steps))


def _sources(args: argparse.Namespace, preset: str | None) -> None:
    """The model (and training data) the command will load: given, or the preset's."""
    for flag, check in (("model", check_causal_lm), ("data", check_data)):
        value = getattr(args, flag, None)
        if value is None and preset is not None:
            value = PRESETS[preset].get(flag)
            label = f"--preset {preset}: {flag} {value}"
        else:
            label = f"--{flag} {value}"
        if value is not None:
            check(label, value)
    data = getattr(args, "data", None) or (PRESETS[preset].get("data") if preset is not None else None)
    config = getattr(args, "data_config", None)
    if config is not None and data is not None and resolve_path(data) is not None:
        raise ValueError(
            f"--data-config {config}: names a config of a hub dataset, but the data is the local file {data} "
            "(one example per line, no configs); drop --data-config or pass a hub dataset id with --data"
        )


def check_args(args: argparse.Namespace) -> None:
    """Every check of `args` that needs no library (each names the option and what it takes); ValueError."""
    _refuse_empty(args)
    command = args.command
    if command in ("train", "reproduce", "demo", "sweep", "budget"):
        output_folder("--out", args.out)
    if command in ("reproduce", "demo", "sweep", "budget"):
        _bounded("--steps", args.steps, TRAIN_BOUNDS["steps"])
    if command in ("train", "sweep", "reproduce", "demo"):
        size_overrides(args)
    if command == "train":
        _train_numbers(args)
        for name, value in size_overrides(args).items():  # a size of a module the method lacks, before torch loads
            what = unsized_module(args.method, name, value)
            if what is not None:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} sizes {what}, which --method {args.method} does not have; leave {flag} out")
    elif command == "eval":
        check_names("--tasks", args.tasks, TASKS)
        output_file("--json", args.json)
        for adapter in adapter_list(args.adapter):
            check_adapter_folder("--adapter", adapter)
        _count("--batch-size", args.batch_size, 1)
        _count("--limit", args.limit, 1)
    elif command == "analyze":
        output_folder("--out", args.out)
        _count("--texts", args.texts, 0)
        for run in args.runs:
            check_adapter_folder("run folder", run)
    elif command == "sweep":
        check_names("--methods", args.methods, METHODS)
        _bounded("--seed", args.seed, TRAIN_BOUNDS["seed"])
        _count("--limit", args.limit, 1)
        parse_lrs(args.lrs, flag="--lrs")
    elif command == "budget":
        methods = check_names("--methods", args.methods, BUDGET_METHODS)
        check_names("--seed-methods", args.seed_methods, methods)
        _count("--seeds", args.seeds, 1)
        _count("--max-extend", args.max_extend, 0)
        parse_budgets(args.budgets, flag="--budgets")
        if args.lrs is not None:
            parse_lrs(args.lrs, flag="--lrs")
    elif command in ("reproduce", "demo"):
        check_names("--methods", args.methods, METHODS)
        _count("--limit", args.limit, 1)
        parse_seeds(args.seeds, 0, flag="--seeds")
    if command != "analyze" and not getattr(args, "read_only", False):  # last: the other options come first
        _sources(args, "mini" if command == "demo" else getattr(args, "preset", None))


def check_hub_cache(args: argparse.Namespace) -> None:
    """After the offline flags are set (`choose_offline`): the model the command will load, when it is a hub id,
    is in the local hub cache while downloads are off (ValueError in one line, no network tried, no torch)."""
    preset = "mini" if args.command == "demo" else getattr(args, "preset", None)
    if args.command == "analyze" or getattr(args, "read_only", False):
        return
    if getattr(args, "model", None) is not None:
        check_hub_model(args.model, f"--model {args.model}")
    elif preset is not None:
        check_hub_model(PRESETS[preset]["model"], f"--preset {preset}: model {PRESETS[preset]['model']}")
