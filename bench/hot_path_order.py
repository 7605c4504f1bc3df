"""Does a decode step's cost depend on which model ran the step before? `bench_hot_path.py`'s variants take turns
step by step; here the same four (Pythia-160M shape, random weights) take turns in two orders, each twice, and the
ours / authors ratio is read per order (median over `--repeats` rounds of 16 tokens after a 128-token prompt).

    python bench/hot_path_order.py [--repeats 5] [--json bench/results/hot_path/order.json]

Its run of 2026-12-07 (two threads, `bench/results/hot_path/order.json`): ours right after the base 1.016 and
1.008, right after the authors' 1.010 and 1.008: within the rounds' spread, no order effect shown; the bench
alternates the order anyway (`bench_hot_path.decode_times`), so none could build up.
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
from bench_hot_path import build_base, build_variants, decode_times
from common import machine, write_json

ORDERS = (("base", "ours", "authors", "lora"), ("base", "authors", "ours", "lora"))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    res = {"machine": machine(), "load_avg_before": [round(x, 2) for x in os.getloadavg()], "runs": []}
    variants = build_variants(build_base("160m"))
    prompt = torch.randint(0, 50304, (1, 128), generator=torch.Generator().manual_seed(1))
    for order in ORDERS + ORDERS:
        models = {k: variants[k] for k in order}
        # one order for every round here (the bench itself alternates): `decode_times` reverses odd rounds
        times = {k: [] for k in order}
        for _ in range(args.repeats):
            for k, t in decode_times(models, prompt, 16, 1, warmup=0).items():
                times[k].extend(t)
        ratio = statistics.median(a / b for a, b in zip(times["ours"], times["authors"]))
        res["runs"].append({"order": list(order), "ours/authors": ratio})
        print(f"{' -> '.join(order)}: ours/authors {ratio:.4f}", flush=True)
    res["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    write_json(args.json, res)
    return res


if __name__ == "__main__":
    main()
