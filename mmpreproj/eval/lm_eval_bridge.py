"""The standard protocol: lm-evaluation-harness tasks on an in-memory model, from the Hub or the shipped data."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from packaging.version import Version
from torch import nn

from ..data import hellaswag_examples, hub_offline, hub_reachable, lambada_examples, wikitext_articles
from .runtime import inference_mode

LM_EVAL_FLOOR = "0.4.12"
"""The oldest lm-eval this bridge runs on (its task index's entries and YAML reader, `_local_config`): pyproject.toml's
`lm-eval>=` and `make test-floor` say the same."""
LM_EVAL_LOCAL_TASKS = ("lambada_openai", "hellaswag", "wikitext")
"""lm-eval tasks that run on the data shipped in assets/ (arc_easy cannot: no local copy)."""
# Folders of lm_eval/tasks/ holding the tasks we use: indexing only these takes milliseconds, not ~10 s.
_TASK_DIRS = {
    "lambada_openai": "lambada",
    "hellaswag": "hellaswag",
    "wikitext": "wikitext",
    "arc_easy": "arc",
}


class LmEvalUnavailableError(RuntimeError):
    """lm-eval is not installed, or the data of a task cannot be reached; the message is one line."""


def check_lm_eval_version(found: str | None = None) -> None:
    """`LmEvalUnavailableError` (one line, both versions named) when lm-eval `found` (default: the installed one) is
    older than `LM_EVAL_FLOOR`."""
    found = found or version("lm_eval")
    if Version(found) < Version(LM_EVAL_FLOOR):
        raise LmEvalUnavailableError(
            f"lm-eval {found} is older than {LM_EVAL_FLOOR}, the oldest mmpreproj runs lm-eval tasks with: "
            f"pip install -U 'lm-eval>={LM_EVAL_FLOOR}'"
        )


def _local_dataset(task: str) -> Callable[..., dict[str, Any]]:
    """A `custom_dataset` callable serving the shipped copy of an lm-eval task's data, in its Hub schema."""

    def build(**_: Any) -> dict[str, Any]:
        import datasets

        if task == "lambada_openai":  # EleutherAI/lambada_openai, test
            return {"test": datasets.Dataset.from_list([{"text": ex["text"]} for ex in lambada_examples()])}
        if task == "hellaswag":  # Rowan/hellaswag, validation (here: the shipped 1,000-example subset)
            return {"validation": datasets.Dataset.from_list(hellaswag_examples())}
        # EleutherAI/wikitext_document_level (wikitext-2-raw-v1), test: one row per article
        return {"test": datasets.Dataset.from_list([{"page": p} for p in wikitext_articles("test")])}

    return build


def _local_config(task: str, task_manager: Any) -> dict[str, Any]:
    """The registered YAML config of `task`, with its data served from assets/ instead of the Hub."""
    from lm_eval.tasks._yaml_loader import load_yaml

    entry = task_manager.task_index.get(task)
    if entry is None or entry.yaml_path is None:
        raise LmEvalUnavailableError(f"lm-eval has no YAML task named {task!r}")
    cfg = load_yaml(entry.yaml_path, resolve_func=True)
    for key in ("tag", "group"):
        cfg.pop(key, None)
    split = "validation" if task == "hellaswag" else "test"
    cfg.update(custom_dataset=_local_dataset(task), training_split=None, validation_split=None, test_split=None)
    cfg["validation_split" if split == "validation" else "test_split"] = split
    return cfg


def _task_manager(tasks: Sequence[str]) -> Any:
    """An lm-eval `TaskManager` that indexes only the folders of `tasks` when they are all known ones."""
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    if all(t in _TASK_DIRS for t in tasks):
        root = Path(lm_eval.tasks.__file__).parent
        return TaskManager(include_path=[str(root / _TASK_DIRS[t]) for t in tasks], include_defaults=False)
    return TaskManager()


def make_hflm(model: nn.Module, tokenizer, *, batch_size: int = 8, max_length: int | None = None) -> Any:
    """`lm_eval.models.huggingface.HFLM` wrapping an in-memory model (it needs `config`, `device`, `.logits`)."""
    try:
        from lm_eval.models.huggingface import HFLM
    except ImportError as err:
        raise LmEvalUnavailableError("lm-eval is not installed: pip install 'mmpreproj[eval]'") from err
    return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length)


def _flatten(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for task, metrics in results.items():
        out[task] = {k.split(",")[0]: v for k, v in metrics.items() if k != "alias" and isinstance(v, (int, float))}
    return out


def run_lm_eval(
    model: nn.Module,
    tokenizer,
    tasks: Sequence[str] = ("lambada_openai", "hellaswag", "wikitext"),
    *,
    limit: int | None = None,
    batch_size: int = 8,
    max_length: int | None = None,
    data_source: str = "hub",
    bootstrap_iters: int = 0,
) -> dict[str, dict[str, float]]:
    """Zero-shot lm-eval tasks on `model`, returned as `{task: {metric: value}}` (lm-eval's ",none" dropped).

    `data_source="hub"` uses lm-eval's own task data (downloaded by `datasets`); "local" serves
    `lambada_openai`, `hellaswag` (the shipped 1,000-example subset) and `wikitext` from assets/, with
    lm-eval's prompts and metrics unchanged. `limit` caps the examples per task. Raises
    `LmEvalUnavailableError` (one line) when lm-eval is missing or the data cannot be reached.
    """
    try:
        import lm_eval
    except ImportError as err:
        raise LmEvalUnavailableError("lm-eval is not installed: pip install 'mmpreproj[eval]'") from err
    check_lm_eval_version()
    if data_source not in ("hub", "local"):
        raise ValueError(f"unknown data source {data_source!r}; expected 'local' or 'hub'")
    names = ", ".join(tasks)
    if data_source == "local":
        missing = [t for t in tasks if t not in LM_EVAL_LOCAL_TASKS]
        if missing:
            raise LmEvalUnavailableError(
                f"lm-eval task(s) {', '.join(missing)} have no local data; use --data-source hub with network access"
            )
        manager = _task_manager(tasks)
        specs: list[Any] = [_local_config(t, manager) for t in tasks]
    else:
        if not hub_offline() and not hub_reachable():
            raise LmEvalUnavailableError(
                f"cannot download the data of lm-eval task(s) {names} (no network?); use --data-source local"
            )
        manager = _task_manager(tasks)
        specs = list(tasks)
    with inference_mode(model):  # HFLM calls model.eval() itself: build it inside, so flags come back
        lm = make_hflm(model, tokenizer, batch_size=batch_size, max_length=max_length)
        try:
            out = lm_eval.simple_evaluate(
                model=lm,
                tasks=specs,
                limit=limit,
                bootstrap_iters=bootstrap_iters,
                task_manager=manager,
                log_samples=False,
            )
        except (ConnectionError, OSError, FileNotFoundError) as err:
            why = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise LmEvalUnavailableError(f"lm-eval could not load the data of {names}: {why}") from None
    return _flatten(out["results"])
