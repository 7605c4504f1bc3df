"""What every recipe does the same way: a CLI from its config dataclass, a table, JSON and plots."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import sys
import typing
from pathlib import Path
from typing import Any

import torch

from recipes.command import flags_named

__all__ = ["environment", "parse_config", "plot_bars", "plot_curves", "print_table", "write_json"]


def parse_config(
    cls: type, argv: list[str] | None = None, doc: str | None = None, help: dict[str, str] | None = None
) -> Any:
    """Build `cls` (a dataclass) from `--field-name` options; bools get --x/--no-x, tuples take several values.

    `help` maps field names to the text `--help` shows before the default."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag, hint = "--" + f.name.replace("_", "-"), hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        shown = " ".join(map(str, default)) if isinstance(default, tuple) else default
        text = f"{(help or {}).get(f.name, '')} (default: {shown})".lstrip()
        if hint is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=text)
        elif typing.get_origin(hint) is tuple:
            parser.add_argument(flag, type=typing.get_args(hint)[0], nargs="+", default=default, help=text)
        else:
            kind = next((a for a in typing.get_args(hint) if a is not type(None)), hint)  # X | None -> X
            if kind is str and default != "":  # '' would stand in for the default silently (`--out ''`)
                kind = _non_empty(default)
            if kind is int and f.name in COUNT_FIELDS:  # refused as typed, before `--quick` could replace it
                kind = _at_least_one
            parser.add_argument(flag, type=kind, default=default, help=text)
    args = vars(parser.parse_args(argv))
    try:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in args.items()})
    except (ValueError, TypeError) as e:  # the config's own checks: usage and one line naming the flag
        parser.error(flags_named(str(e), sys.argv[1:] if argv is None else argv))


COUNT_FIELDS = frozenset({"steps", "batch_size", "batch", "eval_batch", "workers"})
"""Config fields that are counts (>= 1) in every recipe: `--steps 0` is refused by `parse_config` itself."""


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}; must be an integer >= 1")
    return value


_at_least_one.__name__ = "count"


def _non_empty(default: Any):
    """An argparse type for a string option whose default is not '': refuses '' and blanks by name."""

    def check(value: str) -> str:
        if not value.strip():
            what = "path" if isinstance(default, str) and ("/" in default or os.sep in default) else "value"
            shown = "" if default is None else f" (default: {default})"
            raise argparse.ArgumentTypeError(f"empty {what}; pass one, or leave the option out{shown}")
        return value

    check.__name__ = "non-empty string"
    return check


def environment() -> dict[str, Any]:
    """Machine facts saved beside the metrics (load average: the machine may be shared)."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_avg_1_5_15": [round(x, 2) for x in load],
        "process_cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
    }


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A markdown table of `rows` (columns named "... acc" as percentages), printed and returned."""

    def cell(column: str, v: Any) -> str:
        if isinstance(v, float):
            return f"{100 * v:.1f}%" if "acc" in column else f"{v:.1f}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(c, r.get(c, "")) for c in columns) + " |" for r in rows]
    text = "\n".join(lines)
    print(text)
    return text


def write_json(path: str | Path, data: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_bars(values: dict[str, float], path: str | Path, title: str, ylabel: str = "test accuracy") -> Path:
    """One bar per named value, labelled with its value."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=120)
    bars = ax.bar(range(len(values)), list(values.values()), color="tab:blue")
    ax.bar_label(bars, labels=[f"{v:.3f}" for v in values.values()], fontsize=8)
    ax.set_xticks(range(len(values)), list(values), rotation=15, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_curves(curves: dict[str, list[float]], path: str | Path, title: str, every: int) -> Path:
    """Training-loss curves, x = optimizer step."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=120)
    for name, ys in curves.items():
        ax.plot([every * (i + 1) for i in range(len(ys))], ys, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("train loss")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
