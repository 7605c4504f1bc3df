"""`study`: Table 2 of the paper on one preset, every method at its own learning rate, with seeds, run by
several processes at once and over several sessions.

    study("smollm2-135m-cpu", out="docs/evidence/smollm2-135m", runs="runs/smollm2-135m")

A *group* is one row of the table: a method at a size (the paper's, or a trainable budget such as 1% of the
base). For each group, in order:
1. **LR search** on the first seed: train at each start LR and score line PPL on held-out rows (`ppl_split="heldout"`,
   never the test rows). While the best held-out PPL sits at an edge of what was tried,
   the next rung of `LR_LADDER` on that side is tried (at most `max_extend` times).
2. **Full evaluation** of the best LR's arm: line PPL on the first 300 test rows, LAMBADA (first 500: accuracy
   and target PPL), HellaSwag (first 200: a CPU budget; the paper scores 500), and the routing
   ratio `||W_skip x~|| / ||attn_out||` per layer (skip norms are read at training time for every arm).
3. **Seeds**: the group's other seeds train at the best LR and get both evaluations.

Every step is a file: `out/arms/<group>/lr-<lr>-seed-<s>/select.json` (training facts, skip norms, held-out
PPL with per-row losses, `log.jsonl`, `loss_curve.png`) and `full.json` beside it. A restarted
study reads them back (keyed by every setting the numbers depend on) and trains nothing twice, so `out` can
be committed as arms finish and a later session goes on from there. Adapters and checkpoints live under
`runs` (not committed); a full evaluation whose adapter is gone retrains its arm (same seed, same result).
Processes sharing `out` claim each step with a lock file; `workers=2` on two cores, one thread each, runs two
arms at once. `study_report.write_report` reads back what is finished and writes study.json, report.md and figures.
"""

from __future__ import annotations

import copy
import logging
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..analysis import routing_ratios, skip_norms
from ..analysis.plot import plot_loss_curve
from ..data import wikitext_lines
from ..eval import evaluate
from ..method.load import load_adapter
from ..train import get_preset, load_model_and_tokenizer
from ..train.checkpoint import CHECKPOINT_NAME
from ..train.config import TrainConfig
from ..train.errors import NonFiniteLossError
from ..train.methods import host_shape, lora_per_rank
from ..train.sizes import sizes_for_budget
from .arms import arm_key, read_record, train_arm, write_record
from .runner import Scores, best_lr, claim, next_lr, point_config, search_lrs, work_through

log = logging.getLogger("mmpreproj.study")

SELECT_EVAL: dict[str, Any] = {"tasks": ["ppl"], "ppl_split": "heldout", "limit": None}
FULL_EVAL: dict[str, Any] = {
    "tasks": ["ppl", "lambada", "hellaswag"],
    "ppl_split": "test",
    "limits": {"ppl": 300, "lambada": 500, "hellaswag": 200},
    "routing_rows": 32,
}
SELECT_FILE, FULL_FILE = "select.json", "full.json"


@dataclass(frozen=True)
class Group:
    """One row of the table: `method` at `sizes` (TrainConfig size fields), its start LRs, its seed count."""

    label: str
    method: str
    start_lrs: tuple[float, ...]
    seeds: int = 1
    sizes: tuple[tuple[str, Any], ...] = ()
    budget: float | None = None  # the trainable fraction the sizes were chosen for (None = the method's own)


@dataclass(frozen=True)
class Step:
    """What a worker does next: `kind` "select" (train + held-out/test PPL) or "full" (LAMBADA, HellaSwag)."""

    kind: str
    group: Group
    lr: float
    seed: int
    arm: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "arm", f"{self.group.label}/lr-{self.lr:g}-seed-{self.seed}")


def table2_groups(base: nn.Module, *, budget: float = 0.01, seeds: int = 3) -> list[Group]:
    """Table 2's seven rows at the paper's sizes (`seeds` for preproj_skip, lora and lora_matched), then
    pre-projection + a rank-r skip against LoRA at `budget` of the base's parameters (`seeds` each).
    Ordered so the paper's central comparison finishes first."""
    dim, layers = host_shape(base)
    target = round(budget * sum(p.numel() for p in base.parameters()))
    at = {
        m: tuple(
            sorted(
                (sizes_for_budget(m, target, dim=dim, layers=layers, lora_per_rank=lora_per_rank(base)) or {}).items()
            )
        )
        for m in ("preproj_skip", "lora")
    }
    ours, loras = (1e-3, 3e-3), (3e-4, 1e-3)
    b = f"b{budget:g}"
    return [
        Group("preproj_skip", "preproj_skip", ours, seeds),
        Group("lora", "lora", loras, seeds),
        Group("lora_matched", "lora_matched", loras, seeds),
        Group(f"{b}/preproj_skip", "preproj_skip", (3e-3, 1e-2), seeds, at["preproj_skip"], budget),
        Group(f"{b}/lora", "lora", loras, seeds, at["lora"], budget),
        Group("preproj", "preproj", ours),
        Group("skip", "skip", ours),
        Group("preproj_lora", "preproj_lora", loras),
    ]


class Study:
    """Where a study's files are, and what is finished (everything read from disk on each call)."""

    def __init__(
        self,
        preset: str,
        out: str | Path,
        runs: str | Path,
        groups: Sequence[Group],
        *,
        max_extend: int = 2,
        overrides: dict[str, Any] | None = None,
        base_params: int = 0,
        hidden: int = 0,
        limit: int | None = None,
    ) -> None:
        # `limit` replaces every evaluation count (a dry run); the settings are part of every step's key
        self.select_eval = SELECT_EVAL if limit is None else {**SELECT_EVAL, "limit": limit}
        self.full_eval = (
            FULL_EVAL
            if limit is None
            else {**FULL_EVAL, "limits": dict.fromkeys(FULL_EVAL["limits"], limit), "routing_rows": min(limit, 32)}
        )
        self.base_params, self.hidden = base_params, hidden  # the base's parameter count and width, for the report
        self.preset, self.out, self.runs, self.groups = preset, Path(out), Path(runs), list(groups)
        self.max_extend, self.overrides = max_extend, dict(overrides or {})
        self.base_cfg = get_preset(preset, **self.overrides)
        self.seeds = [self.base_cfg.seed + i for i in range(max(g.seeds for g in self.groups))]

    def cfg(self, step: Step) -> TrainConfig:
        sizes = dict(step.group.sizes)
        point = dict(method=step.group.method, lr=step.lr, seed=step.seed, **sizes)
        return point_config(self.preset, self.overrides, self.runs / step.arm, progress=False, **point)

    def select_key(self, step: Step) -> dict[str, Any]:
        return arm_key(self.cfg(step), {**self.select_eval, "model": self.base_cfg.model})

    def full_key(self, step: Step) -> dict[str, Any]:
        return {"select": self.select_key(step), "eval": self.full_eval}

    def read(self, step: Step, kind: str | None = None) -> dict[str, Any] | None:
        kind = kind or step.kind
        key = self.select_key(step) if kind == "select" else self.full_key(step)
        return read_record(self.out / "arms" / step.arm / (SELECT_FILE if kind == "select" else FULL_FILE), key)

    def selected(self, g: Group) -> tuple[dict[float, float | None], bool]:
        """(held-out PPL by LR on the first seed for the finished LRs, whether the search is settled)."""

        def point(lr: float) -> dict[str, Any] | None:
            done = self.read(Step("select", g, lr, self.seeds[0]))
            return None if done is None else done["row"]

        return search_lrs(g.start_lrs, point, "select.ppl", max_extend=self.max_extend)


def plan(s: Study) -> Iterator[Step]:
    """Every unfinished step whose inputs are finished, in priority order (group by group)."""
    for g in s.groups:
        tried, settled = s.selected(g)
        seed0 = s.seeds[0]
        if not settled:
            lrs = list(g.start_lrs)
            missing = [lr for lr in lrs if lr not in tried]
            if missing:
                yield from (Step("select", g, lr, seed0) for lr in missing)
            else:
                yield Step("select", g, next_lr(tried), seed0)  # type: ignore[arg-type]
            continue
        best = best_lr(tried)
        if best is None:
            continue  # every LR diverged: the report says so
        for seed in s.seeds[: g.seeds]:
            for kind in ("select", "full"):
                step = Step(kind, g, best, seed)
                if s.read(step) is None:
                    yield step
                    break


def _routing_batches(tokenizer, max_len: int, n: int) -> list[dict[str, torch.Tensor]]:
    texts = [line for line in wikitext_lines("test") if len(line.strip()) > 50][:n]
    return [dict(tokenizer(t, return_tensors="pt", truncation=True, max_length=max_len)) for t in texts]


def run_step(s: Study, step: Step, base: nn.Module, tokenizer, trained: dict[str, nn.Module]) -> None:
    """Do `step` and write its file. `trained` keeps this process's last trained model for its full step."""
    (_select_step if step.kind == "select" else _full_step)(s, step, base, tokenizer, trained)


def _select_step(s: Study, step: Step, base: nn.Module, tokenizer, trained: dict[str, nn.Module]) -> None:
    """Train the arm and score held-out line PPL into select.json (a diverged arm: its facts, no PPL)."""
    arm_dir, cfg = s.out / "arms" / step.arm, s.cfg(step)
    fresh = (arm_dir / SELECT_FILE).is_file()  # a result for other settings: start over, do not resume
    try:
        model, row = train_arm(cfg, base, tokenizer, fresh=fresh)
    except NonFiniteLossError as err:
        row = {"method": cfg.method, "lr": cfg.lr, "seed": cfg.seed, "diverged": str(err), "select.ppl": None}
        write_record(arm_dir / SELECT_FILE, s.select_key(step), row, {})
        return
    t0 = time.time()
    metrics, items = _scores(model, tokenizer, "ppl", "select", limit=s.select_eval["limit"], ppl_split="heldout")
    row.update(metrics, select_seconds=time.time() - t0)
    arm_dir.mkdir(parents=True, exist_ok=True)
    for f in ("log.jsonl", "metrics.json"):
        if (Path(cfg.out) / f).is_file():
            shutil.copyfile(Path(cfg.out) / f, arm_dir / f)
    plot_loss_curve(arm_dir, title=f"{step.group.label}, LR {step.lr:g}, seed {step.seed}")
    write_record(arm_dir / SELECT_FILE, s.select_key(step), row, items)
    (Path(cfg.out) / CHECKPOINT_NAME).unlink(missing_ok=True)
    trained.clear()
    trained[step.arm] = model


def _full_step(s: Study, step: Step, base: nn.Module, tokenizer, trained: dict[str, nn.Module]) -> None:
    """The full evaluation of the arm's model (this process's, its saved adapter, or trained again) into full.json."""
    cfg = s.cfg(step)
    model = trained.get(step.arm)
    if model is None and (Path(cfg.out) / "adapter").is_dir():
        model = load_adapter(copy.deepcopy(base), cfg.out)
    if model is None:  # the adapter is gone (another machine): train the arm again, same seed
        model, _ = train_arm(cfg, base, tokenizer, fresh=True)
    model.eval()
    t0 = time.time()
    row, items = _full_eval(model, tokenizer, s.full_eval)
    if skip_norms(model):
        batches = _routing_batches(tokenizer, s.base_cfg.max_len, s.full_eval["routing_rows"])
        row["routing_ratios"] = list(routing_ratios(model, batches).values())
    row["eval_seconds"] = time.time() - t0
    write_record(s.out / "arms" / step.arm / FULL_FILE, s.full_key(step), row, items)


def _scores(model: nn.Module, tokenizer, task: str, name: str, *, limit: int | None, ppl_split: str) -> Scores:
    """One task's evaluation as (`{name.metric: value}`, `{name: per-item scores}`)."""
    res = evaluate(model, tokenizer, [task], limit=limit, ppl_split=ppl_split, progress=False, per_item=True)[task]
    return (
        {f"{name}.{k}": v for k, v in res.items() if not isinstance(v, list)},
        {name: {k: v for k, v in res.items() if isinstance(v, list)}},
    )


def _full_eval(model: nn.Module, tokenizer, settings: dict[str, Any]) -> Scores:
    """The full evaluation: line PPL on test rows, LAMBADA, HellaSwag (flat metrics, per-item scores)."""
    row: dict[str, Any] = {}
    items: dict[str, Any] = {}
    for task in settings["tasks"]:
        metrics, its = _scores(
            model, tokenizer, task, task, limit=settings["limits"].get(task), ppl_split=settings["ppl_split"]
        )
        row.update(metrics)
        items.update(its)
    return row, items


def baseline(s: Study, base: nn.Module, tokenizer) -> None:
    """Evaluate the untrained base under both evaluations into `out/baseline.json` (unless finished)."""
    if read_baseline(s) is not None:
        return
    t0 = time.time()
    select, items = _scores(base, tokenizer, "ppl", "select", limit=s.select_eval["limit"], ppl_split="heldout")
    full, full_items = _full_eval(base, tokenizer, s.full_eval)
    row = {"method": "baseline", "params": 0, **select, **full, "eval_seconds": time.time() - t0}
    write_record(s.out / "baseline.json", baseline_key(s), row, {**items, **full_items})


def baseline_key(s: Study) -> dict[str, Any]:
    return {"model": s.base_cfg.model, "select": s.select_eval, "full": s.full_eval}


def read_baseline(s: Study) -> dict[str, Any] | None:
    return read_record(s.out / "baseline.json", baseline_key(s))


def open_study(
    preset: str,
    out: str | Path,
    runs: str | Path,
    base: nn.Module,
    *,
    groups: Sequence[Group] | None = None,
    max_extend: int = 2,
    overrides: dict[str, Any] | None = None,
    limit: int | None = None,
) -> Study:
    """The `Study` over `base` (the default groups: `table2_groups(base)`)."""
    return Study(
        preset,
        out,
        runs,
        groups or table2_groups(base),
        max_extend=max_extend,
        overrides=overrides,
        base_params=sum(p.numel() for p in base.parameters()),
        hidden=host_shape(base)[0],
        limit=limit,
    )


def study(
    preset: str,
    out: str | Path,
    runs: str | Path,
    *,
    groups: Sequence[Group] | None = None,
    max_extend: int = 2,
    overrides: dict[str, Any] | None = None,
    poll_seconds: float = 30.0,
    on_finish: Callable[[Step | None], None] | None = None,
    limit: int | None = None,
) -> Study:
    """Work through the plan until nothing is left, waiting while other workers hold the last steps.
    `on_finish(step)` is called after each finished step (None for the baseline), e.g. to commit its files."""
    base_cfg = get_preset(preset, **dict(overrides or {}))
    base, tokenizer = load_model_and_tokenizer(base_cfg)
    s = open_study(preset, out, runs, base, groups=groups, max_extend=max_extend, overrides=overrides, limit=limit)
    s.out.mkdir(parents=True, exist_ok=True)
    with claim(s.runs / ".claims" / "baseline") as mine:
        if mine and read_baseline(s) is None:
            baseline(s, base, tokenizer)
            if on_finish:
                on_finish(None)
    trained: dict[str, nn.Module] = {}

    def run(step: Step) -> None:
        log.info("%s %s", step.kind, step.arm)
        run_step(s, step, base, tokenizer, trained)

    work_through(
        lambda: plan(s),
        lambda step: s.runs / ".claims" / step.arm / step.kind,
        lambda step: s.read(step) is not None,  # finished by another worker meanwhile
        run,
        on_finish=on_finish,
        poll_seconds=poll_seconds,
    )
    return s
