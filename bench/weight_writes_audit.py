"""Weight-writes audit: every common way a user or a library writes an injected model's weights, followed by
inference, must be seen by the next forward, in every dtype setting, against peft LoRA under the same writes.

Run:  cd <repo> && PYTHONPATH=. OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
      python bench/weight_writes_audit.py [--only SUBSTR] [--quick]

Written by an independent, adversarial audit from docs/limits.md, docs/performance.md "Precision" and the
`mmpreproj.modules.compute.WeightCasts` docstring; the expectations are the auditor's. The library keeps, for
inference, a cast of each fp32 adapter weight to the compute dtype (bf16 / fp16 host, or autocast), keyed on the
weight's identity, storage address, in-place version, device and shape. The one documented limit: a write torch
does not version (through `.data`, or numpy memory) is not seen until any `.to()`. Every other write must be seen.

Each case = (write route, dtype setting, inference mode). Settings: fp32 host, bf16 host, fp16 host, fp32 host
under torch.autocast("cpu", bf16). Modes: torch.no_grad(), torch.inference_mode(), model.generate (greedy, 4 new
tokens, the step logits compared). For each of three routes: peft.get_peft_model(base, PreProjConfig()),
mmpreproj.inject(base, PreProjConfig()) in place, and peft LoRA (r=4 on query_key_value; the oracle for "the
write is seen"), a tiny random GPT-NeoX (2 blocks, width 64; a Llama for a few writes) gets O(1) adapter weights,
runs one inference forward in the mode (so casts are kept), takes the write, and runs the mode again. A PreProj
route passes when its output equals, bit for bit, a `copy.deepcopy` of the written model (fresh, no kept casts)
and is within 5% of the write's effect (or 1e-6) of an independent reference: the written model's own base
attentions unwrapped, with two hooks per block computing `x~ = x^ + W_down SiLU(W_up x^)` (in the documented
compute dtype, from the current fp32 master weights) fed to attention and `W_skip x~` added to its output. LoRA
passes when its output equals its deepcopy's. A documented `.data`/numpy write passes when, after `model.to("cpu")`,
the output is the fresh one (the write may or may not be seen before that).

Output: one line per case `PASS | area | case | details` / `FAIL | ...`, `TOTAL N: P PASS, F FAIL`, then the FAILs
grouped by root cause. `bench/results/weight_writes_audit_before.txt` is the first full run's output.

Result on 01113a4 (CPU with AVX512-BF16/AMX, torch 2.14.1, peft 0.21.2, transformers 5.25.0, accelerate 1.16.0,
one thread, about 150 s): TOTAL 941: 837 PASS, 104 FAIL (bench/results/weight_writes_audit.txt). The first full run
(bench/results/weight_writes_audit_before.txt: 941: 825 PASS, 116 FAIL) had 12 harness FAILs, since fixed: the
AveragedModel case called `.generate` on the AveragedModel itself (it has none; LoRA failed alike: now its `.module`
generates), and the documented vector_to_parameters loop demanded the pre-`.to()` output equal the first one. The
fp32 host without autocast never fails (no casts are kept there). Two root causes, both only on bf16 / fp16 hosts
and under autocast, on both routes (get_peft_model and inject), all seen by LoRA:
  [fused] 86 lines. torch's fused optimizer steps (`fused=True`: SGD, Adam, AdamW, Adagrad; `_fused_*_` bump no
    version counter on CPU) after a kept cast are not seen by the next inference forward: the casts are dropped
    only by a grad forward that casts (WeightCasts.__call__), so a step on hand-set gradients (no training
    forward), a step after an inference forward between backward and step (eval / logging mid-step), and, on a
    fp32 host, a training forward without autocast (fp32 weights need no cast: nothing dropped) followed by an
    evaluation under autocast, all leave the old cast in use until any `.to()`. foreach and for-loop optimizers,
    and a real training step followed by the step, are seen. Library bug (WeightCasts' docstring names fused AdamW
    but relies on a training forward in between; docs/limits.md names only `.data` / numpy).
  [weakref] 18 lines. The kept cast holds a weakref to the Parameter, so after any inference forward
    `torch.utils.swap_tensors(p, ...)` raises "Cannot swap t1 because it has weakref associated with it", and
    with `torch.__future__.set_swap_module_params_on_conversion(True)` `model.load_state_dict` raises (`.to()`
    still works: `_apply` drops the casts first). Library bug, undocumented; LoRA swaps fine.
Notes (PASS, documented): vector_to_parameters writes `param.data = view`; one call is seen (new storage), but
in a perturb / restore loop a later vector can land at a freed address and the old cast is used (2-3 stale evals
of 4 on bf16 / fp16 / autocast, LoRA none): within docs/limits.md's `.data` limit, though the docs name neither
rebinding nor vector_to_parameters. `.data` / numpy in-place writes are unseen until `.to()`, as documented.

Run again after the fixes (bench/results/weight_writes_audit.txt, overwriting the run after the harness fixes):
TOTAL 941: 941 PASS, 0 FAIL. [fused]: no cast is kept while a weight holds a gradient, and a training forward
drops the casts in fp32 too; [weakref]: the casts are kept per weight name and hold the weight itself (no weak
reference). docs/limits.md now names `p.data = new`, vector_to_parameters loops and a fused step on gradients set
by hand and cleared before the next forward.
"""

from __future__ import annotations

import argparse
import copy
import io
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

import peft  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers as tf  # noqa: E402
from torch import nn  # noqa: E402

import mmpreproj  # noqa: E402
from mmpreproj import PreProjConfig  # noqa: E402

tf.utils.logging.disable_progress_bar()

V = 128
IDS = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1))
SETTINGS = {  # name -> (host dtype, autocast bf16)
    "fp32": (torch.float32, False),
    "bf16": (torch.bfloat16, False),
    "fp16": (torch.float16, False),
    "fp32+autocast": (torch.float32, True),
}
MODES = ("no_grad", "inference_mode", "generate")
ROUTES = ("peft", "inject", "lora")
DOCUMENTED = "documented: a .data / numpy write is not seen until any .to() (docs/limits.md)"


# ----------------------------------------------------------------------------------------------- models


def neox(dtype, seed=0):
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
        tie_word_embeddings=False,
    )
    return tf.GPTNeoXForCausalLM(cfg).to(dtype).eval()


def llama(dtype, seed=0):
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


TEMPLATES: dict = {}
LORA_TARGETS = {"neox": ["query_key_value"], "llama": ["q_proj", "v_proj"]}


def template(host, dtype):
    key = (host, dtype)
    if key not in TEMPLATES:
        TEMPLATES[key] = {"neox": neox, "llama": llama}[host](dtype)
    return TEMPLATES[key]


def adapter_params(model, route, name="default"):
    """The named adapter's trainable tensors, in named_parameters order."""
    if route == "lora":
        return [p for n, p in model.named_parameters() if "lora_" in n and f".{name}." in n + "."]
    return [p for n, p in model.named_parameters() if ("preproj" in n) and f".{name}." in n]


def perturb(params, seed=3, scale=0.6):
    """O(1) adapter effect, so a write shows in bf16 / fp16 logits; fp32 master weights kept."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.copy_(torch.randn(p.shape, generator=g) * scale / p.shape[-1] ** 0.5)


def build(route, setting, host="neox", seed=3):
    dtype, _ = SETTINGS[setting]
    base = copy.deepcopy(template(host, dtype))
    if route == "peft":
        model = peft.get_peft_model(base, PreProjConfig())
    elif route == "inject":
        model = mmpreproj.inject(base, PreProjConfig())
    else:
        model = peft.get_peft_model(
            base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS[host], init_lora_weights=False)
        )
    perturb(adapter_params(model, route), seed=seed)
    return model.eval()


def autocast_ctx(setting):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=SETTINGS[setting][1])


def observe(model, setting, mode):
    """The model's output in the mode: logits (no_grad / inference_mode) or generate's step logits."""
    with autocast_ctx(setting):
        if mode == "no_grad":
            with torch.no_grad():
                return model(input_ids=IDS).logits.float()
        if mode == "inference_mode":
            with torch.inference_mode():
                return model(input_ids=IDS).logits.float().clone()
        out = model.generate(
            input_ids=IDS[:, :6],
            attention_mask=torch.ones_like(IDS[:, :6]),
            max_new_tokens=4,
            min_new_tokens=4,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        return torch.stack([x.float() for x in out.logits])


# ----------------------------------------------------------------------------------------------- reference


def hf_model(model):
    return model.base_model.model if isinstance(model, peft.PeftModel) else model


def blocks(model):
    inner = hf_model(model)
    return inner.gpt_neox.layers if hasattr(inner, "gpt_neox") else inner.model.layers


def attn_name(layer):
    return "attention" if hasattr(layer, "attention") else "self_attn"


def ref_adapter(xh, w):
    """compute_dtype="input": compute in x^'s dtype (autocast's when on); x~ = x^ + delta; W_skip x~."""
    up, down, skip = w
    ac = torch.is_autocast_enabled("cpu")
    with torch.autocast("cpu", enabled=False):
        cdt = torch.get_autocast_dtype("cpu") if ac else xh.dtype
        x = xh.to(cdt)
        d = F.linear(F.silu(F.linear(x, up.to(cdt))), down.to(cdt))
        xt = xh + d if ac else x + d
        s = F.linear(xt.to(cdt), skip.to(cdt))
    return xt, s


def reference(model, setting, mode, name="default"):
    """The written model's own base, its wrappers replaced by their base attentions, plus two hooks per block
    computing the paper's formula from the current fp32 master weights (read through .float(): never a kept cast)."""
    ref = copy.deepcopy(model)
    for lay in blocks(ref):
        an = attn_name(lay)
        wrap = getattr(lay, an)
        w = (
            wrap.preproj[name].up.weight.detach().float().clone(),
            wrap.preproj[name].down.weight.detach().float().clone(),
            wrap.preproj_skip[name].proj.weight.detach().float().clone(),
        )
        base_attn = wrap.base_layer
        setattr(lay, an, base_attn)
        box = {}

        def pre(mod, args, kwargs, w=w, box=box):
            if args:
                xt, s = ref_adapter(args[0], w)
                args = (xt,) + tuple(args[1:])
            else:
                xt, s = ref_adapter(kwargs["hidden_states"], w)
                kwargs = dict(kwargs, hidden_states=xt)
            box["s"] = s
            return args, kwargs

        def post(mod, args, kwargs, out, box=box):
            s = box.pop("s")
            if isinstance(out, tuple):
                return (out[0] + s,) + tuple(out[1:])
            return out + s

        base_attn.register_forward_pre_hook(pre, with_kwargs=True)
        base_attn.register_forward_hook(post, with_kwargs=True)
    return observe(ref, setting, mode)


def mx(a, b):
    if a.shape != b.shape:
        return float("inf")
    return (a.double() - b.double()).abs().max().item()


# ----------------------------------------------------------------------------------------------- writes
# write(model, ctx) -> model to observe after the write (None: the same); ctx: route, setting, mode, host,
# params (the active adapter's), donor (a twin built with other adapter values), observe (a callable).

WRITES: list[tuple[str, str, object, dict]] = []  # (area, name, fn, options)


def write(area, name, **opts):
    def deco(fn):
        WRITES.append((area, name, fn, opts))
        return fn

    return deco


def new_values(p, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(p.shape, generator=g) * 0.6 / p.shape[-1] ** 0.5).to(p.dtype)


@write("inplace", "p.mul_(-1.5) under no_grad")
def _(m, c):
    with torch.no_grad():
        for p in c["params"]:
            p.mul_(-1.5)


@write("inplace", "p.copy_(new) under no_grad")
def _(m, c):
    with torch.no_grad():
        for i, p in enumerate(c["params"]):
            p.copy_(new_values(p, 100 + i))


@write("inplace", "p.zero_() under no_grad")
def _(m, c):
    with torch.no_grad():
        for p in c["params"]:
            p.zero_()


@write("inplace", "p.normal_(0, s) under no_grad")
def _(m, c):
    torch.manual_seed(7)
    with torch.no_grad():
        for p in c["params"]:
            p.normal_(0, 0.6 / p.shape[-1] ** 0.5)


@write("inplace", "p.mul_(-1.5) inside torch.inference_mode()")
def _(m, c):
    with torch.inference_mode():
        for p in c["params"]:
            p.mul_(-1.5)


@write("inplace", "p.detach().mul_(-1.5) (shares the version counter)")
def _(m, c):
    for p in c["params"]:
        p.detach().mul_(-1.5)


@write("inplace", "nn.init.normal_(p) (no_grad inside)")
def _(m, c):
    torch.manual_seed(8)
    for p in c["params"]:
        nn.init.normal_(p, std=0.6 / p.shape[-1] ** 0.5)


@write("inplace", "p.set_(new) under no_grad")
def _(m, c):
    with torch.no_grad():
        for i, p in enumerate(c["params"]):
            p.set_(new_values(p, 200 + i))


@write("inplace", "torch.utils.swap_tensors(p, nn.Parameter(new))", cause="weakref")
def _(m, c):
    for i, p in enumerate(c["params"]):
        torch.utils.swap_tensors(p, nn.Parameter(new_values(p, 300 + i), requires_grad=p.requires_grad))


@write("foreach", "torch._foreach_mul_(params, -1.5)")
def _(m, c):
    with torch.no_grad():
        torch._foreach_mul_(c["params"], -1.5)


@write("foreach", "torch._foreach_add_(params, new)")
def _(m, c):
    with torch.no_grad():
        torch._foreach_add_(c["params"], [new_values(p, 400 + i) for i, p in enumerate(c["params"])])


@write("foreach", "torch._foreach_lerp_(params, new, 0.7)")
def _(m, c):
    with torch.no_grad():
        torch._foreach_lerp_(c["params"], [new_values(p, 500 + i) for i, p in enumerate(c["params"])], 0.7)


@write("foreach", "torch._foreach_copy_(params, new)")
def _(m, c):
    with torch.no_grad():
        torch._foreach_copy_(c["params"], [new_values(p, 600 + i) for i, p in enumerate(c["params"])])


OPTIMIZERS = {
    "SGD(momentum) foreach": lambda ps: torch.optim.SGD(ps, lr=0.3, momentum=0.9, foreach=True),
    "SGD(momentum) for-loop": lambda ps: torch.optim.SGD(ps, lr=0.3, momentum=0.9, foreach=False),
    "SGD(momentum) fused": lambda ps: torch.optim.SGD(ps, lr=0.3, momentum=0.9, fused=True),
    "Adam foreach": lambda ps: torch.optim.Adam(ps, lr=0.05, foreach=True),
    "Adam fused": lambda ps: torch.optim.Adam(ps, lr=0.05, fused=True),
    "AdamW foreach": lambda ps: torch.optim.AdamW(ps, lr=0.05, foreach=True),
    "AdamW for-loop": lambda ps: torch.optim.AdamW(ps, lr=0.05, foreach=False),
    "AdamW fused": lambda ps: torch.optim.AdamW(ps, lr=0.05, fused=True),
    "Adagrad foreach": lambda ps: torch.optim.Adagrad(ps, lr=0.05, foreach=True),
    "Adagrad fused": lambda ps: torch.optim.Adagrad(ps, lr=0.05, fused=True),
    "RMSprop foreach": lambda ps: torch.optim.RMSprop(ps, lr=0.01, foreach=True),
}


def train_backward(m, c, autocast=True):
    m.train()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=SETTINGS[c["setting"]][1] and autocast):
        m(input_ids=IDS, labels=IDS).loss.backward()
    m.eval()


def _opt_write(kind, make):
    def real(m, c):
        opt = make(c["params"])
        train_backward(m, c)
        opt.step()

    def hand(m, c):
        opt = make(c["params"])
        for i, p in enumerate(c["params"]):
            p.grad = new_values(p, 700 + i).float() * 3
        opt.step()

    def between(m, c):
        opt = make(c["params"])
        train_backward(m, c)
        c["observe"](m)  # an eval / logging forward between backward and step
        opt.step()

    def fp32_train(m, c):
        opt = make(c["params"])
        train_backward(m, c, autocast=False)
        opt.step()

    write("optimizer", f"{kind}: a real training step (forward+backward in the setting, step)")(real)
    write("optimizer", f"{kind}: a step on hand-set p.grad (no training forward)", cause="fused")(hand)
    write("optimizer", f"{kind}: backward, an inference forward, then step", cause="fused")(between)
    write(
        "optimizer",
        f"{kind}: training forward without autocast, step (autocast eval)",
        settings=("fp32+autocast",),
        cause="fused",
    )(fp32_train)


for _k, _mk in OPTIMIZERS.items():
    _opt_write(_k, _mk)


def donor_state(c):
    return c["donor"].state_dict()


@write("load", "model.load_state_dict(donor.state_dict()) (strict)")
def _(m, c):
    m.load_state_dict(donor_state(c))


@write("load", "model.load_state_dict(donor.state_dict(), assign=True)")
def _(m, c):
    m.load_state_dict({k: v.clone() for k, v in donor_state(c).items()}, assign=True)


@write("load", "torch.save(donor.state_dict()) -> torch.load -> load_state_dict")
def _(m, c):
    buf = io.BytesIO()
    torch.save(donor_state(c), buf)
    buf.seek(0)
    m.load_state_dict(torch.load(buf, weights_only=True))


@write("load", "torch.save(donor.state_dict()) -> torch.load(mmap) -> load_state_dict(assign=True)")
def _(m, c):
    with tempfile.TemporaryDirectory() as d:
        torch.save(donor_state(c), d + "/sd.pt")
        sd = torch.load(d + "/sd.pt", mmap=True, weights_only=True)
        m.load_state_dict(sd, assign=True)


@write("load", "module.weight = nn.Parameter(new) on every adapter Linear")
def _(m, c):
    i = 0
    for mod in list(m.modules()):
        if isinstance(mod, nn.Linear) and any(mod.weight is p for p in c["params"]):
            mod.weight = nn.Parameter(new_values(mod.weight, 800 + i), requires_grad=mod.weight.requires_grad)
            i += 1


@write("load", "torch.nn.utils.vector_to_parameters(new vector, params) (param.data = inside)", documented=True)
def _(m, c):
    vec = torch.nn.utils.parameters_to_vector(c["params"])
    torch.nn.utils.vector_to_parameters(-1.5 * vec, c["params"])


@write(
    "load",
    "vector_to_parameters perturb/restore loop (eval between): 4 rounds, last eval",
    documented=True,
)
def _(m, c):
    ps = c["params"]
    theta = torch.nn.utils.parameters_to_vector(ps).detach().clone()
    g = torch.Generator().manual_seed(11)
    for _ in range(4):
        torch.nn.utils.vector_to_parameters(theta + 0.5 * torch.randn(theta.shape, generator=g), ps)
        c["check"](m)  # each perturbed eval must equal a fresh copy's
        torch.nn.utils.vector_to_parameters(theta, ps)
    torch.nn.utils.vector_to_parameters(theta + 0.5 * torch.randn(theta.shape, generator=g), ps)


@write(
    "load",
    "swap_module_params_on_conversion(True): model.load_state_dict(donor.state_dict())",
    cause="weakref",
)
def _(m, c):
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        m.load_state_dict(donor_state(c))
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)


@write(
    "dtype",
    "swap_module_params_on_conversion(True): model.to(bf16), eval, mul_, .to(host dtype)",
    cause="weakref",
)
def _(m, c):
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        m.to(torch.bfloat16)
        c["observe"](m)
        with torch.no_grad():
            for p in adapter_params(m, c["route"]):
                p.mul_(-1.5)
        m.to(SETTINGS[c["setting"]][0])
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)


@write("load", "peft.set_peft_model_state_dict(model, donor's adapter state dict)", routes=("peft", "lora"))
def _(m, c):
    peft.set_peft_model_state_dict(m, peft.get_peft_model_state_dict(c["donor"]))


@write("load", "peft.set_peft_model_state_dict(..., low_cpu_mem_usage=True) (assign)", routes=("peft", "lora"))
def _(m, c):
    sd = {k: v.clone() for k, v in peft.get_peft_model_state_dict(c["donor"]).items()}
    peft.set_peft_model_state_dict(m, sd, low_cpu_mem_usage=True)


@write("load", "mmpreproj.set_adapter_state_dict(model, donor's adapter_state_dict)", routes=("peft", "inject"))
def _(m, c):
    mmpreproj.set_adapter_state_dict(m, mmpreproj.adapter_state_dict(c["donor"]))


@write(
    "adapters", "save donor adapter; mmpreproj.load_adapter(name='b') + set_adapter('b')", routes=("peft", "inject")
)
def _(m, c):
    with tempfile.TemporaryDirectory() as d:
        mmpreproj.save_adapter(c["donor"], d + "/b")
        mm = mmpreproj.load_adapter(m, d + "/b", adapter_name="b")
    mmpreproj.set_adapter(m, "b")
    c["active"] = "b"
    return mm if mm is not None else m


@write(
    "adapters",
    "load_adapter 'b', set 'b', eval, mul_ 'default' in place, set_adapter('default')",
    routes=("peft", "inject"),
)
def _(m, c):
    with tempfile.TemporaryDirectory() as d:
        mmpreproj.save_adapter(c["donor"], d + "/b")
        mmpreproj.load_adapter(m, d + "/b", adapter_name="b")
    mmpreproj.set_adapter(m, "b")
    c["observe"](m)
    with torch.no_grad():
        for p in c["params"]:
            p.mul_(-1.5)
    mmpreproj.set_adapter(m, "default")


@write(
    "adapters",
    "PeftModel.save_pretrained(donor); PeftModel.load_adapter('b') + set_adapter('b')",
    routes=("peft", "lora"),
)
def _(m, c):
    with tempfile.TemporaryDirectory() as d:
        c["donor"].save_pretrained(d + "/b")
        m.load_adapter(d + "/b", adapter_name="b")
    m.set_adapter("b")
    c["active"] = "b"


@write("copies", "AveragedModel(model, use_buffers=True): eval, update_parameters(written model), eval")
def _(m, c):
    avg = torch.optim.swa_utils.AveragedModel(m, use_buffers=True)
    if c["mode"] != "generate":  # AveragedModel has no generate: its .module generates
        c["observe"](avg)
    c["observe"](avg.module)
    with torch.no_grad():
        for p in c["params"]:
            p.mul_(-1.5)
    avg.update_parameters(m)
    avg.update_parameters(m)  # the second call averages: n_averaged = 2
    return avg.module


@write("copies", "hand EMA: ema = deepcopy(model); eval ema; ema_p.lerp_(p, 0.5) after p changed")
def _(m, c):
    ema = copy.deepcopy(m)
    c["observe"](ema)
    with torch.no_grad():
        for p in c["params"]:
            p.mul_(-1.5)
        ps = adapter_params(ema, c["route"])
        for pe, p in zip(ps, c["params"]):
            pe.lerp_(p, 0.5)
    return ema


@write("copies", "copy.deepcopy(model), mul_ the copy: the copy sees it, the original unchanged")
def _(m, c):
    before = c["observe"](m)
    twin = copy.deepcopy(m)
    c["observe"](twin)
    with torch.no_grad():
        for p in adapter_params(twin, c["route"]):
            p.mul_(-1.5)
    if mx(c["observe"](m), before) != 0:
        raise AssertionError("the original's output changed after a write to its deepcopy")
    return twin


@write("copies", "torch.save(model) -> torch.load(weights_only=False), mul_ the loaded model")
def _(m, c):
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    c["observe"](loaded)
    with torch.no_grad():
        for p in adapter_params(loaded, c["route"]):
            p.mul_(-1.5)
    return loaded


@write("dtype", "model.to(torch.bfloat16) then .to(host dtype) round trip")
def _(m, c):
    m.to(torch.bfloat16)
    c["observe"](m)
    m.to(SETTINGS[c["setting"]][0])


@write("dtype", "model.half() then .float() (then back to the host dtype)")
def _(m, c):
    m.half()
    m.float()
    m.to(SETTINGS[c["setting"]][0])


@write("dtype", "model.float(), eval, mul_, model.to(host dtype)")
def _(m, c):
    m.float()
    c["observe"](m)
    with torch.no_grad():
        for p in c["params"]:
            p.mul_(-1.5)
    m.to(SETTINGS[c["setting"]][0])


@write("library", "accelerate set_module_tensor_to_device(model, name, 'cpu', value=new)")
def _(m, c):
    from accelerate.utils import set_module_tensor_to_device

    names = {id(p): n for n, p in m.named_parameters()}
    for i, p in enumerate(list(c["params"])):
        set_module_tensor_to_device(m, names[id(p)], "cpu", value=new_values(p, 900 + i))


@write("library", "model.apply(fn): nn.init.normal_ on the adapter Linears")
def _(m, c):
    ids = {id(p) for p in c["params"]}
    torch.manual_seed(9)

    def fn(mod):
        if isinstance(mod, nn.Linear) and id(mod.weight) in ids:
            nn.init.normal_(mod.weight, std=0.6 / mod.weight.shape[-1] ** 0.5)

    m.apply(fn)


@write("library", "weight tying: block 1's adapter weights = block 0's Parameters, then mul_ block 0's")
def _(m, c):
    lins = [mod for mod in m.modules() if isinstance(mod, nn.Linear) and any(mod.weight is p for p in c["params"])]
    half = len(lins) // 2
    for a, b in zip(lins[:half], lins[half:]):
        if a.weight.shape == b.weight.shape:
            b.weight = a.weight
    c["observe"](m)
    with torch.no_grad():
        for a in lins[:half]:
            a.weight.mul_(-1.5)


@write("data", "p.data.mul_(-1.5)", documented=True)
def _(m, c):
    for p in c["params"]:
        p.data.mul_(-1.5)


@write("data", "p.detach().numpy() *= -1.5 (numpy memory)", documented=True)
def _(m, c):
    for p in c["params"]:
        arr = p.detach().numpy()
        arr *= -1.5


@write("data", "model.apply(fn): m.weight.data.normal_() on the adapter Linears", documented=True)
def _(m, c):
    ids = {id(p) for p in c["params"]}
    torch.manual_seed(9)

    def fn(mod):
        if isinstance(mod, nn.Linear) and id(mod.weight) in ids:
            mod.weight.data.normal_(0, 0.6 / mod.weight.shape[-1] ** 0.5)

    m.apply(fn)


@write("data", "p.data = new tensor (rebinding, not an in-place write)", documented=True)
def _(m, c):
    for i, p in enumerate(c["params"]):
        p.data = new_values(p, 1000 + i)


LLAMA_WRITES = {
    "p.mul_(-1.5) under no_grad",
    "AdamW fused: a step on hand-set p.grad (no training forward)",
    "AdamW foreach: a real training step (forward+backward in the setting, step)",
    "model.load_state_dict(donor.state_dict()) (strict)",
}


# ----------------------------------------------------------------------------------------------- runner


def run_route(route, setting, mode, host, fn, opts):
    """One route: (ok, detail, seen-changed)."""
    model = build(route, setting, host)
    donor = build(route, setting, host, seed=4)
    ctx = {"route": route, "setting": setting, "mode": mode, "host": host, "donor": donor, "active": "default"}
    ctx["params"] = adapter_params(model, route)
    ctx["observe"] = lambda mm: observe(mm, setting, mode)
    loop_bad = []

    def check_fresh(mm):
        got, fresh = observe(mm, setting, mode), observe(copy.deepcopy(mm), setting, mode)
        if mx(got, fresh) != 0:
            loop_bad.append(mx(got, fresh))

    ctx["check"] = check_fresh
    before = observe(model, setting, mode)  # keeps casts
    target = fn(model, ctx) or model
    got = observe(target, setting, mode)
    fresh = observe(copy.deepcopy(target), setting, mode)
    d_fresh = mx(got, fresh)
    change = mx(fresh, before)
    parts = [f"|out-deepcopy| {d_fresh:.2e}", f"write moved {change:.2e}"]
    ok = d_fresh == 0 and torch.isfinite(got).all().item()
    if loop_bad:
        ok = ok and bool(opts.get("documented"))
        parts.append(f"{len(loop_bad)} stale loop evals (max {max(loop_bad):.2e})")
    if route != "lora":
        ref = reference(target, setting, mode, ctx["active"])
        d_ref = mx(got, ref)
        parts.append(f"|out-ref| {d_ref:.2e}")
        ok = ok and (d_ref <= 1e-6 or d_ref <= 0.05 * max(mx(ref, before), 1e-30))
    if opts.get("documented"):
        stale = mx(got, before) == 0 and change > 0
        target.to("cpu")
        after_to = observe(target, setting, mode)
        d_to = mx(after_to, fresh)
        parts.append(f"{'unseen' if stale else 'seen'} before .to(); after .to('cpu') |out-deepcopy| {d_to:.2e}")
        ok = d_to == 0  # before .to() any output is allowed (the documented limit); after it, the fresh one
    return ok, ", ".join(parts), change


def run_case(area, name, fn, opts, setting, mode, host):
    routes = [r for r in ROUTES if r in opts.get("routes", ROUTES)]
    results, details, fail = {}, [], False
    for route in routes:
        try:
            ok, detail, _ = run_route(route, setting, mode, host, fn, opts)
        except Exception as err:  # noqa: BLE001
            msg = " ".join(str(err).split())
            ok, detail = False, f"{type(err).__name__}: {msg[:200]}"
            if os.environ.get("WRITES_TRACE"):
                traceback.print_exc()
        results[route] = ok
        details.append(f"{route}: {'ok' if ok else 'WRONG'} ({detail})")
        if route != "lora" and not ok:
            fail = True
    lora_ok = results.get("lora", True)
    if "lora" in results and not lora_ok:
        details.append("LoRA also fails: harness or torch, not the library")
    note = f" ({DOCUMENTED})" if opts.get("documented") else ""
    status = "FAIL" if fail else "PASS"
    return status, f"{status} | {area} | {name} | {host} {setting} {mode} | " + "; ".join(details) + note


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--quick", action="store_true", help="no_grad mode only")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    lines, fails = [], []
    modes = ("no_grad",) if args.quick else MODES
    plan = []
    for area, name, fn, opts in WRITES:
        for setting in opts.get("settings", SETTINGS):
            for mode in modes:
                plan.append((area, name, fn, opts, setting, mode, "neox"))
        if name in LLAMA_WRITES:
            for setting in ("bf16", "fp32+autocast"):
                plan.append((area, name, fn, opts, setting, "no_grad", "llama"))
    for area, name, fn, opts, setting, mode, host in plan:
        if args.only and args.only not in f"{area} {name} {host} {setting} {mode}":
            continue
        status, line = run_case(area, name, fn, opts, setting, mode, host)
        print(line, flush=True)
        lines.append(line)
        if status == "FAIL":
            fails.append((opts.get("cause", name), line))
    n, f = len(lines), len(fails)
    print(f"TOTAL {n}: {n - f} PASS, {f} FAIL")
    groups: dict[str, list[str]] = {}
    for cause, line in fails:
        groups.setdefault(cause, []).append(line)
    for cause, ls in groups.items():
        print(f"ROOT CAUSE [{cause}]: {len(ls)} FAIL line(s), e.g. {ls[0][:200]}")
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
