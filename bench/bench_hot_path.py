"""The hot path, side by side in one run: base, ours, the authors' code and LoRA (issue 45, item 8).

    python bench/bench_hot_path.py [--shape 160m|410m] [--tiny] [--dtypes float32,bfloat16] [--prompt 128]
                                   [--new 16] [--seq 512] [--repeats 7] [--lora-rank R] [--json out.json]

Random weights, CPU, no downloads, one process. Four variants, each from a deep copy of one GPT-NeoX of a Pythia
shape (`--tiny`: 2 layers, width 64, vocab 1024, a check that the script runs, in seconds):
- "base": the model alone;
- "ours": `mmpreproj.inject(base)` with the default `PreProjConfig()` (the paper's modules; on a bf16 host they
  compute in bf16 from kept casts of their fp32 weights, `compute_dtype="input"`);
- "authors": the paper's modules as plain forward hooks (`bench_tuner.add_authors_modules`, the whole model in the
  host's dtype), weights copied from "ours";
- "lora": peft LoRA on `query_key_value` and `dense` at the paper's rank (r=480 at 160m: `paper_lora_rank`, alpha
  2r, dropout 0), the whole model cast to the host's dtype; its trainable count is printed beside ours.
Before anything is timed, on each host dtype, ours and authors must give the same logits, and LoRA (B = 0 at
init) the base's. Measured round-robin (decode: in one order on even repeats, the reverse on odd
ones), so load drift on a shared machine hits every variant alike:
1. decode per generated token, batch 1 with the KV cache, per host dtype: each repeat prefills `--prompt` tokens
   (not timed), then times `--new` greedy single-token steps, the variants taking turns step by step;
2. one frozen-probe training step (fp32, forward + backward + AdamW on the trainable weights, base frozen) of
   ours, authors and lora at `--seq` tokens, batch 1 (base trains nothing: it has no step);
3. what our machinery adds per forward: ours minus authors, per decode step and per training step, and the
   Python module hooks left on each variant after its first forward (ours drops its seam checks there).
Ratios are the median (min-max) over repeats of the per-repeat ratio; `weight_bytes_ratio` is ours over base in
weight bytes one decode step reads (`bench_decode.weight_bytes`), the limit of a memory-bound step.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import peft
import torch
import transformers as tf
from bench_decode import DTYPES, next_token, weight_bytes
from bench_tuner import add_authors_modules, copy_into_authors
from common import PYTHIA_SHAPES, interleaved_times, machine, write_json
from torch import nn

import mmpreproj
from mmpreproj.train.methods import count_trainable, paper_lora_rank

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256)
VARIANTS = ("base", "ours", "authors", "lora")
TRAINED = ("ours", "authors", "lora")
DECODE_RATIOS = (("ours", "base"), ("authors", "base"), ("lora", "base"), ("ours", "authors"))
TRAIN_RATIOS = (("ours", "authors"), ("lora", "authors"))
LORA_TARGETS = ["query_key_value", "dense"]
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 2e-2}  # atol = rtol on the logits, per host dtype


def build_base(shape: str) -> tf.GPTNeoXForCausalLM:
    """A random-weight fp32 GPT-NeoX of a Pythia `shape` (or "tiny"), eval mode."""
    torch.manual_seed(0)
    dims, vocab = (TINY, 1024) if shape == "tiny" else (PYTHIA_SHAPES[shape], 50304)
    return tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(vocab_size=vocab, rotary_pct=0.25, **dims)).eval()


def copy_weights(ours: nn.Module, into: nn.Module) -> None:
    """Copy the injected weights of `ours` into the injected model `into` (its wrappers in the same order)."""
    for mine, w in zip(mmpreproj.injected_modules(into), mmpreproj.injected_modules(ours), strict=True):
        for part, src in zip(mine.slots(), w.slots(), strict=True):
            part.load_state_dict(src.state_dict())


def with_authors(host: nn.Module, ours: nn.Module) -> nn.Module:
    """A deep copy of `host` with the authors' hooked modules (in `host`'s dtype), weights copied from `ours`.
    Built afresh per dtype: the hooks are closures over the modules, which a deep copy of the model would share."""
    model = copy.deepcopy(host)
    add_authors_modules(model)
    model.to(next(host.parameters()).dtype)
    copy_into_authors(model, ours)
    return model


def build_variants(base: nn.Module, lora_rank: int | None = None) -> dict[str, nn.Module]:
    """The four fp32 variants of `base` (eval mode); LoRA at `lora_rank` (None: the paper's rank rule)."""
    cfg = base.config
    r = lora_rank or paper_lora_rank(cfg.hidden_size, cfg.num_hidden_layers)
    lora = peft.LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=LORA_TARGETS, bias="none")
    ours = mmpreproj.inject(copy.deepcopy(base), mmpreproj.PreProjConfig())
    models = {
        "base": base,
        "ours": ours,
        "authors": with_authors(base, ours),
        "lora": peft.get_peft_model(copy.deepcopy(base), lora),
    }
    return {k: m.eval() for k, m in models.items()}


def cast_variants(models: dict[str, nn.Module], dtype: torch.dtype) -> dict[str, nn.Module]:
    """The variants on a `dtype` host: base, authors and lora cast whole; ours injected into the cast base with
    the fp32 weights of `models["ours"]` (the default config computes in the host's dtype)."""
    if dtype == torch.float32:
        return models
    base = copy.deepcopy(models["base"]).to(dtype)
    ours = mmpreproj.inject(copy.deepcopy(base), mmpreproj.PreProjConfig())
    copy_weights(models["ours"], ours)
    out = {"base": base, "ours": ours, "authors": with_authors(base, ours)}
    out["lora"] = copy.deepcopy(models["lora"]).to(dtype)
    return {k: m.eval() for k, m in out.items()}


def check_same_outputs(models: dict[str, nn.Module], ids: torch.Tensor) -> None:
    """ours and authors give the same logits (the hooks compute what the wrapper computes), and LoRA at init
    (B = 0) the base's: else the timings would compare different computations."""
    with torch.no_grad():
        logits = {k: models[k](ids).logits for k in VARIANTS}
    tol = TOLERANCE[logits["base"].dtype]
    torch.testing.assert_close(logits["ours"], logits["authors"], atol=tol, rtol=tol)
    torch.testing.assert_close(logits["lora"], logits["base"], atol=tol, rtol=tol)


def check_ids(model: nn.Module) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(3))


def python_hooks(model: nn.Module) -> int:
    """Forward hooks and pre-hooks on `model`'s modules. Reads torch internals (`Module._forward_hooks`,
    `_forward_pre_hooks`): torch has no public way to list a module's hooks."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def decode_round(
    models: dict[str, nn.Module], prompt: torch.Tensor, steps: int
) -> tuple[dict[str, float], dict[str, list[int]]]:
    """Seconds each model spends on `steps` greedy single-token steps after a prefill of `prompt` (not timed),
    the models taking turns step by step; and the tokens each generated (the prefill's next token first)."""
    state, tokens = {}, {}
    with torch.no_grad():
        for k, m in models.items():
            out = m(prompt, use_cache=True)
            state[k] = (out.cache, next_token(out, prompt))
            tokens[k] = [state[k][1].item()]
        spent = dict.fromkeys(models, 0.0)
        for _ in range(steps):
            for k, m in models.items():
                cache, tok = state[k]
                t0 = time.perf_counter()
                out = m(tok, cache=cache, use_cache=True)
                tok = next_token(out, tok)
                spent[k] += time.perf_counter() - t0
                state[k] = (out.cache, tok)
                tokens[k].append(tok.item())
    return spent, tokens


def decode_times(
    models: dict[str, nn.Module], prompt: torch.Tensor, steps: int, repeats: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Seconds per generated token of each model in each of `repeats` rounds (after `warmup` untimed rounds). The
    models take turns in their order on even rounds and in the reverse order on odd ones, so no model always follows
    the same one (whether a step costs more after some others' is `bench/hot_path_order.py`'s question)."""
    for _ in range(warmup):
        decode_round(models, prompt, steps)
    times: dict[str, list[float]] = {k: [] for k in models}
    for i in range(repeats):
        order = list(models) if i % 2 == 0 else list(reversed(models))
        for k, t in decode_round({k: models[k] for k in order}, prompt, steps)[0].items():
            times[k].append(t / steps)
    return times


def train_step(model: nn.Module, ids: torch.Tensor):
    """One frozen-probe step of `model`: forward + backward + AdamW on its trainable weights."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

    def step():
        model(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def spread(seconds: list[float]) -> dict[str, float]:
    """Median and range of `seconds`, in ms."""
    return {"ms": 1e3 * statistics.median(seconds), "ms_min": 1e3 * min(seconds), "ms_max": 1e3 * max(seconds)}


def ratios(times: dict[str, list[float]], pairs) -> dict[str, dict[str, float]]:
    """{"a/b": the median (min-max) over repeats of a's time over b's in the same repeat} for each pair (a, b)."""
    out = {}
    for a, b in pairs:
        r = [x / y for x, y in zip(times[a], times[b])]
        out[f"{a}/{b}"] = {"ratio": statistics.median(r), "ratio_min": min(r), "ratio_max": max(r)}
    return out


def overhead_ms(times: dict[str, list[float]]) -> float:
    """What ours adds over the authors' code: the median over repeats of (ours - authors), in ms."""
    return 1e3 * statistics.median(a - b for a, b in zip(times["ours"], times["authors"]))


def measure_decode(models: dict[str, nn.Module], dtype: str, args: argparse.Namespace) -> dict:
    """Decode per token of the four variants on a `dtype` host, and the weight-bytes ratio."""
    hosted = cast_variants(models, DTYPES[dtype])
    check_same_outputs(hosted, check_ids(hosted["base"]))
    vocab = models["base"].config.vocab_size
    prompt = torch.randint(0, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    times = decode_times(hosted, prompt, args.new, args.repeats)
    limit = weight_bytes(hosted["ours"]) / weight_bytes(hosted["base"])
    rs = ratios(times, DECODE_RATIOS)
    return {
        "weight_bytes_ratio": limit,
        "per_token": {k: spread(v) for k, v in times.items()},
        "ratios": rs,
        "ours/base_over_weight_bytes_ratio": rs["ours/base"]["ratio"] / limit,  # the bar: at most 1.05
        "ours_minus_authors_ms": overhead_ms(times),
        "ours_minus_authors_us_per_layer": 1e3 * overhead_ms(times) / models["base"].config.num_hidden_layers,
        "python_hooks": {k: python_hooks(m) for k, m in hosted.items()},
    }


def measure_train(models: dict[str, nn.Module], args: argparse.Namespace) -> dict:
    """One fp32 frozen-probe training step of ours, authors and lora, round-robin."""
    vocab = models["base"].config.vocab_size
    ids = torch.randint(0, vocab, (1, args.seq), generator=torch.Generator().manual_seed(2))
    for k in TRAINED:
        models[k].train()
    times = interleaved_times({k: train_step(models[k], ids) for k in TRAINED}, repeats=args.repeats)
    for k in TRAINED:
        models[k].eval()
    return {
        "step": {k: spread(v) for k, v in times.items()},
        "ratios": ratios(times, TRAIN_RATIOS),
        "ours_minus_authors_ms": overhead_ms(times),
    }


def measure(args: argparse.Namespace) -> dict:
    """Every measurement of one run (the JSON `--json` writes)."""
    shape = "tiny" if args.tiny else args.shape
    result = {"machine": machine(), "load_avg_before": [round(x, 2) for x in os.getloadavg()], "shape": shape}
    models = build_variants(build_base(shape), args.lora_rank)
    hooks_before = python_hooks(models["ours"])
    check_same_outputs(models, check_ids(models["base"]))
    cfg = models["base"].config
    result |= {
        "width": cfg.hidden_size,
        "layers": cfg.num_hidden_layers,
        "dtypes": args.dtypes,
        "prompt": args.prompt,
        "new_tokens": args.new,
        "seq": args.seq,
        "batch": 1,
        "repeats": args.repeats,
        "lora_rank": models["lora"].peft_config["default"].r,
        "trainable": {k: count_trainable(models[k]) for k in TRAINED},
        "python_hooks": {"ours_before_first_forward": hooks_before, **{k: python_hooks(m) for k, m in models.items()}},
        "decode": {d: measure_decode(models, d, args) for d in args.dtypes},
        "train": measure_train(models, args),
    }
    result["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    return result


def cell(r: dict, key: str = "ms") -> str:
    """'median (min-max)' of a time in ms (2 decimals) or of a ratio (3)."""
    n = 2 if key == "ms" else 3
    return f"{r[key]:.{n}f} ({r[f'{key}_min']:.{n}f}-{r[f'{key}_max']:.{n}f})"


def print_table(res: dict) -> None:
    t, h = res["trainable"], res["python_hooks"]
    print(
        f"hot path, {res['shape']} shape (width {res['width']}, {res['layers']} layers), batch 1, decode "
        f"{res['new_tokens']} tokens after {res['prompt']}, train seq {res['seq']}, {res['repeats']} repeats, "
        f"{res['machine']}, load avg {res['load_avg_before']} -> {res['load_avg_after']}"
    )
    print(
        f"trainable: ours {t['ours']:,}, authors {t['authors']:,}, lora r={res['lora_rank']} {t['lora']:,} "
        f"(lora/ours {t['lora'] / t['ours']:.3f})"
    )
    print(
        f"python hooks after the first forward: base {h['base']}, ours {h['ours']} "
        f"({h['ours_before_first_forward']} before it: the seam checks), authors {h['authors']}, lora {h['lora']}"
    )
    pairs = [f"{a}/{b}" for a, b in DECODE_RATIOS]
    print(f"| median (min-max) | {' ms | '.join(VARIANTS)} ms | {' | '.join(pairs)} | bytes ratio | ours-authors ms |")
    print("|---" * (len(VARIANTS) + len(pairs) + 3) + "|")
    for dtype, row in res["decode"].items():
        times = " | ".join(cell(row["per_token"][k]) for k in VARIANTS)
        rs = " | ".join(cell(row["ratios"][p], "ratio") for p in pairs)
        print(
            f"| decode / token, {dtype} | {times} | {rs} | {row['weight_bytes_ratio']:.3f} | "
            f"{row['ours_minus_authors_ms']:+.3f} |"
        )
    tr = res["train"]
    times = " | ".join(cell(tr["step"][k]) if k in tr["step"] else "-" for k in VARIANTS)
    rs = " | ".join(cell(tr["ratios"][p], "ratio") if p in tr["ratios"] else "-" for p in pairs)
    print(f"| train step, float32 | {times} | {rs} | - | {tr['ours_minus_authors_ms']:+.3f} |")
    print(f"train step lora/authors: {cell(tr['ratios']['lora/authors'], 'ratio')}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(PYTHIA_SHAPES), default="160m")
    ap.add_argument("--tiny", action="store_true", help="2 layers, width 64, vocab 1024: a check in seconds")
    ap.add_argument("--dtypes", default="float32,bfloat16", help=f"comma-separated host dtypes from {list(DTYPES)}")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens prefilled before decoding (not timed)")
    ap.add_argument("--new", type=int, default=16, help="timed greedy decode steps per repeat")
    ap.add_argument("--seq", type=int, default=512, help="tokens of the training step (batch 1)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--lora-rank", type=int, default=None, help="default: the paper's rule (480 at 160m)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    args.dtypes = args.dtypes.split(",")
    for d in args.dtypes:
        if d not in DTYPES:
            ap.error(f"--dtypes: {d!r} is not one of {list(DTYPES)}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    res = measure(args)
    print_table(res)
    write_json(args.json, res)
    return res


if __name__ == "__main__":
    main()
