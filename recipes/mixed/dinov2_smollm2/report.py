"""The study's report, read back from the evidence files: one row per group, paired comparisons, CPU-hours.

Accuracy is the exact match of the greedy answer on the test items (the same items for every arm of a task).
A comparison pairs seeds (Student-t over per-seed differences, 2+ seeds) and items (a paired bootstrap over the
test items, averaged over seeds), `mmpreproj.analysis.stats.compare`; "beyond the noise" when every interval
available excludes zero. CPU-hours: the sum of `cpu_s` over every line of every `times.jsonl` (each training
step and scored batch of every invocation, finished or not) and of the feature pass.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from mmpreproj.analysis.stats import compare, mean_std
from mmpreproj.experiments.runner import best_lr
from mmpreproj.experiments.study import Step

from .study import Group, VlmStudy
from .tasks import WHERE

COMPARISONS = (  # (method, reference)
    ("class/proj+preproj_skip", "class/proj"),
    ("class/proj+lora", "class/proj"),
    ("class/proj+preproj_skip", "class/proj+lora"),
    ("where/2d+preproj_skip", "where/1d+preproj_skip"),
    ("where/2d-il+preproj_skip", "where/1d+preproj_skip"),
    ("where/2d-il+preproj_skip", "where/2d+preproj_skip"),
    ("mosaic/2d+preproj_skip", "mosaic/1d+preproj_skip"),
    ("mosaic/2d+preproj_skip", "mosaic/2d"),
)


def cpu_seconds(out: Path) -> dict[str, float]:
    """{"cpu_s", "wall_s", "lines"} summed over every times file under `out`."""
    total = {"cpu_s": 0.0, "wall_s": 0.0, "lines": 0}
    for path in sorted(out.rglob("*times.jsonl")):
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:  # a line cut by a kill
                continue
            total["cpu_s"] += float(rec.get("cpu_s", 0.0))
            total["wall_s"] += float(rec.get("wall_s", 0.0))
            total["lines"] += 1
    return total


def arm_cpu_minutes(arm_dir: Path) -> float:
    """CPU minutes of one arm's times file (training, held-out and test scoring, every invocation)."""
    path = arm_dir / "times.jsonl"
    return cpu_seconds(arm_dir)["cpu_s"] / 60 if path.is_file() else float("nan")


def _where_parts(generated: list[str], answers: list[str]) -> tuple[float, float]:
    """Share of mosaic answers whose row word (top / bottom) and column word (left / right) are right."""
    rows = cols = 0
    for g, a in zip(generated, answers):
        gw, aw = g.split(), a.split()
        rows += len(gw) == 2 and gw[0] == aw[0]
        cols += len(gw) == 2 and gw[1] == aw[1]
    return rows / len(answers), cols / len(answers)


EARLY = slice(25, 100)  # the training steps whose loss says how fast a place task is learnt (after the warm-up)


def group_results(s: VlmStudy, g: Group) -> dict[str, Any]:
    """What is finished of group `g`: the LRs tried (held-out answer PPL), the best, and per seed its rows."""
    tried, settled = s.selected(g)
    best = best_lr(tried) if settled else None
    seeds: dict[int, dict[str, Any]] = {}
    for seed in s.seeds[: g.seeds] if best is not None else []:
        sel, full = s.read(Step("select", g, best, seed)), s.read(Step("full", g, best, seed))
        if sel is None or full is None:
            continue
        test = full["items"]["test"]
        cpu = arm_cpu_minutes(s.arm_dir(Step("select", g, best, seed)))
        seeds[seed] = {
            "select": sel["row"],
            "test.acc": full["row"]["test.acc"],
            "items": test["item_correct"],
            "cpu_min": cpu,
        }
        if g.task in ("mosaic", "where"):
            seeds[seed]["row_col"] = _where_parts(test["generated"], test["answer"])
            early = [v for v in sel.get("losses", [])[EARLY] if math.isfinite(v)]
            seeds[seed]["early_loss"] = sum(early) / len(early) if early else float("nan")
    return {"tried": tried, "settled": settled, "best": best, "seeds": seeds}


def _pm(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    if not values:
        return "-"
    m, sd, n = mean_std(values)
    return f"{scale * m:.{digits}f}" if n == 1 else f"{scale * m:.{digits}f} ± {scale * sd:.{digits}f}"


def write_report(s: VlmStudy, notes: tuple[str, ...] = ()) -> str:
    """report.md in `s.out` (returned as text)."""
    res = {g.label: group_results(s, g) for g in s.groups}
    lines = [
        "# DINOv2-S -> projector -> SmolLM2-135M: class names, mosaic and picture positions",
        "",
        "Exact match (%) of the greedy answer (KV cache) on test items; mean ± std over seeds at the LR picked",
        "on held-out train items (answer perplexity).",
        "",
        "| group | method | positions | trainable (projector + LM) | LR | held-out PPL by LR | seeds | held-out acc | test acc | place row / column | CPU min / arm |",  # noqa: E501
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in s.groups:
        r = res[g.label]
        seeds = r["seeds"]
        first = next(iter(seeds.values()), None)
        params = (
            "-"
            if first is None
            else f"{first['select']['params']['projector']:,} + {first['select']['params']['adapter']:,}"
        )  # noqa: E501
        tried = ", ".join(f"{lr:g}: {'diverged' if v is None else f'{v:.3f}'}" for lr, v in sorted(r["tried"].items()))
        pos = g.positions if g.positions == "1d" else f"2d ({g.layout})"
        held = _pm([v["select"]["select.acc"] for v in seeds.values()])
        test = _pm([v["test.acc"] for v in seeds.values()])
        rc = "-"
        if g.task in ("mosaic", "where") and seeds:
            rc = f"{_pm([v['row_col'][0] for v in seeds.values()])} / {_pm([v['row_col'][1] for v in seeds.values()])}"
        cpu = _pm([v["cpu_min"] for v in seeds.values()], scale=1.0)
        lr = "-" if r["best"] is None else f"{r['best']:g}"
        lines.append(
            f"| {g.label} | {g.method} | {pos} | {params} | {lr} | {tried or '-'} | {len(seeds)}/{g.seeds} | {held} | {test} | {rc} | {cpu} |"  # noqa: E501
        )
    early = [(g, res[g.label]["seeds"]) for g in s.groups if g.task in ("mosaic", "where") and res[g.label]["seeds"]]
    if early:
        lines += [
            "",
            f"How fast the place is learnt: the mean training loss over steps {EARLY.start + 1}-{EARLY.stop} (per "
            "answer token: the two words and the end; chance 0.46), at the picked LR, mean ± std over seeds:",
            "",
            "| group | positions | training loss, early steps |",
            "|---|---|---|",
        ]
        lines += [
            f"| {g.label} | {g.positions if g.positions == '1d' else f'2d ({g.layout})'} | "
            f"{_pm([v['early_loss'] for v in seeds.values()], scale=1.0, digits=3)} |"
            for g, seeds in early
        ]
    lines += ["", "Paired differences of test accuracy (points; 95% intervals over seeds and over items):", ""]
    lines += [
        "| method | reference | seeds | difference | over seeds | over items | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for a, b in COMPARISONS:
        if a not in res or b not in res or not res[a]["seeds"] or not res[b]["seeds"]:
            continue
        sa, sb = res[a]["seeds"], res[b]["seeds"]
        shared = sorted(set(sa) & set(sb))
        if not shared:
            continue
        c = compare(
            {k: sa[k]["test.acc"] for k in shared},
            {k: sb[k]["test.acc"] for k in shared},
            method=a,
            reference=b,
            metric="image.acc",
            items={k: sa[k]["items"] for k in shared},
            ref_items={k: sb[k]["items"] for k in shared},
        )
        iv = lambda x: "-" if x is None else f"[{100 * x[0]:+.1f}, {100 * x[1]:+.1f}]"  # noqa: E731
        lines.append(
            f"| {a} | {b} | {len(shared)} | {100 * c.diff:+.1f} | {iv(c.seeds)} | {iv(c.items)} | {c.words()} |"
        )
    t = cpu_seconds(s.out)
    lines += [
        "",
        f"Compute: {t['cpu_s'] / 3600:.2f} CPU-hours ({t['wall_s'] / 3600:.2f} wall-hours) summed over {t['lines']:,} "
        "timed pieces of work (every training step and scored batch of every invocation, the feature pass).",
        f"Place answers (mosaic, where): {', '.join(WHERE)} (chance 25%; row / column: the share with the right "
        "top/bottom or left/right word).",
    ]
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    text = "\n".join(lines) + "\n"
    (s.out / "report.md").write_text(text)
    return text
