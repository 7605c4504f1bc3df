"""The runner every experiment of the command is a front end of (`reproduce`, `sweep`, `budget`, `study`).

    runner = ArmRunner.open(base_cfg, settings, data_source="local", progress=False)
    row, items, reused = runner.arm(cfg, title)                   # trained and evaluated, or read back
    tried, settled = search_lrs((1e-3, 3e-3), score, "ppl.ppl", max_extend=2)

Each fact is here once: the LR ladder and the rule that extends a search past an edge (`next_lr`, `search_lrs`,
`best_lr`), each point's config and the evaluation settings (`point_config`, `preset_grid`, `eval_settings_for`),
the arm of an experiment on a shared base (`ArmRunner`: train, evaluate, read back by key through `arms.run_arm`),
and the claims that let several processes share an output folder (`claim`, `work_through`).
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from torch import nn

from ..analysis import plot_loss_curve, routing_ratios
from ..train import get_preset, load_model_and_tokenizer
from ..train.config import TrainConfig
from ..train.methods import check_fits
from ..train.presets import ppl_split_for
from ..train.sizes import sizes_for_method
from .arms import arm_key, eval_arm, run_arm, train_arm

LR_LADDER = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)  # an LR search moves one rung at a time
DOUBLING_BOUNDS = (1e-5, 0.5)  # a search by 2x steps never leaves these
CLAIM_FILE = ".claim"

LrStep = Callable[[float, int], "float | None"]  # (an edge LR, -1 lower / +1 higher) -> the LR one step past it
Scores = tuple[dict[str, Any], dict[str, Any]]  # (flat metrics, per-item scores)
StepT = TypeVar("StepT")


def ladder_step(lr: float, direction: int) -> float | None:
    """One rung of `LR_LADDER` past `lr`'s nearest rung, or None past the ladder's ends."""
    rung = min(range(len(LR_LADDER)), key=lambda i: abs(math.log(LR_LADDER[i] / lr)))
    nxt = rung + direction
    return LR_LADDER[nxt] if 0 <= nxt < len(LR_LADDER) else None


def doubling_step(lr: float, direction: int) -> float | None:
    """`lr` times 2 (or halved), or None outside `DOUBLING_BOUNDS`."""
    nxt = lr * 2 if direction > 0 else lr / 2
    return nxt if DOUBLING_BOUNDS[0] <= nxt <= DOUBLING_BOUNDS[1] else None


def best_lr(tried: dict[float, float | None]) -> float | None:
    """The LR of the lowest finite score, or None when every LR diverged."""
    ok = {lr: v for lr, v in tried.items() if v is not None and math.isfinite(v)}
    return min(ok, key=ok.get) if ok else None


def next_lr(tried: dict[float, float | None], step: LrStep = ladder_step) -> float | None:
    """One `step` past the edge of `tried` where the best finite score sits (lower when every LR diverged);
    None once the best is inside what was tried, or past the step's range."""
    lrs = sorted(tried)
    best = best_lr(tried)
    if best is not None and lrs[0] < best < lrs[-1]:
        return None
    edge = lrs[0] if best is None else best
    nxt = step(edge, -1 if edge == lrs[0] else 1)
    return nxt if nxt is not None and nxt not in tried else None


def search_lrs(
    start: Sequence[float],
    point: Callable[[float], dict[str, Any] | None],
    metric: str,
    *,
    max_extend: int,
    step: LrStep = ladder_step,
) -> tuple[dict[float, float | None], bool]:
    """({LR: `metric`} of the finished points, whether the search is settled): every start LR, then `next_lr`
    while the best sits at an edge, at most `max_extend` times. `point(lr)` is the point's row (trained or read
    back), None when it is not finished: the search is then not settled."""
    tried: dict[float, float | None] = {}
    for lr in start:
        row = point(lr)
        if row is not None:
            tried[lr] = row.get(metric)
    settled = len(tried) == len(start)
    for _ in range(max_extend if tried else 0):
        nxt = next_lr(tried, step)
        if nxt is None:
            break
        row = point(nxt)
        if row is None:
            return tried, False
        tried[nxt] = row.get(metric)
    return tried, settled


def point_config(preset: str, overrides: dict[str, Any], out: Path, *, progress: bool, **point: Any) -> TrainConfig:
    """The preset under `overrides`, then the point's own fields (method, lr, seed, sizes), run folder `out`."""
    return get_preset(preset, **{**overrides, **point, "out": str(out), "progress": progress})


def preset_grid(
    preset: str,
    out: Path,
    methods: Iterable[str],
    field: str,
    values: Iterable[Any],
    overrides: dict[str, Any],
    progress: bool,
) -> dict[tuple[Any, str], TrainConfig]:
    """{(value, method): the point's config}: the preset with `field` (`lr`, `seed`) at each value, out at
    `out/{method}/{field}-{value:g}`, `overrides` less the sizes of modules the method lacks; every one built
    (so checked) before anything trains."""
    return {
        (value, method): point_config(
            preset,
            sizes_for_method(method, overrides),
            out / method / f"{field}-{value:g}",
            progress=progress,
            method=method,
            **{field: value},
        )
        for value in values
        for method in methods
    }


def eval_settings_for(preset: str, defaults: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """An experiment's evaluation settings: `defaults` on the preset's PPL split (`ppl_split_for`), then
    `overrides`; the tasks a list (as an arm's key is read back from JSON)."""
    settings = {**defaults, "ppl_split": ppl_split_for(preset), **(overrides or {})}
    settings["tasks"] = list(settings["tasks"])
    return settings


@contextlib.contextmanager
def claim(folder: Path) -> Iterator[bool]:
    """Hold `folder/.claim` (True), or False when a live process on this host holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    path, me = folder / CLAIM_FILE, f"{socket.gethostname()} {os.getpid()}"
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            host, _, pid = path.read_text().partition(" ") if path.is_file() else ("", "", "")
            if host == socket.gethostname() and pid.strip().isdigit() and not _alive(int(pid)):
                path.unlink(missing_ok=True)  # a killed worker's claim
                continue
            yield False
            return
        os.write(fd, me.encode())
        os.close(fd)
        try:
            yield True
        finally:
            path.unlink(missing_ok=True)
        return
    yield False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def work_through(
    plan: Callable[[], Iterable[StepT]],
    claim_dir: Callable[[StepT], Path],
    finished: Callable[[StepT], bool],
    run: Callable[[StepT], None],
    *,
    on_finish: Callable[[StepT], None] | None = None,
    poll_seconds: float = 30.0,
    stop: Callable[[], bool] | None = None,
) -> None:
    """Run the first step of `plan()` no other process holds, again and again, until the plan is empty (or
    `stop()`); wait `poll_seconds` while other workers hold every step. A step another worker finished meanwhile
    is not run again. `on_finish(step)` after each step run."""
    while True:
        steps = list(plan())
        if not steps or (stop is not None and stop()):
            return
        for step in steps:
            with claim(claim_dir(step)) as mine:
                if not mine:
                    continue
                if finished(step):
                    break
                run(step)
            if on_finish:
                on_finish(step)
            break
        else:
            time.sleep(poll_seconds)


@dataclass
class ArmRunner:
    """The base model, its tokenizer and the evaluation every arm of one experiment shares."""

    base: nn.Module
    tokenizer: Any
    settings: dict[str, Any]  # `eval_arm`'s tasks, limit, ppl_split
    data_source: str
    protocol: str
    progress: bool
    ratio_batches: Callable[[], Any] | None = None  # texts for the routing ratios of a model with a skip

    @classmethod
    def open(
        cls, base_cfg: TrainConfig, settings: dict[str, Any], *, data_source: str, progress: bool, protocol="paper"
    ) -> ArmRunner:
        """Load `base_cfg`'s model and tokenizer."""
        base, tokenizer = load_model_and_tokenizer(base_cfg)
        return cls(base, tokenizer, settings, data_source, protocol, progress)

    def check(self, configs: Iterable[TrainConfig]) -> None:
        """Every arm's method and sizes fit the base (`train.methods.check_fits`), before the study runs one."""
        check_fits(self.base, configs)

    @property
    def eval_key(self) -> dict[str, Any]:
        """The evaluation part of every arm's key."""
        return {**self.settings, "protocol": self.protocol, "data_source": self.data_source}

    def key(self, cfg: TrainConfig) -> dict[str, Any]:
        return arm_key(cfg, self.eval_key)

    def evaluate(self, model: nn.Module) -> Scores:
        return eval_arm(
            model,
            self.tokenizer,
            self.settings,
            data_source=self.data_source,
            protocol=self.protocol,
            progress=self.progress,
        )

    def baseline(self, out: Path, model_id: str, **facts: Any) -> tuple[dict[str, Any], dict[str, Any], bool]:
        """The untrained base's (row, items, reused), in `out/baseline` (read back under the same settings)."""

        def compute(fresh: bool) -> Scores:
            row, items = self.evaluate(self.base)
            return {"method": "baseline", **facts, "params": 0, **row}, items

        return run_arm(out / "baseline", {"model": model_id, **self.eval_key}, compute)

    def arm(
        self, cfg: TrainConfig, title: str, *, diverged: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any], bool]:
        """(row, items, reused) of `cfg`'s arm: read back when finished under the same key, else trained (from
        its checkpoint when there is one) and evaluated, loss curve titled `title`. With `diverged` (facts), a
        diverged point (NaN loss) is a row of them with no PPL, not a crash, and is not recorded."""

        def compute(fresh: bool) -> Scores:
            model, row = train_arm(cfg, self.base, self.tokenizer, fresh=fresh)
            metrics, items = self.evaluate(model)
            row.update(metrics)
            if "skip_norms" in row and self.ratio_batches is not None:  # ||W_skip x~|| / ||attn_out||
                row["routing_ratios"] = list(routing_ratios(model, self.ratio_batches()).values())
            held = row.get("ppl.mean_loss")  # the held-out mean row loss at the last step, when measured
            plot_loss_curve(cfg.out, heldout=(cfg.steps, held) if held is not None else None, title=title)
            return row, items

        try:
            return run_arm(Path(cfg.out), self.key(cfg), compute)
        except Exception as err:
            if diverged is None or type(err).__name__ != "NonFiniteLossError":
                raise
            return {**diverged, "ppl.ppl": None, "diverged": str(err)}, {}, False
