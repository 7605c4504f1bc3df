"""Every ratio the project tracks, measured side by side in one run; writes bench/results/latest.{json,md}.

    python bench/run_all.py [--quick] [--runs 3]

Runs each bench script in its own process (same machine, one after another) with `--json`, then joins the
figures into one markdown table (with `--runs N`, the whole set N times: each cell is the median, with the range): \
inference overhead vs FLOP ratio (GPT-NeoX 160M/410M shapes, ViT-B/16),
a bf16 host's forward and decode with fp32 / host-dtype / bf16 modules and its training memory, \
KV-cache bytes ratio, training tokens/s vs peft LoRA at the paper's rank,
RoPE apply vs reference implementations, compiled vs eager, the Llama-3.2-1B and Qwen2-VL-2B-vision shapes'
forward overhead, the KV-cache bytes ratio of every decoder row, and batch-1 decode per token on fp32 and bf16
hosts (160M with its LM head; the Llama-3.2-1B decoder body per layer) beside the weight-bytes ratio. \
Random weights; no downloads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _run(script: str, args: list[str]) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, str(HERE / script), *args, "--json", out]
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, cwd=HERE)
    data = json.loads(Path(out).read_text())
    os.unlink(out)
    return data


def rows(res: dict) -> list[tuple[str, float, str]]:
    """(what, measured value, reference) for every line of the table, from one run's results."""
    out = []
    for key, name in (("neox160", "GPT-NeoX 160M"), ("neox410", "GPT-NeoX 410M")):
        r = res[key]
        out.append(
            (
                f"{name} forward, injected / base (seq {r['seq']})",
                r["latency_ratio"],
                f"FLOP ratio {r['flop_ratio']:.3f}",
            )
        )
        out.append((f"{name} KV-cache bytes, injected / base", r["kv_bytes_ratio"], "1.000"))
    d = res["dtype"]
    for k in ("fp32 modules", "host dtype", "bf16 modules"):
        out.append(
            (
                f"bf16 GPT-NeoX 160M forward, {k} / base (seq {d['seq']})",
                d["forward"][k]["ratio"],
                f"FLOP ratio {d['flop_ratio']:.3f}",
            )
        )
        out.append(
            (
                f"bf16 GPT-NeoX 160M decode ({d['decode_steps']} steps), {k} / base",
                d["decode"][k]["ratio"],
                f"FLOP ratio {d['flop_ratio']:.3f}",
            )
        )
    for k, r in d.get("train_memory", {}).items():
        out.append(
            (
                f"160M frozen-probe activations over the base, {k} (bytes/token/layer)",
                r["activation_bytes_per_token_layer"],
                f"+{r['per_step_saved_mb']:.0f} MB casts, {r['grads_adam_mb']:.0f} MB grads+AdamW per step",
            )
        )
    v = res["vit"]
    for k in ("preproj_skip", "rope2d", "rope2d_preproj"):
        out.append((f"ViT-B/16 forward, {k} / base", v["latency_ratio"][k], f"FLOP ratio {v['flop_ratio'][k]:.3f}"))
    t = res["train"]["rows"]
    for k in ("preproj_skip", "lora"):
        out.append(
            (
                f"160M frozen-probe step tokens/s, {k} / base fwd-bwd",
                t[k]["speed_vs_base"],
                f"memory {t[k]['memory_vs_base']:.2f}x",
            )
        )
    out.append(
        (
            f"160M training tokens/s, preproj_skip / LoRA r={res['train']['lora_r']}",
            t["preproj_skip"]["tokens_per_s"] / t["lora"]["tokens_per_s"],
            f"params {t['preproj_skip']['trainable_params'] / t['lora']['trainable_params']:.3f}",
        )
    )
    for r in res["rope"]["rows"]:
        out.append((f"{r['case']} (N={r['N']}) apply time", r["ratio"], "1.00 = peer"))
    for r in res["compile"]["rows"]:
        out.append((f"{r['model']}: compiled / eager", r["compiled_vs_eager"], f"compile {r['compile_s']:.0f} s"))
    return out + host_rows(res) + decode_rows(res)


def decode_rows(res: dict) -> list[tuple[str, float, str]]:
    """Batch-1 decode per token over the base (bench_decode.py): 160M with its LM head, Llama-3.2-1B body per layer."""
    out = []
    for key, what in (("decode160", "GPT-NeoX 160M"), ("decode_llama", "Llama-3.2-1B shape, decoder body")):
        d = res[key]
        for host, row in d["hosts"].items():
            for k, r in row["decode"].items():
                if k != "base":
                    out.append((f"{what} decode per token ({host} host, {d['new_tokens']} after {d['prompt']}), "
                                f"{k} / base",
                                r["ratio"], f"weight bytes {row['weight_bytes_ratio']:.3f}; {d['repeats']} repeats "
                                f"{r['ratio_min']:.3f}-{r['ratio_max']:.3f}"))  # fmt: skip
    return out


def host_rows(res: dict) -> list[tuple[str, float, str]]:
    """The Llama-3.2-1B and Qwen2-VL-2B vision shapes (bench_llama_qwen2vl.py) and every decoder row's KV cache."""
    ll, vi, kv = res["hosts"]["llama"], res["hosts"]["qwen2vl_vision"], res["kv_rows"]["rows"]
    worst = max(kv, key=lambda r: abs(r["ratio"] - 1))
    return [
        (f"Llama-3.2-1B shape forward, injected / base ({ll['layers']} of {ll['of_layers']} layers, seq {ll['seq']})",
         ll["latency_ratio"],
         f"FLOP ratio {ll['flop_ratio']:.3f} (whole model + LM head {ll['full_model_flop_ratio']:.3f})"),
        (f"Qwen2-VL-2B vision tower forward, injected / base ({vi['layers']} of {vi['of_layers']} blocks, "
         f"{vi['patches']} patches)", vi["latency_ratio"], f"FLOP ratio {vi['flop_ratio']:.3f}"),
        (f"KV-cache bytes, injected / base, every decoder row ({len(kv)} rows; farthest from 1: {worst['row']})",
         worst["ratio"], "1.000"),
    ]  # fmt: skip


def run_once(quick: bool) -> dict:
    rep = ["--repeats", "2" if quick else "5"]
    seq = "128" if quick else "512"
    return {
        "neox160": _run("bench_inject_neox.py", ["--shape", "160m", "--seq", seq, *rep]),
        "neox410": _run("bench_inject_neox.py", ["--shape", "410m", "--seq", seq, *rep]),
        "dtype": _run("bench_dtype.py", ["--seq", seq, "--decode", "4" if quick else "16", *rep]),
        "vit": _run("bench_vit.py", ["--batch", "2" if quick else "8", *rep]),
        "train": _run("bench_train.py", ["--shape", "160m", "--seq", "128" if quick else "256", *rep]),
        "rope": _run("bench_rope.py", ["--runs", "5" if quick else "21"]),
        "compile": _run("bench_compile.py", ["--seq", "64" if quick else "256", *rep]),
        "hosts": _run(
            "bench_llama_qwen2vl.py",
            [
                "--llama-layers",
                "1",
                "--seq",
                seq,
                "--vision-layers",
                "1" if quick else "2",
                "--image",
                "224" if quick else "448",
                *rep,
            ],
        ),  # fmt: skip
        "kv_rows": _run("bench_kv_rows.py", []),
        # decode: one torch thread, its CPU time (robust to a shared machine's preemption), variants step by step
        "decode160": _run(
            "bench_decode.py",
            ["--shape", "160m", "--new", "4" if quick else "16", *rep, "--threads", "1", "--clock", "cpu"],
        ),
        "decode_llama": _run(
            "bench_decode.py",
            [
                "--shape",
                "llama1b",
                "--layers",
                "1" if quick else "2",
                "--new",
                "4" if quick else "16",
                *rep,
                "--threads",
                "1",
                "--clock",
                "cpu",
            ],
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter sequences and fewer repeats (smoke run)")
    ap.add_argument("--runs", type=int, default=1, help="run the whole set this many times; report median and range")
    ap.add_argument("--out", default=str(HERE / "results"))
    a = ap.parse_args()
    t0, loads, runs = time.time(), [os.getloadavg()[0]], []
    for _ in range(a.runs):
        runs.append(run_once(a.quick))
        loads.append(os.getloadavg()[0])
    table: dict[str, list] = {}
    for res in runs:
        for what, value, ref in rows(res):
            table.setdefault(what, [[], ref])[0].append(value)
    md = [
        f"Machine: {runs[0]['neox160']['machine']}; {a.runs} run(s) of the whole set, {time.time() - t0:.0f} s "
        f"in all; 1-min load average {', '.join(f'{x:.1f}' for x in loads)} (start, after each run); ratios "
        "measured side by side in one process each; median (min-max) over the runs.",
        "",
        "| what | measured | reference |",
        "|---|---|---|",
    ]
    for what, (values, ref) in table.items():
        fmt = ".0f" if "bytes/token" in what else ".3f"
        spread = f" ({min(values):{fmt}}-{max(values):{fmt}})" if len(values) > 1 else ""
        md.append(f"| {what} | {statistics.median(values):{fmt}}{spread} | {ref} |")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps({"load_avg_1min": loads, "runs": runs}, indent=2) + "\n")
    (out / "latest.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
