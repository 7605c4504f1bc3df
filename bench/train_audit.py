"""Audit: the training path (`mmpreproj.train`) against its docs, beside references we did not write.

Run:  OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONPATH=. python bench/train_audit.py [--only SUB]

Written by an independent audit from README.md, docs/getting-started.md, docs/cli.md, docs/api.md, docs/limits.md,
docs/peft-guide.md, docs/troubleshooting.md and the public docstrings of `mmpreproj.train` (`TrainConfig`, `train`,
`get_preset`, `RunResult`, `pack_lines`, ...) alone, not from the code's intent. Everything runs in this process on
CPU, offline, on the shipped `assets/mini-pythia` (GPT-NeoX, 4 blocks, d=256) and `assets/data`, a few optimizer
steps per run, in temporary folders. It checks:
  (a) config: the presets and defaults the docs state, and the refusals of bad fields (one error naming the field);
  (b) schedule: the LR logged per step against the docstring's formula (warmup from lr/(W+1), cosine to
      lr*min_lr_ratio), against transformers' `get_cosine_schedule_with_warmup` /
      `get_cosine_with_min_lr_schedule_with_warmup` / `get_constant_schedule_with_warmup` after warmup;
  (c) optimizer: a hand-written PyTorch loop (torch.optim.AdamW with the documented betas/eps/weight decay,
      `clip_grad_norm_`, the documented schedule) from the same initial weights over the same batch (every row
      every step, so the data order cannot matter): losses, grad norms and final weights; the same for the `lora`
      method with peft's LoRA, and under bf16 autocast;
  (d) frozen base: every base weight bit-identical after training; trainable counts against the docs / `estimate`;
  (e) resume: `stop_at=k` then `resume=True` against an uninterrupted run, bit for bit, at several k, with grad
      accumulation, bf16, checkpointing, LoRA and the shipped text file; refusals of changed settings, of a used
      folder without `overwrite`, of a folder in use (lock), with nothing changed on disk;
  (f) grad accumulation, gradient checkpointing, precision (which tensors are bf16), packing / padding / trim;
  (g) the run folder: files, metrics.json / log.jsonl / train_config.json, reload with `mmpreproj.load_adapter`
      giving the trained model's logits, the caller's RNG restored.
One line per case: PASS/FAIL | area | case | details; then TOTAL. Documented limits are PASS "(documented: where)".
Not covered: DDP / FSDP under torchrun or accelerate (one process at a time here), GPUs, the hub presets' data.
About 100 s on one core (one helper process for the lock and kill cases). Output: bench/results/train_audit.txt
(`... | grep -E '^(PASS|FAIL|TOTAL)' | tee bench/results/train_audit.txt`).

Its run on commit 6170c11: 161 cases, 159 PASS, 2 FAIL (87 s). The trainer agrees with the references: the logged
LR is the docstring's schedule to 0 and transformers' cosine / min-LR cosine / constant schedules after warmup to 0;
a hand-written torch AdamW + clip_grad_norm_ loop from the same initial weights matches losses to <= 2e-6 and weights
to <= 8e-6 (fp32, preproj_skip / skip / peft LoRA, non-default betas, eps, weight decay and clipping; 6e-5 under bf16
autocast), and so does transformers' Trainer on the PeftModel (weights <= 3e-6); the base stays bit-identical for
all six methods and the trainable counts are the documented ones; stop/resume and a SIGKILL/SIGTERM between
periodic checkpoints resume bit-identically (grad accumulation, padding, bf16, checkpointing, LoRA, preproj_lora,
the shipped text file across an epoch); grad_accum=k x b = 1 x kb to 2e-6 (also on padded rows of unequal length);
gradient checkpointing (both variants, verified to recompute) is bit-identical to none. The two FAILs are
docstring/default inconsistencies, not wrong numbers: `TrainConfig.stop_at` says "checkpoint written" but with
`save_every=0` none is (the `--save-every` help says 0 = never, so such a stop cannot be resumed), and
`get_preset("pythia-160m")` loads the base in bfloat16 where `TrainConfig()`, documented as that protocol, uses
float32. That run's lines: bench/results/train_audit_before.txt.

Run again after the docstrings were made true (TrainConfig: "but for `model_dtype`"; `stop_at`: "unless
`save_every=0`, which writes none"; the two cases read those words at run time): 161 cases, 161 PASS."""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
os.chdir(ROOT)
TMP = Path(tempfile.mkdtemp(prefix="train_audit_"))
RESULTS: list[tuple[bool, str, str, str]] = []
MODEL = "assets/mini-pythia"
ONLY: str | None = None

import peft  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

import mmpreproj  # noqa: E402
from mmpreproj.train import (  # noqa: E402
    CHECKPOINT_NAME,
    LMExamples,
    NonFiniteLossError,
    TrainConfig,
    count_trainable,
    expected_trainable,
    get_preset,
    load_checkpoint,
    method_param_table,
    pack_lines,
    pad_lines,
    paper_lora_rank,
    read_lines,
    select_lines,
    train,
)

transformers.logging.set_verbosity_error()


def record(ok, area, case, details):
    RESULTS.append((bool(ok), area, case, details))
    print(f"{'PASS' if ok else 'FAIL'} | {area} | {case} | {details}", flush=True)


def want(name):
    return ONLY is None or ONLY in name


# ------------------------------------------------------------------------------------------------------------ helpers
EX4 = LMExamples.random(4, 24, 8192, seed=1, min_len=24)  # 4 rows, equal length: no padding
EXPAD = LMExamples.random(8, 24, 8192, seed=2, min_len=6)  # 8 rows of unequal length (padded)


def cfg(name, **kw):
    base = dict(
        out=str(TMP / name),
        steps=6,
        warmup_steps=2,
        batch_size=4,
        grad_accum=1,
        save_every=0,
        progress=False,
        overwrite=True,
        max_len=24,
    )
    base.update(kw)
    return get_preset("mini", **base)


def run(name, examples=EX4, **kw):
    c = cfg(name, **kw)
    return c, train(c, examples=examples)


def log_of(out):
    return [json.loads(ln) for ln in Path(out, "log.jsonl").read_text().splitlines() if ln.strip()]


def snapshot(folder):
    folder = Path(folder)
    if not folder.exists():
        return None
    return {
        str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest() if f.is_file() else "<dir>"
        for f in sorted(folder.rglob("*"))
    }


def fresh_base():
    return AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)


def trained_weights(out, method="preproj_skip"):
    """The trainable weights of a run folder, read back by the documented loader into a fresh base."""
    m = mmpreproj.load_adapter(fresh_base(), out, is_trainable=True)
    return {k: p.detach().clone() for k, p in m.named_parameters() if p.requires_grad}


def maxdiff(a, b):
    if set(a) != set(b):
        return float("inf")
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def doc_lr(s, lr, warm, steps, min_ratio=0.0, schedule="cosine"):
    """The docstring: linear warmup from lr/(W+1), then cosine to lr*min_lr_ratio (or constant). s: 0-based step."""
    if s < warm:
        return lr * (s + 1) / (warm + 1)
    if schedule == "constant":
        return lr
    prog = (s - warm) / max(1, steps - warm)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * prog)))


def ref_loop(c, examples, init_out, autocast=False):
    """A plain PyTorch loop: torch AdamW + clip_grad_norm_ + LambdaLR(documented schedule), every row every step."""
    torch.manual_seed(0)
    model = mmpreproj.load_adapter(fresh_base(), init_out, is_trainable=True)
    model.train()
    named = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    opt = torch.optim.AdamW(
        params, lr=c.lr, betas=tuple(c.adam_betas), eps=c.adam_eps, weight_decay=c.weight_decay, foreach=False
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: doc_lr(s, 1.0, c.warmup_steps, c.steps, c.min_lr_ratio, c.schedule)
    )
    n = int(examples.attention_mask.sum(1).max())
    ids, mask, labels = examples.input_ids[:, :n], examples.attention_mask[:, :n], examples.labels[:, :n]
    losses, norms, lrs = [], [], []
    for _ in range(c.steps):
        lrs.append(opt.param_groups[0]["lr"])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        if c.max_grad_norm:
            gn = torch.nn.utils.clip_grad_norm_(params, c.max_grad_norm)
        else:
            gn = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
        norms.append(float(gn))
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses, norms, lrs, {k: p.detach().clone() for k, p in named}


def init_run(name, method="preproj_skip", **kw):
    """A run whose one update (lr=1e-30) rounds away: its adapter holds the run's initial weights."""
    out = TMP / f"init-{name}"
    train(cfg(f"init-{name}", method=method, steps=1, warmup_steps=0, lr=1e-30, **kw), examples=EX4)
    return out


def base_bits_unchanged(model):
    ref = fresh_base().state_dict()
    got = {}
    for k, v in model.state_dict().items():
        kk = k.replace("base_model.model.", "").replace(".base_layer", "")
        if "preproj" in kk or "lora_" in kk:
            continue
        got[kk] = v
    missing = sorted(set(ref) - set(got))
    bad = [k for k in ref if k in got and not torch.equal(ref[k], got[k].to(ref[k].dtype))]
    same_dtype = all(got[k].dtype == ref[k].dtype for k in ref if k in got)
    return missing, bad, same_dtype, len(ref)


def err_line(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, str(e)
    return None, None


# --------------------------------------------------------------------------------------------------------- (a) config
def cases_config():
    area = "config"
    d = TrainConfig()
    ok = (d.lr, d.steps, d.batch_size * d.grad_accum, d.max_len, d.precision) == (1e-5, 500, 16, 512, "bf16")
    record(
        ok,
        area,
        "defaults = the paper's protocol (README: LR 1e-5, 500 steps of 16 x 512, bf16)",
        f"lr={d.lr} steps={d.steps} batch={d.batch_size}x{d.grad_accum} max_len={d.max_len} precision={d.precision}",
    )
    p = get_preset("pythia-160m")
    diffs = {k: v for k, v in p.differences(d).items() if k not in ("preset", "out")}
    doc = " ".join((TrainConfig.__doc__ or "").split())  # added after the first run: what the docstring now states
    stated = set(diffs) == {"model_dtype"} and "but for `model_dtype`" in doc
    record(
        not diffs or stated,
        area,
        "get_preset('pythia-160m') = TrainConfig() (docstring: defaults = the Pythia-160M protocol"
        + (", but for `model_dtype`)" if stated else ")"),
        f"differences besides preset/out: {diffs} (the preset loads the frozen base in bf16, TrainConfig() in fp32)",
    )
    m = get_preset("mini")
    record(
        m.model.endswith("assets/mini-pythia") and "assets/data" in m.data,
        area,
        "get_preset('mini'): shipped model and data (README: offline, shipped model and data)",
        f"model={m.model} data={m.data}",
    )
    t, msg = err_line(lambda: get_preset("nonsense"))
    record(
        t is not None and "nonsense" in msg and "mini" in msg,
        area,
        "get_preset('nonsense') refused naming the presets",
        f"{t}: {msg}"[:200],
    )
    o = get_preset("mini", method="lora", lr=3e-3)
    record(o.method == "lora" and o.lr == 3e-3, area, "get_preset overrides applied", f"method={o.method} lr={o.lr}")
    bad = [
        ("lr", dict(lr=0.0)),
        ("lr", dict(lr=float("inf"))),
        ("lr", dict(lr=float("nan"))),
        ("steps", dict(steps=0)),
        ("warmup_steps", dict(steps=5, warmup_steps=10)),
        ("warmup_steps", dict(warmup_steps=-1)),
        ("batch_size", dict(batch_size=0)),
        ("grad_accum", dict(grad_accum=0)),
        ("max_len", dict(max_len=0)),
        ("num_lines", dict(num_lines=0)),
        ("method", dict(method="dora")),
        ("precision", dict(precision="fp16")),
        ("schedule", dict(schedule="linear")),
        ("min_lr_ratio", dict(min_lr_ratio=1.5)),
        ("adam_betas", dict(adam_betas=(1.0, 0.9))),
        ("adam_eps", dict(adam_eps=-1.0)),
        ("weight_decay", dict(weight_decay=-0.1)),
        ("max_grad_norm", dict(max_grad_norm=-1.0)),
        ("seed", dict(seed=-1)),
        ("model_dtype", dict(model_dtype="float16")),
        ("parallel", dict(parallel="tp")),
        ("expansion", dict(expansion=-1.0)),
        ("skip_rank", dict(skip_rank=0)),
        ("save_every", dict(save_every=-1)),
        ("lora_r", dict(method="lora", lora_r=0)),
        ("resume", dict(resume=True, overwrite=True)),
    ]
    for field, kw in bad:
        t, msg = err_line(lambda kw=kw: get_preset("mini", **kw))
        ok = t is not None and field in (msg or "") and "\n" not in (msg or "")
        record(ok, area, f"refuse {kw}", f"{t}: {msg}"[:160] if t else "ACCEPTED")
    # replace validates; to_json/from_json round trip; from_dict warns on unknown keys
    t, msg = err_line(lambda: m.replace(lr=-1.0))
    record(t is not None and "lr" in msg, area, "TrainConfig.replace validates (docstring)", f"{t}: {msg}"[:160])
    path = TMP / "cfg.json"
    m.to_json(path)
    back = TrainConfig.from_json(path)
    record(back == m, area, "to_json/from_json round trip", f"differences: {back.differences(m)}")
    import warnings

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fd = TrainConfig.from_dict({**m.to_dict(), "future_field": 1})
    record(
        fd == m and any("future_field" in str(x.message) for x in w),
        area,
        "from_dict: unknown key warns and is ignored (docstring)",
        f"warnings={[str(x.message)[:80] for x in w]}",
    )
    record(
        m.effective_batch == m.batch_size * m.grad_accum,
        area,
        "effective_batch = batch_size * grad_accum (docstring)",
        f"{m.effective_batch}",
    )


# ------------------------------------------------------------------------------------------------------- (b) schedule
def cases_schedule():
    area = "schedule"
    from transformers import (
        get_constant_schedule_with_warmup,
        get_cosine_schedule_with_warmup,
        get_cosine_with_min_lr_schedule_with_warmup,
    )

    def hf_lrs(factory, steps, **kw):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.AdamW([p], lr=1.0)
        sch = factory(opt, **kw)
        out = []
        for _ in range(steps):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sch.step()
        return out

    for label, kw, factory, fkw in [
        ("cosine W=3 T=10", dict(steps=10, warmup_steps=3), get_cosine_schedule_with_warmup, {}),
        ("cosine W=0 T=7", dict(steps=7, warmup_steps=0), get_cosine_schedule_with_warmup, {}),
        (
            "cosine min_lr_ratio=0.1 W=2 T=9",
            dict(steps=9, warmup_steps=2, min_lr_ratio=0.1),
            get_cosine_with_min_lr_schedule_with_warmup,
            {"min_lr_rate": 0.1},
        ),
        (
            "constant W=3 T=7",
            dict(steps=7, warmup_steps=3, schedule="constant"),
            get_constant_schedule_with_warmup,
            {},
        ),
    ]:
        c, r = run(f"sched-{label.replace(' ', '_')}", lr=2e-3, **kw)
        got = [e["lr"] for e in log_of(c.out)]
        want_doc = [doc_lr(s, c.lr, c.warmup_steps, c.steps, c.min_lr_ratio, c.schedule) for s in range(c.steps)]
        d_doc = max(abs(a - b) for a, b in zip(got, want_doc)) if len(got) == len(want_doc) else float("inf")
        record(
            d_doc <= 1e-12 * c.lr,
            area,
            f"{label}: logged LR = docstring formula (warmup from lr/(W+1))",
            f"{len(got)} steps, max abs diff {d_doc:.2e}; "
            f"first {got[0]:.3e} = lr/(W+1) {c.lr / (c.warmup_steps + 1):.3e}",
        )
        fk = dict(num_warmup_steps=c.warmup_steps)
        if factory is not get_constant_schedule_with_warmup:
            fk["num_training_steps"] = c.steps
        hf = [c.lr * x for x in hf_lrs(factory, c.steps, **fk, **fkw)]
        W = c.warmup_steps
        d_hf = max(abs(a - b) for a, b in zip(got[W:], hf[W:]))
        d_warm = max((abs(a - b) for a, b in zip(got[:W], hf[:W])), default=0.0)
        record(
            d_hf <= 1e-12 * c.lr,
            area,
            f"{label}: after warmup = transformers {factory.__name__}",
            f"max abs diff {d_hf:.2e} over steps {W + 1}..{c.steps}; in warmup differs by {d_warm:.2e} "
            f"(documented: TrainConfig docstring, warmup starts at lr/(W+1), transformers' at 0)",
        )
    # the LR actually used: the reference loop's weights (cases_optimizer) confirm it; here the last step's LR
    c, r = run("sched-last", steps=5, warmup_steps=1, lr=1e-3, min_lr_ratio=0.2)
    got = [e["lr"] for e in log_of(c.out)]
    record(
        all(g >= c.lr * c.min_lr_ratio - 1e-15 for g in got),
        area,
        "LR never below lr*min_lr_ratio",
        f"lrs={[f'{g:.2e}' for g in got]} (cosine reaches lr*min_lr_ratio after the last step, as transformers')",
    )


# ------------------------------------------------------------------------------------------------------ (c) optimizer
def cases_optimizer():
    area = "optimizer"
    specs = [
        ("preproj_skip, mini's AdamW defaults", "preproj_skip", dict(lr=1e-3), False),
        (
            "preproj_skip, wd=0.1 betas=(0.8,0.95) eps=1e-6 clip=0.05",
            "preproj_skip",
            dict(lr=1e-3, weight_decay=0.1, adam_betas=(0.8, 0.95), adam_eps=1e-6, max_grad_norm=0.05),
            False,
        ),
        ("preproj_skip, max_grad_norm=None (no clipping)", "preproj_skip", dict(lr=1e-3, max_grad_norm=None), False),
        ("preproj_skip, max_grad_norm=0 (no clipping)", "preproj_skip", dict(lr=1e-3, max_grad_norm=0.0), False),
        ("lora (peft LoRA), wd=0.05", "lora", dict(lr=1e-3, weight_decay=0.05), False),
        ("skip, constant schedule", "skip", dict(lr=1e-3, schedule="constant"), False),
        ("preproj_skip, precision=bf16 vs bf16 autocast loop", "preproj_skip", dict(lr=1e-3, precision="bf16"), True),
    ]
    for label, method, kw, ac in specs:
        init = init_run(label[:12].replace(" ", "_").replace(",", "") + str(len(RESULTS)), method=method)
        c, r = run(f"opt-{len(RESULTS)}", method=method, **kw)
        losses, norms, lrs, w_ref = ref_loop(c, EX4, init, autocast=ac)
        log = log_of(c.out)
        got_l = [e["loss"] for e in log]
        got_n = [e["grad_norm"] for e in log]
        dl = max(abs(a - b) for a, b in zip(got_l, losses))
        dl0 = abs(got_l[0] - losses[0])
        dn = max(abs(a - b) / max(b, 1e-12) for a, b in zip(got_n, norms))
        dw = maxdiff(trained_weights(c.out, method), w_ref)
        scale = max(v.abs().max().item() for v in w_ref.values())
        tol_l, tol_w = (2e-2, 2e-3) if ac else (1e-4, 1e-5)
        record(
            dl0 <= tol_l / 10 and dl <= tol_l and dn <= (5e-2 if ac else 1e-4) and dw <= tol_w,
            area,
            f"{label}: = torch AdamW + clip_grad_norm_ loop",
            f"{c.steps} steps: step-1 loss diff {dl0:.1e} (same init), max loss diff {dl:.1e}, "
            f"max rel grad-norm diff {dn:.1e}, final weights max abs diff {dw:.1e} (max |w| {scale:.2e})",
        )
    for method, want_r, extra in [("lora_matched", 149, {}), ("preproj_lora", 64, {}), ("lora", 8, {"lora_r": 8})]:
        c, r = run(f"lora-r-{method}", method=method, steps=1, warmup_steps=0, **extra)
        pc = r.model.peft_config["default"]
        record(
            pc.r == want_r and pc.lora_alpha == 2 * want_r,
            area,
            f"{method}{' lora_r=8' if extra else ''}: LoRA r={want_r}, alpha 2r (cli.md / docstring)",
            f"r={pc.r} alpha={pc.lora_alpha} trainable={r.metrics['trainable_params']:,}",
        )
    # the method 'lora' is peft's LoRA with the paper's rank rule (cli.md: alpha 2r, query_key_value and dense)
    c, r = run("lora-config", method="lora", steps=1, warmup_steps=0)
    pc = r.model.peft_config["default"]
    rank = paper_lora_rank(256, 4)
    ok = (
        isinstance(pc, peft.LoraConfig)
        and pc.r == rank == 160
        and pc.lora_alpha == 2 * rank
        and set(pc.target_modules) == {"query_key_value", "dense"}
    )
    record(
        ok,
        area,
        "lora = peft LoraConfig r=paper rule (160 on mini, README), alpha 2r, query_key_value+dense (cli.md)",
        f"r={pc.r} alpha={pc.lora_alpha} targets={sorted(pc.target_modules)} dropout={pc.lora_dropout}",
    )


# ------------------------------------------------------------------------------------------- (d) frozen base / counts
def cases_frozen():
    area = "frozen"
    counts = {
        "preproj_skip": 917_504,  # README sizes table
        "preproj": 655_360,  # README mini table 0.66M = 2*256*320*4
        "skip": 262_144,  # 0.26M = 256*256*4
        "lora": 983_040,  # r=160: 160*(4*256 + 2*256)*4 (0.98M)
        "lora_matched": 915_456,  # r=149 on mini (cli.md)
        "preproj_lora": 1_048_576,  # preproj + LoRA r=64 (1.05M)
    }
    table = method_param_table(transformers.AutoConfig.from_pretrained(MODEL))  # a model config (meta model)
    for method, want_n in counts.items():
        c, r = run(f"frozen-{method}", method=method, steps=3, warmup_steps=1, lr=1e-2)
        missing, bad, same_dtype, n = base_bits_unchanged(r.model)
        record(
            not missing and not bad and same_dtype,
            area,
            f"{method}: every base weight bit-identical after 3 steps at lr 1e-2",
            f"{n} base tensors, missing={missing[:3]} changed={bad[:3]}",
        )
        names = [k for k, p in r.model.named_parameters() if p.requires_grad]
        only = all(("preproj" in k or "lora_" in k) for k in names)
        ct = count_trainable(r.model)
        mt = r.metrics.get("trainable_params")
        ex = expected_trainable(method, 256, 4, model=fresh_base()) if method != "preproj_lora" else None
        record(
            only and ct == mt == table[method] == want_n and (ex is None or ex == want_n),
            area,
            f"{method}: trainable = documented count {want_n:,}",
            f"count_trainable={ct:,} metrics={mt} method_param_table={table[method]:,} expected_trainable={ex} "
            f"only injected/LoRA names={only}",
        )
    est = mmpreproj.estimate(mmpreproj.PreProjConfig(), "mini-pythia")
    estn = est.params
    record(estn == 917_504, area, "estimate(PreProjConfig(), 'mini-pythia') = 917,504", f"{str(est)[:150]}")
    c, r = run("frozen-small", expansion=1 / 16, skip_rank=16, steps=2, warmup_steps=0)
    record(
        r.metrics["trainable_params"] == 65_536,
        area,
        "expansion=1/16, skip_rank=16: 65,536 (README sizes table)",
        f"{r.metrics['trainable_params']:,}",
    )
    c, r = run("frozen-layers", layers=[-2, -1], steps=2, warmup_steps=0)
    names = {k.split(".attention")[0] for k, p in r.model.named_parameters() if p.requires_grad}
    record(
        r.metrics["trainable_params"] == 917_504 // 2 and names == {"gpt_neox.layers.2", "gpt_neox.layers.3"},
        area,
        "layers=[-2,-1]: only the last two blocks train",
        f"{r.metrics['trainable_params']:,} in {sorted(names)}",
    )
    t, msg = err_line(lambda: cfg("frozen-skiprank-lora", method="lora", skip_rank=8))
    record(
        t is not None and "skip_rank" in msg,
        area,
        "skip_rank on lora: refused naming the field (docstring: applies only to a method with a skip)",
        f"{t}: {msg}"[:170] if t else "accepted",
    )


# --------------------------------------------------------------------------------------------------------- (e) resume
def full_and_resumed(tag, stop, examples=EX4, **kw):
    cf, rf = run(f"full-{tag}", examples=examples, **kw)
    kw2 = dict(kw)
    cs = cfg(f"res-{tag}", stop_at=stop, save_every=100, **kw2)
    rs = train(cs, examples=examples)
    ck = load_checkpoint(Path(cs.out) / CHECKPOINT_NAME)
    stopped = (rs.steps, ck.get("step"))
    rr = train(cs.replace(stop_at=None, resume=True, overwrite=False), examples=examples)
    wf, wr = trained_weights(cf.out), trained_weights(cs.out)
    bit = all(torch.equal(wf[k], wr[k]) for k in wf) and set(wf) == set(wr)
    lf, lr_ = [e["loss"] for e in log_of(cf.out)], [e["loss"] for e in log_of(cs.out)]
    return bit, lf == lr_, stopped, rr, maxdiff(wf, wr), (lf, lr_)


def cases_resume():
    area = "resume"
    for tag, stop, kw, ex in [
        ("k1", 1, {}, EX4),
        ("k2", 2, {}, EX4),
        ("k5", 5, {}, EX4),
        ("accum2-k3", 3, dict(batch_size=2, grad_accum=2), EX4),
        ("padded-b2-k3", 3, dict(batch_size=2), EXPAD),
        ("bf16-k2", 2, dict(precision="bf16"), EX4),
        ("ckpt-k3", 3, dict(gradient_checkpointing=True), EX4),
        ("lora-k2", 2, dict(method="lora"), EX4),
        ("preproj_lora-k4", 4, dict(method="preproj_lora"), EX4),
        ("wd-k3", 3, dict(weight_decay=0.1, lr=3e-3), EX4),
        ("paper_bf16_weights-k2", 2, dict(precision="bf16", paper_bf16_weights=True), EX4),
        ("bf16-host-k3", 3, dict(precision="bf16", model_dtype="bfloat16"), EX4),
        ("packing-text-k3", 3, dict(packing=True, num_lines=40, max_len=32, batch_size=2), None),
    ]:
        bit, logs_eq, stopped, rr, dw, _ = full_and_resumed(tag, stop, examples=ex, **kw)
        record(
            bit and logs_eq and stopped == (stop, stop) and rr.steps == 6,
            area,
            f"stop_at={stop} then resume = uninterrupted ({tag})",
            f"weights bit-identical={bit} (max diff {dw:.1e}), log losses equal={logs_eq}, stopped at {stopped}, "
            f"resumed_from={rr.metrics.get('resumed_from')}",
        )
    # the shipped text file (data order resumed from the checkpoint)
    kw = dict(num_lines=16, max_len=32, batch_size=4, steps=6, warmup_steps=2, save_every=0, progress=False)
    cf = get_preset("mini", out=str(TMP / "full-text"), overwrite=True, **kw)
    train(cf)
    cs = get_preset("mini", out=str(TMP / "res-text"), overwrite=True, stop_at=3, **{**kw, "save_every": 100})
    train(cs)
    train(cs.replace(stop_at=None, resume=True, overwrite=False))
    wf, wr = trained_weights(cf.out), trained_weights(cs.out)
    bit = all(torch.equal(wf[k], wr[k]) for k in wf)
    lf, lr_ = [e["loss"] for e in log_of(cf.out)], [e["loss"] for e in log_of(cs.out)]
    record(
        bit and lf == lr_,
        area,
        "stop_at=3 then resume on the shipped WikiText file (16 lines = 4 steps an epoch: crosses the epoch)",
        f"weights bit-identical={bit}, losses equal={lf == lr_}",
    )
    # several stops in a row
    cs = cfg("res-multi", stop_at=2, save_every=100)
    train(cs, examples=EX4)
    train(cs.replace(stop_at=4, resume=True, overwrite=False), examples=EX4)
    train(cs.replace(stop_at=None, resume=True, overwrite=False), examples=EX4)
    wf = trained_weights(TMP / "full-k1")
    wr = trained_weights(cs.out)
    bit = all(torch.equal(wf[k], wr[k]) for k in wf)
    record(bit, area, "stop 2, resume to 4, resume to 6 = uninterrupted", f"bit-identical={bit}")
    record(
        True,
        area,
        "stop mid gradient-accumulation",
        "not offered: stop_at and save_every count optimizer steps (documented: TrainConfig docstring)",
    )
    # resume with no checkpoint starts from step 0
    c = cfg("res-none", resume=True, overwrite=False)
    r = train(c, examples=EX4)
    wf, wr = trained_weights(TMP / "full-k1"), trained_weights(c.out)
    record(
        all(torch.equal(wf[k], wr[k]) for k in wf),
        area,
        "resume=True with no checkpoint: starts from step 0 (docstring) = a fresh run",
        f"steps={r.steps}",
    )
    # resume a finished run: nothing more to train, weights kept
    before = trained_weights(TMP / "full-k1")
    c = cfg("full-k1", resume=True, overwrite=False, save_every=0)
    t, msg = err_line(lambda: train(c, examples=EX4))
    after = trained_weights(TMP / "full-k1")
    record(
        all(torch.equal(before[k], after[k]) for k in before),
        area,
        "resume of a finished run (save_every=0, no checkpoint) keeps the trained adapter",
        f"{t}: {msg}"[:160] if t else "ran (adapter unchanged)",
    )
    # refusals: changed settings, used folder without overwrite, folder in use; nothing changed on disk
    cs = cfg("refuse-base", stop_at=2, save_every=100)
    train(cs, examples=EX4)
    for field, val in [("lr", 5e-3), ("seed", 7), ("batch_size", 2), ("method", "skip"), ("weight_decay", 0.1)]:
        snap = snapshot(cs.out)
        c2 = cs.replace(stop_at=None, resume=True, overwrite=False, **{field: val})
        t, msg = err_line(lambda c2=c2: train(c2, examples=EX4))
        same = snapshot(cs.out) == snap
        record(
            t is not None and field in msg and same,
            area,
            f"resume with {field} changed refused, folder unchanged",
            f"{t}: {msg}"[:170] + f" | unchanged={same}" if t else f"ACCEPTED | unchanged={same}",
        )
    snap = snapshot(cs.out)
    t, msg = err_line(lambda: train(cs.replace(stop_at=None, overwrite=False), examples=EX4))
    same = snapshot(cs.out) == snap
    record(
        t is not None and same and "overwrite" in msg,
        area,
        "fresh run into a folder holding a run (no overwrite/resume) refused, unchanged",
        f"{t}: {msg}"[:170] + f" | unchanged={same}",
    )
    extra = Path(cs.out) / "user.txt"
    extra.write_text("x")
    train(cs.replace(stop_at=None, overwrite=True, lr=2e-3), examples=EX4)
    ck = Path(cs.out) / CHECKPOINT_NAME
    log = log_of(cs.out)
    ckd = load_checkpoint(ck) if ck.exists() else {}
    record(
        len(log) == 6 and ckd.get("step") == 6 and ckd["config"]["lr"] == 2e-3 and log[0]["lr"] == 2e-3 / 3,
        area,
        "overwrite=True starts over (old log and step-2 checkpoint replaced by the new run's)",
        f"log lines={len(log)} checkpoint step={ckd.get('step')} lr={ckd.get('config', {}).get('lr')} "
        f"user file kept={extra.exists()}",
    )
    # refusals before anything is written: a model that does not exist
    cs2 = cfg("refuse-model", stop_at=2, save_every=100)
    train(cs2, examples=EX4)
    snap = snapshot(cs2.out)
    t, msg = err_line(lambda: train(cs2.replace(data="/nonexistent/data.txt", overwrite=True)))
    record(
        t is not None and snapshot(cs2.out) == snap and "/nonexistent/data.txt" in msg,
        area,
        "overwrite=True with missing data: refused, old run untouched (cli.md: cleared only then)",
        f"{t}: {msg}"[:170] + f" | unchanged={snapshot(cs2.out) == snap}",
    )
    ckp = Path(cs2.out) / CHECKPOINT_NAME
    ckp.write_bytes(ckp.read_bytes()[: ckp.stat().st_size // 2])
    snap = snapshot(cs2.out)
    t, msg = err_line(lambda: train(cs2.replace(stop_at=None, resume=True, overwrite=False), examples=EX4))
    record(
        t is not None and snapshot(cs2.out) == snap and CHECKPOINT_NAME in msg and "\n" not in msg,
        area,
        "resume from a truncated checkpoint.pt: one-line error naming it, folder unchanged",
        f"{t}: {msg}"[:170] + f" | unchanged={snapshot(cs2.out) == snap}",
    )
    snap = snapshot(cs2.out)
    t, msg = err_line(lambda: train(cs2.replace(model="/nonexistent/model", overwrite=True)))
    record(
        t is not None and snapshot(cs2.out) == snap and "/nonexistent/model" in msg,
        area,
        "overwrite=True with a missing model: refused, old run untouched (cli.md: cleared only then)",
        f"{t}: {msg}"[:170] + f" | unchanged={snapshot(cs2.out) == snap}",
    )
    case_lock()
    case_kill()


LOCK_CHILD = """
import sys, time
from mmpreproj.train import get_preset, train, LMExamples
ex = LMExamples.random(4, 24, 8192, seed=1, min_len=24)
c = get_preset("mini", out=sys.argv[1], steps=100000, warmup_steps=0, batch_size=4, save_every=0, progress=False,
               overwrite=True, max_len=24)
train(c, examples=ex)
"""


KILL_CHILD = """
import sys
from mmpreproj.train import get_preset, train, LMExamples
ex = LMExamples.random(8, 24, 8192, seed=2, min_len=6)
c = get_preset("mini", out=sys.argv[1], steps=60, warmup_steps=5, batch_size=2, grad_accum=2, save_every=4,
               progress=False, overwrite=True, max_len=24)
train(c, examples=ex)
"""


def case_kill():
    """A real preemption: the process SIGKILLed between periodic checkpoints, then resume=True."""
    area = "resume"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    kw = dict(steps=60, warmup_steps=5, batch_size=2, grad_accum=2, save_every=4)
    cf, _ = run("kill-full", examples=EXPAD, **kw)
    for sig, after in [(9, 10), (9, 23), (15, 30)]:
        out = TMP / f"kill-{sig}-{after}"
        child = subprocess.Popen([sys.executable, "-c", KILL_CHILD, str(out)], env=env, stderr=subprocess.DEVNULL)
        try:
            t0 = time.time()
            while time.time() - t0 < 90 and child.poll() is None:
                lg = out / "log.jsonl"
                if lg.exists() and len(lg.read_text().splitlines()) >= after:
                    break
                time.sleep(0.01)
            child.send_signal(sig)
            child.wait()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        n_log = len(log_of(out))
        ck = load_checkpoint(out / CHECKPOINT_NAME)["step"] if (out / CHECKPOINT_NAME).exists() else None
        r = train(cfg(out.name, resume=True, overwrite=False, **kw), examples=EXPAD)
        wf, wr = trained_weights(cf.out), trained_weights(out)
        bit = set(wf) == set(wr) and all(torch.equal(wf[k], wr[k]) for k in wf)
        lf, lr_ = log_of(cf.out), log_of(out)
        steps_ok = [e["step"] for e in lr_] == list(range(1, 61))
        loss_ok = [e["loss"] for e in lf] == [e["loss"] for e in lr_]
        record(
            bit and steps_ok and loss_ok,
            area,
            f"killed (signal {sig}) after ~{after} of 60 steps, save_every=4, grad_accum=2, then resume",
            f"killed with {n_log} log lines, checkpoint at step {ck}; resumed_from={r.metrics.get('resumed_from')}; "
            f"weights bit-identical={bit}, log steps 1..60 once={steps_ok}, losses equal={loss_ok}",
        )


def case_lock():
    area = "resume"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    child = subprocess.Popen(
        [sys.executable, "-c", LOCK_CHILD, str(TMP / "locked2")], env=env, stderr=subprocess.DEVNULL
    )
    try:
        lock = TMP / "locked2" / ".mmpreproj-run.lock"
        t0 = time.time()
        while not (lock.exists() and (TMP / "locked2" / "log.jsonl").exists()) and time.time() - t0 < 60:
            time.sleep(0.2)
        c2 = cfg("locked2", steps=3, warmup_steps=0, overwrite=True)
        t, msg = err_line(lambda: train(c2, examples=EX4))
        record(
            t is not None and "in use" in msg and ".mmpreproj-run.lock" in msg,
            area,
            "a folder in use by a live training process is refused (troubleshooting: 'in use by ... lock file')",
            f"{t}: {msg}"[:200],
        )
    finally:
        child.kill()
        child.wait()
    # the lock of a killed process is taken over
    t, msg = err_line(lambda: train(cfg("locked2", steps=2, warmup_steps=0, overwrite=True), examples=EX4))
    record(
        t is None and len(log_of(TMP / "locked2")) == 2,
        area,
        "a lock whose process is gone (SIGKILL) is taken over (cli.md)",
        f"{t}: {msg}"[:160] if t else "trained",
    )


# -------------------------------------------------------------------------------- (f) accum / ckpt / precision / data
def cases_equivalence():
    area = "accum"
    c1, r1 = run("acc-1x4", batch_size=4, grad_accum=1)
    w1, l1 = trained_weights(c1.out), [e["loss"] for e in log_of(c1.out)]
    for b, k in [(2, 2), (1, 4)]:
        c, r = run(f"acc-{k}x{b}", batch_size=b, grad_accum=k)
        w, lk = trained_weights(c.out), [e["loss"] for e in log_of(c.out)]
        dl = max(abs(a - x) for a, x in zip(l1, lk))
        dw = maxdiff(w1, w)
        record(
            dl < 1e-4 and dw < 1e-5,
            area,
            f"grad_accum={k} x batch {b} = grad_accum=1 x batch 4 (equal-length rows)",
            f"max loss diff {dl:.1e}, final weights max abs diff {dw:.1e}, examples_per_step="
            f"{r.metrics.get('examples_per_step')}",
        )
    c1, r1 = run("accp-1x8", examples=EXPAD, batch_size=8, grad_accum=1)
    c2, r2 = run("accp-2x4", examples=EXPAD, batch_size=4, grad_accum=2)
    l1, l2 = [e["loss"] for e in log_of(c1.out)], [e["loss"] for e in log_of(c2.out)]
    dl = max(abs(a - x) for a, x in zip(l1, l2))
    dw = maxdiff(trained_weights(c1.out), trained_weights(c2.out))
    toks = EXPAD.attention_mask.sum(1).tolist()
    record(
        dl < 1e-4 and dw < 1e-5,
        area,
        "grad_accum=2 x 4 = 1 x 8 on padded rows of unequal length",
        f"max loss diff {dl:.1e}, weights max abs diff {dw:.1e} (row lengths {toks})",
    )
    area = "checkpointing"
    for method in ["preproj_skip", "lora", "preproj_lora"]:
        ca, ra = run(f"gc-off-{method}", method=method, gradient_checkpointing=False)
        for reent in [False, True]:
            cb, rb = run(
                f"gc-on-{method}-{reent}", method=method, gradient_checkpointing=True, reentrant_checkpointing=reent
            )
            la, lb = [e["loss"] for e in log_of(ca.out)], [e["loss"] for e in log_of(cb.out)]
            na, nb = [e["grad_norm"] for e in log_of(ca.out)], [e["grad_norm"] for e in log_of(cb.out)]
            dw = maxdiff(trained_weights(ca.out), trained_weights(cb.out))
            dl = max(abs(a - b) for a, b in zip(la, lb))
            dn = max(abs(a - b) for a, b in zip(na, nb))
            record(
                dl < 1e-5 and dn < 1e-5 and dw < 1e-6 and nb[0] > 0,
                area,
                f"{method}: gradient_checkpointing on (reentrant={reent}) = off",
                f"max loss diff {dl:.1e}, grad-norm diff {dn:.1e}, weights diff {dw:.1e}",
            )
    for label, kw in [
        ("preproj_skip layers=[-1]", dict(layers=[-1])),
        ("skip layers=[0]", dict(method="skip", layers=[0])),
        ("preproj_skip precision=bf16", dict(precision="bf16")),
        ("preproj_skip bf16 host", dict(precision="bf16", model_dtype="bfloat16")),
    ]:
        ca, ra = run(f"gc2-off-{len(RESULTS)}", gradient_checkpointing=False, **kw)
        la, wa = [e["loss"] for e in log_of(ca.out)], trained_weights(ca.out)
        for reent in [False, True]:
            cb, rb = run(f"gc2-on-{len(RESULTS)}", gradient_checkpointing=True, reentrant_checkpointing=reent, **kw)
            lb, wb = [e["loss"] for e in log_of(cb.out)], trained_weights(cb.out)
            init = trained_weights(init_run(f"gc2-{len(RESULTS)}", **kw))
            moved = maxdiff(wb, init)
            dl = max(abs(a - b) for a, b in zip(la, lb))
            dw = maxdiff(wa, wb)
            record(
                dl < 1e-5 and dw < 1e-6 and moved > 1e-4,
                area,
                f"{label}: gradient_checkpointing on (reentrant={reent}) = off",
                f"max loss diff {dl:.1e}, weights diff {dw:.1e}, weights moved from init by {moved:.1e}",
            )
    # observed from inside: forward calls of a block per micro-batch and the dtype a frozen matmul computes in
    for label, kw, want_calls, want_dt in [
        ("gc off, fp32", dict(gradient_checkpointing=False, precision="fp32"), 1, torch.float32),
        ("gc on, fp32", dict(gradient_checkpointing=True, precision="fp32"), 2, torch.float32),
        (
            "gc on reentrant, bf16",
            dict(gradient_checkpointing=True, reentrant_checkpointing=True, precision="bf16"),
            2,
            torch.bfloat16,
        ),
        ("gc off, bf16", dict(gradient_checkpointing=False, precision="bf16"), 1, torch.bfloat16),
    ]:
        base = fresh_base()
        calls, dts = [0], set()
        # a hook on the block itself fires once under transformers' checkpointing (it wraps the inside of the
        # block's __call__); its submodules run again in backward, so count the MLP's first linear
        lin = base.gpt_neox.layers[1].mlp.dense_h_to_4h

        def hook(m, a, o, calls=calls, dts=dts):
            calls[0] += 1
            dts.add(o.dtype)

        lin.register_forward_hook(hook)
        c = cfg(f"hook-{len(RESULTS)}", steps=3, warmup_steps=0, batch_size=2, grad_accum=2, **kw)
        train(c, model=base, examples=EX4)
        per = calls[0] / (3 * 2)
        record(
            per == want_calls and dts == {want_dt},
            "checkpointing" if "gc on" in label else "precision",
            f"{label}: block forwards per micro-batch = {want_calls}, frozen matmul in {want_dt}",
            f"{calls[0]} forwards of block 1's dense_h_to_4h over 6 micro-batches ({per:g} each), output {dts}",
        )
    area = "precision"
    c32, r32 = run("prec-fp32", precision="fp32")
    cbf, rbf = run("prec-bf16", precision="bf16")
    dt = {p.dtype for p in rbf.model.parameters() if p.requires_grad}
    base_dt = {p.dtype for p in rbf.model.parameters() if not p.requires_grad}
    l32, lbf = [e["loss"] for e in log_of(c32.out)], [e["loss"] for e in log_of(cbf.out)]
    rel = max(abs(a - b) / a for a, b in zip(l32, lbf))
    record(
        dt == {torch.float32} and base_dt == {torch.float32} and rbf.metrics["trainable_dtypes"] == ["torch.float32"],
        area,
        "precision=bf16 (autocast): trainable master weights fp32, base fp32",
        f"trainable {dt}, base {base_dt}, metrics {rbf.metrics['trainable_dtypes']}",
    )
    record(
        0 < rel < 2e-2,
        area,
        "precision=bf16 losses within bf16 rounding of fp32 (and not identical: autocast is on)",
        f"max rel loss diff {rel:.1e}",
    )
    from safetensors import safe_open

    with safe_open(str(Path(cbf.out) / "adapter" / "adapter_model.safetensors"), "pt") as f:
        fdt = {f.get_tensor(k).dtype for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    record(fdt == {torch.float32}, area, "precision=bf16: the saved adapter is fp32", f"{fdt}")
    c, r = run("prec-bf16-host", precision="bf16", model_dtype="bfloat16")
    dt = {p.dtype for p in r.model.parameters() if p.requires_grad}
    base_dt = {p.dtype for p in r.model.parameters() if not p.requires_grad}
    lb = [e["loss"] for e in log_of(c.out)]
    record(
        dt == {torch.float32} and base_dt == {torch.bfloat16} and all(math.isfinite(x) for x in lb),
        area,
        "model_dtype=bfloat16: base bf16, injected weights stay fp32 (getting-started: fp32 under a bf16 host)",
        f"trainable {dt}, base {base_dt}",
    )
    c, r = run("prec-paper-bf16", precision="bf16", paper_bf16_weights=True)
    dt = {p.dtype for p in r.model.parameters() if p.requires_grad}
    record(
        dt == {torch.bfloat16} and r.metrics["trainable_dtypes"] == ["torch.bfloat16"],
        area,
        "paper_bf16_weights=True: trainable weights bf16 (docstring)",
        f"trainable {dt}, metrics {r.metrics['trainable_dtypes']}",
    )
    c, r = run("prec-bf16-lora", method="lora", precision="bf16")
    dt = {p.dtype for p in r.model.parameters() if p.requires_grad}
    record(dt == {torch.float32}, area, "lora under precision=bf16: LoRA weights fp32", f"{dt}")
    area = "data"
    c, r = run("order", examples=EXPAD, batch_size=2, steps=12, warmup_steps=0)
    tot = int(EXPAD.attention_mask.sum())
    cum = [e["tokens"] for e in log_of(c.out)]
    record(
        [cum[3], cum[7], cum[11]] == [tot, 2 * tot, 3 * tot],
        area,
        "data order: each epoch (4 steps of 2 of 8 rows) uses every row once (token sums)",
        f"tokens after steps 4/8/12 {[cum[3], cum[7], cum[11]]}, all rows {tot}",
    )
    tok = AutoTokenizer.from_pretrained(MODEL)
    eos = tok.eos_token_id
    with gzip.open("assets/data/wikitext-103-raw/wiki.valid.raw.gz", "rt", encoding="utf-8") as fh:
        raw = fh.readlines()
    got_lines = list(read_lines("assets/data/wikitext-103-raw/wiki.valid.raw.gz"))
    record(got_lines == raw, area, "read_lines(.gz) = the file's lines as stored", f"{len(got_lines)} lines")
    sel = select_lines(iter(raw), num_lines=20, min_chars=50)
    ref_sel = [ln for ln in raw if len(ln.strip()) > 50][:20]
    record(sel == ref_sel, area, "select_lines: first N lines with stripped length > min_chars", f"{len(sel)}")
    pk = pack_lines(ref_sel, tok, max_len=32)
    stream = []
    for ln in ref_sel:
        stream += tok(ln)["input_ids"] + [eos]
    nb = len(stream) // 32
    ref_ids = torch.tensor(stream[: nb * 32]).view(nb, 32)
    record(
        torch.equal(pk.input_ids, ref_ids) and torch.equal(pk.labels, ref_ids) and bool(pk.attention_mask.all()),
        area,
        "pack_lines = line eos line eos ... cut into full blocks, every position labelled",
        f"blocks {tuple(pk.input_ids.shape)} vs reference {tuple(ref_ids.shape)}",
    )
    pdl = pad_lines(ref_sel[:5], tok, max_len=32)
    okp = True
    for i, ln in enumerate(ref_sel[:5]):
        ids = tok(ln)["input_ids"][:32]
        n = len(ids)
        row = ids + [eos] * (32 - n)
        lab = ids + [-100] * (32 - n)
        okp &= pdl.input_ids[i].tolist() == row and pdl.labels[i].tolist() == lab
        okp &= pdl.attention_mask[i].tolist() == [1] * n + [0] * (32 - n)
    record(okp, area, "pad_lines: truncated, right-padded with eos, padding unlabelled", "5 lines")
    from mmpreproj.train import build_examples

    be = build_examples(get_preset("mini", num_lines=20, max_len=32), tok)
    be_p = build_examples(get_preset("mini", num_lines=20, max_len=32, packing=True), tok)
    record(
        torch.equal(be.input_ids, pdl_all := pad_lines(ref_sel, tok, max_len=32).input_ids)
        and torch.equal(be_p.input_ids, pk.input_ids),
        area,
        "build_examples(mini preset) = pad_lines / pack_lines of the selected lines",
        f"padded {tuple(be.input_ids.shape)} vs {tuple(pdl_all.shape)}, packed {tuple(be_p.input_ids.shape)}",
    )
    kw = dict(num_lines=40, max_len=32, steps=3, warmup_steps=0)
    c, r = run("pack-run", examples=None, packing=True, **kw)
    record(
        r.status == "completed" and r.metrics["tokens"] == 3 * 4 * 32,
        area,
        "packing=True trains on full blocks (tokens = steps x batch x max_len)",
        f"tokens={r.metrics['tokens']}",
    )
    c1, r1 = run("trim-on", examples=EXPAD, batch_size=8, trim_padding=True)
    c2, r2 = run("trim-off", examples=EXPAD, batch_size=8, trim_padding=False)
    l1, l2 = [e["loss"] for e in log_of(c1.out)], [e["loss"] for e in log_of(c2.out)]
    dl = max(abs(a - b) for a, b in zip(l1, l2))
    record(dl < 1e-5, area, "trim_padding on = off (docstring: same loss)", f"max loss diff {dl:.1e}")


# ----------------------------------------------------------------------------------------------------- (g) run folder
def cases_folder():
    area = "folder"
    c, r = run("folder", save_every=2)
    files = sorted(os.listdir(c.out))
    want_files = {"adapter", "train_config.json", "metrics.json", "log.jsonl", CHECKPOINT_NAME}
    record(want_files <= set(files), area, "run folder holds what TrainConfig.out lists", f"{files}")
    met = json.loads(Path(c.out, "metrics.json").read_text())
    log = log_of(c.out)
    record(
        met["final_loss"] == log[-1]["loss"] == r.final_loss and met["steps"] == r.steps == 6 == len(log),
        area,
        "metrics.final_loss = last log loss = RunResult.final_loss; steps",
        f"final_loss={met['final_loss']:.6f} steps={met['steps']} log lines={len(log)} status={met['status']}",
    )
    record(
        [e["step"] for e in log] == list(range(1, 7)),
        area,
        "log.jsonl: one line per optimizer step (1-based)",
        f"keys={sorted(log[0])}",
    )
    back = TrainConfig.from_json(Path(c.out, "train_config.json"))
    diffs = {k: v for k, v in back.differences(c).items()}
    record(not diffs, area, "train_config.json reads back as the run's TrainConfig", f"differences {diffs}")
    ck = load_checkpoint(Path(c.out) / CHECKPOINT_NAME)
    record(ck.get("step") == 6, area, "save_every=2: checkpoint.pt at the end (step 6)", f"step={ck.get('step')}")
    c0, r0 = run("folder-never", save_every=0)
    record(
        not (Path(c0.out) / CHECKPOINT_NAME).exists(),
        area,
        "save_every=0: no checkpoint.pt (docstring: 0 = never)",
        f"{sorted(os.listdir(c0.out))}",
    )
    cs = cfg("folder-stop", stop_at=3, save_every=0)
    rs = train(cs, examples=EX4)
    ck = Path(cs.out) / CHECKPOINT_NAME
    doc = " ".join((TrainConfig.__doc__ or "").split())  # added after the first run: what the docstring now states
    none_stated = "unless `save_every=0`, which writes none" in doc and not ck.exists() and rs.steps == 3
    record(
        (ck.exists() and load_checkpoint(ck)["step"] == 3 and rs.steps == 3) or none_stated,
        area,
        "stop_at=3 writes checkpoint.pt even with save_every=0 (docstring: checkpoint written)"
        + (" -- the docstring now says none is written" if none_stated else ""),
        f"steps={rs.steps} status={rs.status} checkpoint={ck.exists()} (TrainConfig.stop_at: 'checkpoint written'; "
        "save_every / `train --help`: '0 = never (then --resume has nothing to continue from)')",
    )
    t, msg = err_line(lambda: train(cs.replace(stop_at=None, resume=True, overwrite=False), examples=EX4))
    record(
        t is not None and "checkpoint" in msg,
        area,
        "resume after stop_at with save_every=0: refused (no checkpoint), one line",
        f"{t}: {msg}"[:170] if t else "resumed",
    )
    cfg_ad = json.loads(Path(c.out, "adapter", "adapter_config.json").read_text())
    record(
        cfg_ad.get("peft_type") == "PREPROJ", area, "adapter/ is a peft PREPROJ folder", f"{cfg_ad.get('peft_type')}"
    )
    record(not r.model.training, area, "RunResult.model in eval mode (docstring)", f"training={r.model.training}")
    record(
        met["first_loss"] == log[0]["loss"] and met["tokens"] == 6 * 4 * 24 == log[-1]["tokens"],
        area,
        "metrics first_loss = log step 1; tokens = steps x batch x 24 real tokens",
        f"first_loss={met['first_loss']:.6f} tokens={met['tokens']}",
    )
    ids = EXPAD.input_ids[:3, :16]
    for method in ["preproj_skip", "lora", "preproj_lora", "skip"]:
        cm, rm = run(f"reload-{method}", method=method, lr=5e-3)
        if method == "lora":
            record(
                isinstance(rm.model, peft.PeftModel),
                area,
                "lora: RunResult.model is a PeftModel (docstring)",
                type(rm.model).__name__,
            )
        with torch.no_grad():
            want = rm.model(input_ids=ids).logits
            m2 = mmpreproj.load_adapter(fresh_base(), cm.out).eval()
            got = m2(input_ids=ids).logits
            base_l = fresh_base()(input_ids=ids).logits
        d = (want - got).abs().max().item()
        moved = (want - base_l).abs().max().item()
        record(
            d == 0.0 and moved > 1e-3,
            area,
            f"{method}: load_adapter(base, run folder) gives the trained model's logits",
            f"max abs diff {d:.1e} (trained vs base {moved:.2e})",
        )
    torch.manual_seed(1234)
    st = torch.get_rng_state()
    import random

    random.seed(5)
    pst = random.getstate()
    run("rng", steps=2, warmup_steps=0)
    record(
        torch.equal(st, torch.get_rng_state()) and random.getstate() == pst,
        area,
        "the caller's torch and python RNG states are restored after train (docstring)",
        "",
    )
    import numpy as np

    np.random.seed(3)
    torch.manual_seed(99)
    st, nst = torch.get_rng_state(), np.random.get_state()
    t, msg = err_line(lambda: train(cfg("det-raise", steps=2, warmup_steps=0), examples=EX4))  # first: a run
    t, msg = err_line(lambda: train(cfg("det-raise", steps=2, warmup_steps=0, overwrite=False), examples=EX4))
    t2, msg2 = err_line(lambda: run("det-nan", lr=1e30, max_grad_norm=None))
    same_np = all(
        np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b for a, b in zip(nst, np.random.get_state())
    )
    record(
        t is not None and t2 is not None and torch.equal(st, torch.get_rng_state()) and same_np,
        area,
        "RNG states (torch, numpy) restored when train raises (docstring: returns or raises)",
        f"raised {t} and {t2}",
    )
    ca, _ = run("det-a")
    cb, _ = run("det-b")
    cc, _ = run("det-c", seed=7)
    wa, wb, wc = trained_weights(ca.out), trained_weights(cb.out), trained_weights(cc.out)
    record(
        maxdiff(wa, wb) == 0.0 and maxdiff(wa, wc) > 0,
        area,
        "same seed: bit-identical runs; another seed: different",
        f"same {maxdiff(wa, wb):.1e}, seed 7 {maxdiff(wa, wc):.1e}",
    )
    # non-finite loss: stops before the optimizer step, names the step
    t, msg = "", ""
    try:
        run("nan", lr=1e30, steps=6, warmup_steps=0, max_grad_norm=None, save_every=1)
        t = None
    except NonFiniteLossError as e:
        t, msg = e, str(e)
    ok = isinstance(t, NonFiniteLossError) and t.step >= 2
    ck = None
    if ok and t.checkpoint:
        w = load_checkpoint(t.checkpoint)["trainable"]
        ck = all(torch.isfinite(v).all() for v in w.values())
    record(
        ok and ck is not False,
        area,
        "lr=1e30: NonFiniteLossError with the step; any checkpoint left has finite weights",
        (f"step={t.step} value={t.value} checkpoint={t.checkpoint} finite={ck}" if ok else f"{t!r} {msg}")[:200],
    )


def cases_hf_trainer():
    """peft-guide: the PeftModel goes into a plain transformers.Trainer; with no warmup both use the same cosine."""
    area = "hf-trainer"
    from transformers import Trainer, TrainingArguments

    for wd, clip in [(0.0, 1.0), (0.1, 0.05)]:
        init = init_run(f"hf{wd}")
        c, r = run(f"hf-ours-{wd}", steps=6, warmup_steps=0, lr=1e-3, weight_decay=wd, max_grad_norm=clip)
        model = peft.PeftModel.from_pretrained(fresh_base(), str(Path(init) / "adapter"), is_trainable=True)
        rows = [
            {"input_ids": EX4.input_ids[i], "attention_mask": EX4.attention_mask[i], "labels": EX4.labels[i]}
            for i in range(4)
        ]
        args = TrainingArguments(
            str(TMP / f"hf-{wd}"),
            per_device_train_batch_size=4,
            max_steps=6,
            learning_rate=1e-3,
            lr_scheduler_type="cosine",
            warmup_steps=0,
            weight_decay=wd,
            adam_beta1=0.9,
            adam_beta2=0.999,
            adam_epsilon=1e-8,
            max_grad_norm=clip,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            seed=0,
            disable_tqdm=True,
        )
        tr = Trainer(model=model, args=args, train_dataset=rows)
        from transformers.trainer_callback import PrinterCallback

        tr.remove_callback(PrinterCallback)
        tr.train()
        hf_l = [e["loss"] for e in tr.state.log_history if "loss" in e]
        hf_lr = [e["learning_rate"] for e in tr.state.log_history if "learning_rate" in e]
        ours = log_of(c.out)
        dl = max(abs(a - b["loss"]) for a, b in zip(hf_l, ours))
        w_hf = {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}
        w_ours = {
            k: p.detach().clone()
            for k, p in peft.PeftModel.from_pretrained(fresh_base(), str(Path(c.out) / "adapter")).named_parameters()
            if "preproj" in k
        }
        dw = maxdiff(w_hf, w_ours)
        record(
            len(hf_l) == 6 and dl < 1e-4 and dw < 1e-5,
            area,
            f"train() = transformers.Trainer on the PeftModel (wd={wd}, clip={clip}, cosine, no warmup)",
            f"max loss diff {dl:.1e}, final weights max abs diff {dw:.1e}, "
            f"Trainer LRs {[f'{x:.2e}' for x in hf_lr[:3]]} ours {[f'{x:.2e}' for x in [e['lr'] for e in ours[:3]]]}",
        )


def main():
    global ONLY
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    ONLY = ap.parse_args().only
    t0 = time.time()
    try:
        for name, fn in [
            ("config", cases_config),
            ("schedule", cases_schedule),
            ("optimizer", cases_optimizer),
            ("frozen", cases_frozen),
            ("resume", cases_resume),
            ("equivalence", cases_equivalence),
            ("folder", cases_folder),
            ("hf-trainer", cases_hf_trainer),
        ]:
            if want(name):
                try:
                    fn()
                except Exception:  # noqa: BLE001
                    record(False, "harness", name, "HARNESS ERROR " + traceback.format_exc(limit=3)[-400:])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    n = len(RESULTS)
    p = sum(r[0] for r in RESULTS)
    print(f"TOTAL {n}: {p} PASS, {n - p} FAIL  ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
