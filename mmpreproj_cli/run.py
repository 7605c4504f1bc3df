"""The `mmpreproj` command's subcommands: train, eval, analyze, reproduce, sweep, budget, demo.

`command.main` parses and checks the arguments without the library, then imports this module and calls `run`.
Each subcommand imports the library's modules it runs inside its function: the command's deferred imports, so
this module itself stays light (standard library, `mmpreproj_tables` and the command's own checks) and a
subcommand loads only what it runs (`eval` no experiments or plots, `train` no evaluators).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mmpreproj_tables.tables import BUDGET_METHODS, METHODS, PRESETS
from mmpreproj_tables.values import parse_budgets, parse_lrs

from .checks import adapter_list, check_names, size_overrides
from .parser import TRAIN_FLAGS


def run(args: argparse.Namespace) -> str:
    """Run the subcommand of `args` (parsed and checked by `command.main`); its one-line summary. `--no-progress`
    silences transformers' and the hub's bars too (loading weights) for the call."""
    from mmpreproj.util.progress import library_progress_bars

    with library_progress_bars(not getattr(args, "no_progress", False)):
        return _run(args)


def _run(args: argparse.Namespace) -> str:
    if args.command == "train":
        return _train(args)
    if args.command == "eval":
        return _eval(args)
    if args.command == "analyze":
        return _analyze(args)
    if args.command == "sweep":
        return _sweep(args)
    if args.command == "budget":
        return _budget(args)
    return _reproduce(args, "mini" if args.command == "demo" else args.preset)


def _train(args: argparse.Namespace) -> str:
    from mmpreproj.train import get_preset, train

    overrides = {
        k: getattr(args, k)
        for k in (*TRAIN_FLAGS, "packing", "paper_bf16_weights", "gradient_checkpointing", "resume", "overwrite")
        if getattr(args, k, None) is not None
    }
    if "steps" in overrides and "warmup_steps" not in overrides:  # keep warmup within a shortened run
        overrides["warmup_steps"] = min(PRESETS[args.preset]["warmup_steps"], overrides["steps"])
    overrides.update(size_overrides(args))
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
        from mmpreproj.analysis import plot_loss_curve

        plot_loss_curve(run)


def _eval(args: argparse.Namespace) -> str:
    from mmpreproj.eval import adapters_table, evaluate, evaluate_adapters
    from mmpreproj.method.load import load_adapter
    from mmpreproj.train import load_model_and_tokenizer
    from mmpreproj.train.config import TrainConfig
    from mmpreproj.util.io import atomic_write

    adapters = adapter_list(args.adapter)
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
    from mmpreproj.analysis import plot_skip_norms, routing_ratios, skip_norms_from_adapter
    from mmpreproj.experiments.reproduce import _ratio_batches, _ratio_texts
    from mmpreproj.method.load import load_adapter
    from mmpreproj.train import load_model_and_tokenizer, run_adapter_dir
    from mmpreproj.train.config import TrainConfig

    out = Path(args.out or args.runs[0])
    norms = {run: skip_norms_from_adapter(run_adapter_dir(run)) for run in args.runs}  # every run read first
    for run, by_block in norms.items():
        if not by_block:
            raise ValueError(f"{run}: this adapter has no content skip (method without 'skip')")
    report: dict[str, Any] = {}
    for run in args.runs:
        entry: dict[str, Any] = {"skip_norms": norms[run]}
        if args.texts:
            cfg = TrainConfig.from_json(Path(run) / "train_config.json").replace(device="auto")
            model, tok = load_model_and_tokenizer(cfg)
            model = load_adapter(model, run)
            texts = _ratio_texts(args.data_source, "test", args.texts)
            device = next(model.parameters()).device
            entry["routing_ratios"] = routing_ratios(model, _ratio_batches(tok, texts, cfg.max_len, device))
        report[run] = entry
    out.mkdir(parents=True, exist_ok=True)  # nothing is written before every run has its figures
    (out / "skip_norms.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_skip_norms({Path(r).name: e["skip_norms"] for r, e in report.items()}, out / "skip_norms.png")
    if args.texts:
        plot_skip_norms(
            {Path(r).name: e["routing_ratios"] for r, e in report.items()},
            out / "routing_ratios.png",
            title="||W_skip x~|| / ||attn_out|| per block",
            ylabel="ratio",
        )
    return f"wrote {out / 'skip_norms.json'} and {out / 'skip_norms.png'}"


def _reproduce(args: argparse.Namespace, preset: str) -> str:
    from mmpreproj.experiments.reproduce import reproduce

    methods = check_names("--methods", args.methods, METHODS)
    out = args.out or f"runs/{preset}"
    kwargs: dict[str, Any] = {
        "data_source": args.data_source,
        "protocol": args.protocol,
        "progress": not args.no_progress,
        "seeds": args.seeds,
        "command": _command_line(),
    }
    if methods or args.command == "demo":
        from mmpreproj.experiments.reproduce import DEMO_METHODS

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
    overrides.update(size_overrides(args))  # each reaches the methods that have its module (train.sizes)
    return overrides


def _command_line() -> str:
    return "mmpreproj " + " ".join(sys.argv[1:]) if sys.argv and "pytest" not in sys.argv[0] else "mmpreproj"


def _sweep(args: argparse.Namespace) -> str:
    from mmpreproj.experiments.sweep import lr_sweep

    out = args.out or f"runs/{args.preset}-lr-sweep"
    methods = check_names("--methods", args.methods, METHODS)
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
    from mmpreproj.experiments.budget import budget_study

    out = args.out or f"runs/{args.preset}-budget"
    methods = check_names("--methods", args.methods, BUDGET_METHODS)
    budget_study(
        args.preset,
        out,
        parse_budgets(args.budgets, flag="--budgets"),
        methods,
        seeds=args.seeds,
        seed_methods=check_names("--seed-methods", args.seed_methods, methods),
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
