"""`reproduce`: the paper's Table 2 for one preset — baseline plus every frozen-probe method, one table.

    rows = reproduce("mini", out="runs/demo")            # offline, CPU, minutes
    rows = reproduce("pythia-160m", out="runs/160m")     # online, GPU, the paper's protocol

Steps: load the base once; evaluate it; for each method train a fresh copy of the base (frozen probe),
evaluate it, and read its skip norms and routing ratios; write `results.json`, `table.md` and
`skip_norms.png` under `out`.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .analysis import PAPER_SKIP_NORMS, plot_skip_norms, routing_ratios, skip_norms
from .eval import evaluate
from .paper import PAPER_TABLE2, TABLE_METRICS
from .report import trainable_report
from .train import get_preset, load_model_and_tokenizer, train
from .train.config import METHODS

__all__ = ["reproduce", "format_table", "DEMO_EVAL"]

# What the offline demo evaluates: train on WikiText valid lines, so PPL is measured on test rows.
DEMO_EVAL: dict[str, Any] = {"tasks": ("ppl", "lambada", "hellaswag"), "ppl_split": "test", "limit": None}
PAPER_EVAL: dict[str, Any] = {"tasks": ("ppl", "lambada", "hellaswag", "arc_easy"), "ppl_split": "validation", "limit": None}


def _cell(value: Any, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def format_table(rows: list[dict[str, Any]], preset: str) -> str:
    """A markdown table in the paper's Table 2 layout (plus LAMBADA target perplexity, lm-eval's);
    paper figures in brackets for paper presets."""
    paper = PAPER_TABLE2.get(preset, {})
    head = "| model | method | params | LAMBADA | HellaSwag | ARC-E | PPL | LAMBADA ppl |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        cells = [_cell(row.get(f"{task}.{metric}"), ".1f" if metric == "ppl" else ".3f") for task, metric in TABLE_METRICS]
        params = f"{row['params'] / 1e6:.1f}M" if row["params"] else "-"
        ref = paper.get(row["method"])
        if ref:
            cells = [f"{c} ({_cell(p, '.1f' if i == 3 else '.3f')})" for i, (c, p) in enumerate(zip(cells, ref[1:]))]
            params += f" ({ref[0] or '-'})"
        cells.append(_cell(row.get("lambada.ppl"), ".4g"))
        lines.append(f"| {preset} | {row['method']} | {params} | " + " | ".join(cells) + " |")
    if paper:
        lines.append("\nIn brackets: the paper's Table 2 (500-sample evaluations, line-level PPL).")
    return "\n".join(lines)


def _flatten(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {f"{task}.{k}": v for task, metrics in results.items() for k, v in metrics.items()}


def _ratio_batches(tokenizer, texts: Sequence[str], max_len: int, device: torch.device):
    for text in texts:
        enc = tokenizer(text, return_tensors="pt", truncation=True, max_length=max_len)
        yield {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}


def reproduce(
    preset: str,
    out: str | Path,
    methods: Sequence[str] = ("preproj", "skip", "preproj_skip", "lora", "preproj_lora"),
    *,
    eval_settings: dict[str, Any] | None = None,
    data_source: str = "local",
    protocol: str = "paper",
    train_overrides: dict[str, Any] | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Run baseline + `methods` for `preset` and write results.json, table.md and skip_norms.png to `out`."""
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"unknown method {m!r}; allowed values: {list(METHODS)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = dict(DEMO_EVAL if preset == "mini" else PAPER_EVAL, **(eval_settings or {}))
    tasks, limit, ppl_split = settings["tasks"], settings["limit"], settings["ppl_split"]
    base_cfg = get_preset(preset, **(train_overrides or {}))
    base, tokenizer = load_model_and_tokenizer(base_cfg)

    def run_eval(model) -> dict[str, Any]:
        res = evaluate(model, tokenizer, tasks, protocol=protocol, limit=limit, data_source=data_source,
                       ppl_split=ppl_split, progress=progress)
        return _flatten(res)

    t0 = time.time()
    rows: list[dict[str, Any]] = [{"method": "baseline", "params": 0, **run_eval(base)}]
    norms: dict[str, list[float]] = {}
    texts = _ratio_texts(data_source, ppl_split)
    for method in methods:
        cfg = get_preset(preset, method=method, out=str(out / method), overwrite=True,
                         progress=progress, **(train_overrides or {}))
        result = train(cfg, model=copy.deepcopy(base), tokenizer=tokenizer)
        model = result.model
        row = {"method": method, "params": trainable_report(model).trainable, **run_eval(model),
               "train_loss": result.final_loss, "train_seconds": result.metrics.get("train_seconds")}
        sn = skip_norms(model)
        if sn:
            row["skip_norms"] = list(sn.values())
            norms[method] = row["skip_norms"]
            device = next(model.parameters()).device
            row["routing_ratios"] = list(routing_ratios(model, _ratio_batches(tokenizer, texts, base_cfg.max_len, device)).values())
        rows.append(row)
        del model, result
    table = format_table(rows, preset)
    (out / "table.md").write_text(table + "\n")
    summary = {"preset": preset, "protocol": protocol, "eval": settings, "seconds": time.time() - t0, "rows": rows}
    (out / "results.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    if norms:
        series = dict(norms)
        if preset in PAPER_SKIP_NORMS:
            series["paper"] = PAPER_SKIP_NORMS[preset]
        plot_skip_norms(series, out / "skip_norms.png", title=f"||W_skip||_F per layer ({preset})")
    return rows


def _ratio_texts(data_source: str, split: str, n: int = 32) -> list[str]:
    """A few evaluation rows (the PPL split) on which to measure ||W_skip x~|| / ||attn_out||."""
    from .data import wikitext_lines

    return [line for line in wikitext_lines(split, data_source) if len(line.strip()) > 50][:n]
