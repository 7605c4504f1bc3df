"""The paper's frozen probe on vision: the shipped mini-ViT (`assets/mini-vit`, pretrained on CIFAR-10 classes
0-4) probed on classes 5-9, which it never saw. Every arm trains a new linear head on the frozen backbone's
pooled features, each at its own tuned LR, three seeds at that LR, paired intervals against the linear probe
and against LoRA.

Method, top to bottom:
  1. Backbone: `timm.create_model(ARCH, pretrained=True, num_classes=0, ...)` from --checkpoint (a folder in
     timm's Hub format: model.safetensors + config.json), every weight frozen; `--family open_clip` runs the
     same weights as an open_clip tower (`mini_vit_open_clip.py`, an exact conversion).
  2. Data (assets/cifar10, packed by `pack_cifar_split.py`): probe-train.zip (500 train images per class of
     dog, frog, horse, ship, truck) split into 400 per class to train and the last 100 per class to choose
     the LR (validation); probe-test.zip (1,000 test images per class) scores the chosen runs. Random crop
     (reflect-pad 4) and flip for training, the backbone's normalisation.
  3. Arms (`mmpreproj.train.methods`; a new linear head trains in every one):
       linear        the head alone (linear probe)
       lora          peft LoRA on the host row's attention targets (timm: attn.qkv + attn.proj; open_clip:
                     attn.out_proj only), the paper's rank rule r = int(P / (L * 2 * d * 2))
       lora_matched  the same, r chosen so its count matches pre-projection + skip (ours, not the paper's)
       preproj       pre-projection only (W_up, W_down per block, paper init)
       skip          content skip only (W_skip per block, N(0, 1e-4) init)
       preproj_skip  both
  4. LR: on a lattice lr0 * 2^k (a factor 2 per step), each arm starts at three points around its start and
     extends toward the better side until its best validation accuracy has a neighbour on both sides
     (seed 0). Then seeds 1 and 2 at that LR. Every point is a file `out/<arm>/lr-<lr>/seed-<s>.json`; a
     restarted run reads finished points back and trains only the missing ones.
  5. Report: test accuracy mean +- std over seeds; paired 95% intervals of the difference against `linear`
     and against `lora` (Student-t over seeds; paired bootstrap over the test images); per-layer
     ||W_skip||_F and routing ratio ||W_skip x~|| / ||attn_out|| over depth. Writes summary.json, report.md
     and figures under --out.

    .venv/bin/python recipes/vision/mini_vit_probe.py                         # the table (restartable)
        (35 points: 32 min wall on 2 shared cores at load 5-9, 1,283 s of it training; docs/evidence/mini-vit-probe)
    .venv/bin/python recipes/vision/mini_vit_probe.py --quick --out /tmp/p    # seconds, a smoke run
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.kit`
import mmpreproj  # noqa: E402
from mmpreproj.analysis import (
    PAPER_SKIP_NORMS,
    plot_lr_sweep,
    plot_results,
    plot_skip_growth,
    plot_skip_norms,
    routing_ratios,
    skip_norms,
)
from mmpreproj.analysis.stats import compare, mean_std  # noqa: E402
from mmpreproj.data import asset_path  # noqa: E402
from mmpreproj.train.methods import apply_method, count_trainable  # noqa: E402
from recipes.kit import correct_items, environment, fit_classifier, load_image_zip, parse_config  # noqa: E402
from recipes.kit.backbones import Backbone, load_backbone  # noqa: E402
from recipes.vision.cifar_probe import Probe, preparer  # noqa: E402
from recipes.vision.mini_vit_open_clip import open_clip_backbone  # noqa: E402

ARMS = ("linear", "lora", "lora_matched", "preproj", "skip", "preproj_skip")
START_K = {"linear": 3}  # the search starts at lr0 * 2^k (k = 0 for the arms not named)
K_RANGE = (-8, 8)  # the lattice ends: lr0 / 256 ... lr0 * 256
REFERENCES = ("linear", "lora")
METRIC = "image.acc"
HEAD_SEED = 10_000
FAMILIES = ("timm", "open_clip")


@dataclass
class Config:
    """Every knob of the run; `--quick` shrinks data, steps, seeds and the search for a smoke test."""

    backbone: str = "timm:vit_tiny_patch16_224"
    checkpoint: str = str(asset_path("mini-vit"))
    family: str = "timm"  # "open_clip": the same weights as an open_clip tower (`mini_vit_open_clip.py`)
    arms: tuple[str, ...] = ARMS
    train_zip: str = str(asset_path("cifar10", "probe-train.zip"))
    test_zip: str = str(asset_path("cifar10", "probe-test.zip"))
    val_per_class: int = 100  # the last images of each class of train_zip choose the LR
    test_per_class: int = 0  # 0 = all
    steps: int = 200
    batch_size: int = 32
    warmup_steps: int = 20
    weight_decay: float = 0.0
    lr0: float = 1e-3  # the lattice: lr0 * 2^k
    max_points: int = 7  # LR points per arm at most
    seeds: tuple[int, ...] = (0, 1, 2)  # the first one searches the LR
    routing_images: int = 256  # test images for the routing ratio
    threads: int = 1
    out: str = "runs/mini-vit-probe"
    quick: bool = False
    progress: bool = False

    def __post_init__(self) -> None:
        bad = [a for a in self.arms if a not in ARMS]
        if bad:
            raise ValueError(f"arms: unknown {bad}; allowed values: {list(ARMS)}")
        if not self.seeds:
            raise ValueError("seeds: give at least one seed")
        if self.family not in FAMILIES:
            raise ValueError(f"family={self.family!r}; allowed values: {list(FAMILIES)}")
        if self.max_points < 3:
            raise ValueError(f"max_points must be >= 3 (a point and both neighbours), got {self.max_points}")
        if self.quick:
            self.steps, self.batch_size, self.warmup_steps, self.val_per_class = 2, 8, 1, 2
            self.test_per_class, self.routing_images, self.seeds, self.max_points = 4, 8, self.seeds[:2], 3


# 1-2. Backbone with an arm, data ---------------------------------------------------------------------------
def build(cfg: Config, arm: str, seed: int) -> tuple[Probe, Backbone, dict]:
    """The frozen backbone with the arm's trainable modules and a new 5-class head; info on what trains."""
    backbone = get_backbone(cfg)
    torch.manual_seed(seed)  # W_skip's and LoRA A's init
    info: dict = {}
    if arm == "linear":
        backbone.model.requires_grad_(False)
    else:
        trained = apply_method(backbone.model, arm)  # LoRA: a PeftModel around the same, modified modules
        info["adapter_params"] = count_trainable(trained)
        cfg = getattr(trained, "peft_config", {}).get("default")  # ours leaves peft's record too: a LoRA's has `r`
        if getattr(cfg, "r", None) is not None:
            info["lora_r"] = cfg.r
    torch.manual_seed(HEAD_SEED + seed)  # the same head init in every arm at one seed (pairing)
    return Probe(backbone.model, backbone.dim, num_classes=5), backbone, info


def get_backbone(cfg: Config) -> Backbone:
    """The frozen checkpoint as timm built it, or the same weights in open_clip's tower."""
    if cfg.family == "open_clip":
        return open_clip_backbone(cfg.checkpoint)
    return load_backbone(cfg.backbone, cfg.checkpoint)


def split_train_val(x: torch.Tensor, y: torch.Tensor, val_per_class: int) -> tuple[tuple, tuple]:
    """The last `val_per_class` images of each class as validation, the rest to train."""
    val = torch.zeros(len(y), dtype=torch.bool)
    for c in y.unique():
        idx = (y == c).nonzero().flatten()
        val[idx[len(idx) - val_per_class :]] = True
    return (x[~val], y[~val]), (x[val], y[val])


def load_data(cfg: Config) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    per_class = 8 if cfg.quick else None
    x, y, classes = load_image_zip(cfg.train_zip, per_class)
    train, val = split_train_val(x, y, cfg.val_per_class)
    xt, yt, test_classes = load_image_zip(cfg.test_zip, cfg.test_per_class or None)
    if classes != test_classes:
        raise ValueError(f"train classes {classes} differ from test classes {test_classes}")
    return {"train": train, "val": val, "test": (xt, yt), "classes": classes}


# 3. One point: arm x LR x seed -------------------------------------------------------------------------------
def point_path(out: Path, arm: str, lr: float, seed: int) -> Path:
    return out / arm / f"lr-{lr:g}" / f"seed-{seed}.json"


def run_point(cfg: Config, data: dict, arm: str, lr: float, seed: int) -> dict:
    """Train one arm at one LR and seed; score validation, test (per image) and the skip's use."""
    model, backbone, info = build(cfg, arm, seed)
    prep_train = preparer(backbone, backbone.img_size, train=True)
    prep_test = preparer(backbone, backbone.img_size, train=False)
    fit = fit_classifier(
        model,
        data["train"],
        data["val"],
        steps=cfg.steps,
        batch_size=cfg.batch_size,
        lr=lr,
        weight_decay=cfg.weight_decay,
        warmup_steps=cfg.warmup_steps,
        seed=seed,
        prepare_train=prep_train,
        prepare_test=prep_test,
        desc=f"{arm} lr {lr:g} s{seed}",
        progress=cfg.progress,
    )
    hits = correct_items(model, *data["test"], prep_test)  # (N_test,)
    result = {
        "arm": arm,
        "lr": lr,
        "seed": seed,
        "val_accuracy": fit.test_accuracy,
        "train_accuracy": fit.train_accuracy,
        "test_accuracy": hits.float().mean().item(),
        "test_correct": hits.int().tolist(),
        "trainable_params": fit.trainable_params,
        "seconds": fit.seconds,
        "final_train_loss": fit.final_train_loss,
        "loss_curve": fit.loss_curve,
        **info,
    }
    if arm in ("skip", "preproj_skip"):
        norms = skip_norms(model)
        images = prep_test(data["test"][0][: cfg.routing_images], None)
        ratios = routing_ratios(model.backbone, [{"x": images[i : i + 64]} for i in range(0, len(images), 64)])
        result["skip_norms"] = [norms[i] for i in sorted(norms)]
        result["routing_ratios"] = [ratios[i] for i in sorted(ratios)]
    return result


def get_point(cfg: Config, data: dict, arm: str, lr: float, seed: int, log: list) -> dict:
    """A finished point read back, or trained now and written (atomically: a killed run leaves no file)."""
    path = point_path(Path(cfg.out), arm, lr, seed)
    if path.is_file():
        log.append(("read", arm, lr, seed))
        return json.loads(path.read_text())
    result = run_point(cfg, data, arm, lr, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result) + "\n")
    os.replace(tmp, path)
    log.append(("trained", arm, lr, seed))
    print(
        f"{arm:13s} lr {lr:<9g} seed {seed}: val {result['val_accuracy']:.4f} test {result['test_accuracy']:.4f} "
        f"({result['seconds']:.0f} s, load {os.getloadavg()[0]:.1f})",
        flush=True,
    )
    return result


# 4. The LR search ----------------------------------------------------------------------------------------------
def search_lr(cfg: Config, data: dict, arm: str, log: list) -> tuple[float, dict[int, dict]]:
    """Best LR on the lattice lr0 * 2^k by validation accuracy (first seed), bracketed by both neighbours
    when `max_points` and the lattice ends allow; returns it and every point tried ({k: result})."""
    seed, k0 = cfg.seeds[0], START_K.get(arm, 0)
    tried: dict[int, dict] = {}
    todo = [k0 - 1, k0, k0 + 1]
    while todo:
        for k in todo:
            tried[k] = get_point(cfg, data, arm, cfg.lr0 * 2.0**k, seed, log)
        best = max(sorted(tried), key=lambda k: tried[k]["val_accuracy"])  # ties: the smaller LR
        todo = []
        if len(tried) < cfg.max_points:
            if best == min(tried) and best > K_RANGE[0]:
                todo = [best - 1]
            elif best == max(tried) and best < K_RANGE[1]:
                todo = [best + 1]
    best = max(sorted(tried), key=lambda k: tried[k]["val_accuracy"])
    return cfg.lr0 * 2.0**best, tried


# 5. Summary, figures, report -------------------------------------------------------------------------------------
def summarise(cfg: Config, arms: dict[str, dict]) -> dict:
    """Per arm: test accuracy over seeds at its LR; paired comparisons against the references."""
    summary: dict = {}
    for arm, a in arms.items():
        accs = {s: r["test_accuracy"] for s, r in a["seeds"].items()}
        mean, std, n = mean_std(list(accs.values()))
        row = {
            "best_lr": a["best_lr"],
            "bracketed": a["bracketed"],
            "test_mean": mean,
            "test_std": std,
            "n_seeds": n,
            "test_by_seed": accs,
            "val_by_lr": {f"{r['lr']:g}": r["val_accuracy"] for r in a["tried"].values()},
            "trainable_params": a["seeds"][cfg.seeds[0]]["trainable_params"],
            "lora_r": a["seeds"][cfg.seeds[0]].get("lora_r"),
            "seconds": [r["seconds"] for r in a["seeds"].values()],
        }
        for key in ("skip_norms", "routing_ratios"):
            per_seed = [r[key] for r in a["seeds"].values() if key in r]
            if per_seed:
                row[key] = [sum(v) / len(v) for v in zip(*per_seed)]
        for ref in REFERENCES:
            if ref in arms and ref != arm:
                ref_seeds = arms[ref]["seeds"]
                c = compare(
                    accs,
                    {s: r["test_accuracy"] for s, r in ref_seeds.items()},
                    method=arm,
                    reference=ref,
                    metric=METRIC,
                    items={s: r["test_correct"] for s, r in a["seeds"].items()},
                    ref_items={s: r["test_correct"] for s, r in ref_seeds.items()},
                )
                row[f"vs_{ref}"] = {"diff": c.diff, "seeds_ci": c.seeds, "items_ci": c.items, "words": c.words()}
        summary[arm] = row
    return summary


def _ci(c: dict | None, key: str) -> str:
    if not c or c.get(key) is None:
        return ""
    lo, hi = c[key]
    return f"[{100 * lo:+.1f}, {100 * hi:+.1f}]"


def table_md(summary: dict) -> str:
    """The markdown table: one row per arm."""
    head = (
        "| arm | trainable | best LR | test acc (mean ± std, seeds) | vs linear: diff, seeds 95%, images 95% "
        "| vs LoRA: diff, seeds 95%, images 95% |\n|---|---|---|---|---|---|"
    )
    rows = []
    for arm, r in summary.items():
        cells = []
        for ref in REFERENCES:
            c = r.get(f"vs_{ref}")
            cells.append("" if c is None else f"{100 * c['diff']:+.1f} {_ci(c, 'seeds_ci')} {_ci(c, 'items_ci')}")
        name = arm + (f" (r={r['lora_r']})" if r.get("lora_r") else "")
        lr = f"{r['best_lr']:g}" + ("" if r["bracketed"] else " (edge)")
        rows.append(
            f"| {name} | {r['trainable_params']:,} | {lr} | {100 * r['test_mean']:.1f} ± "
            f"{100 * r['test_std']:.1f} ({r['n_seeds']}) | {cells[0]} | {cells[1]} |"
        )
    return "\n".join([head, *rows])


def lr_table_md(summary: dict) -> str:
    """Validation accuracy (first seed) at every LR tried, one row per arm; the chosen one in bold."""
    lrs = sorted({float(lr) for r in summary.values() for lr in r["val_by_lr"]})
    lines = ["| arm | " + " | ".join(f"{lr:g}" for lr in lrs) + " |", "|---|" + "---|" * len(lrs)]
    for arm, r in summary.items():
        vals = {float(lr): v for lr, v in r["val_by_lr"].items()}
        cells = [
            ("" if lr not in vals else f"**{100 * vals[lr]:.1f}**" if lr == r["best_lr"] else f"{100 * vals[lr]:.1f}")
            for lr in lrs
        ]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plots(summary: dict, arms: dict, out: Path, width: int) -> list[str]:
    """accuracy.png, lr_sweep.png, and for the skip arms skip_norms.png, skip_growth.png, routing.png."""
    names = []
    plot_results(
        {"test accuracy (classes 5-9)": {a: (r["test_mean"], r["test_std"]) for a, r in summary.items()}},
        out / "accuracy.png",
        title="mini-ViT probe, mean ± std over seeds",
    )
    plot_lr_sweep(
        {a: [(r["lr"], r["val_accuracy"]) for r in arms[a]["tried"].values()] for a in arms},
        out / "lr_sweep.png",
        ylabel="validation accuracy",
        title="validation accuracy vs LR (seed 0)",
    )
    names += ["accuracy.png", "lr_sweep.png"]
    norms = {a: r["skip_norms"] for a, r in summary.items() if "skip_norms" in r}
    if norms:
        plot_skip_norms(norms, out / "skip_norms.png", title="||W_skip||_F per layer, mini-ViT probe")
        growth = {f"mini-ViT {a}": [v / (1e-4 * width) for v in vs] for a, vs in norms.items()}
        for p in ("pythia-160m", "pythia-410m"):
            text_width = 768 if p.endswith("160m") else 1024
            growth[f"paper {p.removeprefix('pythia-')} (text, Fig. 2)"] = [
                v / (1e-4 * text_width) for v in PAPER_SKIP_NORMS[p]
            ]
        plot_skip_growth(growth, out / "skip_growth.png")
        ratios = {a: r["routing_ratios"] for a, r in summary.items() if "routing_ratios" in r}
        plot_skip_norms(
            ratios,
            out / "routing.png",
            title="routing ratio per layer, mini-ViT probe",
            ylabel="||W_skip x~|| / ||attn_out||",
        )
        names += ["skip_norms.png", "skip_growth.png", "routing.png"]
    return names


def report_md(cfg: Config, summary: dict, table: str, figures: list[str], meta: dict) -> str:
    lines = [
        "# Frozen probe of the shipped mini-ViT on CIFAR-10 classes 5-9",
        "",
        f"Backbone `{cfg.backbone}` from `{meta['checkpoint']}` (pretrained on classes 0-4 only, frozen), run as "
        f"a {cfg.family} model. "
        f"{meta['n_train']:,} train / {meta['n_val']:,} validation (LR choice) / {meta['n_test']:,} test images "
        f"of dog, frog, horse, ship, truck. {cfg.steps} steps x {cfg.batch_size}, AdamW, {cfg.warmup_steps} warmup "
        f"steps then cosine, weight decay {cfg.weight_decay}; LR lattice {cfg.lr0:g} x 2^k; seeds {list(cfg.seeds)}. "
        "Test accuracy in %; differences in points, with the 95% interval over seeds (Student-t) and over test "
        "images (paired bootstrap).",
        "",
        table,
        "",
        "Validation accuracy (%, first seed) at each LR tried; the chosen LR in bold:",
        "",
        lr_table_md(summary),
        "",
        *[f"![{f}]({f})" for f in figures],
        "",
        "## Command",
        "",
        "```",
        meta["command"],
        "```",
        "",
        f"Training time summed over all {meta['points']} points: {meta['train_seconds']:.0f} s (each point's own "
        f"fit, evaluation not counted). This call: {meta['wall_seconds']:.0f} s wall ({meta['trained']} points "
        f"trained, {meta['read']} read back), load average at its end {meta['environment']['load_avg_1_5_15']} "
        f"on {meta['environment']['cpus']} shared cores, {cfg.threads} thread(s).",
    ]
    return "\n".join(lines) + "\n"


def _points(arm: dict) -> list[dict]:
    """Every distinct point of an arm: the LRs tried (first seed) and the other seeds."""
    return list(arm["tried"].values()) + [r for s, r in arm["seeds"].items() if r not in arm["tried"].values()]


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_config(Config, argv, __doc__)
    torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    data = load_data(cfg)
    width = get_backbone(cfg).dim
    log: list = []
    arms: dict[str, dict] = {}
    for arm in cfg.arms:
        best_lr, tried = search_lr(cfg, data, arm, log)
        ks = sorted(tried)
        best_k = next(k for k in ks if cfg.lr0 * 2.0**k == best_lr)
        seeds = {cfg.seeds[0]: tried[best_k]}
        for seed in cfg.seeds[1:]:
            seeds[seed] = get_point(cfg, data, arm, best_lr, seed, log)
        arms[arm] = {"best_lr": best_lr, "tried": tried, "seeds": seeds, "bracketed": ks[0] < best_k < ks[-1]}
    summary = summarise(cfg, arms)
    table = table_md(summary)
    print(table)
    figures = plots(summary, arms, out, width)
    repo = Path(__file__).resolve().parents[2]
    ckpt = Path(cfg.checkpoint).resolve()
    meta = {
        "checkpoint": str(ckpt.relative_to(repo)) if ckpt.is_relative_to(repo) else cfg.checkpoint,
        "n_train": len(data["train"][1]),
        "n_val": len(data["val"][1]),
        "n_test": len(data["test"][1]),
        "command": "OMP_NUM_THREADS=1 .venv/bin/python recipes/vision/mini_vit_probe.py " + " ".join(argv),
        "wall_seconds": time.perf_counter() - t0,
        "trained": sum(e[0] == "trained" for e in log),
        "read": sum(e[0] == "read" for e in log),
        "points": len(log),
        "train_seconds": sum(p["seconds"] for a in arms.values() for p in _points(a)),
        "environment": environment(),
        "mmpreproj_version": mmpreproj.__version__,
    }
    (out / "report.md").write_text(report_md(cfg, summary, table, figures, meta))
    result = {
        "recipe": "mini_vit_probe",
        "config": dataclasses.asdict(cfg),
        "summary": summary,
        "table": table,
        "figures": figures,
        "log": log,
        **meta,
    }
    (out / "summary.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(
        f"wrote {out / 'report.md'} ({meta['trained']} trained, {meta['read']} read back) "
        f"in {meta['wall_seconds']:.0f} s"
    )
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.command`
    from recipes.command import run_main  # a refusal in one line naming its flags

    run_main(main)
