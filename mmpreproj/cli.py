"""The `mmpreproj` command: train, eval, analyze, reproduce, sweep, budget, demo (also `python -m mmpreproj`)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "build_parser"]

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
    from .train.config import METHODS, MODEL_DTYPES, PARALLEL, PRECISIONS
    from .train.presets import PRESETS

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
            "parallel": "with torchrun/accelerate launch: ddp (default) or fsdp (needs --save-every 0)",
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
    p.add_argument("--resume", action="store_true", default=None, help="continue from OUT/checkpoint.pt")
    p.add_argument("--overwrite", action="store_true", default=None, help="start afresh in a non-empty OUT")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _preset_value(field: str) -> str:
    """The presets' value of a TrainConfig field, for --help: "1.25 in every preset" or "mini: 1.25, ..."."""
    from .train.presets import PRESETS, get_preset

    values = {name: getattr(get_preset(name), field) for name in sorted(PRESETS)}
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
        help="comma-separated block indices to inject into, negative from the end (default: the preset's, "
        f"{_preset_value('layers')}; None = every block)",
    )
    p.add_argument(
        "--parts",
        default=None,
        help=f"comma-separated host parts to inject into (default: the preset's, {_preset_value('parts')}; "
        "None = the host row's parts)",
    )


def _size_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The size flags given, as TrainConfig fields (--layers 0,-1 -> [0, -1]); ValueError naming the flag."""
    out: dict[str, Any] = {}
    for name in ("expansion", "skip_rank"):
        if getattr(args, name, None) is not None:
            out[name] = getattr(args, name)
    if getattr(args, "layers", None) is not None:
        items = [t.strip() for t in args.layers.split(",") if t.strip()]
        if not items or not all(t.removeprefix("-").isdecimal() for t in items):
            raise ValueError(f"--layers {args.layers!r}: pass comma-separated block indices such as 0,1,-1")
        out["layers"] = [int(t) for t in items]
    if getattr(args, "parts", None) is not None:
        out["parts"] = [t.strip() for t in args.parts.split(",") if t.strip()]
        if not out["parts"]:
            raise ValueError(f"--parts {args.parts!r}: pass comma-separated part names such as language")
    from .tuner.config import MAX_EXPANSION  # the config's bound, said in the flag's words

    for flag, name in (("--expansion", "expansion"), ("--skip-rank", "skip_rank")):
        value = out.get(name)
        top = MAX_EXPANSION if name == "expansion" else float("inf")
        if value is not None and not (0 < value <= top and value == value and value != float("inf")):
            must = (
                "an int >= 1 (and at most the model width d)"
                if name == "skip_rank"
                else f"a finite number in (0, {MAX_EXPANSION}] "
                f"(the inner width int(expansion*d) is at most {MAX_EXPANSION}*d)"
            )
            raise ValueError(f"{flag} {value}; must be {must}")
    return out


def _add_eval_args(p: argparse.ArgumentParser, single_model: bool = True) -> None:
    from .eval import DATA_SOURCES, PROTOCOLS, TASKS

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
        help="'local' reads assets/ (never waits on a network); 'hub' uses the datasets hub copies",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
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
    p.add_argument("--data-source", choices=("local", "hub"), default="local")

    for name, helptext in (
        ("reproduce", "baseline + every method, one Table-2-style table"),
        ("demo", "the offline main job: `reproduce --preset mini` with the paper's five methods"),
    ):
        p = sub.add_parser(name, help=helptext)
        from .train.methods import METHODS
        from .train.presets import PRESETS

        if name == "reproduce":
            p.add_argument("--preset", choices=sorted(PRESETS), required=True)
        p.add_argument("--out", default=None, help="output folder (default: runs/<preset>)")
        p.add_argument(
            "--methods", default=None, help=f"comma-separated subset of {', '.join(METHODS)} (default: all of them)"
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

    p = sub.add_parser("sweep", help="final PPL vs learning rate, per method (one seed per point) -> lr_sweep.png")
    from .experiments.sweep import DEFAULT_LRS

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
    p.add_argument("--data-source", choices=("local", "hub"), default="local")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_size_args(p)

    p = sub.add_parser(
        "budget", help="at each parameter budget, each method at its own best LR, 3 seeds -> pareto.png"
    )
    from .experiments.budget import DEFAULT_BUDGETS
    from .train.sizes import BUDGET_METHODS

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
    p.add_argument("--data-source", choices=("local", "hub"), default="local")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return ap


def _count(flag: str, value: int | None, minimum: int) -> None:
    if value is not None and value < minimum:
        raise ValueError(f"{flag} {value}; must be an integer >= {minimum}")


def _names(flag: str, value: str | None, allowed: Sequence[str]) -> list[str] | None:
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


def _existing(flag: str, value: str | None) -> None:
    if value is not None and not Path(value).exists():
        raise ValueError(f"{flag} {value}: no such file or folder")


def _adapter_folder(flag: str, value: str) -> None:
    """An existing run or adapter folder that holds an adapter (checked before the base is loaded)."""
    from .train.adapters import run_adapter_dir
    from .tuner.files import ADAPTER_CONFIG_NAME

    _existing(flag, value)
    if not (run_adapter_dir(value) / ADAPTER_CONFIG_NAME).is_file():
        raise ValueError(
            f"{flag} {value}: holds no adapter ({ADAPTER_CONFIG_NAME} missing); pass a run folder or an adapter folder"
        )


def _model(flag: str, value: str | None) -> None:
    """A name written as a local path must exist (a hub id is looked up when the model loads)."""
    from .data.model_source import check_local_model

    if value is not None:
        try:
            check_local_model(value)
        except FileNotFoundError:
            raise ValueError(f"{flag} {value}: no such folder (a local path; a hub id looks like org/name)") from None


def _data(flag: str, value: str | None) -> None:
    """A name written as a local path (`train.sources`' rule) must be an existing file."""
    from .train.sources import looks_like_path, resolve_path

    if value is None:
        return
    local = resolve_path(value)
    if local is None and looks_like_path(value):
        raise ValueError(
            f"{flag} {value}: no such file (a local text file, one example per line; or a hub dataset id)"
        )
    if local is not None and not local.is_file():
        raise ValueError(f"{flag} {value}: is a folder; pass a text file, one example per line")


def _check_args(args: argparse.Namespace) -> None:
    """Every path, count and list option, checked before any work starts (no arm trained, no file written)."""
    from .eval import TASKS
    from .train.methods import METHODS

    _refuse_empty(args)
    command = args.command
    if command in ("train", "reproduce", "demo", "sweep", "budget"):  # train's counts: TrainConfig names them
        _output_folder("--out", args.out)
    if command in ("train", "reproduce", "demo"):
        _data("--data", args.data)
    if command in ("reproduce", "demo", "sweep", "budget"):
        _count("--steps", args.steps, 1)
    if command == "eval":
        _names("--tasks", args.tasks, TASKS)
        _output_file("--json", args.json)
        for adapter in _adapters(args.adapter):
            _adapter_folder("--adapter", adapter)
        _count("--batch-size", args.batch_size, 1)
        _count("--limit", args.limit, 1)
    elif command == "analyze":
        _output_folder("--out", args.out)
        _count("--texts", args.texts, 0)
        for run in args.runs:
            _adapter_folder("run folder", run)
    elif command == "sweep":
        from .experiments.sweep import parse_lrs

        _names("--methods", args.methods, METHODS)
        parse_lrs(args.lrs, flag="--lrs")
        _count("--seed", args.seed, 0)
        _count("--limit", args.limit, 1)
    elif command == "budget":
        from .experiments.budget import parse_budgets
        from .experiments.sweep import parse_lrs
        from .train.sizes import BUDGET_METHODS

        methods = _names("--methods", args.methods, BUDGET_METHODS)
        _names("--seed-methods", args.seed_methods, methods)
        parse_budgets(args.budgets, flag="--budgets")
        if args.lrs is not None:
            parse_lrs(args.lrs, flag="--lrs")
        _count("--seeds", args.seeds, 1)
        _count("--max-extend", args.max_extend, 0)
    elif command in ("reproduce", "demo"):
        from .experiments.reproduce import parse_seeds

        _names("--methods", args.methods, METHODS)
        parse_seeds(args.seeds, 0, flag="--seeds")
        _count("--limit", args.limit, 1)
    if command in ("train", "sweep", "reproduce", "demo"):
        _size_overrides(args)
    if command != "analyze":  # last: the other options are checked even when the model is also wrong
        _model("--model", args.model)


def _train(args: argparse.Namespace) -> str:
    from .train import get_preset, train

    overrides = {
        k: getattr(args, k)
        for k in (*TRAIN_FLAGS, "packing", "paper_bf16_weights", "gradient_checkpointing", "resume", "overwrite")
        if getattr(args, k, None) is not None
    }
    if "steps" in overrides and "warmup_steps" not in overrides:  # keep warmup within a shortened run
        from .train.presets import PRESETS

        overrides["warmup_steps"] = min(PRESETS[args.preset]["warmup_steps"], overrides["steps"])
    overrides.update(_size_overrides(args))
    out = args.out or f"runs/{args.preset}-{args.method}"
    cfg = get_preset(args.preset, method=args.method, out=out, progress=not args.no_progress, **overrides)
    result = train(cfg)
    _loss_curve_png(out)
    m = result.metrics
    return (
        f"trained {cfg.method} on {cfg.model}: {m.get('steps')} steps, final loss {m.get('final_loss'):.4f} -> {out}"
    )


def _loss_curve_png(run: str) -> None:
    """The run folder's loss_curve.png (rank 0 only; skipped without matplotlib, the `plot` extra)."""
    import importlib.util
    import os

    if (
        os.environ.get("RANK", "0") == "0"
        and (Path(run) / "log.jsonl").is_file()
        and importlib.util.find_spec("matplotlib")
    ):
        from .analysis import plot_loss_curve

        plot_loss_curve(run)


def _adapters(values: list[str] | None) -> list[str]:
    """The adapters of repeated and/or comma-separated --adapter options, in order; ValueError on a repeat."""
    names = [a.strip() for v in values or [] for a in v.split(",") if a.strip()]
    empty = [v for v in values or [] if not v.replace(",", "").strip()]
    if empty:
        raise ValueError(f"--adapter {empty[0]!r}: empty path; pass a run folder or an adapter folder")
    if len(set(names)) != len(names):
        raise ValueError(f"--adapter {','.join(names)}: names one adapter twice")
    return names


def _eval(args: argparse.Namespace) -> str:
    from .eval import adapters_table, evaluate, evaluate_adapters
    from .train import load_model_and_tokenizer
    from .train.config import TrainConfig
    from .tuner.load import load_adapter
    from .util.io import atomic_write

    adapters = _adapters(args.adapter)
    model, tok = load_model_and_tokenizer(TrainConfig(model=args.model, device="auto"))
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if args.json:  # checked and its folder made before the work, so the results cannot be lost at the end
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    opts = dict(
        tasks=tasks,
        protocol=args.protocol,
        limit=args.limit,
        data_source=args.data_source,
        batch_size=args.batch_size,
        ppl_split=args.ppl_split,
        progress=not args.no_progress,
    )
    if len(adapters) > 1:  # one base, each adapter in turn: {adapter: {task: metrics}}
        by_adapter = evaluate_adapters(model, tok, adapters, **opts)
        text = json.dumps(by_adapter, indent=2)
        if args.json:
            atomic_write(args.json, lambda f: Path(f).write_text(text + "\n", encoding="utf-8"))
        print(text)
        print(adapters_table(by_adapter))
        return f"{len(adapters)} adapters of {args.model} scored on {', '.join(tasks)}"
    if adapters:
        model = load_adapter(model, adapters[0])
    res = evaluate(model, tok, **opts)
    text = json.dumps(res, indent=2)
    if args.json:
        atomic_write(args.json, lambda f: Path(f).write_text(text + "\n", encoding="utf-8"))
    print(text)
    parts = [
        f"{t}: " + ", ".join(f"{k}={v:.4g}" for k, v in r.items() if isinstance(v, float)) for t, r in res.items()
    ]
    return "; ".join(p for p in parts)


def _analyze(args: argparse.Namespace) -> str:
    from .analysis import plot_skip_norms, routing_ratios, skip_norms_from_adapter
    from .experiments.reproduce import _ratio_batches, _ratio_texts
    from .train import load_model_and_tokenizer, run_adapter_dir
    from .train.config import TrainConfig
    from .tuner.load import load_adapter

    out = Path(args.out or args.runs[0])
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    for run in args.runs:
        norms = skip_norms_from_adapter(run_adapter_dir(run))
        if not norms:
            raise ValueError(f"{run}: this adapter has no content skip (method without 'skip')")
        entry: dict[str, Any] = {"skip_norms": norms}
        if args.texts:
            cfg = TrainConfig.from_json(Path(run) / "train_config.json").replace(device="auto")
            model, tok = load_model_and_tokenizer(cfg)
            model = load_adapter(model, run)
            texts = _ratio_texts(args.data_source, "test", args.texts)
            device = next(model.parameters()).device
            entry["routing_ratios"] = routing_ratios(model, _ratio_batches(tok, texts, cfg.max_len, device))
        report[run] = entry
    (out / "skip_norms.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_skip_norms({Path(r).name: list(e["skip_norms"].values()) for r, e in report.items()}, out / "skip_norms.png")
    if args.texts:
        plot_skip_norms(
            {Path(r).name: list(e["routing_ratios"].values()) for r, e in report.items()},
            out / "routing_ratios.png",
            title="||W_skip x~|| / ||attn_out|| per layer",
            ylabel="ratio",
        )
    return f"wrote {out / 'skip_norms.json'} and {out / 'skip_norms.png'}"


def _reproduce(args: argparse.Namespace, preset: str) -> str:
    from .experiments.reproduce import reproduce
    from .train.methods import METHODS

    methods = _names("--methods", args.methods, METHODS)
    out = args.out or f"runs/{preset}"
    kwargs: dict[str, Any] = {
        "data_source": args.data_source,
        "protocol": args.protocol,
        "progress": not args.no_progress,
        "seeds": args.seeds,
        "command": _command_line(),
    }
    if methods or args.command == "demo":
        from .experiments.reproduce import DEMO_METHODS

        kwargs["methods"] = methods or DEMO_METHODS
    if args.limit is not None:
        kwargs["eval_settings"] = {"limit": args.limit}
    kwargs["train_overrides"] = _repro_overrides(args)
    rows = reproduce(preset, out, **kwargs)
    print((Path(out) / "table.md").read_text())
    return f"{len(rows)} rows -> {out}/report.md (table, intervals, figures), results.json"


def _repro_overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {k: getattr(args, k) for k in ("model", "data") if getattr(args, k, None) is not None}
    if args.steps is not None:
        overrides.update(steps=args.steps, warmup_steps=min(args.steps, max(1, args.steps // 10)))
    overrides.update(_size_overrides(args))  # each reaches the methods that have its module (train.sizes)
    return overrides


def _command_line() -> str:
    return "mmpreproj " + " ".join(sys.argv[1:]) if sys.argv and "pytest" not in sys.argv[0] else "mmpreproj"


def _sweep(args: argparse.Namespace) -> str:
    from .experiments.sweep import lr_sweep, parse_lrs
    from .train.methods import METHODS

    out = args.out or f"runs/{args.preset}-lr-sweep"
    methods = _names("--methods", args.methods, METHODS)
    lr_sweep(
        args.preset,
        out,
        methods,
        parse_lrs(args.lrs, flag="--lrs"),
        seed=args.seed,
        data_source=args.data_source,
        eval_settings={"limit": args.limit} if args.limit is not None else None,
        train_overrides=_repro_overrides(args),
        progress=not args.no_progress,
        command=_command_line(),
    )
    print((Path(out) / "sweep.md").read_text())
    return f"{out}/report.md, lr_sweep.png"


def _budget(args: argparse.Namespace) -> str:
    from .experiments.budget import budget_study, parse_budgets
    from .experiments.sweep import parse_lrs
    from .train.sizes import BUDGET_METHODS

    out = args.out or f"runs/{args.preset}-budget"
    methods = _names("--methods", args.methods, BUDGET_METHODS)
    budget_study(
        args.preset,
        out,
        parse_budgets(args.budgets, flag="--budgets"),
        methods,
        seeds=args.seeds,
        seed_methods=_names("--seed-methods", args.seed_methods, methods),
        start_lrs=parse_lrs(args.lrs, flag="--lrs") if args.lrs else None,
        max_extend=args.max_extend,
        paper_point=not args.no_paper_point,
        data_source=args.data_source,
        train_overrides=_repro_overrides(args),
        progress=not args.no_progress,
        command=_command_line(),
        read_only=args.read_only,
    )
    return f"{out}/report.md, pareto.png"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        _check_args(args)
        if args.command == "train":
            summary = _train(args)
        elif args.command == "eval":
            summary = _eval(args)
        elif args.command == "analyze":
            summary = _analyze(args)
        elif args.command == "sweep":
            summary = _sweep(args)
        elif args.command == "budget":
            summary = _budget(args)
        else:
            summary = _reproduce(args, "mini" if args.command == "demo" else args.preset)
    except KeyboardInterrupt:
        print("mmpreproj: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one line for the user; -v shows the traceback
        if args.verbose:
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"mmpreproj {args.command}: error: {msg}", file=sys.stderr)
        return 1
    print(f"mmpreproj {args.command}: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
