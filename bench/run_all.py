"""Every ratio the project tracks, measured side by side in one run; writes bench/results/latest.{json,md}.

    python bench/run_all.py [--quick]

Runs each bench script in its own process (same machine, one after another) with `--json`, then joins the
figures into one markdown table: inference overhead vs FLOP ratio (GPT-NeoX 160M/410M shapes, ViT-B/16),
KV-cache bytes ratio, fused vs unfused Q/K/V + skip, training tokens/s vs peft LoRA at the paper's rank,
RoPE apply vs reference implementations, compiled vs eager. Random weights; no downloads.
"""

from __future__ import annotations

import argparse
import json
import os
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter sequences and fewer repeats (smoke run)")
    ap.add_argument("--out", default=str(HERE / "results"))
    a = ap.parse_args()
    rep = ["--repeats", "2" if a.quick else "5"]
    seq = "128" if a.quick else "512"
    t0 = time.time()
    res = {
        "neox160": _run("bench_inject_neox.py", ["--shape", "160m", "--seq", seq, *rep]),
        "neox410": _run("bench_inject_neox.py", ["--shape", "410m", "--seq", seq, *rep]),
        "vit": _run("bench_vit.py", ["--batch", "2" if a.quick else "8", *rep]),
        "train": _run("bench_train.py", ["--shape", "160m", "--seq", "128" if a.quick else "256", *rep]),
        "rope": _run("bench_rope.py", ["--runs", "5" if a.quick else "21"]),
        "compile": _run("bench_compile.py", ["--seq", "64" if a.quick else "256", *rep]),
    }
    md = [f"Machine: {res['neox160']['machine']}; load average at the end {os.getloadavg()[0]:.1f}; "
          f"{time.time() - t0:.0f} s in all; ratios measured side by side in one process each.", "",
          "| what | measured ratio | reference |", "|---|---|---|"]
    for key, name in (("neox160", "GPT-NeoX 160M"), ("neox410", "GPT-NeoX 410M")):
        r = res[key]
        md.append(f"| {name} forward, injected / base (seq {r['seq']}) | {r['latency_ratio']:.3f} | FLOP ratio {r['flop_ratio']:.3f} |")
        md.append(f"| {name} forward, fused Q/K/V+skip / base | {r['fused_latency_ratio']:.3f} | FLOP ratio {r['flop_ratio']:.3f} |")
        md.append(f"| {name} KV-cache bytes, injected / base | {r['kv_bytes_ratio']:.3f} | 1.000 |")
    v = res["vit"]
    for k in ("preproj_skip", "rope2d", "rope2d_preproj"):
        md.append(f"| ViT-B/16 forward, {k} / base | {v['latency_ratio'][k]:.3f} | FLOP ratio {v['flop_ratio'][k]:.3f} |")
    t = res["train"]["rows"]
    for k in ("preproj_skip", "lora"):
        md.append(f"| 160M frozen-probe step tokens/s, {k} / base fwd-bwd | {t[k]['speed_vs_base']:.3f} | "
                  f"memory {t[k]['memory_vs_base']:.2f}x |")
    md.append(f"| 160M training tokens/s, preproj_skip / LoRA r={res['train']['lora_r']} | "
              f"{t['preproj_skip']['tokens_per_s'] / t['lora']['tokens_per_s']:.3f} | "
              f"params {t['preproj_skip']['trainable_params'] / t['lora']['trainable_params']:.3f} |")
    for r in res["rope"]["rows"]:
        md.append(f"| {r['case']} (N={r['N']}) apply time | {r['ratio']:.2f} | 1.00 = peer |")
    for r in res["compile"]["rows"]:
        md.append(f"| {r['model']}: compiled / eager | {r['compiled_vs_eager']:.3f} | compile {r['compile_s']:.0f} s |")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / "latest.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
