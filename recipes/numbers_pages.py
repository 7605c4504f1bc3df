"""The numbers of docs/results.md's toy-model sections and of docs/performance.md outside its `make bench` table,
generated from (tables) or checked against (sentences) the committed raw files they come from.

`recipes/headline.py` adds `BLOCKS`, `BLOCK_SOURCES` and `CLAIMS` to its own, so `python recipes/headline.py`
rewrites these blocks too, `--check` and `tests/test_headline.py` fail when a page no longer matches its files,
and docs/numbers.md lists them. Everything here reads JSON only.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

from recipes.claim import Claim

ROOT = Path(__file__).resolve().parents[1]
MINI_VIT = ROOT / "docs" / "evidence" / "mini-vit-probe"  # summary.json, summary_open_clip.json
MINI_VIT_ASSET = ROOT / "assets" / "mini-vit"  # training_log.json (the backbone's pretraining)
BENCH = ROOT / "bench" / "results"  # latest.json, decode/*.json, gpu/*.json, cli_startup.json
SMOLLM2_BENCH = ROOT / "docs" / "evidence" / "smollm2-135m" / "bench.json"

RESULTS, PERFORMANCE = "docs/results.md", "docs/performance.md"
MINI_VIT_JSON = "docs/evidence/mini-vit-probe/summary.json"
OPEN_CLIP_JSON = "docs/evidence/mini-vit-probe/summary_open_clip.json"
PRETRAIN_JSON = "assets/mini-vit/training_log.json"
LATEST_JSON = "bench/results/latest.json"
DECODE_JSON = "bench/results/decode/*.json"
COMPILE_JSON = "bench/results/decode/160m_2layers_compile.json"
GPU_JSON = "bench/results/gpu/h200-2026-12-04.json"
CLI_JSON = "bench/results/cli_startup.json"
HOT_PATH_DIR = "bench/results/hot_path"
HOT_PATH_JSON = HOT_PATH_DIR + "/run-*.json"
HOT_PATH_ONE_THREAD_DIR = "bench/results/hot_path_one_thread"  # the same script under OMP_NUM_THREADS=1
HOT_PATH_ONE_THREAD_JSON = HOT_PATH_ONE_THREAD_DIR + "/run-*.json"
HOT_PATH_VARIANTS = ("base", "ours", "authors", "lora")
SMOLLM2_BENCH_JSON = "docs/evidence/smollm2-135m/bench.json"


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


# docs/results.md: the mini-ViT frozen probe (docs/evidence/mini-vit-probe/summary.json, written by the recipe)


def _mini_vit(name: str = "summary.json") -> dict:
    return _read(MINI_VIT / name)["summary"]


def _ci(c: dict, key: str) -> str:
    lo, hi = c[key]
    return f"[{100 * lo:+.1f}, {100 * hi:+.1f}]"


def mini_vit_table_block() -> str:
    """The probe's table, one row per arm: the recipe's own layout (`mini_vit_probe.table_md`), from summary.json."""
    lines = [
        "| arm | trainable | best LR | test acc (mean ± std, seeds) | vs linear: diff, seeds 95%, images 95% "
        "| vs LoRA: diff, seeds 95%, images 95% |",
        "|---|---|---|---|---|---|",
    ]
    for arm, r in _mini_vit().items():
        cells = [
            f"{100 * c['diff']:+.1f} {_ci(c, 'seeds_ci')} {_ci(c, 'items_ci')}" if (c := r.get(f"vs_{ref}")) else ""
            for ref in ("linear", "lora")
        ]
        name = arm + (f" (r={r['lora_r']})" if r.get("lora_r") else "")
        lr = f"{r['best_lr']:g}" + ("" if r["bracketed"] else " (edge)")
        lines.append(
            f"| {name} | {r['trainable_params']:,} | {lr} | {100 * r['test_mean']:.1f} ± {100 * r['test_std']:.1f} "
            f"({r['n_seeds']}) | {cells[0]} | {cells[1]} |"
        )
    return "\n".join(lines)


def _mini_vit_pretraining() -> dict[str, float]:
    """The backbone's held-out accuracy, size, training seconds and the load at the end of its training."""
    log = _read(MINI_VIT_ASSET / "training_log.json")
    return {
        "params": log["fit"]["trainable_params"] / 1e6,
        "acc": 100 * log["fit"]["test_accuracy"],
        "seconds": log["fit"]["seconds"],
        "load": log["environment"]["load_avg_1_5_15"][0],
    }


def _mini_vit_vs_linear() -> dict[str, float]:
    """The smallest and largest gain of an adapter over the linear probe, in points."""
    diffs = [100 * r["vs_linear"]["diff"] for r in _mini_vit().values() if "vs_linear" in r]
    return {"lo": min(diffs), "hi": max(diffs)}


def _mini_vit_vs_lora() -> dict[str, float]:
    """How far pre-projection + skip is behind LoRA (paper's rank) and behind LoRA of the matched size."""
    s = _mini_vit()
    ps = s["preproj_skip"]
    return {
        "paper": -100 * ps["vs_lora"]["diff"],
        "matched": 100 * (s["lora_matched"]["test_mean"] - ps["test_mean"]),
        "r": s["lora_matched"]["lora_r"],
    }


def _mini_vit_skip_alone() -> dict[str, float]:
    skip = _mini_vit()["skip"]
    return {"acc": 100 * skip["test_mean"], "k": skip["trainable_params"] / 1e3}


def _mini_vit_skip_norms() -> dict[str, float | str]:
    """`||W_skip||_F` at the end over its init (1e-4 * width 128), and the blocks where the routing ratio
    exceeds 1 with the pre-projection."""
    s = _mini_vit()
    init = 1e-4 * 128
    norms = [n / init for arm in ("skip", "preproj_skip") for n in s[arm]["skip_norms"]]
    above = [i for i, r in enumerate(s["preproj_skip"]["routing_ratios"]) if r > 1]
    return {"lo": round(min(norms), -1), "hi": round(max(norms), -1), "blocks": f"{above[0]}-{above[-1]}"}


def _mini_vit_open_clip() -> dict[str, float]:
    """pre-projection + skip through open_clip and through timm: mean and std over seeds, in %."""
    oc, timm = _mini_vit("summary_open_clip.json")["preproj_skip"], _mini_vit()["preproj_skip"]
    return {"oc": 100 * oc["test_mean"], "oc_sd": 100 * oc["test_std"],
            "timm": 100 * timm["test_mean"], "timm_sd": 100 * timm["test_std"]}  # fmt: skip


def _mini_vit_cost() -> dict[str, float]:
    """Points, training minutes summed over them, and the 1-minute load at the end of the run."""
    data = _read(MINI_VIT / "summary.json")
    return {
        "points": data["points"],
        "minutes": data["train_seconds"] / 60,
        "load": data["environment"]["load_avg_1_5_15"][0],
    }


# docs/performance.md: bench/results/latest.json (`make bench`), decode/*.json, gpu/*.json, cli_startup.json


def _latest() -> dict:
    """The one run of `make bench` in bench/results/latest.json."""
    return _read(BENCH / "latest.json")["runs"][0]


def _loads_1min(x: object) -> list[float]:
    """Every 1-minute load average read in a results file: lists under "load_avg_1min", the first of each
    other "load_avg..." (1, 5, 15) triple."""
    out: list[float] = []
    if isinstance(x, dict):
        for k, v in x.items():
            if k == "load_avg_1min":
                out += v
            elif k.startswith("load_avg"):
                out.append(v[0])
            else:
                out += _loads_1min(v)
    elif isinstance(x, list):
        for v in x:
            out += _loads_1min(v)
    return out


def _bench_noise() -> dict[str, float]:
    """The load during the set, and the wall-clock decode of bench_dtype against bench_decode's CPU-clock one."""
    data = _read(BENCH / "latest.json")
    loads = _loads_1min(data)
    run = data["runs"][0]
    dtype = run["dtype"]["decode"]["host dtype"]
    return {
        "lo": min(loads),
        "hi": max(loads),
        "end": data["load_avg_1min"][-1],
        "dtype": dtype["ratio"],
        "dtype_lo": dtype["ratio_min"],
        "dtype_hi": dtype["ratio_max"],
        "repeats": run["dtype"]["repeats"],
        "decode": run["decode160"]["hosts"]["bfloat16"]["decode"]["injected"]["ratio"],
    }


DECODE_ROWS = (  # label, then a file of bench/results/decode/ or "latest:KEY", a decode run of `make bench`
    ("GPT-NeoX 160M, LM head included, run 1", "160m_quiet_1.json"),
    ("GPT-NeoX 160M, run 2", "160m_quiet_2.json"),
    ("GPT-NeoX 160M, in the `run_all` set above", "latest:decode160"),
    ("GPT-NeoX 160M, run 3", "160m_loaded.json"),
    ("Llama-3.2-1B shape, decoder body, 2 of 16 layers", "llama1b_2layers_quiet.json"),
    ("Llama-3.2-1B shape, same, in the `run_all` set", "latest:decode_llama"),
    ("Llama-3.2-1B shape, same, loaded machine", "llama1b_2layers_loaded.json"),
)
DECODE_COLUMNS = (  # (host dtype, variant) per column
    ("float32", "injected"),
    ("bfloat16", "injected"),
    ("bfloat16", "injected, F.linear (before)"),
    ("bfloat16", "bf16 modules"),
)
BEFORE = "injected, F.linear (before)"


def _decode_run(source: str) -> dict:
    if source.startswith("latest:"):
        return _latest()[source.removeprefix("latest:")]
    return _read(BENCH / "decode" / source)


def _decode_runs() -> dict[str, dict]:
    return {source: _decode_run(source) for _, source in DECODE_ROWS}


def _load_range(run: dict) -> str:
    a, b = run["load_avg_before"][0], run["load_avg_after"][0]
    return f"{min(a, b):.1f}-{max(a, b):.1f}"


def _ratio(run: dict, host: str, variant: str) -> dict | None:
    return run["hosts"][host]["decode"].get(variant)


def decode_table_block() -> str:
    """The batch-1 decode table: each run's median ratio over the base (range over repeats) per host dtype."""
    lines = [
        "| decode per token, over the base | fp32 host | bf16 host | bf16 host, before | bf16 host, bf16 modules "
        "| weight bytes |",
        "|---|---|---|---|---|---|",
    ]
    for label, source in DECODE_ROWS:
        run = _decode_run(source)
        cells = [
            f"{r['ratio']:.3f} ({r['ratio_min']:.3f}-{r['ratio_max']:.3f})" if (r := _ratio(run, *col)) else "-"
            for col in DECODE_COLUMNS
        ]
        bytes_ratio = run["hosts"]["bfloat16"]["weight_bytes_ratio"]
        lines.append(
            f"| {label} ({run['repeats']} repeats, load {_load_range(run)}) | {' | '.join(cells)} "
            f"| {bytes_ratio:.3f} |"
        )
    return "\n".join(lines)


def _decode_quiet() -> dict[str, float | str]:
    """The 160M runs on the quieter machine against the weight-bytes ratio, and the loaded run's load."""
    runs = _decode_runs()
    quiet = [runs[s] for s in ("160m_quiet_1.json", "160m_quiet_2.json", "latest:decode160")]
    over = [
        _ratio(r, h, "injected")["ratio"] / r["hosts"][h]["weight_bytes_ratio"] - 1
        for r in quiet
        for h in ("float32", "bfloat16")
    ]
    loads = [v for r in quiet for v in (r["load_avg_before"][0], r["load_avg_after"][0])]
    return {
        "n": len(quiet),
        "load": max(loads),
        "over": 100 * max(over),
        "max": max(_ratio(r, h, "injected")["ratio"] for r in quiet for h in ("float32", "bfloat16")),
        "loaded": _load_range(runs["160m_loaded.json"]),
    }


def _decode_llama_and_noise() -> dict[str, float | str]:
    """fp32 at the Llama shape against 2% over its bytes ratio; fp32 "before" (the same code) as the noise."""
    runs = _decode_runs()
    llama = [runs[s] for s in ("llama1b_2layers_quiet.json", "latest:decode_llama", "llama1b_2layers_loaded.json")]
    fp32 = [_ratio(r, "float32", "injected")["ratio"] for r in llama]
    pairs = {s: r for s, r in runs.items() if _ratio(r, "float32", BEFORE)}
    before = {s: _ratio(r, "float32", BEFORE)["ratio"] for s, r in pairs.items()}
    noise = max(abs(before[s] - _ratio(r, "float32", "injected")["ratio"]) for s, r in pairs.items())
    return {
        "lo": min(fp32),
        "hi": max(fp32),
        "bound": 1.02 * llama[0]["hosts"]["float32"]["weight_bytes_ratio"],
        "b160": ", ".join(f"{v:.3f}" for s, v in before.items() if s.startswith("160m")),
        "bllama": ", ".join(f"{v:.3f}" for s, v in before.items() if s.startswith("llama")),
        "noise": 100 * noise,
    }


def _decode_bf16_before_after() -> dict[str, str]:
    """bf16 host, "before" (plain F.linear) -> after, in the quiet runs that measured both."""
    runs = _decode_runs()

    def pair(source: str) -> str:
        r = runs[source]
        return f"{_ratio(r, 'bfloat16', BEFORE)['ratio']:.3f} -> {_ratio(r, 'bfloat16', 'injected')['ratio']:.3f}"

    return {
        "q1": pair("160m_quiet_1.json"),
        "q2": pair("160m_quiet_2.json"),
        "llama": pair("llama1b_2layers_quiet.json"),
    }


def _decode_compile() -> dict[str, float | str]:
    data = _read(BENCH / "decode" / "160m_2layers_compile.json")
    fp32, bf16 = data["hosts"]["float32"], data["hosts"]["bfloat16"]
    return {
        "load": _load_range(data),
        "base": fp32["decode"]["base compiled"]["ratio"],
        "compiled": fp32["decode"]["injected compiled"]["ratio"],
        "eager": fp32["decode"]["injected"]["ratio"],
        "seconds": fp32["compile_s"],
        "bf16_seconds": bf16["compile_s"],
    }


def _dtype_forward() -> dict[str, float]:
    """bench_dtype's forward over the base in the `make bench` run: fp32 compute, host dtype, bf16 modules."""
    fwd = _latest()["dtype"]["forward"]
    return {
        "fp32": fwd["fp32 modules"]["ratio"],
        "host": fwd["host dtype"]["ratio"],
        "bf16": fwd["bf16 modules"]["ratio"],
    }


def _train_memory(row: str) -> Callable[[], dict[str, float]]:
    """Activation bytes per token and layer that autograd saves over the frozen base, for one host set-up."""

    def values() -> dict[str, float]:
        b = _latest()["dtype"]["train_memory"][row]["activation_bytes_per_token_layer"]
        return {"bytes": b, "per_d": b / 768}

    return values


def _train_memory_step() -> dict[str, float]:
    mem = _latest()["dtype"]["train_memory"]["bf16 host, compute input"]
    return {"casts": mem["per_step_saved_mb"], "adam": mem["grads_adam_mb"]}


def _flop_ratios() -> dict[str, float]:
    run = _latest()
    return {
        "n160": run["neox160"]["flop_ratio"],
        "n410": run["neox410"]["flop_ratio"],
        "vit": run["vit"]["flop_ratio"]["preproj_skip"],
    }


def _gpu() -> dict:
    return _read(BENCH / "gpu" / "h200-2026-12-04.json")


def _range(r: dict, digits: int = 2) -> str:
    return f"{r['ratio']:.{digits}f} ({r['ratio_min']:.{digits}f}-{r['ratio_max']:.{digits}f})"


def gpu_table_block() -> str:
    """bench/gpu.sh's first GPU run: each case's median over the base (min-max over repeats) per shape."""
    lines = [
        "| shape | bf16 forward 8 x 512 | decode, ms/token (batch 1) | frozen-probe step: `preproj_skip` "
        "| LoRA (the paper's rank rule) |",
        "|---|---|---|---|---|",
    ]
    for shape, s in _gpu()["shapes"].items():
        fwd, dec, step = s["forward"], s["decode"], s["train"]
        lines.append(
            f"| {shape.upper()} | {_range(fwd['injected'])}; base {fwd['base']['ms']:.3g} ms "
            f"| {dec['injected']['ms_per_token']:.1f} vs {dec['base']['ms_per_token']:.1f}, {_range(dec['injected'])} "
            f"| {_range(step['preproj_skip'])}; base {step['base']['ms']:.3g} ms | {_range(step['lora'])} |"
        )
    return "\n".join(lines)


def _gpu_reading() -> dict[str, float]:
    """MFU in the forward and the step, the base's decode time per token, the 410M step's peak memory, and the
    FLOP ratios of the two shapes (from `make bench`)."""
    shapes = _gpu()["shapes"].values()
    fwd = [100 * r["mfu"] for s in shapes for r in s["forward"].values()]
    step = [100 * r["mfu"] for s in shapes for r in s["train"].values()]
    dec = [s["decode"]["base"]["ms_per_token"] for s in shapes]
    train410 = _gpu()["shapes"]["410m"]["train"]
    run = _latest()
    return {
        "fwd_lo": min(fwd),
        "fwd_hi": max(fwd),
        "step": sum(step) / len(step),
        "dec_lo": min(dec),
        "dec_hi": max(dec),
        "ps": train410["preproj_skip"]["peak_gb"],
        "lora": train410["lora"]["peak_gb"],
        "f160": 100 * (run["neox160"]["flop_ratio"] - 1),
        "f410": 100 * (run["neox410"]["flop_ratio"] - 1),
    }


def _smollm2_bench() -> dict[str, float]:
    """SmolLM2-135M: training step, decode per token and a step's resident memory over the base, fp32 and bf16."""
    data = _read(SMOLLM2_BENCH)

    def over(dtype: str, what: str) -> dict[str, float]:
        row = data[dtype][what][dtype]
        return {k: v / row["base"] for k, v in row.items()}

    step, dec, mem = over("fp32", "train_step"), over("fp32", "decode_per_token"), over("fp32", "peak_mb")
    bdec, bmem = over("bf16", "decode_per_token"), over("bf16", "peak_mb")
    return {
        "repeats": data["fp32"]["repeats"],
        "step": step["preproj_skip"],
        "step1": step["preproj_skip@1%"],
        "step_lora": step["lora r=64"],
        "step_lora1": step["lora@1%"],
        "dec": dec["preproj_skip"],
        "dec_lora": dec["lora r=64"],
        "mem": mem["preproj_skip"],
        "mem1": mem["preproj_skip@1%"],
        "mem_lora": mem["lora r=64"],
        "bdec": bdec["preproj_skip"],
        "bdec_lora": bdec["lora r=64"],
        "bmem": bmem["preproj_skip"],
        "bmem1": bmem["preproj_skip@1%"],
    }


CLI_TORCH, CLI_HELP = "python -c 'import torch'", "--help"


def cli_startup_block() -> str:
    """bench/cli_startup.py's table: `import torch`, `--help` and the refused invocations (their range)."""
    data = _read(BENCH / "cli_startup.json")
    med, over = data["median_s"], data["over_import_torch"]
    refused = [k for k in med if k not in (CLI_TORCH, CLI_HELP)]
    lo, hi = min(med[k] for k in refused), max(med[k] for k in refused)
    olo, ohi = min(over[k] for k in refused), max(over[k] for k in refused)
    return "\n".join(
        [
            "| command | median | / `import torch` |",
            "|---|---|---|",
            f'| `python -c "import torch"` | {med[CLI_TORCH]:.2f} s | 1 |',
            f"| `mmpreproj --help` | {med[CLI_HELP]:.2f} s | {over[CLI_HELP]:.2f} |",
            f"| {', '.join(f'`{k}`' for k in refused)} | {lo:.2f}-{hi:.2f} s | {olo:.2f}-{ohi:.2f} |",
        ]
    )


def _cli_share() -> dict[str, float]:
    """The slowest refused command's time over `import torch` (and the --help), measured side by side."""
    ratios = _read(BENCH / "cli_startup.json")["over_import_torch"]
    return {"share": max(v for k, v in ratios.items() if "import torch" not in k)}


def _cli_load() -> dict[str, float]:
    load = _read(BENCH / "cli_startup.json")["loadavg"]
    return {"before": load["before"][0], "after": load["after"][0]}


def _hot_path_runs(folder: str = HOT_PATH_DIR) -> list[dict]:
    """Every run of bench/bench_hot_path.py kept in `folder` (one JSON per run)."""
    runs = [_read(p) for p in sorted((ROOT / folder).glob("run-*.json"))]
    if not runs:
        raise FileNotFoundError(f"no {folder}/run-*.json: run bench/bench_hot_path.py --json {folder}/run-1.json")
    return runs


def _over_runs(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max) over the runs of one figure each run reports (itself a median over its repeats)."""
    return statistics.median(values), min(values), max(values)


def hot_path_block() -> str:
    """bench/bench_hot_path.py's runs: decode per token on both dtypes and the training step, side by side; each cell
    the median over the runs of a run's median over its repeats, with the range over the runs."""
    runs = _hot_path_runs()

    def cell(values: list[float], fmt: str) -> str:
        med, lo, hi = _over_runs(values)
        return f"{med:{fmt}} ({lo:{fmt}}-{hi:{fmt}})"

    head = f"| {len(runs)} runs: median (min-max over the runs) | base, ms | ours, ms | the authors' hooks, ms"
    rows = [head + " | LoRA, ms | ours / authors |", "|---|---|---|---|---|---|"]
    for dtype in runs[0]["dtypes"]:
        dec = [r["decode"][dtype] for r in runs]
        times = [cell([d["per_token"][k]["ms"] for d in dec], ".1f") for k in HOT_PATH_VARIANTS]
        ratio = cell([d["ratios"]["ours/authors"]["ratio"] for d in dec], ".3f")
        rows.append(f"| decode per token, {dtype} | {' | '.join(times)} | {ratio} |")
    times = [cell([r["train"]["step"][k]["ms"] for r in runs], ".0f") for k in HOT_PATH_VARIANTS[1:]]
    ratio = cell([r["train"]["ratios"]["ours/authors"]["ratio"] for r in runs], ".3f")
    rows.append(f"| frozen-probe training step, float32 | - | {' | '.join(times)} | {ratio} |")
    return "\n".join(rows)


def _hot_path() -> dict[str, float | str]:
    """The hot-path runs' load and the ratios the text quotes (medians over the runs)."""
    runs = _hot_path_runs()
    out: dict[str, float | str] = {
        "runs": len(runs),
        "before": min(r["load_avg_before"][0] for r in runs),
        "after": max(r["load_avg_after"][0] for r in runs),
        "bytes": runs[0]["decode"]["float32"]["weight_bytes_ratio"],
        "hooks": runs[0]["python_hooks"]["ours"],
        "hooks_first": runs[0]["python_hooks"]["ours_before_first_forward"],
        "step": statistics.median(r["train"]["ratios"]["ours/authors"]["ratio"] for r in runs),
    }
    for dtype, tag in (("float32", "fp32"), ("bfloat16", "bf16")):
        dec = [r["decode"][dtype] for r in runs]
        out[f"{tag}_base"] = statistics.median(d["ratios"]["ours/base"]["ratio"] for d in dec)
        out[f"{tag}_bytes"] = statistics.median(d["ours/base_over_weight_bytes_ratio"] for d in dec)
        out[f"{tag}_auth"] = statistics.median(d["ratios"]["ours/authors"]["ratio"] for d in dec)
    return out


def _hot_path_one_thread() -> dict[str, float | int]:
    """The one-thread runs' ours / authors decode ratios (medians over the runs), their threads and load."""
    runs = _hot_path_runs(HOT_PATH_ONE_THREAD_DIR)
    if any(not r["machine"].split(", ")[1].startswith("1 thread") for r in runs):
        raise ValueError(f"{HOT_PATH_ONE_THREAD_JSON}: a run that did not use one thread")
    out: dict[str, float | int] = {
        "runs": len(runs),
        "before": min(r["load_avg_before"][0] for r in runs),
        "after": max(r["load_avg_after"][0] for r in runs),
    }
    for dtype, tag in (("float32", "fp32"), ("bfloat16", "bf16")):
        out[f"{tag}_auth"] = statistics.median(r["decode"][dtype]["ratios"]["ours/authors"]["ratio"] for r in runs)
    return out


def sizes_block() -> str:
    """docs/peft-guide.md's size table: `mmpreproj.estimate` of two configs on three named shapes (computed, not
    measured: the trainable count and 16 bytes per trainable weight for fp32 weights, gradients and AdamW)."""
    from mmpreproj import PreProjConfig, estimate  # the library's own count (imports torch)

    shapes = {"mini-pythia": "mini-pythia (7M)", "pythia-160m": "Pythia-160M", "llama-3-8b": "Llama-3-8B"}
    configs = {
        "`PreProjConfig()` (the paper's)": PreProjConfig(),
        "`PreProjConfig(expansion=1/16, skip_rank=16)`": PreProjConfig(expansion=1 / 16, skip_rank=16),
    }
    lines = ["| config | " + " | ".join(shapes.values()) + " |", "|---" * (len(shapes) + 1) + "|"]
    for name, config in configs.items():
        cells = []
        for shape in shapes:
            e = estimate(config, shape)
            train = f", {e.train_bytes / 1e9:.3g} GB to train" if shape == "llama-3-8b" else ""
            share = f"{e.percent:.1f}" if e.percent >= 10 else f"{e.percent:.2f}"
            cells.append(f"{e.params:,} ({share}%{train})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def quant_memory_block() -> str:
    """docs/peft-guide.md's memory table: the medians of bench/results/quant.json (`bench/bench_quant.py --json`)."""
    data = _read(BENCH / "quant.json")
    med, mib = data["medians"], 2**20
    names = {"float32": "float32", "int8": "int8 (torchao)", "nf4": "nf4 (bitsandbytes)"}
    keys = ("base_param_bytes", "steady_rss", "step_peak_rss", "step_extra_rss")
    lines = [
        "| base | base params MiB | steady RSS MiB | step peak RSS MiB | peak - steady MiB |",
        "|---|---|---|---|---|",
    ]
    for v in data["args"]["variants"]:
        cells = [f"{med[v][k] / mib:,.0f}" + ("" if v == "float32" else f" ({med[v][k] / med['float32'][k]:.2f}x)")
                 for k in keys]  # fmt: skip
        lines.append(f"| {names[v]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _quant_load() -> dict[str, float]:
    """The load around the memory bench: only its memory figures matter, the load says how busy the machine was."""
    data = _read(BENCH / "quant.json")
    before, after = (float(data[k][0]) for k in ("loadavg_before", "loadavg_after"))  # the bench writes them as text
    return {"before": before, "after": after, "repeats": data["args"]["repeats"]}


def _quantized_recipe() -> dict[str, float]:
    """The int8 recipe's line PPLs and reload check (docs/evidence/quantized-base/metrics.json)."""
    m = _read(ROOT / "docs" / "evidence" / "quantized-base" / "metrics.json")
    return {"float": m["ppl_float_base"], "int8": m["ppl_before"], "after": m["ppl_after"],
            "exact": "bit-exact" if m["reload_bit_exact"] else "NOT bit-exact"}  # fmt: skip


def _one_call_sweep() -> dict[str, int]:
    """The one call over every causal-LM class built tiny (bench/results/one_call_sweep.jsonl, one row per class):
    injected with the base's logits at identity init and others once perturbed, refused, not buildable."""
    rows = [json.loads(line) for line in (BENCH / "one_call_sweep.jsonl").read_text().splitlines() if line.strip()]
    ok = [r for r in rows if r["stage"] == "ok"]
    exact = sum(1 for r in ok if r.get("identity_equal") and r.get("perturbed_differs"))
    return {
        "ok": exact if exact == len(ok) else f"{exact} of {len(ok)}",  # a silently wrong row shows in the page
        "refused": sum(1 for r in rows if r["stage"] == "refused"),
        "cannot": sum(1 for r in rows if r["stage"] in ("build", "base-forward")),
        "total": len(rows),
    }


def _smollm2_sizes() -> dict[str, float]:
    """Trainable weights of the paper's size and of the 1% budget on SmolLM2-135M, from the study's arms."""
    groups = {g["label"]: g for g in _read(ROOT / "docs" / "evidence" / "smollm2-135m" / "study.json")["groups"]}
    params = {
        k: next(iter(groups[k]["seeds"].values()))["params"] / 1e6 for k in ("preproj_skip", "b0.01/preproj_skip")
    }
    return {"paper": params["preproj_skip"], "one": params["b0.01/preproj_skip"]}


def _estimates() -> dict[str, float]:
    """The paper's default and a small config on Llama-3-8B (`mmpreproj.estimate`), as getting-started quotes them."""
    from mmpreproj import PreProjConfig, estimate

    big, small = (
        estimate(PreProjConfig(), "llama-3-8b"),
        estimate(PreProjConfig(expansion=1 / 16, skip_rank=16), "llama-3-8b"),
    )
    return {"big": big.params, "big_pct": big.percent, "big_gb": big.train_bytes / 1e9, "small": small.params,
            "small_pct": small.percent, "small_gb": small.train_bytes / 1e9}  # fmt: skip


BLOCKS: dict[Path, dict[str, Callable[[], str]]] = {
    ROOT / RESULTS: {"mini-vit-probe": mini_vit_table_block},
    ROOT / "docs" / "peft-guide.md": {"sizes": sizes_block, "quant-memory": quant_memory_block},
    ROOT / "README.md": {"sizes": sizes_block},
    ROOT / PERFORMANCE: {
        "decode-table": decode_table_block,
        "gpu-h200": gpu_table_block,
        "cli-startup": cli_startup_block,
        "hot-path": hot_path_block,
    },
}

BLOCK_SOURCES: dict[str, tuple[str, ...]] = {
    "mini-vit-probe": (MINI_VIT_JSON + " (written by recipes/vision/mini_vit_probe.py)",),
    "decode-table": (DECODE_JSON, LATEST_JSON + " (decode160, decode_llama)"),
    "gpu-h200": (GPU_JSON,),
    "cli-startup": (CLI_JSON,),
    "hot-path": (HOT_PATH_JSON + " (bench/bench_hot_path.py --json, one file per run)",),
    "quant-memory": ("bench/results/quant.json (bench/bench_quant.py --repeats 3 --json)",),
    "sizes": ("mmpreproj.estimate (computed from the configs and the named shapes, mmpreproj/method/estimate.py)",),
}

CLAIMS: tuple[Claim, ...] = (
    Claim(
        PERFORMANCE,
        "Over the {runs} runs, ours decodes at {fp32_base:.3f}x the base in fp32 and {bf16_base:.3f}x in bf16, "
        "against a\nweight-bytes ratio of {bytes:.3f} (the limit of a memory-bound step: {fp32_bytes:.3f} and "
        "{bf16_bytes:.3f} of it), and at\n{fp32_auth:.3f}x and {bf16_auth:.3f}x the authors' code; the training step "
        "is {step:.3f}x theirs. "
        "{hooks} Python hooks are left on\nthe model after its first forward (the input-embedding one and the model's "
        "mixed-batch pair; {hooks_first} before it, the seam checks\namong them, dropped once checked). The runs' "
        "1-minute load stayed between {before:.1f} and {after:.1f}.",
        _hot_path,
        (HOT_PATH_JSON,),
    ),
    Claim(
        PERFORMANCE,
        "On one thread (`OMP_NUM_THREADS=1`, {runs} runs, 1-minute load {before:.1f} to {after:.1f}) ours decodes at "
        "{fp32_auth:.3f}x\nthe authors' code in fp32 and {bf16_auth:.3f}x in bf16.",
        _hot_path_one_thread,
        (HOT_PATH_ONE_THREAD_JSON,),
    ),
    Claim(
        RESULTS,
        "timm `VisionTransformer` (32px input, 8x8 patches, width 128, 6 blocks, {params:.1f}M parameters)",
        _mini_vit_pretraining,
        (PRETRAIN_JSON,),
    ),
    Claim(
        RESULTS,
        "{acc:.1f}% on 1,500\nheld-out test images of those classes (chance 20%), {seconds:.0f} s of training on one "
        "thread (1-minute load\naverage {load:.1f} at its end)",
        _mini_vit_pretraining,
        (PRETRAIN_JSON,),
    ),
    Claim(
        RESULTS,
        "**Every adapter beats the linear probe**, beyond the noise ({lo:+.1f} to {hi:+.1f} points)",
        _mini_vit_vs_linear,
        (MINI_VIT_JSON,),
    ),
    Claim(
        RESULTS,
        "**LoRA beats pre-projection + skip**, by {paper:.1f} points at the paper's LoRA rank and {matched:.1f} at "
        "the matched parameter\n  count (r = {r})",
        _mini_vit_vs_lora,
        (MINI_VIT_JSON,),
    ),
    Claim(RESULTS, "(skip alone: {acc:.1f}% with {k:.0f}k trainable)", _mini_vit_skip_alone, (MINI_VIT_JSON,)),
    Claim(
        RESULTS,
        "`||W_skip||_F` ends {lo:.0f}-{hi:.0f}x its init",
        _mini_vit_skip_norms,
        (MINI_VIT_JSON + " (skip_norms)",),
    ),
    Claim(
        RESULTS,
        "the skip's output exceeds attention's in blocks {blocks}",
        _mini_vit_skip_norms,
        (MINI_VIT_JSON + " (routing_ratios)",),
    ),
    Claim(
        RESULTS,
        "({oc:.1f} ± {oc_sd:.1f} vs {timm:.1f} ± {timm_sd:.1f})",
        _mini_vit_open_clip,
        (OPEN_CLIP_JSON, MINI_VIT_JSON),
    ),
    Claim(
        RESULTS,
        "{points} points,\n{minutes:.0f} min of training summed over them on the shared 2 cores (1-minute load "
        "average {load:.1f} at the end)",
        _mini_vit_cost,
        (MINI_VIT_JSON,),
    ),
    Claim(
        PERFORMANCE,
        "from {lo:.1f} to {hi:.1f} and ended at {end:.1f}",
        _bench_noise,
        (LATEST_JSON,),
    ),
    Claim(
        PERFORMANCE,
        "{dtype:.3f} here for host dtype (its {repeats} repeats range {dtype_lo:.2f}-{dtype_hi:.2f})",
        _bench_noise,
        (LATEST_JSON,),
    ),
    Claim(
        PERFORMANCE,
        "gives {decode:.3f} for the same variant",
        _bench_noise,
        (LATEST_JSON,),
    ),
    Claim(
        PERFORMANCE,
        "(1-min load at most {load:.1f}) the 160M ratios are at most {over:.1f}% above the weight-bytes ratio",
        _decode_quiet,
        (DECODE_JSON, LATEST_JSON),
    ),
    Claim(PERFORMANCE, "(<= {max:.2f}, {n} runs); at load {loaded} they are not", _decode_quiet, (DECODE_JSON,)),
    Claim(
        PERFORMANCE,
        "fp32 at {lo:.2f}-{hi:.2f} (the 2% bound is {bound:.3f}",
        _decode_llama_and_noise,
        (DECODE_JSON, LATEST_JSON),
    ),
    Claim(
        PERFORMANCE,
        "(fp32 before: {b160} at 160M; {bllama} at Llama), so those pairs show the noise: about +-{noise:.0f} points",
        _decode_llama_and_noise,
        (DECODE_JSON,),
    ),
    Claim(
        PERFORMANCE,
        "after: {q1} and {q2} at 160M, {llama} at Llama",
        _decode_bf16_before_after,
        (DECODE_JSON,),
    ),
    Claim(PERFORMANCE, "2 layers, fp32, load {load})", _decode_compile, (COMPILE_JSON,)),
    Claim(
        PERFORMANCE,
        "compiled base {base:.3f} of the eager base, compiled injected {compiled:.3f} (eager injected {eager:.3f}), "
        "{seconds:.0f} s of compiling",
        _decode_compile,
        (COMPILE_JSON,),
    ),
    Claim(PERFORMANCE, "The bf16 rows of that run spent {bf16_seconds:.0f} s", _decode_compile, (COMPILE_JSON,)),
    Claim(
        PERFORMANCE,
        "forward {fp32:.2f} with fp32 compute, {host:.2f} in the host dtype and {bf16:.2f} with bf16 modules",
        _dtype_forward,
        (LATEST_JSON,),
    ),
    Claim(
        PERFORMANCE,
        "| bf16 host | {bytes:,.0f} B ({per_d:.1f} bytes x d) |",
        _train_memory("bf16 host, compute input"),
        (LATEST_JSON,),
    ),
    Claim(
        PERFORMANCE,
        "| fp32 host under bf16 autocast (the trainer's default) | {bytes:,.0f} B ({per_d:.1f} bytes x d) |",
        _train_memory("fp32 host + bf16 autocast, compute input"),
        (LATEST_JSON,),
    ),
    Claim(
        PERFORMANCE,
        "one bf16 copy of the injected weights ({casts:.0f} MB at 160M)\nand {adam:.0f} MB of fp32 grads + "
        "AdamW state",
        _train_memory_step,
        (LATEST_JSON,),
    ),
    Claim(
        PERFORMANCE,
        "({n160:.2f} at 160M, {n410:.2f} at 410M, {vit:.2f} for ViT-B/16)",
        _flop_ratios,
        (LATEST_JSON,),
    ),
    Claim(
        PERFORMANCE,
        "MFU is {fwd_lo:.0f}-{fwd_hi:.0f}% in the forward and about {step:.0f}% in the step, and the base decodes "
        "at\n{dec_lo:.0f}-{dec_hi:.0f} ms a token",
        _gpu_reading,
        (GPU_JSON,),
    ),
    Claim(
        PERFORMANCE,
        "(+{f160:.0f}% at 160M, +{f410:.0f}% at 410M)",
        _gpu_reading,
        (LATEST_JSON + " (FLOP ratios)",),
    ),
    Claim(PERFORMANCE, "the 410M step: {ps:.1f} GiB, LoRA's {lora:.1f} GiB", _gpu_reading, (GPU_JSON,)),
    Claim(
        PERFORMANCE,
        "{repeats} interleaved\nrepeats; an earlier run of 3 kept no file and is left out): a frozen-probe training "
        "step costs {step:.2f}x the frozen\nbase's forward + backward with the paper's modules (34.8M trainable), "
        "{step1:.2f}x at 1% (`for_budget`, 1.35M),\nagainst {step_lora:.2f}x for LoRA r=64 (7.4M) and "
        "{step_lora1:.2f}x for LoRA at 1%",
        _smollm2_bench,
        (SMOLLM2_BENCH_JSON,),
    ),
    Claim(
        PERFORMANCE,
        "Greedy decode with the KV cache: {dec:.2f}x\nthe base per token with the paper's modules, "
        "{dec_lora:.2f}x with LoRA r=64 (unmerged). A step adds {mem:.2f}x the\nbase's resident memory with the "
        "paper's modules, "
        "{mem1:.2f}x at 1%, {mem_lora:.2f}x with LoRA r=64",
        _smollm2_bench,
        (SMOLLM2_BENCH_JSON,),
    ),
    Claim(
        PERFORMANCE,
        "decode {bdec:.2f}x against LoRA's {bdec_lora:.2f}x;\nmemory {bmem:.2f}x for the paper's size (its AdamW "
        "state dominates a small step) against {bmem1:.2f}x at 1%",
        _smollm2_bench,
        (SMOLLM2_BENCH_JSON,),
    ),
    Claim(PERFORMANCE, "1-minute load average {before:.1f} before and {after:.1f} after", _cli_load, (CLI_JSON,)),
    Claim(
        "docs/getting-started.md",
        "the paper's default on Llama-3-8B is {big:,} ({big_pct:.1f}%, {big_gb:.1f} GB); "
        "`PreProjConfig(expansion=1/16, skip_rank=16)` is {small:,} ({small_pct:.2f}%, {small_gb:.2f} GB)",
        _estimates,
        ("mmpreproj.estimate (computed)",),
    ),
    Claim(
        "README.md",
        "on SmolLM2-135M it trains {one:.2f}M weights, where `PreProjConfig()` trains {paper:.1f}M",
        _smollm2_sizes,
        ("docs/evidence/smollm2-135m/study.json",),
    ),
    Claim(
        "docs/hosts.md",
        "the one call injects {ok} (each one\nreturning the base's logits at identity init, and other logits once "
        "perturbed) and refuses {refused} with the reason;\ntransformers itself cannot build or run the tiny config "
        "of {cannot} (`bench/one_call_sweep.py`, {total} classes",
        _one_call_sweep,
        ("bench/results/one_call_sweep.jsonl",),
    ),
    Claim(
        "README.md",
        "over all {total} causal-LM classes of transformers, {ok} inject exactly and {refused} are\nrefused with the "
        "reason",
        _one_call_sweep,
        ("bench/results/one_call_sweep.jsonl",),
    ),
    Claim(
        "docs/peft-guide.md",
        "--repeats {repeats} --json bench/results/quant.json`; 1-minute load average "
        "{before:.1f}\nbefore, {after:.1f} after, 2 CPUs)",
        _quant_load,
        ("bench/results/quant.json",),
    ),
    Claim(
        "docs/peft-guide.md",
        "line\nPPL on 100 test rows: float32 base {float:.1f}, int8 base {int8:.1f}, after training {after:.1f}; the "
        "reload is {exact}",
        _quantized_recipe,
        ("docs/evidence/quantized-base/metrics.json",),
    ),
    Claim("docs/cli.md", "at most {share:.2f} of the time `import torch` alone takes", _cli_share, (CLI_JSON,)),
)
