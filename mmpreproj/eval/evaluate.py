"""`evaluate`: the one entry point the CLI calls, for either protocol."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from torch import nn

from mmpreproj_tables.tables import DATA_SOURCES, PROTOCOLS, TASKS

from ..data import (
    DataUnavailableError,
    arc_easy_examples,
    hellaswag_examples,
    lambada_examples,
    wikitext_articles,
    wikitext_detokenize,
    wikitext_lines,
)
from .document_ppl import document_perplexity
from .lambada import lambada_accuracy
from .line_ppl import line_perplexity
from .lm_eval_bridge import LM_EVAL_LOCAL_TASKS, LmEvalUnavailableError, run_lm_eval
from .multiple_choice import arc_easy_accuracy, hellaswag_accuracy

log = logging.getLogger(__name__)

# The paper's sample counts (arXiv 2604.10791, its evaluation protocol; see `evaluate`), used when `limit` is None
# under protocol="paper".
PAPER_LIMITS: dict[str, int | None] = {
    "ppl": 300,
    "lambada": 500,
    "hellaswag": 500,
    "arc_easy": 500,
    "doc_ppl": None,
}
"""The paper's examples per task under protocol `paper` when `limit` is None (None = all)."""
LM_EVAL_TASK_NAMES = {
    "ppl": "wikitext",
    "lambada": "lambada_openai",
    "hellaswag": "hellaswag",
    "arc_easy": "arc_easy",
}
"""Our task name -> lm-eval's. `doc_ppl` is ours under both protocols (lm-eval's wikitext is `ppl` there)."""


def _check_choice(kind: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {kind} {value!r}; expected one of {', '.join(allowed)}")


def _paper_task(
    model: nn.Module, tokenizer, task: str, n: int | None, source: str, *, ppl_split: str, **opts: Any
) -> dict[str, Any]:
    """One task of the paper's protocol on its first `n` examples (`opts`: max_length, batch_size, progress)."""
    if task == "ppl":
        return line_perplexity(model, tokenizer, wikitext_lines(ppl_split, source)[:n], **opts)
    if task == "lambada":
        return lambada_accuracy(model, tokenizer, lambada_examples(n, source), **opts)
    if task == "hellaswag":
        return hellaswag_accuracy(model, tokenizer, hellaswag_examples(n, source), **opts)
    return arc_easy_accuracy(model, tokenizer, arc_easy_examples(n, source), **opts)


def evaluate(
    model: nn.Module,
    tokenizer,
    tasks: Sequence[str] = ("ppl", "lambada", "hellaswag", "arc_easy"),
    protocol: str = "paper",
    limit: int | None = None,
    data_source: str = "local",
    batch_size: int = 8,
    *,
    ppl_split: str = "validation",
    max_length: int = 512,
    doc_max_length: int | None = None,
    skip_unavailable: bool = True,
    progress: bool = True,
    per_item: bool = False,
) -> dict[str, dict[str, Any]]:
    """Evaluate `model` on `tasks` and return `{task: {metric: value}}`.

    Tasks: "ppl", "lambada", "hellaswag", "arc_easy", and "doc_ppl" (token-weighted WikiText-103 test
    perplexity over whole articles with rolling windows, `document_perplexity`; the same under both protocols).

    - `protocol="paper"`: the paper's own evaluators (arXiv 2604.10791): line-level PPL on the first
      300 `ppl_split` rows, LAMBADA / HellaSwag / ARC-Easy on the first 500, sequences cut at `max_length`.
      `limit` (if given) replaces every one of those counts.
    - `protocol="lm-eval"`: lm-evaluation-harness (`wikitext`, `lambada_openai`, `hellaswag`, `arc_easy`),
      zero-shot, on all examples or the first `limit`.

    `doc_max_length` is the window of "doc_ppl" and lm-eval's `max_length` (default: the model's
    `config.max_position_embeddings`, else 2048). `batch_size` sequences go through the model at once.

    `data_source="local"` reads the data shipped in assets/ (ARC-Easy has none), "hub" downloads it. A task
    whose data cannot be reached gets `{"unavailable": <one-line reason>}` (also logged) when
    `skip_unavailable`, else its `DataUnavailableError` / `LmEvalUnavailableError` is raised.
    Unknown task, protocol or data source names raise `ValueError` naming the allowed values.
    `per_item=True` adds each paper-protocol task's per-example scores (`row_loss`, `item_logprob`,
    `item_correct`), from which `mmpreproj.analysis.stats` bootstraps intervals.
    """
    tasks = list(tasks)
    _check_arguments(tasks, protocol, data_source, limit, batch_size, max_length, doc_max_length)
    results: dict[str, dict[str, Any]] = {}
    harness = [t for t in tasks if protocol == "lm-eval" and t in LM_EVAL_TASK_NAMES]
    for task in tasks:
        if task in harness:
            continue
        try:
            results[task] = _own_task(
                model,
                tokenizer,
                task,
                limit,
                data_source,
                ppl_split=ppl_split,
                max_length=max_length,
                doc_max_length=doc_max_length,
                per_item=per_item,
                batch_size=batch_size,
                progress=progress,
            )
        except DataUnavailableError as err:
            _unavailable(results, task, err, skip_unavailable)
    if harness:
        _harness_tasks(
            results,
            model,
            tokenizer,
            harness,
            limit=limit,
            batch_size=batch_size,
            doc_max_length=doc_max_length,
            data_source=data_source,
            skip_unavailable=skip_unavailable,
        )
    return {t: results[t] for t in tasks}


def _check_arguments(
    tasks: list[str],
    protocol: str,
    data_source: str,
    limit: int | None,
    batch_size: int,
    max_length: int,
    doc_max_length: int | None,
) -> None:
    """ValueError naming the allowed values for no task, an unknown name, or a count that is not an int >= 1."""
    if not tasks:
        raise ValueError(f"no task to evaluate; expected some of {', '.join(TASKS)}")
    for task in tasks:
        _check_choice("task", task, TASKS)
    for name, value, none_ok in (
        ("limit", limit, True),
        ("batch_size", batch_size, False),
        ("max_length", max_length, False),
        ("doc_max_length", doc_max_length, True),
    ):
        if not (
            (value is None and none_ok) or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)
        ):
            raise ValueError(f"{name}={value!r}; must be {'None or ' if none_ok else ''}an int >= 1")
    _check_choice("protocol", protocol, PROTOCOLS)
    _check_choice("data source", data_source, DATA_SOURCES)


def _unavailable(results: dict[str, dict[str, Any]], task: str, err: Exception, skip_unavailable: bool) -> None:
    """Record `task` as unavailable (and log why) when `skip_unavailable`, else raise `err`."""
    if not skip_unavailable:
        raise err
    log.warning("%s: %s", task, err)
    results[task] = {"unavailable": str(err)}


def _own_task(
    model: nn.Module,
    tokenizer,
    task: str,
    limit: int | None,
    data_source: str,
    *,
    ppl_split: str,
    max_length: int,
    doc_max_length: int | None,
    per_item: bool,
    **opts: Any,
) -> dict[str, Any]:
    """One task by this library's evaluators: "doc_ppl" over whole articles, the others by the paper's protocol
    (`opts`: batch_size, progress)."""
    if task == "doc_ppl":
        documents = wikitext_articles("test", data_source)[:limit]
        return document_perplexity(
            model,
            tokenizer,
            documents,
            max_length=doc_max_length,
            detokenize=wikitext_detokenize,
            **opts,
        )
    n = limit if limit is not None else PAPER_LIMITS[task]
    return _paper_task(
        model,
        tokenizer,
        task,
        n,
        data_source,
        ppl_split=ppl_split,
        max_length=max_length,
        per_item=per_item,
        **opts,
    )


def _harness_tasks(
    results: dict[str, dict[str, Any]],
    model: nn.Module,
    tokenizer,
    harness: list[str],
    *,
    limit: int | None,
    batch_size: int,
    doc_max_length: int | None,
    data_source: str,
    skip_unavailable: bool,
) -> None:
    """The `harness` tasks in one lm-eval run, into `results`; unavailable: a task with no local data under
    `data_source="local"`, or every one when lm-eval cannot run."""
    if data_source == "local":
        for task in [t for t in harness if LM_EVAL_TASK_NAMES[t] not in LM_EVAL_LOCAL_TASKS]:
            harness.remove(task)
            _unavailable(
                results,
                task,
                LmEvalUnavailableError(
                    f"lm-eval task {LM_EVAL_TASK_NAMES[task]!r} has no local "
                    "data; use --data-source hub with network access"
                ),
                skip_unavailable,
            )
    try:
        if harness:
            names = [LM_EVAL_TASK_NAMES[t] for t in harness]
            out = run_lm_eval(
                model,
                tokenizer,
                names,
                limit=limit,
                batch_size=batch_size,
                max_length=doc_max_length,
                data_source=data_source,
            )
            results.update({t: out[LM_EVAL_TASK_NAMES[t]] for t in harness})
    except LmEvalUnavailableError as err:
        for task in harness:
            _unavailable(results, task, err, skip_unavailable)
