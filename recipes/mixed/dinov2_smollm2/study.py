"""The study: groups (an arm's method, task and positions), each at its own held-out LR, seeds on the key pairs.

It runs on the text study's planner (`mmpreproj.experiments.study`): `plan` orders the steps (LR search on the
first seed, moving one rung of `LR_LADDER` past an edge; then every seed at the best LR, "select" then "full"),
`Study.read` / `Study.selected` read finished steps back by key, `runner.claim` lets several processes share the work.
What differs is what a step does:

- "select": train the arm at (LR, seed), save its projector and adapter under `runs`, score held-out items of
  the train split (answer perplexity picks the LR; greedy exact match is reported beside it);
- "full": greedy exact match on the test items (test images only; no teacher-forced loss there).

Files (`out` = docs/evidence/vlm-dinov2-smollm2): `arms/<group>/lr-<lr>-seed-<s>/{select.json, full.json,
times.jsonl}` and `features.json` + `features-times.jsonl`. `times.jsonl` gets one line per training step and
per scored batch of every invocation (a killed one too), so the CPU-hours count all the work done.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mmpreproj.data.assets import asset_path
from mmpreproj.experiments.arms import read_record, write_record
from mmpreproj.experiments.runner import claim, work_through
from mmpreproj.experiments.study import SELECT_FILE, Step, Study, plan
from mmpreproj.train.runlog import write_json
from recipes.kit import load_image_zip

from .arms import Arm, NonFiniteLoss, Times, build_arm, load_arm, save_arm, score, train_arm
from .features import cached_features, load_tower, weights_digest
from .tasks import Encoder, Item, class_items, item_stream, mosaic_items, where_items

log = logging.getLogger("vlm-dinov2-smollm2")
FULL_FILE, TIMES_FILE = "full.json", "times.jsonl"


@dataclass(frozen=True)
class Group:
    """One row of the table. `layout`: the M-RoPE layout of the 2D positions ("chunked": Qwen2-VL's)."""

    label: str
    method: str
    task: str
    positions: str = "2d"
    layout: str = "chunked"
    start_lrs: tuple[float, ...] = (3e-4, 1e-3)
    seeds: int = 1


# The key pairs with 3 seeds (class/proj+lora, the matched LoRA, got its seeds after the others); the rest 1. The
# positional question is asked twice. `mosaic` (where is the <class>?) binds a class to a place: with the LM frozen,
# a per-token projector cannot learn to name a tile's place (mosaic/2d, the projector alone, scored 26.6% against 25%
# chance and 50% / 51% on row / column, seed 0), and with pre-projection + skip in the LM neither positions learnt it
# in 250 steps (2d, seed 0: 24.2% test; 1d, seed 0 at LR 3e-4: 23.0% held-out; both with the training loss flat at
# chance, 0.46, from step 50 on), so its seeds are not spent. `where` (where is the one picture among empty tiles?)
# asks the place alone: design changed after those runs; the mosaic cells stay as they are.
GROUPS = (
    Group("class/proj", "proj", "class", seeds=3),
    Group("class/proj+preproj_skip", "proj+preproj_skip", "class", seeds=3),
    Group("where/2d+preproj_skip", "proj+preproj_skip", "where", "2d", seeds=3),
    Group("where/1d+preproj_skip", "proj+preproj_skip", "where", "1d", seeds=3),
    Group("where/2d-il+preproj_skip", "proj+preproj_skip", "where", "2d", "interleaved"),
    Group("class/proj+lora", "proj+lora", "class", seeds=3),
    Group("mosaic/2d+preproj_skip", "proj+preproj_skip", "mosaic", "2d"),
    Group("mosaic/1d+preproj_skip", "proj+preproj_skip", "mosaic", "1d"),
    Group("mosaic/2d-il+preproj_skip", "proj+preproj_skip", "mosaic", "2d", "interleaved"),
    Group("mosaic/2d", "proj", "mosaic", "2d"),
)


@dataclass(frozen=True)
class Config:
    """Every setting the numbers depend on (all of it is part of each step's key)."""

    tower: str = "dinov2-small"  # features.TOWERS
    lm: str = "smollm2-135m"  # or "tiny" (a random 2-layer Llama in code, tests)
    steps: int = 250
    batch: int = 8
    warmup: int = 25
    budget: float = 0.01  # the adapter's trainable share of the LM; LoRA's rank matched to it
    size: int = 112  # tower input side: 8 x 8 patches of 14
    pool: int = 2  # patch tokens pooled 2 x 2: a 4 x 4 grid per image (class)
    tile: int = 2  # a mosaic tile pooled further to 2 x 2: the mosaic is a 4 x 4 grid
    train_per_class: int = 300  # of the train split; the last `heldout_per_class` of each class are held out
    heldout_per_class: int = 30
    test_per_class: int = 100
    mosaic_heldout: int = 200
    mosaic_test: int = 500
    eval_batch: int = 25
    eval_limit: int | None = None  # a dry run: at most this many held-out / test items, spread over the classes
    max_extend: int = 1  # LR rungs tried past an edge
    seed: int = 0  # the first seed; the data splits and the held-out / test mosaics are fixed by it


QUICK = dict(  # a smoke run's sizes (`--quick`, the GPU script's dry run): tiny random models, a few items
    tower="random-tiny",
    lm="tiny",
    steps=3,
    batch=2,
    warmup=1,
    budget=0.002,
    train_per_class=6,
    heldout_per_class=2,
    test_per_class=2,
    mosaic_heldout=4,
    mosaic_test=8,
    eval_batch=4,
    max_extend=0,
)


class VlmStudy(Study):
    """The text study's bookkeeping (`read`, `selected`) over this recipe's steps and keys."""

    def __init__(self, cfg: Config, out: Path, runs: Path, groups: Sequence[Group], features_key: str) -> None:
        self.c, self.out, self.runs, self.groups = cfg, Path(out), Path(runs), list(groups)
        self.features_key, self.max_extend = features_key, cfg.max_extend
        self.seeds = [cfg.seed + i for i in range(max(g.seeds for g in self.groups))]

    def select_key(self, step: Step) -> dict[str, Any]:
        g = {k: v for k, v in dataclasses.asdict(step.group).items() if k not in ("start_lrs", "seeds")}
        return {
            "config": dataclasses.asdict(self.c),
            "features": self.features_key,
            "group": g,
            "lr": step.lr,
            "seed": step.seed,
        }

    def full_key(self, step: Step) -> dict[str, Any]:
        return {"select": self.select_key(step), "test": "greedy exact match, KV cache"}

    def arm_dir(self, step: Step) -> Path:
        return self.out / "arms" / step.arm


@dataclass
class Data:
    """Cached features per split, labels, classes, and the fixed held-out / test items per task."""

    feats: dict[str, torch.Tensor]
    labels: dict[str, torch.Tensor]
    classes: list[str]
    train_idx: list[int]
    heldout: dict[str, list[Item]]
    test: dict[str, list[Item]]


def load_data(cfg: Config, tower: nn.Module, runs: Path, out: Path) -> tuple[Data, str]:
    """Images from the shipped zips, features from the cache (computed once, by one process), the items."""
    images, labels = {}, {}
    for split, per_class in (("train", cfg.train_per_class), ("test", cfg.test_per_class)):
        images[split], labels[split], classes = load_image_zip(asset_path("cifar10", f"{split}.zip"), per_class)
    key = f"{cfg.tower}-{weights_digest(tower)}-s{cfg.size}-p{cfg.pool}"
    while True:  # one process computes; the others wait for its file
        with claim(runs / ".claims" / "features") as mine:
            if mine:
                t0 = time.process_time()
                feats = cached_features(
                    tower,
                    runs / "features",
                    images,
                    name=cfg.tower,
                    size=cfg.size,
                    pool=cfg.pool,
                    times=out / "features-times.jsonl",
                )
                if read_record(out / "features.json", {"features": key}) is None:
                    info = {
                        "images": {s: int(x.shape[0]) for s, x in images.items()},
                        "cpu_s": time.process_time() - t0,
                        "device": device_name(next(tower.parameters()).device),
                    }
                    write_json(out / "features.json", {"key": {"features": key}, "row": info})
                break
        time.sleep(10)
    # the train split's last `heldout_per_class` images of each class are held out (LR selection only)
    y = labels["train"]
    rank = torch.zeros_like(y)
    for c in range(len(classes)):
        where = (y == c).nonzero()[:, 0]
        rank[where] = torch.arange(len(where))
    cut = cfg.train_per_class - cfg.heldout_per_class
    train_idx = (rank < cut).nonzero()[:, 0].tolist()
    held_idx = (rank >= cut).nonzero()[:, 0].tolist()
    test_idx = list(range(len(labels["test"])))
    heldout = {
        "class": class_items(y, held_idx, classes),
        "mosaic": mosaic_items(y, held_idx, classes, cfg.mosaic_heldout, seed=cfg.seed + 1000),
        "where": where_items(held_idx, cfg.mosaic_heldout, seed=cfg.seed + 3000),
    }
    test = {
        "class": class_items(labels["test"], test_idx, classes),
        "mosaic": mosaic_items(labels["test"], test_idx, classes, cfg.mosaic_test, seed=cfg.seed + 2000),
        "where": where_items(test_idx, cfg.mosaic_test, seed=cfg.seed + 4000),
    }
    if cfg.eval_limit is not None:
        heldout, test = ({t: _spread(v, cfg.eval_limit) for t, v in d.items()} for d in (heldout, test))
    return Data(feats, labels, classes, train_idx, heldout, test), key


def _spread(items: list[Item], n: int) -> list[Item]:
    """At most n items, every k-th (class items are ordered by class: all classes stay in)."""
    return items[:: max(1, math.ceil(len(items) / n))][:n]


def run_step(s: VlmStudy, step: Step, data: Data, base: nn.Module, tok, trained: dict[str, Arm], times: Times) -> None:
    """Do `step` and write its file (`trained` keeps this process's last trained arm for its "full" step)."""
    cfg, g = s.c, step.group
    enc = Encoder(tok, g.task, g.positions, cfg.tile)
    folder, arm_dir = s.runs / step.arm, s.arm_dir(step)
    vision_dim = data.feats["train"].shape[-1]
    if step.kind == "select":
        arm = build_arm(copy.deepcopy(base), vision_dim, g.method, budget=cfg.budget, layout=g.layout, seed=step.seed)
        stream = item_stream(g.task, data.labels["train"], data.train_idx, data.classes, seed=step.seed)
        row: dict[str, Any] = {"group": g.label, "lr": step.lr, "seed": step.seed, "params": arm.params}
        row["device"] = device_name(next(base.parameters()).device)  # recorded, never in the key
        try:
            losses = train_arm(
                arm,
                enc,
                data.feats["train"],
                stream,
                steps=cfg.steps,
                batch=cfg.batch,
                lr=step.lr,
                warmup=cfg.warmup,
                times=times,
            )
        except NonFiniteLoss as err:
            row.update({"diverged": str(err), "select.ppl": None})
            write_record(arm_dir / SELECT_FILE, s.select_key(step), row, {})
            return
        save_arm(arm, folder)
        res = score(
            arm, enc, data.feats["train"], data.heldout[g.task], batch=cfg.eval_batch, times=times, kind="select"
        )
        row.update({"select.ppl": res["answer_ppl"], "select.acc": res["acc"], "final_loss": _tail_mean(losses)})
        write_record(arm_dir / SELECT_FILE, s.select_key(step), row, {"select": res["items"]}, losses=losses)
        trained.clear()
        trained[step.arm] = arm
        return
    arm = trained.get(step.arm)
    if arm is None and (folder / "projector.safetensors").is_file():
        arm = load_arm(copy.deepcopy(base), vision_dim, g.method, folder, layout=g.layout)
    if arm is None:  # the saved arm is gone (another machine): train it again, same seed, same result
        run_step(s, Step("select", g, step.lr, step.seed), data, base, tok, trained, times)
        arm = trained[step.arm]
    test = data.test[g.task]
    res = score(arm, enc, data.feats["test"], test, batch=cfg.eval_batch, times=times, kind="test", with_loss=False)
    items = {**res["items"], "answer": [it.answer for it in test]}
    row = {"test.acc": res["acc"], "device": device_name(next(base.parameters()).device)}
    write_record(arm_dir / FULL_FILE, s.full_key(step), row, {"test": items})


def device_name(device: torch.device) -> str:
    """ "cpu", or "cuda:0 (NVIDIA H100 80GB HBM3)": where a step ran (recorded in its row, not its key)."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def _tail_mean(losses: list[float], n: int = 20) -> float:
    tail = [v for v in losses[-n:] if math.isfinite(v)]
    return sum(tail) / len(tail) if tail else float("nan")


def open_study(cfg: Config, out: Path, runs: Path, groups: Sequence[Group], features_key: str) -> VlmStudy:
    return VlmStudy(cfg, out, runs, groups, features_key)


def run(
    cfg: Config,
    out: Path,
    runs: Path,
    groups: Sequence[Group],
    base: nn.Module,
    tok,
    *,
    on_finish: Callable[[Step | None], None] | None = None,
    poll_seconds: float = 30.0,
    stop: Callable[[], bool] | None = None,
) -> VlmStudy:
    """Work through the plan until nothing is left, waiting while other workers hold the last steps;
    `on_finish(step)` after each finished step (None after the features). Everything runs on `base`'s device
    (the tower too; batches are built on the CPU). `stop()` true before a step: return with the rest unrun
    (a time guard; `plan(s)` then lists what is left)."""
    out.mkdir(parents=True, exist_ok=True)
    tower = load_tower(cfg.tower).to(next(base.parameters()).device)
    data, key = load_data(cfg, tower, runs, out)
    del tower
    if on_finish:
        on_finish(None)
    s = open_study(cfg, out, runs, groups, key)
    trained: dict[str, Arm] = {}

    def run_one(step: Step) -> None:
        log.info("%s %s", step.kind, step.arm)
        run_step(s, step, data, base, tok, trained, Times(s.arm_dir(step) / TIMES_FILE))

    work_through(
        lambda: plan(s),
        lambda step: runs / ".claims" / step.arm / step.kind,
        lambda step: s.read(step) is not None,  # finished by another worker meanwhile
        run_one,
        on_finish=on_finish,
        poll_seconds=poll_seconds,
        stop=stop,
    )
    return s


def features_key(out: Path) -> str | None:
    """The features key of a finished feature pass (for a report written without the tower)."""
    try:
        return json.loads((out / "features.json").read_text())["key"]["features"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
