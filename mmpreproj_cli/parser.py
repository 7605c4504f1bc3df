"""The `mmpreproj` command line: subcommands, options and their choices, read from `mmpreproj_tables` (no torch)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn

from mmpreproj_tables.tables import (
    BUDGET_METHODS,
    DATA_SOURCES,
    DEFAULT_BUDGETS,
    DEFAULT_LRS,
    METHODS,
    MODEL_DTYPES,
    PAPER_METHODS,
    PARALLEL,
    PRECISIONS,
    PRESETS,
    PROTOCOLS,
    SIZE_DEFAULTS,
    TASKS,
)

TRAIN_FLAGS = {  # CLI flag -> TrainConfig field, for the optional overrides of a preset
    "model": str,
    "data": str,
    "data_config": str,
    "num_lines": int,
    "max_len": int,
    "steps": int,
    "warmup_steps": int,
    "lr": float,
    "batch_size": int,
    "grad_accum": int,
    "seed": int,
    "device": str,
    "save_every": int,
    "precision": str,
    "model_dtype": str,
    "lora_r": int,
    "lora_alpha": int,
    "parallel": str,
}


def _add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", choices=METHODS, default="preproj_skip", help="what trains (default: %(default)s)")
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="mini",
        help="hyperparameters to start from; other flags override them (default: %(default)s)",
    )
    p.add_argument("--out", default=None, help="run folder (default: runs/<preset>-<method>)")
    for flag, typ in TRAIN_FLAGS.items():
        kw: dict[str, Any] = {"type": typ, "default": None}
        if flag == "precision":
            kw["choices"] = PRECISIONS
        if flag == "model_dtype":
            kw["choices"] = MODEL_DTYPES
        if flag == "parallel":
            kw["choices"] = PARALLEL
        helps = {
            "model": "hub id or local folder",
            "data": "hub dataset id or local text file (one example per line)",
            "parallel": "with torchrun/accelerate launch: ddp (default) or fsdp (FSDP2: weights sharded over ranks)",
            "save_every": "write OUT/checkpoint.pt every N optimizer steps and at the end; 0 = never (then --resume "
            "has nothing to continue from)",
        }
        p.add_argument("--" + flag.replace("_", "-"), dest=flag, help=helps.get(flag, "override the preset"), **kw)
    _add_size_args(p)
    p.add_argument("--packing", action="store_true", default=None, help="pack lines into full blocks")
    p.add_argument(
        "--paper-bf16-weights",
        action="store_true",
        default=None,
        help="keep the injected weights in bf16 as the paper did (updates at lr 1e-5 mostly round away)",
    )
    p.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=None)
    run_folder = p.add_mutually_exclusive_group()  # go on with the run in OUT, or start over there: one
    run_folder.add_argument(
        "--resume",
        action="store_true",
        default=None,
        help="continue from OUT/checkpoint.pt (an OUT with no run yet: start from step 0)",
    )
    run_folder.add_argument(
        "--overwrite",
        action="store_true",
        default=None,
        help="start afresh in an OUT that holds a run (cleared once all is loaded)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _preset_value(field: str) -> str:
    """The presets' value of a TrainConfig field, for --help: "1.25 in every preset" or "mini: 1.25, ..."."""
    values = {name: PRESETS[name].get(field, SIZE_DEFAULTS[field]) for name in sorted(PRESETS)}
    if len(set(map(str, values.values()))) == 1:
        return f"{next(iter(values.values()))} in every preset"
    return ", ".join(f"{n}: {v}" for n, v in values.items())


def _add_size_args(p: argparse.ArgumentParser) -> None:
    """The injected modules' sizes (TrainConfig / PreProjConfig fields of the same names)."""
    p.add_argument(
        "--expansion",
        type=float,
        default=None,
        help="pre-projection inner width / d, below 1 a bottleneck (e.g. 0.0625) "
        f"(default: the preset's, {_preset_value('expansion')})",
    )
    p.add_argument(
        "--skip-rank",
        type=int,
        default=None,
        help="rank r of a low-rank skip W_skip = B A, 2*r*d weights per block "
        f"(default: the preset's, {_preset_value('skip_rank')}; None = the full d x d skip)",
    )
    p.add_argument(
        "--layers",
        default=None,
        help="comma-separated block indices to inject into, negative from the end; a list that starts with a "
        f"minus takes '=': --layers=-2,-1 (default: the preset's, {_preset_value('layers')}; None = every block)",
    )
    p.add_argument(
        "--parts",
        default=None,
        help=f"comma-separated host parts to inject into (default: the preset's, {_preset_value('parts')}; "
        "None = the host row's parts)",
    )


def _add_eval_args(p: argparse.ArgumentParser, single_model: bool = True) -> None:
    if single_model:
        p.add_argument("--model", default="assets/mini-pythia", help="hub id or local folder (default: %(default)s)")
        p.add_argument(
            "--adapter",
            action="append",
            default=None,
            help="a run folder or adapter folder to load on top of the model; several (a,b or repeated "
            "--adapter) are scored one after another on the base loaded once, one table row each",
        )
        p.add_argument(
            "--tasks",
            default="ppl,lambada,hellaswag,arc_easy",
            help=f"comma-separated, from {', '.join(TASKS)} (default: %(default)s)",
        )
        p.add_argument("--json", default=None, help="write the results here")
        p.add_argument("--batch-size", type=int, default=8)
        p.add_argument(
            "--ppl-split",
            choices=("validation", "test", "heldout"),
            default="validation",
            help="WikiText rows for line PPL; heldout = validation rows 3240 on (default: %(default)s)",
        )
    p.add_argument("--protocol", choices=PROTOCOLS, default="paper", help="(default: %(default)s)")
    p.add_argument("--limit", type=int, default=None, help="examples per task (default: the protocol's own)")
    p.add_argument(
        "--data-source",
        choices=DATA_SOURCES,
        default="local",
        help="'local' reads assets/ (never waits on a network); 'hub' uses the datasets hub copies (from the "
        "local cache; downloads need --online)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are its one line, `PROG: error: MESSAGE` (naming the option and, for a
    choice, every allowed value), without the usage block before it; `--help` shows that."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The `mmpreproj` command line: every subcommand, its options and their choices (no library import)."""
    ap = OneLineParser(
        prog="mmpreproj",
        description="Position-agnostic pre-projection + content skip (arXiv 2604.10791): train, evaluate, analyse.",
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("train", help="frozen-probe training of one method -> a run folder")
    _add_train_args(p)

    p = sub.add_parser("eval", help="evaluate a model (optionally with an adapter) on the paper's or lm-eval's tasks")
    _add_eval_args(p)

    p = sub.add_parser("analyze", help="per-layer W_skip norms (JSON + PNG) and skip/attention routing ratios")
    p.add_argument("runs", nargs="+", help="run folders written by `mmpreproj train`")
    p.add_argument("--out", default=None, help="where to write skip_norms.json/png (default: first run folder)")
    p.add_argument("--texts", type=int, default=32, help="evaluation rows for the routing ratio (0 = skip it)")
    p.add_argument("--data-source", choices=DATA_SOURCES, default="local")

    _add_table_commands(sub.add_parser)
    _add_sweep(sub.add_parser)
    _add_budget(sub.add_parser)
    for p in sub.choices.values():  # every subcommand may load a model or data
        p.add_argument(
            "--online",
            action="store_true",
            help="allow hub downloads (default: offline, HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 unless "
            "HF_HUB_OFFLINE is set in the environment; the command says which in its first line)",
        )
    return ap


def _add_table_commands(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    """`reproduce` and `demo`: the baseline and the methods, one Table-2-style table."""
    for name, helptext in (
        ("reproduce", "baseline + every method, one Table-2-style table"),
        ("demo", "the offline main job: `reproduce --preset mini` with the paper's five methods"),
    ):
        p = add_parser(name, help=helptext)
        if name == "reproduce":
            p.add_argument("--preset", choices=sorted(PRESETS), required=True)
        p.add_argument("--out", default=None, help="output folder (default: runs/<preset>)")
        default = "the paper's five: " + ", ".join(PAPER_METHODS) if name == "demo" else "all of them"
        p.add_argument(
            "--methods", default=None, help=f"comma-separated subset of {', '.join(METHODS)} (default: {default})"
        )
        _add_eval_args(p, single_model=False)
        p.add_argument("--steps", type=int, default=None, help="override the preset's optimizer steps")
        p.add_argument("--model", default=None, help="override the preset's model (hub id or local folder)")
        p.add_argument("--data", default=None, help="override the preset's training data (hub id or local file)")
        p.add_argument(
            "--seeds",
            default=None,
            help="K >= 1 (the preset's seed and the next K-1) or distinct seeds >= 0 such as 0,3,7 "
            "(default: the preset's seed)",
        )
        _add_size_args(p)


def _add_sweep(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    """`sweep`: final PPL against the learning rate, per method."""
    p = add_parser("sweep", help="final PPL vs learning rate, per method (one seed per point) -> lr_sweep.png")
    p.add_argument("--preset", choices=sorted(PRESETS), default="mini", help="(default: %(default)s)")
    p.add_argument("--out", default=None, help="output folder (default: runs/<preset>-lr-sweep)")
    p.add_argument("--methods", default="preproj_skip,lora", help="comma-separated (default: %(default)s)")
    p.add_argument(
        "--lrs",
        default=",".join(f"{lr:g}" for lr in DEFAULT_LRS),
        help="peak LRs, distinct finite numbers > 0 (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=None, help="override the preset's seed")
    p.add_argument("--steps", type=int, default=None, help="override the preset's optimizer steps")
    p.add_argument("--model", default=None, help="override the preset's model (hub id or local folder)")
    p.add_argument("--limit", type=int, default=None, help="PPL rows (default: the protocol's 300)")
    p.add_argument("--data-source", choices=DATA_SOURCES, default="local")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_size_args(p)


def _add_budget(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    """`budget`: the methods at equal parameter budgets, each at its own best LR."""
    p = add_parser("budget", help="at each parameter budget, each method at its own best LR, 3 seeds -> pareto.png")
    p.add_argument("--preset", choices=sorted(PRESETS), default="mini", help="(default: %(default)s)")
    p.add_argument("--out", default=None, help="output folder (default: runs/<preset>-budget)")
    p.add_argument(
        "--budgets",
        default=",".join(f"{b:g}" for b in DEFAULT_BUDGETS),
        help="fractions of the base's parameters (default: %(default)s)",
    )
    p.add_argument("--methods", default=",".join(BUDGET_METHODS), help="comma-separated (default: %(default)s)")
    p.add_argument("--seeds", type=int, default=3, help="seeds at each best LR (default: %(default)s)")
    p.add_argument("--seed-methods", default=None, help="methods that get the extra seeds (default: all)")
    p.add_argument("--lrs", default=None, help="start LRs for every method (default: each method's own, 2x apart)")
    p.add_argument(
        "--max-extend",
        type=int,
        default=3,
        help="LRs added past an edge while the best is there (default: %(default)s)",
    )
    p.add_argument("--no-paper-point", action="store_true", help="leave out the paper's full-size preproj_skip")
    p.add_argument(
        "--read-only",
        action="store_true",
        help="train nothing: read back the finished points and write the report (the rest: not run)",
    )
    p.add_argument("--steps", type=int, default=None, help="override the preset's optimizer steps")
    p.add_argument("--model", default=None, help="override the preset's model (hub id or local folder)")
    p.add_argument("--data-source", choices=DATA_SOURCES, default="local")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
