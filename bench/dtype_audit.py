"""Dtype audit: mmpreproj's pre-projection + content skip across host dtypes, autocast, casts after inject,
save/load across dtypes, quantized frozen bases, torch.compile and the KV cache, against references this
project did not write.

Run:  PYTHONPATH=. OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python bench/dtype_audit.py [--only SUBSTR]

Written by an independent audit from the docs alone (README.md, docs/api.md, docs/limits.md,
docs/performance.md "Precision", docs/troubleshooting.md, docs/peft-guide.md "Deploy" and "Quantized frozen
base", docs/getting-started.md, CHANGELOG.md on `autocast_adapter_dtype`, and the public docstrings of
`PreProjConfig`, `modules.compute`, `modules.preproj`, `modules.skip`, `integrations.quantized`); the
expectations are the auditor's. The reference for the method is the paper's formula written here as hooks on an
untouched copy of the base (`x~ = x^ + W_down SiLU(W_up x^)` fed to attention, `W_skip x~` added to its
output), computed in the dtype the docs name: "input" = the activations' dtype (autocast's when on) from the
fp32 master weights, "float32" = inputs cast to fp32 and back. Where two dtypes round differently, a case
passes when the library is within 1e-6 of the documented reference or at most half as far from it as from the
other reading (both distances printed), so a wrong compute dtype fails. Every model is tiny, random, built from
a config in code; nothing is downloaded. Areas:
  * host:    fp32 / bf16 / fp16 GPT-NeoX and Llama: identity init == base bit for bit; fp32 master weights;
             x~ and the skip in the documented dtype (module level and logits, both compute_dtype modes);
             gradients land in the fp32 weights and match the hand reference's (5%: docs/performance.md).
  * autocast: fp32 host under torch.autocast("cpu", bf16): forward and gradients vs the hand reference;
             peft's autocast_adapter_dtype True / False (get_peft_model, add_adapter, from_pretrained) against
             LoRA under the same call.
  * cast:    `.to(bf16)` / `.half()` / `.float()` after inject, each after a cached no-grad forward: the next
             output uses the cast weights; in-place writes, load_adapter, foreach and fused AdamW steps after a
             cached forward: no stale kept cast.
  * save:    adapters saved on bf16 / fp32 hosts loaded on the other: file dtypes, loaded dtypes, values.
  * quant:   torchao int8 and bitsandbytes NF4 / FP4 bases (and transformers' BitsAndBytesConfig 4-bit load with
             disable_cpu_4bit_packing, refused after a repacking forward): identity exact, gradients == a float
             base holding the dequantized weights, training leaves the base unchanged, modules_to_save of a
             quantized module refused, adapter round trip bit-exact, save_pretrained refused, unload gives the
             same parameters; a 4-bit base survives an eval no-grad forward before training.
  * compile: torch.compile (aot_eager and inductor) == eager forward, training step, bf16 weight change seen
             after compile without a recompile, static-cache compiled generate == eager tokens, compiles do not
             grow with tokens; torch.export bit-equal in fp32 and bf16; inject of a compiled model refused.
  * kv:      bf16 KV-cache decode == no-cache recomputation (relative to the base's own cache error); cache
             bytes and dtypes with and without the adapter equal.
One line per case: PASS/FAIL/SKIP | area | case | details; then TOTAL. `bench/results/dtype_audit.txt` is its output.

Result on commit 730f82a (the library as audited; CPU with AVX512-BF16 and AMX, one thread, 42 s with a warm
inductor cache, about 90 s cold): TOTAL 99: 98 PASS, 1 FAIL, 0 SKIP. bitsandbytes 0.50 ran on this CPU (int8,
NF4, FP4 and a transformers BitsAndBytesConfig 4-bit load all ran: no SKIP). Every numeric reference comparison
is bit-exact except where a kernel differs by construction (inductor fp32 1.8e-7, inductor bf16 3.9e-3 against the
base's own 2.9e-3, int8 gradients 2.5e-7 relative to the float base holding the dequantized weights, bf16/fp16
gradients <= 4.9e-3 relative against the hand reference's): both compute_dtype modes on bf16/fp16 hosts equal the
formula in the dtype the docs name (the other reading is 1.6e-2 away on x~), autocast equals a bf16 hand reference,
kept casts never go stale (in-place writes, load_adapter, load_state_dict with and without assign, foreach and
fused AdamW, gradient checkpointing both ways, .to/.half/.float, compiled graphs), autocast_adapter_dtype matches
LoRA in all three peft calls, K/V-cache bytes are equal, compiled static-cache decode does not recompile per token.
The one FAIL:
  FAIL | autocast | fp32 host under bf16 autocast, compute_dtype=input: x~ and skip in the host's dtype (perf.md)
  Under autocast the default mode returns x~ and the skip in bf16, not in the fp32 host's dtype as
  docs/performance.md "Precision" says ("`x~` and the skip come out in the host's dtype"); the PreProjection and
  ContentSkip docstrings say the opposite ("returns x~ in that dtype", the autocast's), and the logits are
  bit-equal to the hand reference either way (Q/K/V and the skip would cast x~ to bf16 under autocast anyway).
  Reading: a docs error (one sentence of performance.md), not a library bug.
Harness notes: the first draft's "float32"-under-autocast reference rounded x^ to bf16 before the residual; the
PreProjection docstring says the input is cast to the weights' dtype (fp32) and back, and the reference now does
so (the library was then bit-equal). quantize_frozen_base refuses an injected model with RuntimeError (the
docstring names no type; accepted here).
Re-run after the docs fix (a61a090; bench/results/dtype_audit.txt, the first run: dtype_audit_before.txt): TOTAL 99:
98 PASS, 1 FAIL, the same case: it checks the library against docs/performance.md's former sentence (host's dtype);
the sentence now says the autocast dtype, which is what this case measures.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import peft  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers as tf  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import mmpreproj  # noqa: E402
from mmpreproj import PreProjConfig  # noqa: E402

tf.utils.logging.disable_progress_bar()

CASES: list[tuple[str, str, object]] = []
RESULTS: list[str] = []
V = 128
IDS = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1))
IDENTITY = PreProjConfig(init="identity", skip_init_std=0.0)


class Skip(Exception):
    pass


def case(area, name):
    def deco(fn):
        CASES.append((area, name, fn))
        return fn

    return deco


def check(cond, detail):
    if not cond:
        raise AssertionError(detail)
    return detail


# ----------------------------------------------------------------------------------------------- models


def neox(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    cfg = tf.GPTNeoXConfig(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    return tf.GPTNeoXForCausalLM(cfg).to(dtype).eval()


def llama(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    cfg = tf.LlamaConfig(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return tf.LlamaForCausalLM(cfg).to(dtype).eval()


HOSTS = {"neox": neox, "llama": llama}


def layers(model):
    inner = model.base_model.model if isinstance(model, peft.PeftModel) else model
    return inner.gpt_neox.layers if hasattr(inner, "gpt_neox") else inner.model.layers


def attn(layer):
    return layer.attention if hasattr(layer, "attention") else layer.self_attn


def adapter_weights(model, name="default"):
    """Per block: (W_up, W_down, W_skip) of the injected model (the names its state dict shows)."""
    out = []
    for lay in layers(model):
        a = attn(lay)
        out.append((a.preproj[name].up.weight, a.preproj[name].down.weight, a.preproj_skip[name].proj.weight))
    return out


def adapter_params(model):
    return [p for ws in adapter_weights(model) for p in ws]


def perturb(model, seed=3, scale=0.6):
    """Adapter weights of O(1) effect (so compute dtypes are told apart); fp32 master weights kept."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapter_params(model):
            p.copy_(torch.randn(p.shape, generator=g) * scale / p.shape[1] ** 0.5)
    return model


def build(host="neox", dtype=torch.float32, cfg=None, scale=0.6):
    """(base copy untouched, injected model with perturbed adapter)."""
    base = HOSTS[host](dtype)
    ref = copy.deepcopy(base)
    model = mmpreproj.inject(base, cfg or PreProjConfig())
    if scale:
        perturb(model, scale=scale)
    return ref, model


def logits(model, ids=IDS, **kw):
    with torch.no_grad():
        return model(input_ids=ids, **kw).logits


def mx(a, b):
    return (a.double() - b.double()).abs().max().item()


# ----------------------------------------------------------------------------------------------- reference


def ref_adapter(xh, w, mode):
    """The paper's modules on the norm output `xh`, in the dtype the docs give for `mode`.

    input:   compute in xh's dtype (autocast's when on), x~ = xh + delta (the residual in the promoted dtype);
    float32: compute in float32 (autocast's dtype when on: "autocast still decides the matmul dtype"), cast back;
    fp32:    (an alternative reading for contrast) everything in float32 even under autocast, cast back.
    """
    up, down, skip = w
    ac = torch.is_autocast_enabled("cpu")
    acd = torch.get_autocast_dtype("cpu")
    with torch.autocast("cpu", enabled=False):
        if mode == "input":
            cdt = acd if ac else xh.dtype
            x = xh.to(cdt)
            d = F.linear(F.silu(F.linear(x, up.to(cdt))), down.to(cdt))
            xt = xh + d if ac else x + d  # under autocast the residual promotes, as a host's residual add does
            s = F.linear(xt.to(cdt), skip.to(cdt))
        else:  # "float32" (autocast still picks the matmul dtype) or "fp32" (never autocast: the contrast)
            cdt = acd if ac and mode == "float32" else torch.float32
            x = xh.float()  # "inputs are cast to the weights' dtype"
            d = F.linear(F.silu(F.linear(x.to(cdt), up.to(cdt))), down.to(cdt))
            xt = (x + d.float()).to(xh.dtype)  # "... and back"
            s = F.linear(xt.float().to(cdt), skip.to(cdt)).to(xt.dtype)
    return xt, s


def ref_skip(xt, skip, mode):
    """W_skip x~ for a given x~ in the documented dtype (no autocast here), returned in x~'s dtype."""
    cdt = xt.dtype if mode == "input" else torch.float32
    return F.linear(xt.to(cdt), skip.to(cdt)).to(xt.dtype)


def hook_reference(ref_model, weights, mode):
    """Hooks on the untouched base copy: attention sees x~, its output gets + W_skip x~."""
    handles = []
    for lay, w in zip(layers(ref_model), weights):
        a = attn(lay)
        box = {}

        def pre(mod, args, kwargs, w=w, box=box):
            if args:
                xt, s = ref_adapter(args[0], w, mode)
                args = (xt,) + tuple(args[1:])
            else:
                xt, s = ref_adapter(kwargs["hidden_states"], w, mode)
                kwargs = dict(kwargs, hidden_states=xt)
            box["s"] = s
            return args, kwargs

        def post(mod, args, kwargs, out, box=box):
            s = box.pop("s")
            if isinstance(out, tuple):
                return (out[0] + s,) + tuple(out[1:])
            return out + s

        handles.append(a.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(a.register_forward_hook(post, with_kwargs=True))
    return handles


def reference_logits(ref_model, weights, mode, ids=IDS, grad=False):
    hs = hook_reference(ref_model, weights, mode)
    try:
        if grad:
            return ref_model(input_ids=ids).logits
        with torch.no_grad():
            return ref_model(input_ids=ids).logits
    finally:
        for h in hs:
            h.remove()


def judge(lib, ref, alt, what):
    """lib within 1e-6 of ref, or at most half as far from ref as from the alternative reading."""
    d_ref, d_alt, d_refalt = mx(lib, ref), mx(lib, alt), mx(ref, alt)
    msg = f"{what}: max|lib-ref| {d_ref:.2e}, max|lib-alt| {d_alt:.2e} (ref vs alt {d_refalt:.2e})"
    check(torch.isfinite(lib).all().item(), msg + " non-finite")
    return check(d_ref <= 1e-6 or d_ref <= 0.5 * d_alt, msg)


def capture(model):
    """Per block: the wrapper's input x^ and what the wrapped attention received (x~), from a forward."""
    got, hs = [], []
    for lay in layers(model):
        a = attn(lay)
        box = {}
        got.append(box)

        def pre_outer(mod, args, kwargs, box=box):
            box["xh"] = (args[0] if args else kwargs["hidden_states"]).detach()

        def pre_inner(mod, args, kwargs, box=box):
            box["xt"] = (args[0] if args else kwargs["hidden_states"]).detach()

        def post_inner(mod, args, kwargs, out, box=box):
            box["attn"] = (out[0] if isinstance(out, tuple) else out).detach()

        def post_outer(mod, args, kwargs, out, box=box):
            box["out"] = (out[0] if isinstance(out, tuple) else out).detach()

        hs += [
            a.register_forward_pre_hook(pre_outer, with_kwargs=True),
            a.base_layer.register_forward_pre_hook(pre_inner, with_kwargs=True),
            a.base_layer.register_forward_hook(post_inner, with_kwargs=True),
            a.register_forward_hook(post_outer, with_kwargs=True),
        ]
    return got, hs


def cache_tensors(cache):
    if hasattr(cache, "layers"):
        return [t for lay in cache.layers for t in (lay.keys, lay.values) if t is not None]
    return [t for kv in cache for t in kv]


# ----------------------------------------------------------------------------------------------- host


for _host, _dt in [
    ("neox", torch.float32),
    ("neox", torch.bfloat16),
    ("neox", torch.float16),
    ("llama", torch.bfloat16),
]:

    @case("host", f"{_host} {str(_dt)[6:]}: identity init == base bit for bit")
    def _(host=_host, dt=_dt):
        base = HOSTS[host](dt)
        want = logits(base)
        model = mmpreproj.inject(base, IDENTITY)
        got = logits(model)
        return check(torch.equal(got, want) and got.dtype == dt, f"max diff {mx(got, want):.2e}, dtype {got.dtype}")


for _dt in (torch.bfloat16, torch.float16):

    @case("host", f"neox {str(_dt)[6:]}: master weights stay float32 (inject and get_peft_model), base unchanged")
    def _(dt=_dt):
        m1 = mmpreproj.inject(neox(dt))
        m2 = peft.get_peft_model(neox(dt), PreProjConfig())
        dts = {p.dtype for m in (m1, m2) for p in adapter_params(m)}
        base_dts = {p.dtype for n, p in m1.named_parameters() if not p.requires_grad}
        return check(dts == {torch.float32} and base_dts == {dt}, f"adapter {dts}, base {base_dts}")


for _host, _dt, _mode in [
    ("neox", torch.bfloat16, "input"),
    ("neox", torch.bfloat16, "float32"),
    ("neox", torch.float16, "input"),
    ("llama", torch.bfloat16, "input"),
    ("llama", torch.bfloat16, "float32"),
]:

    @case("host", f"{_host} {str(_dt)[6:]} compute_dtype={_mode}: per-block x~ and skip vs formula (no grad)")
    def _(host=_host, dt=_dt, mode=_mode):
        _, model = build(host, dt, PreProjConfig(compute_dtype=mode))
        got, hs = capture(model)
        logits(model)
        for h in hs:
            h.remove()
        alt = "float32" if mode == "input" else "input"
        msgs = []
        for i, (box, w) in enumerate(zip(got, adapter_weights(model))):
            xt_ref, s_ref = ref_adapter(box["xh"], w, mode)
            xt_alt, s_alt = ref_adapter(box["xh"], w, alt)
            check(box["xt"].dtype == dt, f"block {i}: x~ dtype {box['xt'].dtype}, host {dt}")
            msgs.append(judge(box["xt"], xt_ref, xt_alt, f"b{i} x~"))
            a = box["attn"]  # the wrapper's output is attention's + the skip of x~ (the lib's own x~ here)
            s_ref2 = ref_skip(box["xt"], w[2], mode)
            s_alt2 = ref_skip(box["xt"], w[2], alt)
            msgs.append(judge(box["out"], a + s_ref2, a + s_alt2, f"b{i} attn+skip"))
        return "; ".join(msgs[:3])

    @case("host", f"{_host} {str(_dt)[6:]} compute_dtype={_mode}: logits vs hooked reference (no grad)")
    def _(host=_host, dt=_dt, mode=_mode):
        ref, model = build(host, dt, PreProjConfig(compute_dtype=mode))
        alt = "float32" if mode == "input" else "input"
        w = adapter_weights(model)
        got = logits(model)
        return judge(got, reference_logits(ref, w, mode), reference_logits(ref, w, alt), "logits")


@case("host", "neox fp32 perturbed: logits == hooked reference within fp32 rounding (1e-5)")
def _():
    ref, model = build("neox", torch.float32)
    got, want = logits(model), reference_logits(ref, adapter_weights(model), "input")
    base = logits(ref)
    d = mx(got, want)
    return check(d <= 1e-5 and mx(got, base) > 1e-2, f"max|lib-ref| {d:.2e}, adapter moved logits {mx(got, base):.2e}")


for _host, _dt, _mode in [
    ("neox", torch.float32, "input"),
    ("neox", torch.bfloat16, "input"),
    ("neox", torch.bfloat16, "float32"),
    ("neox", torch.float16, "input"),
    ("llama", torch.bfloat16, "input"),
]:

    @case("host", f"{_host} {str(_dt)[6:]} compute_dtype={_mode}: grads in fp32 weights == hand reference's")
    def _(host=_host, dt=_dt, mode=_mode):
        ref, model = build(host, dt, PreProjConfig(compute_dtype=mode))
        model.train()
        out = model(input_ids=IDS, labels=IDS)
        out.loss.backward()
        leaves = [tuple(p.detach().clone().requires_grad_(True) for p in ws) for ws in adapter_weights(model)]
        lg = reference_logits(ref, leaves, mode, grad=True)
        ref_loss = F.cross_entropy(lg[:, :-1].float().reshape(-1, V), IDS[:, 1:].reshape(-1))
        ref_loss.backward()
        worst, msgs = 0.0, []
        for p, q in zip(adapter_params(model), [t for ws in leaves for t in ws]):
            check(
                p.grad is not None and p.grad.dtype == torch.float32,
                f"grad {None if p.grad is None else p.grad.dtype}",
            )
            rel = ((p.grad - q.grad).norm() / q.grad.norm()).item()
            worst = max(worst, rel)
        frozen = [n for n, p in model.named_parameters() if not p.requires_grad and p.grad is not None]
        tol = 1e-4 if dt == torch.float32 else 0.05
        msgs = f"loss lib {out.loss.item():.5f} ref {ref_loss.item():.5f}; worst rel grad err {worst:.2e} (tol {tol})"
        return check(worst <= tol and not frozen and abs(out.loss.item() - ref_loss.item()) < 2e-2, msgs)


def wide(dtype=torch.float32, seed=0):
    """d = 768 (Pythia-160M's width), one block: where the docs' prepacked bf16 path matters."""
    torch.manual_seed(seed)
    cfg = tf.GPTNeoXConfig(
        vocab_size=V,
        hidden_size=768,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=12,
        max_position_embeddings=256,
    )
    return tf.GPTNeoXForCausalLM(cfg).to(dtype).eval()


HOSTS["wide"] = wide


@case("host", "d=768 bf16, 1 / 128 rows, first and kept-cast forwards: x~ and skip bit-identical to F.linear")
def _():
    ref, model = build("wide", torch.bfloat16)
    msgs = []
    for n in (1, 128):
        ids = torch.randint(0, V, (1, n), generator=torch.Generator().manual_seed(n))
        for rep in ("first", "kept"):
            got, hs = capture(model)
            logits(model, ids)
            for h in hs:
                h.remove()
            box, w = got[0], adapter_weights(model)[0]
            d1 = mx(box["xt"], ref_adapter(box["xh"], w, "input")[0])
            d2 = mx(box["out"], box["attn"] + ref_skip(box["xt"], w[2], "input"))
            msgs.append(f"{n} rows {rep}: {d1:.1e}/{d2:.1e}")
            check(d1 == 0 and d2 == 0, "; ".join(msgs))
    return "max|lib-ref| x~/skip " + "; ".join(msgs)


@case("host", "PreProjConfig(compute_dtype='bfloat16') refused naming compute_dtype")
def _():
    try:
        PreProjConfig(compute_dtype="bfloat16")
    except (ValueError, TypeError) as err:
        return check("compute_dtype" in str(err), f"refused: {str(err)[:120]}")
    raise AssertionError("accepted compute_dtype='bfloat16' (docstring: 'input' or 'float32')")


@case("host", "bf16 host: a cached no-grad forward adds nothing to state_dict; a deepcopy then changed uses its own")
def _():
    ref, model = build("neox", torch.bfloat16)
    keys = sorted(model.state_dict())
    before = logits(model)
    same_keys = keys == sorted(model.state_dict())
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in adapter_params(twin):
            p.mul_(-1.5)
    got = logits(twin)
    want = reference_logits(ref, adapter_weights(twin), "input")
    orig = logits(model)
    kept = torch.equal(orig, before)
    msg = f"keys unchanged {same_keys}; copy max|lib-ref(new)| {mx(got, want):.2e}; original kept {kept}"
    return check(same_keys and mx(got, want) == 0 and torch.equal(orig, before), msg)


@case("host", "bf16 host, two adapters: cached forwards on both, change A in place, switch back: new A used")
def _():
    ref, model = build("neox", torch.bfloat16)
    src = perturb(mmpreproj.inject(neox(torch.bfloat16)), seed=21)
    with tempfile.TemporaryDirectory() as d:
        mmpreproj.save_adapter(src, d + "/b")
        mmpreproj.load_adapter(model, d + "/b", adapter_name="b")
    logits(model)
    mmpreproj.set_adapter(model, "b")
    got_b = logits(model)
    with torch.no_grad():
        for p in adapter_params(model):  # adapter "default"
            p.mul_(-1.5)
    mmpreproj.set_adapter(model, "default")
    got = logits(model)
    want = reference_logits(ref, adapter_weights(model), "input")
    want_b = reference_logits(ref, adapter_weights(model, "b"), "input")
    return check(
        mx(got, want) == 0 and mx(got_b, want_b) == 0, f"A max|lib-ref| {mx(got, want):.1e}; B {mx(got_b, want_b):.1e}"
    )


@case("host", "bf16 host: adapter_disabled and unload after cached forwards == the base bit for bit")
def _():
    ref, model = build("neox", torch.bfloat16)
    base = logits(ref)
    logits(model)
    with mmpreproj.adapter_disabled(model):
        off = logits(model)
    on = logits(model)
    mmpreproj.unload(model)
    back = logits(model)
    moved = mx(on, base)
    return check(
        torch.equal(off, base) and torch.equal(back, base) and moved > 1e-2,
        f"disabled diff {mx(off, base):.1e}; unload diff {mx(back, base):.1e}; adapter on moved {moved:.1e}",
    )


@case("host", "bf16 host: inference_mode forward, then a training step and a no-grad forward work and agree")
def _():
    ref, model = build("neox", torch.bfloat16)
    with torch.inference_mode():
        model(input_ids=IDS)
    model.train()
    model(input_ids=IDS, labels=IDS).loss.backward()
    g = [p.grad.clone() for p in adapter_params(model)]
    torch.optim.SGD(adapter_params(model), lr=0.1).step()
    model.eval()
    got = logits(model)
    with torch.inference_mode():
        got2 = model(input_ids=IDS).logits
    want = reference_logits(ref, adapter_weights(model), "input")
    ok = all(x.abs().sum() > 0 for x in g)
    return check(
        ok and mx(got, want) == 0 and mx(got2, want) == 0,
        f"grads {ok}; no_grad {mx(got, want):.1e}; inference_mode {mx(got2, want):.1e}",
    )


# ----------------------------------------------------------------------------------------------- autocast


for _mode in ("input", "float32"):

    @case("autocast", f"fp32 neox under autocast(cpu, bf16), compute_dtype={_mode}: logits vs hand reference")
    def _(mode=_mode):
        ref, model = build("neox", torch.float32, PreProjConfig(compute_dtype=mode))
        w = adapter_weights(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = logits(model)
            want = reference_logits(ref, w, mode)
            alt = reference_logits(ref, w, "fp32")
        return judge(got, want, alt, "logits (alt: adapter in fp32 under autocast)")

    @case("autocast", f"fp32 neox under autocast(cpu, bf16), compute_dtype={_mode}: grads vs hand reference (5%)")
    def _(mode=_mode):
        ref, model = build("neox", torch.float32, PreProjConfig(compute_dtype=mode))
        model.train()
        leaves = [tuple(p.detach().clone().requires_grad_(True) for p in ws) for ws in adapter_weights(model)]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lg = model(input_ids=IDS).logits
            lr = reference_logits(ref, leaves, mode, grad=True)
        for x in (lg, lr):
            F.cross_entropy(x[:, :-1].float().reshape(-1, V), IDS[:, 1:].reshape(-1)).backward()
        worst = max(
            ((p.grad - q.grad).norm() / q.grad.norm()).item()
            for p, q in zip(adapter_params(model), [t for ws in leaves for t in ws])
        )
        dts = {p.grad.dtype for p in adapter_params(model)} | {p.dtype for p in adapter_params(model)}
        return check(worst <= 0.05 and dts == {torch.float32}, f"worst rel grad err {worst:.2e}; dtypes {dts}")


@case("autocast", "fp32 neox under autocast(cpu, fp16): logits vs hand reference")
def _():
    ref, model = build("neox", torch.float32)
    w = adapter_weights(model)
    with torch.autocast("cpu", dtype=torch.float16):
        got = logits(model)
        want = reference_logits(ref, w, "input")
        alt = reference_logits(ref, w, "fp32")
    return judge(got, want, alt, "logits (alt: adapter in fp32)")


@case("autocast", "fp32 host: no-grad fp32, then bf16 autocast, then fp32 again: each == its reference")
def _():
    ref, model = build("neox", torch.float32)
    w = adapter_weights(model)
    a = logits(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        b = logits(model)
        want_b = reference_logits(ref, w, "input")
        alt_b = reference_logits(ref, w, "fp32")
    c = logits(model)
    want_a = reference_logits(ref, w, "input")
    msg = f"fp32 {mx(a, want_a):.1e}, autocast {mx(b, want_b):.1e} (alt {mx(b, alt_b):.1e})"
    msg += f", fp32 again {mx(c, want_a):.1e}"
    return check(mx(a, want_a) <= 1e-6 and mx(b, want_b) == 0 and mx(c, want_a) <= 1e-6, msg)


for _mode in ("input", "float32"):

    @case(
        "autocast", f"fp32 host under bf16 autocast, compute_dtype={_mode}: x~ and skip in the host's dtype (perf.md)"
    )
    def _(mode=_mode):
        # docs/performance.md "Precision": "`x~` and the skip come out in the host's dtype" (here float32). The
        # PreProjection docstring says "input" returns x~ in the input's dtype "(or autocast's)": the two differ here.
        _, model = build("neox", torch.float32, PreProjConfig(compute_dtype=mode))
        seen = {}

        def grab(mod, args, out):
            seen.setdefault(type(mod).__name__, set()).add(out.dtype)

        hs = [m.register_forward_hook(grab) for n, m in model.named_modules() if n.endswith((".default",))]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits(model)
        for h in hs:
            h.remove()
        return check(all(d == {torch.float32} for d in seen.values()) and seen, f"module output dtypes {seen}")


def lora_cfg():
    return peft.LoraConfig(r=4, target_modules=["query_key_value"], init_lora_weights=True)


def lora_dtypes(m):
    return {p.dtype for n, p in m.named_parameters() if "lora_" in n}


def preproj_dtypes(m):
    return {p.dtype for n, p in m.named_parameters() if "preproj" in n}


for _flag in (True, False):

    @case("autocast", f"get_peft_model(bf16 base, autocast_adapter_dtype={_flag}): adapter dtype as LoRA's")
    def _(flag=_flag):
        ours = peft.get_peft_model(neox(torch.bfloat16), PreProjConfig(), autocast_adapter_dtype=flag)
        lora = peft.get_peft_model(neox(torch.bfloat16), lora_cfg(), autocast_adapter_dtype=flag)
        want = {torch.float32} if flag else {torch.bfloat16}  # CHANGELOG: True keeps fp32, False the attention's
        a, b = preproj_dtypes(ours), lora_dtypes(lora)
        return check(a == want and b == want, f"preproj {a}, LoRA {b}, expected {want}")

    @case("autocast", f"add_adapter / from_pretrained on bf16 base, autocast_adapter_dtype={_flag}: as LoRA's")
    def _(flag=_flag):
        want = {torch.float32} if flag else {torch.bfloat16}
        with tempfile.TemporaryDirectory() as d:
            ours = peft.get_peft_model(neox(torch.bfloat16), PreProjConfig())
            ours.add_adapter("b", PreProjConfig(), autocast_adapter_dtype=flag)
            a = {p.dtype for n, p in ours.named_parameters() if "preproj" in n and ".b." in n}
            lora = peft.get_peft_model(neox(torch.bfloat16), lora_cfg())
            lora.add_adapter("b", lora_cfg(), autocast_adapter_dtype=flag)
            b = {p.dtype for n, p in lora.named_parameters() if "lora_" in n and ".b." in n}
            peft.get_peft_model(neox(), PreProjConfig()).save_pretrained(d + "/o")
            peft.get_peft_model(neox(), lora_cfg()).save_pretrained(d + "/l")
            c = preproj_dtypes(
                peft.PeftModel.from_pretrained(neox(torch.bfloat16), d + "/o", autocast_adapter_dtype=flag)
            )
            e = lora_dtypes(
                peft.PeftModel.from_pretrained(neox(torch.bfloat16), d + "/l", autocast_adapter_dtype=flag)
            )
        msg = f"add_adapter: ours {a} LoRA {b}; from_pretrained: ours {c} LoRA {e}; expected {want}"
        return check(a == b == c == e == want, msg)


@case("autocast", "bf16 base, autocast_adapter_dtype=False (bf16 weights): logits vs formula in bf16")
def _():
    ref = neox(torch.bfloat16)
    model = peft.get_peft_model(copy.deepcopy(ref), PreProjConfig(), autocast_adapter_dtype=False)
    perturb(model)
    w = adapter_weights(model)
    return judge(logits(model), reference_logits(ref, w, "input"), reference_logits(ref, w, "float32"), "logits")


# ----------------------------------------------------------------------------------------------- casts


for _first, _then, _name in [
    (torch.float32, torch.bfloat16, ".to(torch.bfloat16)"),
    (torch.float32, torch.float16, ".half()"),
    (torch.bfloat16, torch.float32, ".float()"),
]:

    @case("cast", f"inject on {str(_first)[6:]}, cached forward, then model{_name}: output uses cast weights")
    def _(first=_first, then=_then, name=_name):
        ref, model = build("neox", first)
        logits(model)  # a no-grad forward: kept casts made
        model = model.half() if name == ".half()" else model.float() if name == ".float()" else model.to(then)
        ref = ref.to(then)
        got = logits(model)
        w = adapter_weights(model)
        wd = {p.dtype for p in adapter_params(model)}
        want = reference_logits(ref, w, "input")
        alt = reference_logits(
            ref, [tuple(t.to(first).to(then) if first != then else t for t in ws) for ws in w], "float32"
        )
        d = mx(got, want)
        return check(
            got.dtype == then and d <= (1e-5 if then == torch.float32 else 2e-2) and torch.isfinite(got).all(),
            f"adapter weights now {wd}; out {got.dtype}; max|lib-ref(cast weights)| {d:.2e}; alt {mx(got, alt):.2e}",
        )


for _dt in (torch.bfloat16, torch.float32):

    @case("cast", f"{str(_dt)[6:]} host: in-place weight change after a cached no-grad forward is used next")
    def _(dt=_dt):
        ref, model = build("neox", dt)
        before = logits(model)
        with torch.no_grad():
            for p in adapter_params(model):
                p.mul_(-1.5)
        got = logits(model)
        want = reference_logits(ref, adapter_weights(model), "input")
        d = mx(got, want)
        return check(d <= 1e-5 and mx(before, got) > 1e-2, f"max|lib-ref(new)| {d:.2e}; moved {mx(before, got):.2e}")


@case("cast", "bf16 host: load_adapter into the same model after a cached forward: new weights used")
def _():
    ref, model = build("neox", torch.bfloat16)
    src = perturb(mmpreproj.inject(neox(torch.bfloat16)), seed=11)
    with tempfile.TemporaryDirectory() as d:
        mmpreproj.save_adapter(src, d + "/a")
        logits(model)
        mmpreproj.load_adapter(model, d + "/a", adapter_name="x")
        mmpreproj.set_adapter(model, "x")
        got = logits(model)
    want = reference_logits(ref, adapter_weights(src), "input")
    return check(mx(got, want) == 0.0 and mx(got, logits(src)) == 0.0, f"max|lib-ref| {mx(got, want):.2e}")


@case("cast", "bf16 host: load_state_dict over the active adapter after a cached forward: new weights used")
def _():
    ref, model = build("neox", torch.bfloat16)
    src = perturb(mmpreproj.inject(neox(torch.bfloat16)), seed=12)
    logits(model)
    sd = {k: v for k, v in src.state_dict().items() if "preproj" in k}
    model.load_state_dict(sd, strict=False)
    got = logits(model)
    want = reference_logits(ref, adapter_weights(src), "input")
    return check(mx(got, want) == 0.0, f"max|lib-ref(new)| {mx(got, want):.2e}")


for _fused in (False, True):

    @case("cast", f"bf16 host: cached forward, train step (AdamW fused={_fused}), no-grad forward uses new weights")
    def _(fused=_fused):
        ref, model = build("neox", torch.bfloat16)
        before = logits(model)
        opt = torch.optim.AdamW(adapter_params(model), lr=1e-2, fused=fused, foreach=None if fused else True)
        model.train()
        model(input_ids=IDS, labels=IDS).loss.backward()
        opt.step()
        model.eval()
        got = logits(model)
        want = reference_logits(ref, adapter_weights(model), "input")
        d = mx(got, want)
        return check(d == 0.0 and mx(got, before) > 0, f"max|lib-ref(stepped)| {d:.2e}; moved {mx(got, before):.2e}")


for _reentrant in (True, False):

    @case(
        "cast",
        f"bf16 host, gradient checkpointing (reentrant={_reentrant}), fused AdamW: next no-grad uses new weights",
    )
    def _(reentrant=_reentrant):
        ref, model = build("neox", torch.bfloat16)
        before = logits(model)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        model.train()
        model.enable_input_require_grads() if reentrant else None
        leaves = [tuple(p.detach().clone().requires_grad_(True) for p in ws) for ws in adapter_weights(model)]
        model(input_ids=IDS, labels=IDS).loss.backward()
        lg = reference_logits(ref, leaves, "input", grad=True)
        F.cross_entropy(lg[:, :-1].float().reshape(-1, V), IDS[:, 1:].reshape(-1)).backward()
        flat = [t for ws in leaves for t in ws]
        worst = max(((p.grad - q.grad).norm() / q.grad.norm()).item() for p, q in zip(adapter_params(model), flat))
        torch.optim.AdamW(adapter_params(model), lr=1e-2, fused=True).step()
        model.eval()
        got = logits(model)
        want = reference_logits(ref, adapter_weights(model), "input")
        d = mx(got, want)
        msg = (
            f"grad rel err vs hand ref {worst:.1e}; after step max|lib-ref(new)| {d:.2e}; moved {mx(got, before):.1e}"
        )
        return check(worst <= 0.05 and d == 0 and mx(got, before) > 0, msg)


@case(
    "cast", "bf16 host: load_state_dict(assign=True) of new adapter tensors after a cached forward: new weights used"
)
def _():
    ref, model = build("neox", torch.bfloat16)
    logits(model)
    sd = {k: v.detach().clone().mul_(-1.5) for k, v in model.state_dict().items() if "preproj" in k}
    model.load_state_dict(sd, strict=False, assign=True)
    got = logits(model)
    want = reference_logits(ref, adapter_weights(model), "input")
    same = all(
        torch.equal(adapter_weights(model)[0][0], sd[k])
        for k in sd
        if k.endswith("0.attention.preproj.default.up.weight")
    )
    return check(mx(got, want) == 0 and same, f"max|lib-ref(new)| {mx(got, want):.2e}; assigned {same}")


# ----------------------------------------------------------------------------------------------- save / load


@case("save", "adapter saved from a bf16 host: file float32, loads on an fp32 host bit-exact, fp32 weights")
def _():
    src = perturb(mmpreproj.inject(neox(torch.bfloat16)))
    with tempfile.TemporaryDirectory() as d:
        mmpreproj.save_adapter(src, d + "/a")
        file_dts = {t.dtype for t in load_file(d + "/a/adapter_model.safetensors").values()}
        m = mmpreproj.load_adapter(neox(torch.float32), d + "/a")
        p = peft.PeftModel.from_pretrained(neox(torch.float32), d + "/a")
    eq = all(torch.equal(a, b) for a, b in zip(adapter_params(src), adapter_params(m)))
    eq2 = all(torch.equal(a, b) for a, b in zip(adapter_params(src), adapter_params(p)))
    dts = preproj_dtypes(m) | preproj_dtypes(p)
    return check(
        file_dts == {torch.float32} and eq and eq2 and dts == {torch.float32},
        f"file {file_dts}; loaded {dts}; values equal {eq}/{eq2}",
    )


@case("save", "adapter saved from an fp32 host loads on a bf16 host: fp32 weights, logits == formula")
def _():
    src = perturb(mmpreproj.inject(neox(torch.float32)))
    ref = neox(torch.bfloat16)
    with tempfile.TemporaryDirectory() as d:
        mmpreproj.save_adapter(src, d + "/a")
        m = mmpreproj.load_adapter(neox(torch.bfloat16), d + "/a")
        p = peft.PeftModel.from_pretrained(neox(torch.bfloat16), d + "/a")
    dts = preproj_dtypes(m) | preproj_dtypes(p)
    eq = all(torch.equal(a, b) for a, b in zip(adapter_params(src), adapter_params(m)))
    w = adapter_weights(m)
    got = logits(m)
    msg = judge(got, reference_logits(ref, w, "input"), reference_logits(ref, w, "float32"), "logits")
    return check(
        dts == {torch.float32} and eq and torch.equal(got, logits(p)), f"loaded {dts}, values equal {eq}; {msg}"
    )


@case("save", "bf16 adapter (autocast_adapter_dtype=False) saved, loaded on fp32 host: values kept exactly")
def _():
    src = peft.get_peft_model(neox(torch.bfloat16), PreProjConfig(), autocast_adapter_dtype=False)
    perturb(src)
    with tempfile.TemporaryDirectory() as d:
        src.save_pretrained(d + "/a")
        file_dts = {t.dtype for t in load_file(d + "/a/adapter_model.safetensors").values()}
        p = peft.PeftModel.from_pretrained(neox(torch.float32), d + "/a")
        lsrc = peft.get_peft_model(neox(torch.bfloat16), lora_cfg(), autocast_adapter_dtype=False)
        lsrc.save_pretrained(d + "/l")
        lp = peft.PeftModel.from_pretrained(neox(torch.float32), d + "/l")
    eq = all(torch.equal(a.float(), b.float()) for a, b in zip(adapter_params(src), adapter_params(p)))
    return check(
        eq and file_dts == {torch.bfloat16} and preproj_dtypes(p) == lora_dtypes(lp),
        f"file {file_dts}; loaded ours {preproj_dtypes(p)}, LoRA {lora_dtypes(lp)}; values equal {eq}",
    )


@case("save", "bf16 host trained adapter: save/load on a fresh bf16 host gives the same logits bit for bit")
def _():
    _, src = build("llama", torch.bfloat16)
    with tempfile.TemporaryDirectory() as d:
        mmpreproj.save_adapter(src, d + "/a")
        m = mmpreproj.load_adapter(llama(torch.bfloat16), d + "/a")
    return check(torch.equal(logits(m), logits(src)), f"max diff {mx(logits(m), logits(src)):.2e}")


@case("save", "model.to(bf16) after inject (bf16 adapter) -> save_adapter -> load on a bf16 host: values exact, fp32")
def _():
    src = perturb(mmpreproj.inject(neox()))
    src.to(torch.bfloat16)
    with tempfile.TemporaryDirectory() as d:
        mmpreproj.save_adapter(src, d + "/a")
        file_dts = {t.dtype for t in load_file(d + "/a/adapter_model.safetensors").values()}
        m = mmpreproj.load_adapter(neox(torch.bfloat16), d + "/a")
    eq = all(torch.equal(a.float(), b) for a, b in zip(adapter_params(src), adapter_params(m)))
    return check(
        eq and preproj_dtypes(m) == {torch.float32}, f"file {file_dts}; loaded {preproj_dtypes(m)}; values {eq}"
    )


# ----------------------------------------------------------------------------------------------- quantized


def quantized(scheme, host="neox"):
    from mmpreproj.integrations.quantized import quantize_frozen_base

    try:
        return quantize_frozen_base(HOSTS[host](), scheme)
    except (ImportError, RuntimeError, NotImplementedError) as err:
        raise Skip(f"{scheme} cannot run here: {type(err).__name__}: {str(err)[:120]}") from err


def dequantized(model):
    import bitsandbytes as bnb

    out = copy.deepcopy(model)
    for _name, mod in list(out.named_modules()):
        for cname, child in list(mod.named_children()):
            w = getattr(child, "weight", None)
            if (
                isinstance(child, torch.nn.Linear)
                and w is not None
                and type(w.data) is not torch.Tensor
                or (w is not None and hasattr(w, "quant_state"))
            ):
                dense = (
                    bnb.functional.dequantize_4bit(w.data, w.quant_state)
                    if hasattr(w, "quant_state")
                    else w.dequantize()
                )
                lin = torch.nn.Linear(child.in_features, child.out_features, bias=child.bias is not None)
                with torch.no_grad():
                    lin.weight.copy_(dense.float().reshape(lin.weight.shape))
                    if child.bias is not None:
                        lin.bias.copy_(child.bias.float())
                setattr(mod, cname, lin)
    return out


def qstate(model):
    from mmpreproj.integrations.quantized import is_quantized_tensor

    out = {}
    for n, p in model.named_parameters():
        if is_quantized_tensor(p):
            t = p.dequantize() if hasattr(p, "dequantize") and not hasattr(p, "quant_state") else p.data
            out[n] = (p, t.detach().clone())
    return out


for _scheme in ("int8", "nf4", "fp4"):

    @case("quant", f"{_scheme}: identity init == quantized base exactly; adapter fp32; base weights quantized")
    def _(scheme=_scheme):
        base = quantized(scheme)
        want = logits(base)
        n_q = len(qstate(base))
        model = mmpreproj.inject(base, IDENTITY)
        got = logits(model)
        return check(
            torch.equal(got, want) and n_q > 0 and preproj_dtypes(model) == {torch.float32},
            f"{n_q} quantized weights; max diff {mx(got, want):.2e}; adapter {preproj_dtypes(model)}",
        )

    @case("quant", f"{_scheme}: grads == float base holding the dequantized weights; step leaves base unchanged")
    def _(scheme=_scheme):
        qbase = quantized(scheme)
        fbase = dequantized(qbase)
        model = perturb(mmpreproj.inject(qbase))
        fmodel = mmpreproj.inject(fbase)
        with torch.no_grad():
            for a, b in zip(adapter_params(model), adapter_params(fmodel)):
                b.copy_(a)
        before = qstate(model)
        others = {
            n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad and n not in before
        }
        model.train()
        fmodel.train()
        model(input_ids=IDS, labels=IDS).loss.backward()
        fmodel(input_ids=IDS, labels=IDS).loss.backward()
        worst = max(
            ((a.grad - b.grad).norm() / b.grad.norm()).item()
            for a, b in zip(adapter_params(model), adapter_params(fmodel))
        )
        torch.optim.AdamW(adapter_params(model), lr=1e-2).step()
        after = qstate(model)
        same_q = after.keys() == before.keys() and all(torch.equal(before[k][1], after[k][1]) for k in before)
        same_o = all(torch.equal(p, others[n]) for n, p in model.named_parameters() if n in others)
        qgrads = [n for n, (p, _) in after.items() if p.requires_grad or p.grad is not None]
        msg = f"worst rel grad err vs dequantized float base {worst:.2e}; quantized kept {same_q}, others {same_o}"
        return check(worst <= 1e-4 and same_q and same_o and not qgrads, msg + f"; quantized with grad {qgrads[:2]}")

    @case("quant", f"{_scheme}: modules_to_save naming a quantized module is refused, model unchanged")
    def _(scheme=_scheme):
        base = quantized(scheme)
        tree = [n for n, _ in base.named_modules()]
        try:
            mmpreproj.inject(base, PreProjConfig(modules_to_save=["gpt_neox.layers.0.mlp"]))
        except (ValueError, TypeError) as err:
            same = tree == [n for n, _ in base.named_modules()]
            return check("quantiz" in str(err).lower() and same, f"refused: {str(err)[:110]}; unchanged {same}")
        raise AssertionError("accepted a modules_to_save holding quantized weights (they cannot train)")

    @case("quant", f"{_scheme}: save_adapter -> load_adapter on a freshly quantized base bit-exact; unload restores")
    def _(scheme=_scheme):
        base = quantized(scheme)
        want_base = logits(base)
        ptrs = {n: p for n, p in base.named_parameters()}
        model = perturb(mmpreproj.inject(base))
        got = logits(model)
        with tempfile.TemporaryDirectory() as d:
            mmpreproj.save_adapter(model, d + "/a")
            fresh = mmpreproj.load_adapter(quantized(scheme), d + "/a")
        reload_eq = torch.equal(logits(fresh), got)
        mmpreproj.unload(model)
        after = dict(model.named_parameters())
        same_params = after.keys() == ptrs.keys() and all(after[n] is ptrs[n] for n in ptrs)
        back = logits(model)
        msg = (
            f"reload bit-exact {reload_eq}; unload same parameters {same_params}; base diff {mx(back, want_base):.2e}"
        )
        return check(reload_eq and same_params and torch.equal(back, want_base), msg)


@case("quant", "int8: mmpreproj.save_pretrained refused before writing; adapter_only=True writes the adapter")
def _():
    model = perturb(mmpreproj.inject(quantized("int8")))
    with tempfile.TemporaryDirectory() as d:
        try:
            mmpreproj.save_pretrained(model, d + "/full")
            raise AssertionError("whole-model save of an in-place torchao base accepted")
        except (ValueError, TypeError, RuntimeError) as err:
            msg = str(err)[:100]
        empty = not Path(d + "/full").exists() or not any(Path(d + "/full").iterdir())
        mmpreproj.save_pretrained(model, d + "/ad", adapter_only=True)
        files = sorted(p.name for p in Path(d + "/ad").rglob("*") if p.is_file())
    return check(
        empty and any("safetensors" in f for f in files),
        f"refused: {msg}; nothing written {empty}; adapter_only {files}",
    )


@case("quant", "nf4: eval no-grad forward before training: gradients still flow (== without that forward)")
def _():
    torch.manual_seed(0)
    a = perturb(mmpreproj.inject(quantized("nf4")))
    b = perturb(mmpreproj.inject(quantized("nf4")))
    logits(a.eval())  # the inference path troubleshooting.md says would repack the weights
    for m in (a, b):
        m.train()
        m(input_ids=IDS, labels=IDS).loss.backward()
    ga = [p.grad for p in adapter_params(a)]
    ok = all(g is not None and g.abs().sum() > 0 for g in ga)
    worst = (
        max(((p.grad - q.grad).norm() / q.grad.norm()).item() for p, q in zip(adapter_params(a), adapter_params(b)))
        if ok
        else -1
    )
    return check(ok and worst <= 1e-6, f"grads present {ok}; rel diff to a model without that forward {worst:.2e}")


@case("quant", "nf4 with compute_dtype=torch.bfloat16: identity == quantized base exactly; adapter trains")
def _():
    from mmpreproj.integrations.quantized import quantize_frozen_base

    base = quantize_frozen_base(neox(), "nf4", compute_dtype=torch.bfloat16)
    want = logits(base)
    model = mmpreproj.inject(base, IDENTITY)
    got = logits(model)
    model.train()
    model(input_ids=IDS, labels=IDS).loss.backward()
    grads = [p.grad is not None and p.grad.abs().sum().item() > 0 for p in adapter_params(model)]
    return check(
        torch.equal(got, want) and any(grads),
        f"identity diff {mx(got, want):.1e}; adapter grads nonzero {sum(grads)}/{len(grads)}",
    )


@case("quant", "quantize_frozen_base refuses a bad compute_dtype and an injected model, model unchanged")
def _():
    from mmpreproj.integrations.quantized import quantize_frozen_base

    m = neox()
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    msgs = []
    for label, fn in [
        ("float64", lambda: quantize_frozen_base(m, "nf4", compute_dtype=torch.float64)),
        ("injected", lambda: quantize_frozen_base(mmpreproj.inject(neox()), "int8")),
    ]:
        try:
            fn()
            raise AssertionError(f"{label}: accepted")
        except (ValueError, TypeError, RuntimeError) as err:  # the docstring names no exception type
            msgs.append(f"{label}: {type(err).__name__}: {str(err)[:60]}")
    same = all(torch.equal(v, m.state_dict()[k]) and type(m.state_dict()[k]) is torch.Tensor for k, v in sd.items())
    return check(same, "; ".join(msgs) + f"; unchanged {same}")


@case("quant", "int8 llama: identity exact, grads == float base holding the dequantized weights")
def _():
    qbase = quantized("int8", "llama")
    want = logits(qbase)
    fbase = dequantized(qbase)
    ident = mmpreproj.inject(copy.deepcopy(qbase), IDENTITY)
    d0 = mx(logits(ident), want)
    model = perturb(mmpreproj.inject(qbase))
    fmodel = mmpreproj.inject(fbase)
    with torch.no_grad():
        for a, b in zip(adapter_params(model), adapter_params(fmodel)):
            b.copy_(a)
    for m in (model, fmodel):
        m.train()
        m(input_ids=IDS, labels=IDS).loss.backward()
    worst = max(
        ((a.grad - b.grad).norm() / b.grad.norm()).item()
        for a, b in zip(adapter_params(model), adapter_params(fmodel))
    )
    return check(d0 == 0 and worst <= 1e-4, f"identity diff {d0:.1e}; worst rel grad err {worst:.2e}")


@case("quant", "int8 through peft: get_peft_model, save_pretrained, PeftModel.from_pretrained on a fresh int8 base")
def _():
    model = peft.get_peft_model(quantized("int8"), PreProjConfig())
    perturb(model)
    got = logits(model)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d + "/a")
        fresh = peft.PeftModel.from_pretrained(quantized("int8"), d + "/a")
    back = logits(fresh)
    return check(torch.equal(back, got) and preproj_dtypes(fresh) == {torch.float32}, f"max diff {mx(back, got):.1e}")


def hf_4bit(tmp):
    try:
        neox().save_pretrained(tmp)
        q = tf.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32)
        return tf.AutoModelForCausalLM.from_pretrained(tmp, quantization_config=q, device_map="cpu").eval()
    except Exception as err:  # noqa: BLE001
        raise Skip(f"transformers 4-bit load on CPU failed: {type(err).__name__}: {str(err)[:120]}") from err


@case("quant", "transformers BitsAndBytesConfig 4-bit + disable_cpu_4bit_packing: identity exact, adapter trains")
def _():
    from mmpreproj.integrations.quantized import disable_cpu_4bit_packing

    with tempfile.TemporaryDirectory() as d:
        base = hf_4bit(d)
        n = disable_cpu_4bit_packing(base)
        want = logits(base)
        model = mmpreproj.inject(base, IDENTITY)
        got = logits(model)
        perturb(model)
        model.train()
        model(input_ids=IDS, labels=IDS).loss.backward()
        nz = sum(p.grad is not None and p.grad.abs().sum().item() > 0 for p in adapter_params(model))
    return check(
        n > 0 and torch.equal(got, want) and nz == len(adapter_params(model)),
        f"{n} layers kept differentiable; identity diff {mx(got, want):.1e}; grads nonzero {nz}",
    )


@case("quant", "transformers 4-bit: disable_cpu_4bit_packing after an eval no-grad forward refused (or nothing to do)")
def _():
    from mmpreproj.integrations.quantized import disable_cpu_4bit_packing

    with tempfile.TemporaryDirectory() as d:
        base = hf_4bit(d)
        logits(base)  # may repack in place (AVX512-BF16 CPUs, troubleshooting.md)
        try:
            n = disable_cpu_4bit_packing(base)
        except (ValueError, TypeError, RuntimeError) as err:
            return f"refused: {type(err).__name__}: {str(err)[:110]}"
        model = mmpreproj.inject(base)
        perturb(model)
        model.train()
        model(input_ids=IDS, labels=IDS).loss.backward()
        nz = sum(p.grad is not None and p.grad.abs().sum().item() > 0 for p in adapter_params(model))
    return check(
        nz == len(adapter_params(model)), f"accepted ({n} layers): grads nonzero {nz}/{len(adapter_params(model))}"
    )


# ----------------------------------------------------------------------------------------------- compile


def reset():
    torch._dynamo.reset()


@case("compile", "aot_eager: compiled fp32 injected model == eager (forward), adapter active")
def _():
    reset()
    ref, model = build("llama", torch.float32)
    eager = logits(model)
    fast = torch.compile(model, backend="aot_eager")
    got = logits(fast)
    return check(mx(got, eager) <= 1e-5 and mx(eager, logits(ref)) > 1e-2, f"max|compiled-eager| {mx(got, eager):.2e}")


@case("compile", "aot_eager: compiled training step (loss, grads, AdamW) == eager")
def _():
    reset()
    _, a = build("neox", torch.float32)
    b = copy.deepcopy(a)
    fast = torch.compile(b, backend="aot_eager")
    a.train()
    b.train()
    la = a(input_ids=IDS, labels=IDS).loss
    lb = fast(input_ids=IDS, labels=IDS).loss
    la.backward()
    lb.backward()
    worst = max(
        ((p.grad - q.grad).norm() / p.grad.norm()).item() for p, q in zip(adapter_params(a), adapter_params(b))
    )
    for m in (a, b):
        torch.optim.AdamW(adapter_params(m), lr=1e-2).step()
    d2 = mx(logits(a.eval()), logits(fast.eval()))
    return check(
        abs(la.item() - lb.item()) <= 1e-5 and worst <= 1e-4 and d2 <= 1e-5,
        f"loss diff {abs(la.item() - lb.item()):.1e}; worst rel grad {worst:.1e}; after step max diff {d2:.1e}",
    )


@case("compile", "aot_eager bf16 host: weight changed in place after a compiled forward is used next (no stale cast)")
def _():
    reset()
    ref, model = build("neox", torch.bfloat16)
    fast = torch.compile(model, backend="aot_eager")
    logits(fast)
    with torch.no_grad():
        for p in adapter_params(model):
            p.mul_(-1.5)
    got = logits(fast)
    want = reference_logits(ref, adapter_weights(model), "input")
    alt = reference_logits(ref, adapter_weights(model), "float32")
    return judge(got, want, alt, "logits after the change")


@case("compile", "inductor: compiled fp32 injected model == eager within fp32 reassociation (1e-4)")
def _():
    reset()
    _, model = build("neox", torch.float32)
    eager = logits(model)
    got = logits(torch.compile(model))
    return check(mx(got, eager) <= 1e-4, f"max|compiled-eager| {mx(got, eager):.2e}")


@case("compile", "aot_eager bf16 host: compiled training step (loss, grads) == eager bf16")
def _():
    reset()
    _, a = build("neox", torch.bfloat16)
    b = copy.deepcopy(a)
    fast = torch.compile(b, backend="aot_eager")
    a.train()
    b.train()
    la = a(input_ids=IDS, labels=IDS).loss
    lb = fast(input_ids=IDS, labels=IDS).loss
    la.backward()
    lb.backward()
    worst = max(
        ((p.grad - q.grad).norm() / p.grad.norm()).item() for p, q in zip(adapter_params(a), adapter_params(b))
    )
    dts = {p.grad.dtype for p in adapter_params(b)}
    return check(
        abs(la.item() - lb.item()) <= 1e-2 and worst <= 0.05 and dts == {torch.float32},
        f"loss diff {abs(la.item() - lb.item()):.1e}; worst rel grad {worst:.1e}; grad dtypes {dts}",
    )


@case("compile", "inject of a torch.compile'd model refused naming the order (compile after inject)")
def _():
    reset()
    fast = torch.compile(neox(), backend="aot_eager")
    try:
        mmpreproj.inject(fast)
    except (ValueError, TypeError, RuntimeError) as err:
        return check("compile" in str(err).lower(), f"{type(err).__name__}: {str(err)[:110]}")
    raise AssertionError("inject accepted a compiled model")


@case("compile", "aot_eager: torch.compile(get_peft_model(bf16 base)) forward == eager bit for bit")
def _():
    reset()
    model = peft.get_peft_model(neox(torch.bfloat16), PreProjConfig())
    perturb(model)
    eager = logits(model)
    got = logits(torch.compile(model, backend="aot_eager"))
    return check(torch.equal(got, eager), f"max|compiled-eager| {mx(got, eager):.2e}")


class Logits(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(ids, use_cache=False).logits


for _dt in (torch.float32, torch.bfloat16):

    @case("compile", f"torch.export of the {str(_dt)[6:]} injected model (docs' way 3) == eager bit for bit")
    def _(dt=_dt):
        reset()
        _, model = build("neox", dt)
        eager = logits(model)
        with torch.no_grad():
            prog = torch.export.export(Logits(model), (IDS,))
            got = prog.module()(IDS)
        return check(torch.equal(got, eager), f"max|exported-eager| {mx(got, eager):.2e}")


@case("compile", "inductor: compiled fp32 training step (loss, grads) == eager within fp32 reassociation")
def _():
    reset()
    _, a = build("neox", torch.float32)
    b = copy.deepcopy(a)
    fast = torch.compile(b)
    a.train()
    b.train()
    la = a(input_ids=IDS, labels=IDS).loss
    lb = fast(input_ids=IDS, labels=IDS).loss
    la.backward()
    lb.backward()
    worst = max(
        ((p.grad - q.grad).norm() / p.grad.norm()).item() for p, q in zip(adapter_params(a), adapter_params(b))
    )
    return check(
        abs(la.item() - lb.item()) <= 1e-5 and worst <= 1e-4,
        f"loss diff {abs(la.item() - lb.item()):.1e}; worst rel grad {worst:.1e}",
    )


@case("compile", "inductor bf16 host: compiled == eager within 4x the base's own compiled-vs-eager gap + 1 ulp")
def _():
    reset()
    ref, model = build("neox", torch.bfloat16)
    d_lib = mx(logits(torch.compile(model)), logits(model))
    reset()
    d_base = mx(logits(torch.compile(ref)), logits(ref))
    tol = 4 * d_base + logits(model).abs().max().item() * 2**-8
    return check(d_lib <= tol, f"max|compiled-eager| injected {d_lib:.2e}, base {d_base:.2e}, tol {tol:.2e}")


@case(
    "compile", "bf16 host under compile: in-place weight change recompiles nothing and is used (no guard per weight)"
)
def _():
    reset()
    ref, model = build("neox", torch.bfloat16)
    n = {"graphs": 0}

    def backend(gm, example):
        n["graphs"] += 1
        return gm.forward

    fast = torch.compile(model, backend=backend)
    logits(fast)
    first = n["graphs"]
    with torch.no_grad():
        for p in adapter_params(model):
            p.mul_(-1.5)
    got = logits(fast)
    want = reference_logits(ref, adapter_weights(model), "input")
    return check(
        n["graphs"] == first and mx(got, want) == 0,
        f"graphs {first} -> {n['graphs']}; max|lib-ref(new)| {mx(got, want):.1e}",
    )


def count_compiles(model, new_tokens, prompt):
    reset()
    n = {"graphs": 0}

    def backend(gm, example):
        n["graphs"] += 1
        return gm.forward

    model.forward = torch.compile(model.forward, backend=backend)
    try:
        out = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, cache_implementation="static")
    finally:
        del model.forward
    return n["graphs"], out


@case("compile", "static-cache compiled generate (docs' way 2) == eager generate; graphs do not grow with tokens")
def _():
    _, model = build("neox", torch.float32)
    base = neox()
    prompt = IDS[:1, :6]
    with torch.no_grad():
        eager = model.generate(prompt, max_new_tokens=10, do_sample=False)
        g4, _ = count_compiles(model, 4, prompt)
        g10, out = count_compiles(model, 10, prompt)
        b4, _ = count_compiles(base, 4, prompt)
        b10, _ = count_compiles(base, 10, prompt)
    same = torch.equal(out, eager)
    msg = f"tokens equal {same}; graphs injected 4 tok {g4} / 10 tok {g10}; base {b4} / {b10}"
    return check(same and g10 <= max(g4, b10) and g10 - b10 <= g4 - b4, msg)


# ----------------------------------------------------------------------------------------------- KV cache


def decode_vs_recompute(model, steps=6):
    """Greedy decode with the KV cache step by step; each step's logits vs one no-cache forward of the sequence."""
    prompt = IDS[:, :6]
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
        cache, seq, step_logits = out.past_key_values, prompt, [out.logits[:, -1]]
        for _ in range(steps):
            nxt = step_logits[-1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
            o = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            step_logits.append(o.logits[:, -1])
        full = model(input_ids=seq, use_cache=False).logits[:, prompt.shape[1] - 1 :]
    return mx(torch.stack(step_logits, 1), full), seq


for _host, _dt in (("neox", torch.bfloat16), ("llama", torch.bfloat16), ("neox", torch.float16)):

    @case(
        "kv",
        f"{_host} {str(_dt)[6:]}: KV-cache decode == no-cache recomputation (within 2x the base's own gap + 1 ulp)",
    )
    def _(host=_host, dt=_dt):
        ref, model = build(host, dt)
        d_lib, seq = decode_vs_recompute(model)
        d_base, _ = decode_vs_recompute(ref)
        scale = logits(model).abs().max().item()
        tol = 2 * d_base + scale * 2**-8
        return check(d_lib <= tol, f"max|cached-recomputed| injected {d_lib:.2e}, base {d_base:.2e}, tol {tol:.2e}")

    @case("kv", f"{_host} {str(_dt)[6:]}: cache bytes and dtypes with the adapter == without")
    def _(host=_host, dt=_dt):
        ref, model = build(host, dt)
        with torch.no_grad():
            a = cache_tensors(model(input_ids=IDS, use_cache=True).past_key_values)
            b = cache_tensors(ref(input_ids=IDS, use_cache=True).past_key_values)
        ba, bb = sum(t.numel() * t.element_size() for t in a), sum(t.numel() * t.element_size() for t in b)
        da, db = {t.dtype for t in a}, {t.dtype for t in b}
        return check(ba == bb and ba > 0 and da == db == {dt}, f"bytes {ba} vs {bb}; dtypes {da} vs {db}")


@case("kv", "fp32 neox: generate (KV cache) tokens == greedy no-cache recomputation, adapter active")
def _():
    ref, model = build("neox", torch.float32)
    prompt = IDS[:, :6]
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=8, do_sample=False)
        seq = prompt
        for _ in range(8):
            seq = torch.cat([seq, model(input_ids=seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], 1)
        base_out = ref.generate(prompt, max_new_tokens=8, do_sample=False)
    return check(
        torch.equal(out, seq) and not torch.equal(out, base_out),
        f"equal {torch.equal(out, seq)}; differs from base {not torch.equal(out, base_out)}",
    )


@case("kv", "fp32 host under bf16 autocast: cache bytes and dtypes with the adapter == without")
def _():
    ref, model = build("neox", torch.float32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        a = cache_tensors(model(input_ids=IDS, use_cache=True).past_key_values)
        b = cache_tensors(ref(input_ids=IDS, use_cache=True).past_key_values)
    ba, bb = sum(t.numel() * t.element_size() for t in a), sum(t.numel() * t.element_size() for t in b)
    da, db = {t.dtype for t in a}, {t.dtype for t in b}
    return check(ba == bb and ba > 0 and da == db, f"bytes {ba} vs {bb}; dtypes {da} vs {db}")


# ----------------------------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.time()
    for area, name, fn in CASES:
        label = f"{area} | {name}"
        if args.only and args.only not in label:
            continue
        t1 = time.time()
        try:
            detail, status = fn(), "PASS"
        except Skip as err:
            detail, status = str(err), "SKIP"
        except AssertionError as err:
            detail, status = str(err), "FAIL"
        except Exception as err:  # noqa: BLE001
            tb = traceback.extract_tb(err.__traceback__)[-1]
            detail, status = (
                f"CRASH {type(err).__name__}: {str(err)[:150]} @ {Path(tb.filename).name}:{tb.lineno}",
                "FAIL",
            )
        RESULTS.append(status)
        print(f"{status} | {label} | {detail} [{time.time() - t1:.1f} s]", flush=True)
    n = len(RESULTS)
    p, f, s = (RESULTS.count(x) for x in ("PASS", "FAIL", "SKIP"))
    print(f"TOTAL {n}: {p} PASS, {f} FAIL, {s} SKIP ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
