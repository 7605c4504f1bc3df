"""Batch-1 decode time per generated token, injected over base, on fp32 and bf16 hosts (CPU, random weights).

    python bench/bench_decode.py [--shape 160m|410m|llama1b] [--layers N] [--dtypes float32,bfloat16]
                                 [--prompt 128] [--new 16] [--repeats 7] [--compile] [--json out.json]

Each repeat prefills `--prompt` tokens (not timed) and times `--new` greedy single-token steps with the KV
cache; the variants take turns step by step, so load changes on a shared machine hit them alike. The ratio
is the median over repeats of (variant / base) in that repeat, with its range (min-max).
Variants per host dtype: `base`, `injected` (default `PreProjConfig`: the modules compute in the host's
dtype from kept weight casts) and, on a bf16 host, `bf16 modules` (the injected weights themselves cast to
bf16, the paper authors' setting, run by our modules). With `--compile`, `torch.compile(model)` of the base
and the injected model run beside eager (compile time reported apart). `weight_bytes_ratio` is the limit for
a memory-bound step: bytes of the weights one step reads (the blocks, the final norm and the LM head; one
embedding row), injected over base. `llama1b` is the Llama-3.2-1B shape with `--layers` of its 16 decoder
layers (default 2) and times the decoder body without the LM head (`--no-head`, per-layer representative:
the 128256 x 2048 head alone outweighs 4 layers).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch
import torch.nn.functional as F
import transformers as tf
from common import PYTHIA_SHAPES, machine, write_json

import mmpreproj

LLAMA_1B = dict(hidden_size=2048, num_attention_heads=32, num_key_value_heads=8, intermediate_size=8192,
                vocab_size=128256, head_dim=64, tie_word_embeddings=True, rope_theta=500000.0,
                max_position_embeddings=4096, num_hidden_layers=16)  # fmt: skip
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build_base(shape: str, layers: int | None, dtype: torch.dtype) -> torch.nn.Module:
    """A random-weight host of `shape` in `dtype`, eval mode (`layers` overrides the depth)."""
    torch.manual_seed(0)
    if shape == "llama1b":
        cfg = tf.LlamaConfig(**{**LLAMA_1B, "num_hidden_layers": layers or 2})
        model = tf.LlamaForCausalLM(cfg)
    else:
        dims = {**PYTHIA_SHAPES[shape], **({"num_hidden_layers": layers} if layers else {})}
        model = tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(vocab_size=50304, rotary_pct=0.25, **dims))
    return model.to(dtype).eval()


def plain_linear(model: torch.nn.Module) -> torch.nn.Module:
    """The injected modules of `model` run every inference matmul as `F.linear` on the kept cast (the code
    before the decode layouts of `WeightCasts.linear`), for a before/after side by side in one process."""
    for w in mmpreproj.injected_modules(model):
        for part in w.slots():
            casts = part.casts
            casts.linear = lambda x, weight, casts=casts: F.linear(x, casts(weight, x.dtype))
    return model


def variants(base: torch.nn.Module, before: bool = False) -> dict[str, torch.nn.Module]:
    out = {"base": base, "injected": mmpreproj.inject(copy.deepcopy(base))}
    if before:
        out["injected, F.linear (before)"] = plain_linear(mmpreproj.inject(copy.deepcopy(base)))
    if base.dtype != torch.float32:
        authors = mmpreproj.inject(copy.deepcopy(base))
        for w in mmpreproj.injected_modules(authors):
            for part in w.slots():
                part.to(base.dtype)
        out["bf16 modules"] = authors
    return out


def weight_bytes(model: torch.nn.Module, head: bool = True) -> int:
    """Bytes of the weights one decode step reads: every parameter but the input embedding (one row of it);
    a tied LM head is counted once, as the head; without `head`, the decoder body only. Injected fp32
    weights computing in a bf16 host's dtype count as their bf16 casts (what the step reads)."""
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    counted = out is not None and head and out.weight is emb  # a tied head reads the whole table
    total = 0 if counted else emb[0].numel() * emb.element_size()
    skip = {id(emb)} if not counted else set()
    if out is not None and not head:
        skip.add(id(out.weight))
    dtype = emb.dtype
    for p in model.parameters():
        if id(p) not in skip:
            total += p.numel() * p.element_size()
    for w in mmpreproj.injected_modules(model):
        for part in w.slots():
            for p in part.parameters():
                total -= p.numel() * (p.element_size() - dtype.itemsize)
    return total


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}  # cpu: this thread's CPU time (1 torch thread)


def decode_round(
    models: dict[str, torch.nn.Module], prompt: torch.Tensor, steps: int, clock=time.perf_counter
) -> dict[str, float]:
    """Seconds each model spends on `steps` greedy single-token steps after a prefill of `prompt` (not timed);
    the models take turns step by step, so load changes on a shared machine hit them alike."""
    state = {}
    for k, m in models.items():
        out = m(prompt, use_cache=True)
        state[k] = (out.cache, next_token(out, prompt))
    spent = dict.fromkeys(models, 0.0)
    for _ in range(steps):
        for k, m in models.items():
            cache, tok = state[k]
            t0 = clock()
            out = m(tok, cache=cache, use_cache=True)
            tok = next_token(out, tok)
            spent[k] += clock() - t0
            state[k] = (out.cache, tok)
    return spent


def next_token(out, ids: torch.Tensor) -> torch.Tensor:
    """Greedy next token (1, 1); a decoder body without its LM head (`--no-head`) repeats the last token."""
    logits = getattr(out, "logits", None)
    return logits[:, -1:].argmax(-1) if logits is not None else ids[:, -1:]


def rounds(
    models: dict[str, torch.nn.Module],
    prompt: torch.Tensor,
    steps: int,
    repeats: int,
    warmup: int = 1,
    clock=time.perf_counter,
) -> dict[str, list[float]]:
    """`repeats` timed rounds of `decode_round` (after `warmup` untimed ones): every round's seconds per model."""
    for _ in range(warmup):
        decode_round(models, prompt, steps, clock)
    times: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(repeats):
        for k, t in decode_round(models, prompt, steps, clock).items():
            times[k].append(t)
    return times


def summary(times: dict[str, list[float]], steps: int) -> dict:
    """Per-token ms and the median (min-max) over repeats of the per-repeat ratio to the base."""
    ratios = {k: [t / b for t, b in zip(v, times["base"])] for k, v in times.items()}
    return {k: {"ms_per_token": 1e3 * statistics.median(times[k]) / steps, "ratio": statistics.median(ratios[k]),
                "ratio_min": min(ratios[k]), "ratio_max": max(ratios[k])} for k in times}  # fmt: skip


def run(
    shape: str,
    layers: int | None,
    dtypes: list[str],
    prompt_len: int,
    steps: int,
    repeats: int,
    compiled: bool = False,
    head: bool = True,
    clock: str = "wall",
    before: bool = False,
) -> dict:
    result = {
        "shape": shape,
        "layers": layers,
        "lm_head": head,
        "clock": clock,
        "prompt": prompt_len,
        "new_tokens": steps,
        "repeats": repeats,
        "machine": machine(),
        "load_avg_before": [round(x, 2) for x in os.getloadavg()],
        "hosts": {},
    }
    for name in dtypes:
        base = build_base(shape, layers, DTYPES[name])
        models = variants(base, before)
        if not head:  # the decoder body: per-layer representative (the LM head is a fixed cost beside it)
            models = {k: m.base_model for k, m in models.items()}
        prompt = torch.randint(0, base.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(1))
        row: dict = {"weight_bytes_ratio": weight_bytes(models["injected"], head) / weight_bytes(models["base"], head)}
        if compiled:
            torch._dynamo.reset()  # a fresh compile per host dtype (else the recompile limit drops frames to eager)
            t0 = time.perf_counter()
            for k in ("base", "injected"):
                models[f"{k} compiled"] = c = torch.compile(models[k])
                with torch.no_grad():
                    decode_round({k: c}, prompt, steps)  # compiles the prefill and the growing-cache step
            row["compile_s"] = time.perf_counter() - t0
        with torch.no_grad():
            row["decode"] = summary(rounds(models, prompt, steps, repeats, clock=CLOCKS[clock]), steps)
        result["hosts"][name] = row
        del base, models
    result["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    return result


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=[*sorted(PYTHIA_SHAPES), "llama1b"], default="160m")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's; llama1b: 2)")
    ap.add_argument("--dtypes", default="float32,bfloat16", help=f"comma-separated host dtypes from {list(DTYPES)}")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=16, help="generated (timed) tokens per repeat")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument(
        "--no-head",
        action="store_true",
        help="time the decoder body without the LM head (per layer; the default for llama1b)",
    )
    ap.add_argument(
        "--before",
        action="store_true",
        help="also run the injected modules with plain F.linear "
        "matmuls (the code before the kept decode layouts), side by side",
    )
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(model) beside eager")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall time, or this thread's CPU time (needs --threads 1; robust on an oversubscribed machine)",
    )
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    dtypes = a.dtypes.split(",")
    for d in dtypes:
        if d not in DTYPES:
            ap.error(f"--dtypes: {d!r} is not one of {list(DTYPES)}")
    if a.clock == "cpu" and a.threads != 1:
        ap.error("--clock cpu measures one thread: pass --threads 1")
    if a.threads:
        torch.set_num_threads(a.threads)
    head = not (a.no_head or a.shape == "llama1b")
    res = run(a.shape, a.layers, dtypes, a.prompt, a.new, a.repeats, a.compile, head, a.clock, a.before)
    layers = f", {a.layers or 2} of 16 layers" if a.shape == "llama1b" else ""
    layers += "" if head else ", decoder body (no LM head)"
    print(
        f"decode, {a.shape} shape{layers}, batch 1, {a.new} tokens after {a.prompt}, {a.clock} clock, "
        f"{res['machine']}, "
        f"load avg {res['load_avg_before']} -> {res['load_avg_after']}"
    )
    print("| host | variant | ms / token | over base, median (min-max) | weight-bytes ratio |")
    print("|---|---|---|---|---|")
    for host, row in res["hosts"].items():
        for k, r in row["decode"].items():
            print(
                f"| {host} | {k} | {r['ms_per_token']:.1f} | {r['ratio']:.3f} ({r['ratio_min']:.3f}-"
                f"{r['ratio_max']:.3f}) | {row['weight_bytes_ratio']:.3f} |"
            )
    write_json(a.json, res)
    return res


if __name__ == "__main__":
    main()
