"""Audit 3: the capabilities the docs promise to keep, checked from the documented behaviour and side by side
with peft's LoRA under the same calls.

Run:  OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 PYTHONPATH=. python bench/capability_audit.py [--only SUBSTRING] [--list]

Written by an independent capability audit: its expectations are the auditor's, judged from README.md,
docs/peft-guide.md, docs/limits.md, docs/getting-started.md and from what LoRA does under the same peft calls.
Areas: several adapters and mixed batches (`forward(adapter_names=...)`), peft's functional API
(`peft.functional.set_adapter / delete_adapter / set_requires_grad`, `get_/set_peft_model_state_dict`) against
LoRA, exact `unload` (state_dict keys and values, outputs, `requires_grad`, module types) on GPT-NeoX, Llama, a timm
ViT and an open_clip CLIP, whole-model folders (`mmpreproj.save_pretrained` / `from_pretrained`), `preproj_lora`
folders, deep copies / pickling / `state_dict()` round trips / dtype casts, the legacy fixtures, and documented
small promises (inference_mode, is_trainable, merge refused, trainable counts). Every refused call must leave the
model unchanged (parameters, buffers, requires_grad, module tree, peft's attributes) and name the bad argument.
`bench/results/capability_audit.txt` is its output (212 cases, about 20 s on one core).

What its FAILs said, as the auditor judged them (`bench/results/capability_audit_before.txt`: 9 of 212), and now
(`capability_audit.txt`: 5, each a limit written in docs/limits.md or documented):
  * fixed (tests/method/model/test_reliability_capability_audit.py): `PeftModel.unload()` of a PREPROJ model left
    `peft_config` on the base (LoRA's unload deletes it); `PeftModel.add_adapter` started the new adapter's
    `modules_to_save` module from the active adapter's trained values, not the base's (LoRA: the base's);
    `mmpreproj.load_adapter(..., adapter_name="b", is_trainable=True)` left b frozen once active; after
    `load_state_dict(assign=True)` (new parameter objects) `unload` left the base frozen (now found by name);
  * limits (docs/limits.md): with `modules_to_save` and several adapters the waiting adapters' values are outside
    `state_dict()` (2 cases); after transformers' `model.load_adapter`, `mmpreproj.unload` leaves transformers' own
    record, so its `save_pretrained` and a second `load_adapter` refuse, as after a LoRA `load_adapter` (2 cases);
  * documented: a legacy (pre-peft) folder through peft's own `PeftModel.load_adapter` fails in peft's reader.

One line per case: PASS/FAIL | area | case | details.  Every case builds its own tiny host (random weights, from
configs in code: tests/helpers/zoo.py, timm and open_clip as their tests build them); nothing is downloaded.

Re-run on b778dff (bench/results/capability_audit.txt): TOTAL 212: 205 PASS, 7 FAIL. The two new FAILs are this
harness's expectation that the last adapter's delete is refused (then documented): it is now allowed on every route,
as LoRA's is (issue 45 item 2; docs/limits.md no longer lists the refusal). The other five are as before.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import logging
import os
import pickle
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import peft  # noqa: E402
import peft.functional as pf  # noqa: E402
import torch  # noqa: E402
import transformers as tf  # noqa: E402
from calls_audit import DEEP_TYPES, diff, origin, snap  # noqa: E402 (the snapshot of the second audit)
from safetensors.torch import load_file  # noqa: E402

import mmpreproj  # noqa: E402
from mmpreproj import PreProjConfig  # noqa: E402
from tests.helpers import zoo  # noqa: E402

CASES: list = []
TMP = Path(tempfile.mkdtemp(prefix="capability_audit_"))


def case(area, name):
    def deco(fn):
        CASES.append((area, name, fn))
        return fn

    return deco


class Fail(Exception):
    pass


def tmpdir(tag="d"):
    return Path(tempfile.mkdtemp(prefix=f"{tag}_", dir=TMP))


# ---------------------------------------------------------------- hosts and inputs


def neox(seed=0):
    return zoo.tiny_neox(seed=seed)


def llama(seed=0):
    return zoo.BUILDERS["llama"](seed=seed)


def timm_vit(seed=0):
    import timm.models.vision_transformer as tv

    torch.manual_seed(seed)
    return tv.VisionTransformer(embed_dim=64, depth=2, img_size=32, patch_size=8, num_heads=4, num_classes=10).eval()


def clip(seed=0):
    from open_clip.model import CLIP

    torch.manual_seed(seed)
    return CLIP(
        embed_dim=32,
        vision_cfg=dict(image_size=32, patch_size=8, width=64, layers=2, head_width=32),
        text_cfg=dict(context_length=16, vocab_size=100, width=64, heads=2, layers=2),
    ).eval()


def ids(batch=3):
    return zoo.tokens(batch=batch)[0]


def img(batch=3):
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def lm_out(model, batch=3, **kw):
    with torch.no_grad():
        return model(ids(batch), **kw).logits


def vit_out(model, batch=3, **kw):
    with torch.no_grad():
        return model(img(batch), **kw)


def clip_out(model, batch=3, **kw):
    t = torch.randint(1, 99, (batch, 16), generator=torch.Generator().manual_seed(2))
    t[:, -3] = 99
    with torch.no_grad():
        return torch.cat([model.encode_image(img(batch)), model.encode_text(t)], -1)


HOSTS = {
    "neox": (neox, lm_out),
    "llama": (llama, lm_out),
    "timm_vit": (timm_vit, vit_out),
    "clip": (clip, clip_out),
}

# ---------------------------------------------------------------- snapshots and comparisons


def refused(model, call, words):
    """`call()` must raise, name one of `words`, and leave `model` unchanged (raises Fail otherwise)."""
    before = snap(model)
    try:
        r = call()
    except Exception as e:  # noqa: BLE001
        probs = []
        src = origin(e)
        if isinstance(e, DEEP_TYPES) or "/torch/" in src or "/transformers/" in src:
            probs.append(f"deep crash {type(e).__name__} in {src.split('site-packages/')[-1]}")
        if words and not any(w.lower() in str(e).lower() for w in words):
            probs.append(f"message names none of {words}")
        probs += diff(before, snap(model))
        msg = f"{type(e).__name__}: {str(e)[:150]}".replace("\n", " ")
        if probs:
            raise Fail("; ".join(probs) + f" | {msg}") from None
        return msg
    raise Fail(f"NOT refused (returned {type(r).__name__}); changes: {diff(before, snap(model)) or 'none'}")


def exact(a, b, what):
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise Fail(f"{what}: not tensors ({type(a).__name__}, {type(b).__name__})")
    if a.shape != b.shape or a.dtype != b.dtype:
        raise Fail(f"{what}: shape/dtype {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
    if not torch.equal(a, b):
        raise Fail(f"{what}: not bit-equal, max diff {(a.float() - b.float()).abs().max().item():.3g}")


def close(a, b, what, **tol):
    try:
        torch.testing.assert_close(a, b, **tol)
    except AssertionError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        raise Fail(f"{what}: " + "; ".join(lines[:3])) from None
    return "bit-equal" if torch.equal(a, b) else f"close (max {(a.float() - b.float()).abs().max().item():.2g})"


def differs(a, b, what):
    if a.shape == b.shape and torch.equal(a, b):
        raise Fail(f"{what}: equal (the adapter had no effect; the check would be vacuous)")


def adapter_params(model, name=None):
    """The injected weights (of adapter `name`), by parameter name."""
    out = {}
    for n, p in model.named_parameters():
        parts = n.split(".")
        for slot in ("preproj", "preproj_skip"):
            if slot in parts:
                i = parts.index(slot)
                if i + 1 < len(parts) and (name is None or parts[i + 1] == name):
                    out[n] = p
    return out


def perturb(model, name=None, seed=1, scale=0.05, params=None):
    """Move adapter `name`'s weights (or `params`) off their init, deterministically (an init of zeros hides bugs)."""
    g = torch.Generator().manual_seed(seed)
    ps = params if params is not None else adapter_params(model, name)
    if not ps:
        raise Fail(f"harness: no adapter params for {name!r}")
    with torch.no_grad():
        for _, p in sorted(ps.items()):
            p.add_(scale * torch.randn(p.shape, generator=g).to(p.dtype))
    return model


def noise(t, seed=5):
    """Random values shaped as `t` (a constant shift of an LM head is invisible after a mean-free LayerNorm)."""
    return torch.randn(t.shape, generator=torch.Generator().manual_seed(seed)).to(t.dtype)


def sd_copy(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_sd(a, b, what):
    if a.keys() != b.keys():
        raise Fail(
            f"{what}: state_dict keys differ: -{sorted(a.keys() - b.keys())[:3]} +{sorted(b.keys() - a.keys())[:3]}"
        )
    for k in a:
        if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not torch.equal(a[k], b[k]):
            raise Fail(f"{what}: state_dict value {k} differs")


def flags(model):
    return {n: p.requires_grad for n, p in model.named_parameters()}


def types(model):
    return [(n, type(m).__name__) for n, m in model.named_modules()]


HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


def residue(model):
    """Per module: hook counts, instance attribute names and the training flag (what unload must put back)."""
    out = {}
    for n, m in model.named_modules():
        hooks = tuple(len(getattr(m, h, {}) or {}) for h in HOOK_DICTS)
        out[n] = (hooks, tuple(sorted(vars(m))), m.training)
    return out


def residue_diff(a, b):
    d = []
    for n in a:
        if n in b and a[n] != b[n]:
            ha, attrs_a, ta = a[n]
            hb, attrs_b, tb = b[n]
            what = []
            if ha != hb:
                what.append(f"hooks {dict(zip(HOOK_DICTS, hb))} vs {dict(zip(HOOK_DICTS, ha))}")
            if attrs_a != attrs_b:
                what.append(f"attrs +{sorted(set(attrs_b) - set(attrs_a))} -{sorted(set(attrs_a) - set(attrs_b))}")
            if ta != tb:
                what.append(f"training {ta}->{tb}")
            d.append(f"{n or '<root>'}: {'; '.join(what)}")
    return d


def folder_of(host, cfg, seed, name_seed):
    """An adapter folder of `host` with perturbed weights."""
    build, _ = HOSTS[host]
    src = build()
    mmpreproj.inject(src, cfg)
    perturb(src, seed=name_seed)
    d = tmpdir("adapter")
    mmpreproj.save_adapter(src, d)
    return d, src


def two_adapter_inplace(host="neox", cfg_b=None):
    """Model with 'default' (perturbed) and 'b' (loaded from a folder, perturbed); plus models holding each alone."""
    build, out = HOSTS[host]
    d_a, alone_a = folder_of(host, PreProjConfig(), 0, 11)
    d_b, alone_b = folder_of(host, cfg_b or PreProjConfig(), 0, 22)
    m = mmpreproj.load_adapter(build(), d_a)
    mmpreproj.load_adapter(m, d_b, adapter_name="b")
    return m, alone_a, alone_b, d_a, d_b


# ================================================================= several adapters, mixed batches


def mixed_rows(m, out, names, alone, base, kw_name="adapter_names"):
    got = out(m, **{kw_name: names})
    details = []
    for i, n in enumerate(names):
        want = out(base if n == "__base__" else alone[n])
        details.append(close(got[i], want[i], f"row {i} ({n})"))
    return ", ".join(sorted(set(details)))


for _host in ("neox", "llama"):

    @case("mixed batch", f"{_host}: inject + load_adapter(adapter_name='b'): rows = each adapter alone / the base")
    def _(host=_host):
        m, a, b, *_ = two_adapter_inplace(host)
        build, out = HOSTS[host]
        differs(out(a), out(b), "adapters a and b")
        return mixed_rows(m, out, ["default", "b", "__base__"], {"default": a, "b": b}, build())

    @case("mixed batch", f"{_host}: inject: rows = set_adapter / adapter_disabled forwards on the same model")
    def _(host=_host):
        m, a, b, *_ = two_adapter_inplace(host)
        _, out = HOSTS[host]
        names = ["b", "__base__", "default"]
        got = out(m, adapter_names=names)
        mmpreproj.set_adapter(m, "b")
        ob = out(m)
        mmpreproj.set_adapter(m, "default")
        od = out(m)
        with mmpreproj.adapter_disabled(m):
            o0 = out(m)
        r = [close(got[0], ob[0], "row b"), close(got[1], o0[1], "row base"), close(got[2], od[2], "row default")]
        if mmpreproj.active_adapter(m) != "default":
            raise Fail(f"active adapter after the mixed batch: {mmpreproj.active_adapter(m)}")
        return ", ".join(sorted(set(r)))


@case("mixed batch", "neox: a mixed batch leaves the active adapter's later outputs unchanged")
def _():
    m, a, *_ = two_adapter_inplace("neox")
    before = lm_out(m)
    lm_out(m, adapter_names=["b", "__base__", "b"])
    exact(lm_out(m), before, "after a mixed batch")
    return "ok"


@case("mixed batch", "neox: all rows 'b' = set_adapter('b')")
def _():
    m, _, b, *_ = two_adapter_inplace("neox")
    return close(lm_out(m, adapter_names=["b", "b", "b"]), lm_out(b), "all-b batch")


@case("mixed batch", "neox: mixed batch in training mode (documented to run) = per-row eval forwards")
def _():
    m, a, b, *_ = two_adapter_inplace("neox")
    m.train()
    got = lm_out(m, adapter_names=["default", "b", "__base__"])
    m.eval()
    return ", ".join(
        {
            close(got[0], lm_out(a)[0], "row a"),
            close(got[1], lm_out(b)[1], "row b"),
            close(got[2], lm_out(neox())[2], "base"),
        }
    )


@case("mixed batch", "neox: mixed batch backward reaches only the rows' adapters' weights")
def _():
    m, *_ = two_adapter_inplace("neox")
    for p in adapter_params(m).values():
        p.requires_grad_(True)
    m(ids(), adapter_names=["b", "b", "__base__"]).logits.sum().backward()
    ga = [n for n, p in adapter_params(m, "default").items() if p.grad is not None and p.grad.abs().sum() > 0]
    gb = [n for n, p in adapter_params(m, "b").items() if p.grad is None or p.grad.abs().sum() == 0]
    if ga or gb:
        raise Fail(f"default got grads: {ga[:2]}; b without grads: {gb[:2]}")
    return "ok"


@case("mixed batch", "neox PeftModel: generate(adapter_names=...) rows = each adapter's greedy generate alone")
def _():
    m, a, b = peft_two("neox")
    m.eval()
    x = ids()
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(x))
    with torch.no_grad():
        got = m.generate(input_ids=x, adapter_names=["default", "b", "__base__"], **kw)
        want = [a.generate(input_ids=x, **kw)[0], b.generate(input_ids=x, **kw)[1], neox().generate(x, **kw)[2]]
    for i in range(3):
        exact(got[i], want[i], f"generated row {i}")
    return "ok"


def peft_two(host="neox", cfg=None, route="add_adapter"):
    build, out = HOSTS[host]
    pm = peft.get_peft_model(build(), cfg or PreProjConfig())
    perturb(pm, "default", seed=11)
    if route == "add_adapter":
        pm.add_adapter("b", cfg or PreProjConfig())
        perturb(pm, "b", seed=22)
        d = tmpdir("b")
        pm.save_pretrained(str(d), selected_adapters=["b"])
        b_alone = peft.PeftModel.from_pretrained(build(), str(d / "b"))
    else:
        d_b, b_alone = folder_of(host, cfg or PreProjConfig(), 0, 22)
        pm.load_adapter(str(d_b), adapter_name="b")
    d_a = tmpdir("a")
    pm.save_pretrained(str(d_a), selected_adapters=["default"])
    a_alone = peft.PeftModel.from_pretrained(build(), str(d_a))
    return pm, a_alone, b_alone


for _host, _route in [
    ("neox", "add_adapter"),
    ("neox", "load_adapter"),
    ("llama", "add_adapter"),
    ("timm_vit", "load_adapter"),
]:

    @case("mixed batch", f"{_host}: PeftModel.{_route}: rows = each adapter alone / the base")
    def _(host=_host, route=_route):
        build, out = HOSTS[host]
        pm, a, b = peft_two(host, route=route)
        differs(out(a), out(b), "adapters a and b")
        return mixed_rows(pm, out, ["b", "default", "__base__"], {"default": a, "b": b}, build())


@case("mixed batch", "neox LoRA reference: PeftModel.add_adapter rows = each adapter alone (harness check)")
def _():
    cfg = peft.LoraConfig(r=4, target_modules=["query_key_value"], init_lora_weights=False)
    pm = peft.get_peft_model(neox(), cfg)
    pm.add_adapter("b", peft.LoraConfig(r=4, target_modules=["query_key_value"], init_lora_weights=False))
    pm.eval()
    got = lm_out(pm, adapter_names=["b", "default", "__base__"])
    pm.set_adapter("b")
    ob = lm_out(pm)
    pm.set_adapter("default")
    od = lm_out(pm)
    with pm.disable_adapter():
        o0 = lm_out(pm)
    return ", ".join({close(got[0], ob[0], "b"), close(got[1], od[1], "default"), close(got[2], o0[2], "base")})


@case("mixed batch", "clip (in place): encode_text with 'b' active = b alone")
def _():
    m, a, b, *_ = two_adapter_inplace("clip")
    mmpreproj.set_adapter(m, "b")
    t = torch.randint(1, 99, (3, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        return close(m.encode_text(t), b.encode_text(t), "active b")


# ---- refusals of mixed batches


@case("mixed batch refused", "neox: an unknown adapter name names it, model unchanged")
def _():
    m, *_ = two_adapter_inplace("neox")
    return refused(m, lambda: m(ids(), adapter_names=["default", "nope", "b"]), ["nope"])


@case("mixed batch refused", "neox: a count other than the batch's is refused, model unchanged")
def _():
    m, *_ = two_adapter_inplace("neox")
    return refused(m, lambda: m(ids(), adapter_names=["default", "b"]), ["adapter_names", "batch", "rows"])


@case("mixed batch refused", "neox PeftModel: unknown name refused, model unchanged")
def _():
    pm, *_ = peft_two("neox")
    return refused(pm, lambda: pm(ids(), adapter_names=["default", "zz", "b"]), ["zz"])


@case("mixed batch refused", "neox: a deleted adapter's name is refused afterwards")
def _():
    m, *_ = two_adapter_inplace("neox")
    mmpreproj.delete_adapter(m, "b")
    return refused(m, lambda: m(ids(), adapter_names=["default", "b", "default"]), ["b"])


@case("mixed batch refused", "neox: modules_to_save trained in place + '__base__' row refused (documented)")
def _():
    m = neox()
    mmpreproj.inject(m, PreProjConfig(modules_to_save=["lm_head"]))
    perturb(m, "default", seed=3)
    d, _ = folder_of("neox", PreProjConfig(modules_to_save=["lm_head"]), 0, 5)
    mmpreproj.load_adapter(m, d, adapter_name="b")
    return refused(m, lambda: m(ids(), adapter_names=["default", "__base__", "default"]), ["modules_to_save"])


# ================================================================= peft.functional against LoRA


def lora_inplace_two():
    m = neox()
    for n in ("default", "b"):
        cfg = peft.LoraConfig(r=4, target_modules=["query_key_value"], init_lora_weights=False)
        peft.inject_adapter_in_model(cfg, m, adapter_name=n)
    return m


def lora_params(model, name):
    return {n: p for n, p in model.named_parameters() if f".{name}." in n and "lora_" in n}


@case("peft.functional", "in place: pf.set_adapter(model, 'b') = adapter b alone; active_adapter says 'b'")
def _():
    m, a, b, *_ = two_adapter_inplace("neox")
    pf.set_adapter(m, "b")
    if mmpreproj.active_adapter(m) != "b":
        raise Fail(f"active_adapter: {mmpreproj.active_adapter(m)}")
    r = close(lm_out(m), lm_out(b), "after pf.set_adapter(b)")
    pf.set_adapter(m, "default")
    return r + "; back: " + close(lm_out(m), lm_out(a), "after pf.set_adapter(default)")


@case("peft.functional", "in place: pf.set_requires_grad(b, True/False) flips exactly b's params (as LoRA's)")
def _():
    res = []
    for kind in ("lora", "preproj"):
        if kind == "lora":
            m = lora_inplace_two()
            for p in m.parameters():
                p.requires_grad_(False)
            own = lora_params
        else:
            m, *_ = two_adapter_inplace("neox")
            for p in m.parameters():
                p.requires_grad_(False)
            own = adapter_params
        before = flags(m)
        pf.set_requires_grad(m, "b", requires_grad=True)
        after = flags(m)
        flipped = {n for n in before if before[n] != after[n]}
        want = set(own(m, "b"))
        if flipped != want:
            raise Fail(f"{kind}: flipped {sorted(flipped - want)[:2]} extra, {sorted(want - flipped)[:2]} missing")
        pf.set_requires_grad(m, "b", requires_grad=False)
        if flags(m) != before:
            raise Fail(f"{kind}: set_requires_grad(False) did not restore the flags")
        res.append(f"{kind} {len(want)} params")
    return ", ".join(res)


@case("peft.functional", "in place: get_peft_model_state_dict(b) -> set_peft_model_state_dict into a fresh inject")
def _():
    m, _, b, *_ = two_adapter_inplace("neox")
    sd = peft.get_peft_model_state_dict(m, adapter_name="b")
    if any(".b." in k or ".default." in k for k in sd):
        raise Fail(f"keys carry the adapter name: {[k for k in sd if '.b.' in k][:2]}")
    fresh = mmpreproj.inject(neox(), PreProjConfig())
    res = peft.set_peft_model_state_dict(fresh, sd)
    unexpected = list(getattr(res, "unexpected_keys", []))
    if unexpected:
        raise Fail(f"unexpected keys {unexpected[:3]}")
    return close(lm_out(fresh), lm_out(b), "fresh model after set_peft_model_state_dict")


@case("peft.functional", "in place: set_peft_model_state_dict(adapter_name='b') into a two-adapter model")
def _():
    m, a, b, *_ = two_adapter_inplace("neox")
    sd = {k: v.clone() for k, v in peft.get_peft_model_state_dict(m, adapter_name="b").items()}
    perturb(m, "b", seed=99)
    peft.set_peft_model_state_dict(m, sd, adapter_name="b")
    mmpreproj.set_adapter(m, "b")
    r = close(lm_out(m), lm_out(b), "b restored")
    mmpreproj.set_adapter(m, "default")
    return r + "; default untouched: " + close(lm_out(m), lm_out(a), "default")


@case("peft.functional", "in place: LoRA reference get/set_peft_model_state_dict roundtrip (harness check)")
def _():
    m = lora_inplace_two()
    sd = {k: v.clone() for k, v in peft.get_peft_model_state_dict(m, adapter_name="b").items()}
    want = lm_out(m)
    with torch.no_grad():
        for p in lora_params(m, "default").values():
            p.mul_(1.5)
    peft.set_peft_model_state_dict(m, sd, adapter_name="default")
    return f"{len(sd)} keys; outputs changed as expected: {not torch.equal(lm_out(m), want)}"


@case("peft.functional", "in place: pf.delete_adapter(b, prefix='preproj'): outputs = default alone, b gone")
def _():
    m, a, *_ = two_adapter_inplace("neox")
    pf.delete_adapter(m, "b", prefix="preproj")
    left = [n for n in m.state_dict() if ".b." in n]
    if left:
        raise Fail(f"b's keys remain: {left[:2]}")
    if mmpreproj.adapter_names(m) != ["default"]:
        raise Fail(f"adapter_names {mmpreproj.adapter_names(m)}")
    lora = lora_inplace_two()
    pf.delete_adapter(lora, "b", prefix="lora_")
    ours_kept, lora_kept = "b" in getattr(m, "peft_config", {}), "b" in getattr(lora, "peft_config", {})
    if ours_kept != lora_kept:
        raise Fail(f"peft_config keeps 'b': ours {ours_kept}, LoRA {lora_kept}")
    return close(lm_out(m), lm_out(a), "after delete b") + f"; peft_config keeps 'b' as LoRA's does: {lora_kept}"


@case("peft.functional", "in place: pf.delete_adapter of the active adapter hands over to the other (as LoRA)")
def _():
    m, a, *_ = two_adapter_inplace("neox")
    mmpreproj.set_adapter(m, "b")
    pf.delete_adapter(m, "b", prefix="preproj")
    if mmpreproj.active_adapter(m) != "default":
        raise Fail(f"active {mmpreproj.active_adapter(m)}")
    return close(lm_out(m), lm_out(a), "after deleting the active b")


@case("peft.functional", "in place: then unload after pf.delete_adapter gives the base bit-exact")
def _():
    m, *_ = two_adapter_inplace("neox")
    pf.delete_adapter(m, "b", prefix="preproj")
    mmpreproj.unload(m)
    exact(lm_out(m), lm_out(neox()), "unloaded")
    same_sd(m.state_dict(), neox().state_dict(), "unloaded")
    return "ok"


@case("peft.functional", "PeftModel: get_peft_model_state_dict -> set_peft_model_state_dict into a fresh PeftModel")
def _():
    pm, a, _ = peft_two("neox")
    sd = peft.get_peft_model_state_dict(pm)
    fresh = peft.get_peft_model(neox(), PreProjConfig())
    res = peft.set_peft_model_state_dict(fresh, sd)
    if list(res.unexpected_keys):
        raise Fail(f"unexpected keys {list(res.unexpected_keys)[:3]}")
    return close(lm_out(fresh), lm_out(a), "fresh PeftModel")


@case("peft.functional", "PeftModel: set_peft_model_state_dict(adapter_name='b') restores b, default untouched")
def _():
    pm, a, b = peft_two("neox")
    sd = {k: v.clone() for k, v in peft.get_peft_model_state_dict(pm, adapter_name="b").items()}
    perturb(pm, "b", seed=99)
    peft.set_peft_model_state_dict(pm, sd, adapter_name="b")
    pm.set_adapter("b")
    r = close(lm_out(pm), lm_out(b), "b restored")
    pm.set_adapter("default")
    return r + "; " + close(lm_out(pm), lm_out(a), "default untouched")


@case("peft.functional", "PeftModel: pf.set_requires_grad(pm.base_model.model, 'b') flips exactly b's params")
def _():
    pm, *_ = peft_two("neox")
    inner = pm.base_model.model
    for p in inner.parameters():
        p.requires_grad_(False)
    before = flags(inner)
    pf.set_requires_grad(inner, "b", requires_grad=True)
    after = flags(inner)
    flipped = {n for n in before if before[n] != after[n]}
    want = set(adapter_params(inner, "b"))
    if flipped != want:
        raise Fail(f"flipped extra {sorted(flipped - want)[:2]}, missing {sorted(want - flipped)[:2]}")
    return f"{len(want)} params"


@case("peft.functional", "PeftModel: set_requires_grad('b') and set_adapter('b') leave the same trainables as LoRA")
def _():
    res = []
    for kind in ("lora", "preproj"):
        if kind == "lora":
            mk = lambda: peft.LoraConfig(r=4, target_modules=["query_key_value"])  # noqa: E731
            own = lora_params
        else:
            mk = PreProjConfig
            own = adapter_params
        pm = peft.get_peft_model(neox(), mk())
        pm.add_adapter("b", mk())
        pm.set_requires_grad("b", requires_grad=True)
        tr1 = {n for n, p in pm.named_parameters() if p.requires_grad}
        pm.set_adapter("b")
        tr2 = {n for n, p in pm.named_parameters() if p.requires_grad}
        shape = (
            tr1 == set(own(pm, "default")) | set(own(pm, "b")),
            tr2 == set(own(pm, "b")),
            tr1 == set(own(pm, "default")) | set(own(pm, "b")) or tr1,
        )
        res.append((kind, shape[0], shape[1]))
    if res[0][1:] != res[1][1:]:
        raise Fail(f"LoRA vs PREPROJ (both trainable after set_requires_grad, only b after set_adapter): {res}")
    return str(res)


# ================================================================= exact unload


def unload_case(host, *, route="inject", train=False, mts=None, two=False):
    build, out = HOSTS[host]
    base = build()
    sd0 = sd_copy(base)
    fl0 = flags(base)
    ty0 = types(base)
    res0 = residue(base)
    o0 = out(base)
    cfg = PreProjConfig(modules_to_save=mts) if mts else PreProjConfig()
    if route == "inject":
        m = mmpreproj.inject(base, cfg)
    else:
        m = peft.get_peft_model(base, cfg)
    perturb(m, "default", seed=4)
    if two:
        d, _ = folder_of(host, cfg, 0, 8)
        if route == "inject":
            mmpreproj.load_adapter(m, d, adapter_name="b")
            mmpreproj.set_adapter(m, "b")
        else:
            m.load_adapter(str(d), adapter_name="b")
            m.set_adapter("b")
    differs(out(m), o0, "injected vs base")
    if train:
        m.train()
        opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
        if host in ("neox", "llama"):
            x = ids()
            loss = m(input_ids=x, labels=x).loss
        elif host == "clip":
            loss = m.encode_image(img()).square().mean()
        else:
            loss = m(img()).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        m.eval()
    mts_keys = set()
    if mts:
        mts_vals = {
            k: v.detach().clone()
            for k, v in m.state_dict().items()
            if any(k.startswith(p + ".") or f".{p}." in k for p in mts)
        }
        mts_keys = {k.replace("base_model.model.", "") for k in mts_vals}
    u = mmpreproj.unload(m) if route == "inject" else m.unload()
    if u is None:
        u = base
    sd1 = u.state_dict()
    if sd1.keys() != sd0.keys():
        raise Fail(f"keys: -{sorted(sd0.keys() - sd1.keys())[:3]} +{sorted(sd1.keys() - sd0.keys())[:3]}")
    changed = [k for k in sd0 if sd0[k].dtype != sd1[k].dtype or not torch.equal(sd0[k], sd1[k])]
    bad = [k for k in changed if k not in mts_keys]
    if bad:
        raise Fail(f"base values changed: {bad[:3]}")
    if flags(u) != fl0:
        raise Fail(f"requires_grad not restored: {[n for n in fl0 if flags(u).get(n) != fl0[n]][:3]}")
    if types(u) != ty0:
        raise Fail("module tree (names/types) differs from the base's")
    rd = residue_diff(res0, residue(u))
    if route == "peft":  # reported once, by its own case ("PeftModel.unload() leaves no peft_config")
        rd = [x for x in rd if x != "<root>: attrs +['peft_config'] -[]"]
    if rd:
        raise Fail(f"left on modules after unload: {rd[:2]}")
    left = [n for n, mod in u.named_modules() if "preproj" in type(mod).__name__.lower()]
    if left or hasattr(u, "peft_config") and route == "inject":
        raise Fail(f"leftovers: modules {left[:2]}, peft_config {hasattr(u, 'peft_config')}")
    if not changed:
        exact(out(u), o0, "outputs after unload")
        return "state_dict and outputs bit-identical to the base"
    return f"outside modules_to_save bit-identical; modules_to_save kept their trained values ({len(changed)} tensors)"


for _host in ("neox", "llama", "timm_vit", "clip"):
    for _route in ("inject", "peft"):
        if _route == "peft" and _host == "clip":
            continue
        case("unload", f"{_host} {_route}: unload = the base (state_dict, outputs, flags, module types)")(
            lambda host=_host, route=_route: unload_case(host, route=route)
        )
        case("unload", f"{_host} {_route}: after a training step (AdamW, weight decay)")(
            lambda host=_host, route=_route: unload_case(host, route=route, train=True)
        )
    case("unload", f"{_host} inject: with a second adapter active")(lambda host=_host: unload_case(host, two=True))

for _host, _mts in [("neox", ["lm_head"]), ("llama", ["lm_head"]), ("timm_vit", ["head"])]:
    case("unload", f"{_host} inject: modules_to_save={_mts}, untrained")(
        lambda host=_host, mts=_mts: unload_case(host, mts=mts)
    )
    case("unload", f"{_host} inject: modules_to_save={_mts}, after a training step")(
        lambda host=_host, mts=_mts: unload_case(host, mts=mts, train=True)
    )
case("unload", "neox peft: modules_to_save=['lm_head'], after a training step")(
    lambda: unload_case("neox", route="peft", mts=["lm_head"], train=True)
)
case("unload", "neox inject: modules_to_save + two adapters, 'b' active, trained")(
    lambda: unload_case("neox", mts=["lm_head"], train=True, two=True)
)


@case("unload", "neox: modules_to_save trained then unload: compare with LoRA (which keeps the trained copy)")
def _():
    # LoRA: PeftModel.unload() puts modules_to_save[active] in place (the trained copy).
    cfg = peft.LoraConfig(r=4, target_modules=["query_key_value"], modules_to_save=["lm_head"])
    pm = peft.get_peft_model(neox(), cfg)
    with torch.no_grad():
        pm.base_model.model.lm_head.modules_to_save["default"].weight.add_(
            1.0 * noise(pm.base_model.model.lm_head.modules_to_save["default"].weight)
        )
    u = pm.unload()
    lora_kept = not torch.equal(u.lm_head.weight, neox().lm_head.weight)
    m = mmpreproj.inject(neox(), PreProjConfig(modules_to_save=["lm_head"]))
    with torch.no_grad():
        m.lm_head.weight.add_(1.0 * noise(m.lm_head.weight))
    mmpreproj.unload(m)
    ours_kept = not torch.equal(m.lm_head.weight, neox().lm_head.weight)
    return f"LoRA keeps trained modules_to_save: {lora_kept}; mmpreproj keeps: {ours_kept}"


@case("unload", "PeftModel.unload() leaves no peft_config on the base (as LoRA's); get_peft_model again is clean")
def _():
    res = {}
    for kind, cfg in [
        ("lora", peft.LoraConfig(r=4, target_modules=["query_key_value"])),
        ("preproj", PreProjConfig()),
    ]:
        u = peft.get_peft_model(neox(), cfg).unload()
        left = "peft_config" in vars(u)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            peft.get_peft_model(u, peft.LoraConfig(r=4, target_modules=["query_key_value"]))
        again = [str(x.message)[:60] for x in w if "peft_config" in str(x.message)]
        res[kind] = (left, again)
    if res["preproj"] != res["lora"]:
        raise Fail(f"(peft_config left, warnings of a second get_peft_model): {res}")
    return str(res)


@case("unload", "neox: adapter_disabled gives the base bit-exact")
def _():
    m, *_ = two_adapter_inplace("neox")
    with mmpreproj.adapter_disabled(m):
        exact(lm_out(m), lm_out(neox()), "adapter_disabled")
    return "ok"


@case("unload", "neox PeftModel: disable_adapter() gives the base bit-exact")
def _():
    pm, *_ = peft_two("neox")
    with pm.disable_adapter():
        exact(lm_out(pm), lm_out(neox()), "disable_adapter")
    return "ok"


# ================================================================= whole-model folders


for _host in ("neox", "llama"):

    @case("save_pretrained", f"{_host}: save_pretrained -> from_pretrained / load_adapter / plain base reproduce")
    def _(host=_host):
        build, out = HOSTS[host]
        m = perturb(mmpreproj.inject(build(), PreProjConfig()), "default", seed=5)
        want = out(m)
        d = tmpdir("full")
        mmpreproj.save_pretrained(m, d)
        r = [close(out(mmpreproj.from_pretrained(d).eval()), want, "from_pretrained", rtol=0, atol=0)]
        cls = type(build())
        base, info = cls.from_pretrained(str(d), output_loading_info=True)
        if any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")):
            raise Fail(f"plain from_pretrained load info: { {k: v for k, v in info.items() if v} }")
        exact(out(base.eval()), out(build()), "plain from_pretrained = base")
        r.append(close(out(mmpreproj.load_adapter(base, d)), want, "load_adapter(base, DIR)", rtol=0, atol=0))
        return ", ".join(r)


@case("save_pretrained", "neox: adapter_only=True -> load_adapter reproduces")
def _():
    m = perturb(mmpreproj.inject(neox(), PreProjConfig()), "default", seed=5)
    d = tmpdir("ao")
    mmpreproj.save_pretrained(m, d, adapter_only=True)
    exact(lm_out(mmpreproj.load_adapter(neox(), d)), lm_out(m), "adapter_only")
    return "ok"


@case("save_pretrained", "neox: modules_to_save=['lm_head'] trained -> save_pretrained -> from_pretrained")
def _():
    m = mmpreproj.inject(neox(), PreProjConfig(modules_to_save=["lm_head"]))
    perturb(m, "default", seed=5)
    with torch.no_grad():
        m.lm_head.weight.add_(0.1 * noise(m.lm_head.weight))
    want = lm_out(m)
    d = tmpdir("full")
    mmpreproj.save_pretrained(m, d)
    got = lm_out(mmpreproj.from_pretrained(d).eval())
    return close(got, want, "from_pretrained", rtol=0, atol=0)


@case("save_pretrained", "neox: modules_to_save trained -> save_pretrained: the top folder is the base")
def _():
    m = mmpreproj.inject(neox(), PreProjConfig(modules_to_save=["lm_head"]))
    with torch.no_grad():
        m.lm_head.weight.add_(0.1 * noise(m.lm_head.weight))
    d = tmpdir("full")
    mmpreproj.save_pretrained(m, d)
    base = tf.GPTNeoXForCausalLM.from_pretrained(str(d)).eval()
    try:
        exact(lm_out(base), lm_out(neox()), "top folder vs the untouched base")
    except Fail as e:
        raise Fail(f"{e} (the trained modules_to_save value is written as the base)") from None
    return "ok"


@case("save_pretrained", "neox: two adapters, 'b' active -> save_pretrained -> from_pretrained = the active one")
def _():
    m, _, b, *_ = two_adapter_inplace("neox")
    mmpreproj.set_adapter(m, "b")
    d = tmpdir("full")
    mmpreproj.save_pretrained(m, d)
    got = mmpreproj.from_pretrained(d).eval()
    return close(lm_out(got), lm_out(b), "from_pretrained of a two-adapter model with b active")


@case("save_pretrained", "neox: save_adapter(adapter_name='b') of an inactive adapter -> load alone = b")
def _():
    m, _, b, *_ = two_adapter_inplace("neox")
    d = tmpdir("b")
    mmpreproj.save_adapter(m, d, adapter_name="b")
    return close(lm_out(mmpreproj.load_adapter(neox(), d)), lm_out(b), "b reloaded", rtol=0, atol=0)


for _host in ("timm_vit", "clip", "llama"):

    @case("save_pretrained", f"{_host}: save_adapter -> load_adapter and PeftModel.from_pretrained reproduce")
    def _(host=_host):
        build, out = HOSTS[host]
        d, src = folder_of(host, PreProjConfig(), 0, 6)
        r = [close(out(mmpreproj.load_adapter(build(), d)), out(src), "load_adapter", rtol=0, atol=0)]
        if host != "clip":
            r.append(
                close(out(peft.PeftModel.from_pretrained(build(), str(d))), out(src), "PeftModel", rtol=0, atol=0)
            )
        return ", ".join(r)


@case("save_pretrained", "neox PeftModel.save_pretrained -> mmpreproj.load_adapter reproduces")
def _():
    pm = perturb(peft.get_peft_model(neox(), PreProjConfig()), "default", seed=6)
    d = tmpdir("pm")
    pm.save_pretrained(str(d))
    return close(lm_out(mmpreproj.load_adapter(neox(), d)), lm_out(pm), "load_adapter", rtol=0, atol=0)


@case("save_pretrained", "neox: transformers model.load_adapter(DIR) reproduces")
def _():
    d, src = folder_of("neox", PreProjConfig(), 0, 6)
    m = neox()
    m.load_adapter(str(d))
    return close(lm_out(m), lm_out(src), "transformers load_adapter", rtol=0, atol=0)


# ================================================================= preproj_lora


def preproj_lora_model(seed=0):
    from mmpreproj.train import apply_method

    pm = apply_method(neox(seed), "preproj_lora")
    trainable = {n: p for n, p in pm.named_parameters() if p.requires_grad}
    perturb(pm, params=trainable, seed=9)
    return pm.eval(), trainable


@case("preproj_lora", "apply_method: trains LoRA and ours only; save_pretrained -> load_adapter reproduces")
def _():
    pm, trainable = preproj_lora_model()
    if not any("lora_" in n for n in trainable) or not adapter_params(pm):
        raise Fail(f"trainables: {sorted(trainable)[:4]}")
    non = [n for n in trainable if "lora_" not in n and n not in adapter_params(pm)]
    if non:
        raise Fail(f"other trainables: {non[:3]}")
    d = tmpdir("pl")
    pm.save_pretrained(str(d))
    got = mmpreproj.load_adapter(neox(), d)
    if not isinstance(got, peft.PeftModel):
        raise Fail(f"load_adapter returned {type(got).__name__}")
    tr = [n for n, p in got.named_parameters() if p.requires_grad]
    if tr:
        raise Fail(f"loaded (is_trainable=False) has trainables {tr[:2]}")
    return close(lm_out(got), lm_out(pm), "reloaded", rtol=0, atol=0)


@case("preproj_lora", "load_adapter(is_trainable=True): exactly LoRA's and ours trainable")
def _():
    pm, trainable = preproj_lora_model()
    d = tmpdir("pl")
    pm.save_pretrained(str(d))
    got = mmpreproj.load_adapter(neox(), d, is_trainable=True)
    tr = {n for n, p in got.named_parameters() if p.requires_grad}
    if tr != set(trainable):
        raise Fail(f"extra {sorted(tr - set(trainable))[:2]}, missing {sorted(set(trainable) - tr)[:2]}")
    return f"{len(tr)} tensors"


@case("preproj_lora", "loaded folder's unload() gives the base bit-exact")
def _():
    pm, _ = preproj_lora_model()
    d = tmpdir("pl")
    pm.save_pretrained(str(d))
    got = mmpreproj.load_adapter(neox(), d)
    u = got.unload()
    same_sd(u.state_dict(), neox().state_dict(), "unloaded preproj_lora")
    exact(lm_out(u), lm_out(neox()), "unloaded preproj_lora")
    return "ok"


@case("preproj_lora", "apply_method model unload() gives the base bit-exact (after a step)")
def _():
    pm, _ = preproj_lora_model()
    pm.train()
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-2)
    pm(input_ids=ids(), labels=ids()).loss.backward()
    opt.step()
    u = pm.unload()
    same_sd(u.state_dict(), neox().state_dict(), "unloaded")
    return "ok"


@case("preproj_lora", "peft.PeftModel.from_pretrained(base, DIR) reads the LoRA part alone (documented)")
def _():
    pm, _ = preproj_lora_model()
    d = tmpdir("pl")
    pm.save_pretrained(str(d))
    lora_only = peft.PeftModel.from_pretrained(neox(), str(d))
    if any("preproj" in n for n, _ in lora_only.named_parameters()):
        raise Fail("PREPROJ weights present")
    # our part off: the stacked model with our wrappers disabled must equal the LoRA-only model
    with mmpreproj.adapter_disabled(pm):
        want = lm_out(pm)
    return close(lm_out(lora_only), want, "LoRA part alone")


# ================================================================= copies, pickling, state_dict, dtype


@case("copies", "neox inject: deepcopy keeps outputs; unload of the copy leaves the original injected")
def _():
    m, a, b, *_ = two_adapter_inplace("neox")
    c = copy.deepcopy(m)
    r = close(lm_out(c), lm_out(m), "deepcopy", rtol=0, atol=0)
    r2 = close(
        lm_out(c, adapter_names=["b", "default", "__base__"]),
        lm_out(m, adapter_names=["b", "default", "__base__"]),
        "mixed on copy",
        rtol=0,
        atol=0,
    )
    mmpreproj.set_adapter(c, "b")
    if mmpreproj.active_adapter(m) != "default":
        raise Fail("set_adapter on the copy switched the original")
    mmpreproj.unload(c)
    if not mmpreproj.is_injected(m):
        raise Fail("unload of the copy unloaded the original")
    exact(lm_out(c), lm_out(neox()), "copy unloaded = base")
    exact(lm_out(m), lm_out(a), "original still = a")
    return f"{r}; {r2}"


@case("copies", "neox PeftModel: deepcopy keeps outputs, set_adapter on copy independent")
def _():
    pm, a, b = peft_two("neox")
    c = copy.deepcopy(pm)
    close(lm_out(c), lm_out(pm), "deepcopy", rtol=0, atol=0)
    c.set_adapter("b")
    close(lm_out(c), lm_out(b), "copy b")
    return close(lm_out(pm), lm_out(a), "original default")


@case("copies", "neox inject: pickle.dumps/loads keeps outputs and unloads to the base")
def _():
    m, a, *_ = two_adapter_inplace("neox")
    c = pickle.loads(pickle.dumps(m))
    r = close(lm_out(c), lm_out(m), "pickled", rtol=0, atol=0)
    mmpreproj.unload(c)
    exact(lm_out(c), lm_out(neox()), "pickled then unloaded")
    return r


@case("copies", "neox inject: torch.save/torch.load(weights_only=False) keeps outputs")
def _():
    m, *_ = two_adapter_inplace("neox")
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    c = torch.load(buf, weights_only=False)
    return close(lm_out(c), lm_out(m), "torch.save/load", rtol=0, atol=0)


@case("copies", "neox inject: state_dict() -> load_state_dict into another injected model (two adapters)")
def _():
    m, *_ = two_adapter_inplace("neox")
    other, *_ = two_adapter_inplace("neox")
    perturb(other, seed=77)
    for p in other.parameters():
        with torch.no_grad():
            p.add_(0.01)
    res = other.load_state_dict(m.state_dict())
    if res.missing_keys or res.unexpected_keys:
        raise Fail(f"{res}")
    r = close(lm_out(other), lm_out(m), "after load_state_dict", rtol=0, atol=0)
    mmpreproj.set_adapter(other, "b")
    mmpreproj.set_adapter(m, "b")
    return r + "; b: " + close(lm_out(other), lm_out(m), "b after load_state_dict", rtol=0, atol=0)


@case("copies", "neox PeftModel: state_dict() -> load_state_dict into another PeftModel")
def _():
    pm, *_ = peft_two("neox")
    other, *_ = peft_two("neox")
    perturb(other, seed=78)
    res = other.load_state_dict(pm.state_dict())
    if res.missing_keys or res.unexpected_keys:
        raise Fail(f"{res}")
    return close(lm_out(other), lm_out(pm), "after load_state_dict", rtol=0, atol=0)


@case("copies", "timm_vit inject: deepcopy and state_dict round trip keep outputs")
def _():
    m = perturb(mmpreproj.inject(timm_vit(), PreProjConfig()), seed=3)
    c = copy.deepcopy(m)
    r = close(vit_out(c), vit_out(m), "deepcopy", rtol=0, atol=0)
    o = perturb(mmpreproj.inject(timm_vit(seed=1), PreProjConfig()), seed=4)
    o.load_state_dict(m.state_dict())
    return r + ", " + close(vit_out(o), vit_out(m), "load_state_dict", rtol=0, atol=0)


def dtype_case(cast, dtype):
    m, a, *_ = two_adapter_inplace("neox")
    want = lm_out(m)
    cast(m)
    dts = {p.dtype for p in m.parameters()}
    ad = {p.dtype for p in adapter_params(m).values()}
    got = lm_out(m)
    if not torch.isfinite(got).all():
        raise Fail("non-finite outputs")
    close(got.float(), want, f"{dtype} vs fp32", rtol=0.1, atol=0.1)
    mix = lm_out(m, adapter_names=["b", "default", "__base__"])
    if not torch.isfinite(mix).all():
        raise Fail("non-finite mixed outputs")
    mmpreproj.unload(m)
    if {p.dtype for p in m.parameters()} != {dtype}:
        raise Fail(f"after unload dtypes { ({p.dtype for p in m.parameters()}) }")
    return f"params {sorted(map(str, dts))}, adapter {sorted(map(str, ad))}; close to fp32; mixed batch and unload run"


case("dtype", "neox inject: .to(torch.bfloat16) runs, close to fp32, mixed batch, unload")(
    lambda: dtype_case(lambda m: m.to(torch.bfloat16), torch.bfloat16)
)
case("dtype", "neox inject: .half() runs, close to fp32, mixed batch, unload")(
    lambda: dtype_case(lambda m: m.half(), torch.float16)
)


@case("dtype", "neox bf16 host: inject keeps the modules fp32 (documented), save/load round trip exact")
def _():
    base = neox().to(torch.bfloat16)
    m = perturb(mmpreproj.inject(base, PreProjConfig()), seed=2)
    ad = {p.dtype for p in adapter_params(m).values()}
    if ad != {torch.float32}:
        raise Fail(f"adapter dtypes {ad}")
    d = tmpdir("bf")
    mmpreproj.save_adapter(m, d)
    got = mmpreproj.load_adapter(neox().to(torch.bfloat16), d)
    return close(lm_out(got), lm_out(m), "bf16 reload", rtol=0, atol=0)


@case("dtype", "neox PeftModel: .to(bfloat16) then save_pretrained -> reload into a bf16 base: outputs equal")
def _():
    pm = perturb(peft.get_peft_model(neox(), PreProjConfig()), seed=2)
    pm.to(torch.bfloat16)
    d = tmpdir("bfp")
    pm.save_pretrained(str(d))
    got = peft.PeftModel.from_pretrained(neox().to(torch.bfloat16), str(d))
    return close(lm_out(got), lm_out(pm), "reload", rtol=0, atol=0)


# ================================================================= legacy fixtures

FIX = ROOT / "tests" / "fixtures" / "legacy_adapters"


def legacy_base():
    torch.manual_seed(0)
    cfg = tf.GPTNeoXConfig(
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        vocab_size=32,
        max_position_embeddings=64,
    )
    return tf.GPTNeoXForCausalLM(cfg).eval()


LEGACY_IDS = torch.tensor([[1, 5, 9, 3, 7, 2]])


def legacy_check(model, folder):
    want = load_file(str(FIX / folder / "logits.safetensors"))["logits"]
    with torch.no_grad():
        got = model(LEGACY_IDS).logits
    tol = 64 * torch.finfo(torch.float32).eps * float(want.abs().max())
    return close(got, want, f"{folder} logits vs recorded", rtol=0, atol=tol)


def legacy_copy(folder):
    d = tmpdir("legacy") / folder
    shutil.copytree(FIX / folder, d)
    return d


for _folder in ("preproj_skip", "preproj_lora_run", "preproj_lora_checkpoint"):
    case("legacy", f"{_folder}: load_adapter reproduces the recorded logits")(
        lambda folder=_folder: legacy_check(mmpreproj.load_adapter(legacy_base(), legacy_copy(folder)), folder)
    )


@case("legacy", "save_pretrained: from_pretrained reproduces the recorded logits")
def _():
    return legacy_check(mmpreproj.from_pretrained(legacy_copy("save_pretrained")).eval(), "save_pretrained")


@case("legacy", "save_pretrained: load_adapter(base, DIR) reproduces the recorded logits")
def _():
    return legacy_check(mmpreproj.load_adapter(legacy_base(), legacy_copy("save_pretrained")), "save_pretrained")


@case("legacy", "preproj_skip: loaded, saved again, read by PeftModel.from_pretrained")
def _():
    m = mmpreproj.load_adapter(legacy_base(), legacy_copy("preproj_skip"))
    d = tmpdir("again")
    mmpreproj.save_adapter(m, d)
    return legacy_check(peft.PeftModel.from_pretrained(legacy_base(), str(d)), "preproj_skip")


@case("legacy", "preproj_skip: loaded as a second adapter (adapter_name='old') = the recorded logits")
def _():
    m = mmpreproj.inject(legacy_base(), PreProjConfig())
    mmpreproj.load_adapter(m, legacy_copy("preproj_skip"), adapter_name="old")
    mmpreproj.set_adapter(m, "old")
    return legacy_check(m, "preproj_skip")


@case("legacy", "preproj_skip: PeftModel.load_adapter(adapter_name='old') = the recorded logits")
def _():
    pm = peft.get_peft_model(legacy_base(), PreProjConfig())
    pm.load_adapter(str(legacy_copy("preproj_skip")), adapter_name="old")
    pm.set_adapter("old")
    return legacy_check(pm, "preproj_skip")


@case("legacy", "loading leaves the fixture folders byte-identical")
def _():
    before = {p: p.read_bytes() for p in FIX.rglob("*") if p.is_file()}
    mmpreproj.load_adapter(legacy_base(), FIX / "preproj_skip")
    mmpreproj.load_adapter(legacy_base(), FIX / "preproj_lora_run")
    after = {p: p.read_bytes() for p in FIX.rglob("*") if p.is_file()}
    if before != after:
        raise Fail(f"changed: {[str(p) for p in after if before.get(p) != after[p]][:3]}")
    return f"{len(before)} files"


# ================================================================= small documented promises


@case("promises", "PreProjConfig(inference_mode=True): inject leaves the adapter frozen")
def _():
    m = mmpreproj.inject(neox(), PreProjConfig(inference_mode=True))
    tr = [n for n, p in m.named_parameters() if p.requires_grad]
    if tr:
        raise Fail(f"trainable: {tr[:3]}")
    return "ok"


@case("promises", "peft.inject_adapter_in_model(PreProjConfig(inference_mode=True)) leaves it frozen")
def _():
    m = peft.inject_adapter_in_model(PreProjConfig(inference_mode=True), neox())
    tr = [n for n, p in m.named_parameters() if p.requires_grad]
    if tr:
        raise Fail(f"trainable: {tr[:3]}")
    return "ok"


@case("promises", "get_peft_model(inference_mode=True): nothing trainable (as LoRA)")
def _():
    res = {}
    for kind, cfg in [
        ("lora", peft.LoraConfig(r=4, target_modules=["query_key_value"], inference_mode=True)),
        ("preproj", PreProjConfig(inference_mode=True)),
    ]:
        pm = peft.get_peft_model(neox(), cfg)
        res[kind] = sum(p.numel() for p in pm.parameters() if p.requires_grad)
    if res["preproj"] != 0 or res["lora"] != 0:
        raise Fail(str(res))
    return str(res)


@case("promises", "load_adapter: frozen by default, is_trainable=True trains exactly the adapter")
def _():
    d, _ = folder_of("neox", PreProjConfig(), 0, 1)
    m = mmpreproj.load_adapter(neox(), d)
    if any(p.requires_grad for p in m.parameters()):
        raise Fail("default load has trainables")
    m2 = mmpreproj.load_adapter(neox(), d, is_trainable=True)
    tr = {n for n, p in m2.named_parameters() if p.requires_grad}
    if tr != set(adapter_params(m2)):
        raise Fail(f"trainables {sorted(tr ^ set(adapter_params(m2)))[:3]}")
    return f"{len(tr)} tensors"


@case("promises", "PeftModel.from_pretrained(is_trainable=True/False) as LoRA")
def _():
    d, _ = folder_of("neox", PreProjConfig(), 0, 1)
    a = peft.PeftModel.from_pretrained(neox(), str(d))
    b = peft.PeftModel.from_pretrained(neox(), str(d), is_trainable=True)
    ta = sum(p.requires_grad for p in a.parameters())
    tb = {n for n, p in b.named_parameters() if p.requires_grad}
    if ta or tb != set(adapter_params(b)):
        raise Fail(f"frozen-load trainables {ta}; trainable-load mismatch {sorted(tb ^ set(adapter_params(b)))[:2]}")
    return "ok"


@case("promises", "merge_and_unload refused with the reason, model unchanged (PeftModel)")
def _():
    pm, *_ = peft_two("neox")
    return refused(pm, lambda: pm.merge_and_unload(), ["nonlinear", "merge", "unload"])


@case("promises", "merge_adapter refused with the reason, model unchanged (PeftModel)")
def _():
    pm, *_ = peft_two("neox")
    return refused(pm, lambda: pm.merge_adapter(), ["nonlinear", "merge"])


@case("promises", "in place: merge via a wrapper's merge() refused, model unchanged")
def _():
    m, *_ = two_adapter_inplace("neox")
    w = next(mod for mod in m.modules() if isinstance(mod, mmpreproj.PreProjAttention))
    return refused(m, lambda: w.merge(), ["nonlinear", "merge"])


@case("promises", "add_weighted_adapter refused with the reason, model unchanged")
def _():
    pm, *_ = peft_two("neox")
    return refused(
        pm,
        lambda: pm.add_weighted_adapter(["default", "b"], [0.5, 0.5], "mix"),
        ["weighted", "add_weighted_adapter", "PREPROJ", "supported"],
    )


for _host in ("neox", "llama", "timm_vit", "clip"):

    @case("promises", f"{_host}: trainable_report = sums of requires_grad / all params; injected = adapter params")
    def _(host=_host):
        build, _ = HOSTS[host]
        m = mmpreproj.inject(build(), PreProjConfig())
        rep = mmpreproj.trainable_report(m)
        tr = sum(p.numel() for p in m.parameters() if p.requires_grad)
        tot = sum(p.numel() for p in m.parameters())
        inj = sum(p.numel() for p in adapter_params(m, "default").values())
        if (rep.trainable, rep.total, rep.injected) != (tr, tot, inj):
            raise Fail(f"report {rep.trainable}/{rep.total}/{rep.injected} vs {tr}/{tot}/{inj}")
        return str(rep)


@case("promises", "neox two adapters: trainable_report and PeftModel.get_nb_trainable_parameters agree")
def _():
    pm, *_ = peft_two("neox")
    rep = mmpreproj.trainable_report(pm)
    tr, tot = pm.get_nb_trainable_parameters()
    st = sum(p.numel() for p in pm.parameters() if p.requires_grad)
    if (rep.trainable, rep.total) != (tr, tot) or tr != st:
        raise Fail(f"report {rep.trainable}/{rep.total}, peft {tr}/{tot}, sum {st}")
    inj = sum(p.numel() for p in adapter_params(pm, "default").values())
    if rep.injected != inj:
        raise Fail(f"injected {rep.injected} vs the active adapter's {inj}")
    return str(rep)


@case("promises", "README sizes: estimate / mini-pythia injection = 917,504 and 65,536")
def _():
    res = []
    for cfg, want in [(PreProjConfig(), 917_504), (PreProjConfig(expansion=1 / 16, skip_rank=16), 65_536)]:
        m = mmpreproj.inject(tf.AutoModelForCausalLM.from_pretrained(str(ROOT / "assets" / "mini-pythia")), cfg)
        got = sum(p.numel() for p in m.parameters() if p.requires_grad)
        est = mmpreproj.estimate(cfg, "mini-pythia")
        est_n = getattr(est, "trainable", None) or getattr(est, "injected", None)
        if got != want:
            raise Fail(f"injected {got:,} vs README {want:,}")
        res.append(f"{got:,} (estimate {est_n})")
    return ", ".join(res)


@case("promises", "identity init: outputs equal the base bit for bit (neox, llama, timm_vit)")
def _():
    for host in ("neox", "llama", "timm_vit"):
        build, out = HOSTS[host]
        m = mmpreproj.inject(build(), PreProjConfig(init="identity"))
        exact(out(m), out(build()), f"{host} identity")
    return "ok"


@case("promises", "PeftModel.get_model_status reports both adapters and their requires_grad")
def _():
    pm, *_ = peft_two("neox")
    st = pm.get_model_status()
    if sorted(st.available_adapters) != ["b", "default"]:
        raise Fail(f"available {st.available_adapters}")
    if st.requires_grad.get("default") is not True or st.requires_grad.get("b") is not False:
        raise Fail(f"requires_grad {st.requires_grad}")
    return f"{st.requires_grad}"


@case("promises", "mmpreproj.set_adapter hands the new active adapter the old one's trainable flag")
def _():
    m = mmpreproj.inject(neox(), PreProjConfig())
    d, _ = folder_of("neox", PreProjConfig(), 0, 1)
    mmpreproj.load_adapter(m, d, adapter_name="b")
    mmpreproj.set_adapter(m, "b")
    tr = {n for n, p in m.named_parameters() if p.requires_grad}
    if tr != set(adapter_params(m, "b")):
        raise Fail(f"trainable after switch: {sorted(tr)[:3]}")
    return f"{len(tr)} tensors"


@case("promises", "mmpreproj.adapter_state_dict / set_adapter_state_dict round trip restores outputs")
def _():
    m = perturb(mmpreproj.inject(neox(), PreProjConfig()), seed=3)
    sd = {k: v.clone() for k, v in mmpreproj.adapter_state_dict(m).items()}
    want = lm_out(m)
    perturb(m, seed=4)
    mmpreproj.set_adapter_state_dict(m, sd)
    return close(lm_out(m), want, "restored", rtol=0, atol=0)


@case("promises", "get_peft_model_state_dict (in place) = mmpreproj.adapter_state_dict")
def _():
    m = perturb(mmpreproj.inject(neox(), PreProjConfig()), seed=3)
    a = peft.get_peft_model_state_dict(m)
    b = mmpreproj.adapter_state_dict(m)
    if a.keys() != b.keys() or any(not torch.equal(a[k], b[k]) for k in a):
        raise Fail(f"keys {sorted(a)[:2]} vs {sorted(b)[:2]}")
    return f"{len(a)} tensors"


# ================================================================= modules_to_save with several adapters


def mts_folder(shift, seed):
    """A neox adapter folder with modules_to_save=['lm_head'], the head and the injected weights moved."""
    src = mmpreproj.inject(neox(), PreProjConfig(modules_to_save=["lm_head"]))
    perturb(src, "default", seed=seed)
    with torch.no_grad():
        src.lm_head.weight.add_(shift * noise(src.lm_head.weight, seed))
    d = tmpdir("mts")
    mmpreproj.save_adapter(src, d)
    return d, src


def mts_two():
    d_a, a = mts_folder(0.1, 11)
    d_b, b = mts_folder(-0.2, 22)
    m = mmpreproj.load_adapter(neox(), d_a)
    mmpreproj.load_adapter(m, d_b, adapter_name="b")
    return m, a, b


@case("modules_to_save", "two adapters: set_adapter('b') = b alone (its head), back to default = a alone")
def _():
    m, a, b = mts_two()
    differs(lm_out(a), lm_out(b), "a vs b")
    mmpreproj.set_adapter(m, "b")
    r = close(lm_out(m), lm_out(b), "b", rtol=0, atol=0)
    mmpreproj.set_adapter(m, "default")
    return r + ", " + close(lm_out(m), lm_out(a), "default", rtol=0, atol=0)


@case("modules_to_save", "two adapters: save_adapter(adapter_name='b') while default is active writes b's head")
def _():
    m, a, b = mts_two()
    d = tmpdir("sb")
    mmpreproj.save_adapter(m, d, adapter_name="b")
    return close(lm_out(mmpreproj.load_adapter(neox(), d)), lm_out(b), "b saved inactive, reloaded", rtol=0, atol=0)


@case("modules_to_save", "two adapters: get_peft_model_state_dict(adapter_name='b') holds b's head values")
def _():
    m, a, b = mts_two()
    sd = peft.get_peft_model_state_dict(m, adapter_name="b")
    heads = {k: v for k, v in sd.items() if "lm_head" in k}
    if not heads:
        raise Fail(f"no lm_head key among {sorted(sd)[:4]}")
    for k, v in heads.items():
        exact(v, b.lm_head.weight.detach(), f"{k} vs b's head")
    return f"{sorted(heads)}"


@case("modules_to_save", "in place: get_/set_peft_model_state_dict round trip restores head and adapter")
def _():
    d, src = mts_folder(0.1, 11)
    sd = peft.get_peft_model_state_dict(src)
    fresh = mmpreproj.inject(neox(), PreProjConfig(modules_to_save=["lm_head"]))
    res = peft.set_peft_model_state_dict(fresh, sd)
    if list(res.unexpected_keys):
        raise Fail(f"unexpected {list(res.unexpected_keys)[:3]}")
    return close(lm_out(fresh), lm_out(src), "after set_peft_model_state_dict", rtol=0, atol=0)


@case("modules_to_save", "PeftModel: get_/set_peft_model_state_dict round trip restores head and adapter")
def _():
    pm = peft.get_peft_model(neox(), PreProjConfig(modules_to_save=["lm_head"]))
    perturb(pm, "default", seed=3)
    with torch.no_grad():
        pm.base_model.model.lm_head.weight.add_(0.1 * noise(pm.base_model.model.lm_head.weight))
    sd = peft.get_peft_model_state_dict(pm)
    fresh = peft.get_peft_model(neox(), PreProjConfig(modules_to_save=["lm_head"]))
    peft.set_peft_model_state_dict(fresh, sd)
    return close(lm_out(fresh), lm_out(pm), "fresh PeftModel", rtol=0, atol=0)


@case("modules_to_save", "two adapters: deepcopy then set_adapter('b') on the copy = b; original stays a")
def _():
    m, a, b = mts_two()
    c = copy.deepcopy(m)
    mmpreproj.set_adapter(c, "b")
    r = close(lm_out(c), lm_out(b), "copy b", rtol=0, atol=0)
    return r + ", " + close(lm_out(m), lm_out(a), "original", rtol=0, atol=0)


@case("modules_to_save", "two adapters: pickle round trip then set_adapter('b') = b")
def _():
    m, a, b = mts_two()
    c = pickle.loads(pickle.dumps(m))
    mmpreproj.set_adapter(c, "b")
    return close(lm_out(c), lm_out(b), "pickled, b", rtol=0, atol=0)


@case("modules_to_save", "two adapters: state_dict() -> load_state_dict into a twin, then set_adapter('b') = b")
def _():
    m, a, b = mts_two()
    twin, *_ = mts_two()
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(0.01)
    mmpreproj.set_adapter(twin, "b")
    with torch.no_grad():
        twin.lm_head.weight.add_(0.3 * noise(twin.lm_head.weight))
    mmpreproj.set_adapter(twin, "default")
    res = twin.load_state_dict(m.state_dict())
    if res.missing_keys or res.unexpected_keys:
        raise Fail(str(res))
    r = close(lm_out(twin), lm_out(a), "default after load_state_dict", rtol=0, atol=0)
    mmpreproj.set_adapter(twin, "b")
    try:
        r2 = close(lm_out(twin), lm_out(b), "b after load_state_dict", rtol=0, atol=0)
    except Fail as e:
        keys = [k for k in m.state_dict() if "lm_head" in k]
        raise Fail(f"{e} (the state_dict's lm_head keys: {keys}: b's waiting head value is not in it)") from None
    return r + ", " + r2


@case("modules_to_save", "two adapters: .to(bfloat16) then set_adapter('b') runs, head bf16, close to b")
def _():
    m, a, b = mts_two()
    m.to(torch.bfloat16)
    mmpreproj.set_adapter(m, "b")
    dt = m.lm_head.weight.dtype
    if dt != torch.bfloat16:
        raise Fail(f"lm_head dtype after switch {dt} (the waiting value was not moved by .to())")
    got = lm_out(m)
    return close(got.float(), lm_out(b), "bf16 b vs fp32 b", rtol=0.1, atol=0.1)


@case("modules_to_save", "two adapters: unload gives the base bit-exact (b active)")
def _():
    m, a, b = mts_two()
    mmpreproj.set_adapter(m, "b")
    mmpreproj.unload(m)
    same_sd(m.state_dict(), neox().state_dict(), "unloaded")
    return "state_dict = base"


@case("modules_to_save", "two adapters: delete_adapter('b') then set_adapter is gone, unload gives the base")
def _():
    m, a, b = mts_two()
    mmpreproj.delete_adapter(m, "b")
    r = close(lm_out(m), lm_out(a), "after deleting b", rtol=0, atol=0)
    mmpreproj.unload(m)
    same_sd(m.state_dict(), neox().state_dict(), "unloaded")
    return r


@case("modules_to_save", "two adapters: save_pretrained with 'b' active -> from_pretrained = b; top = base")
def _():
    m, a, b = mts_two()
    mmpreproj.set_adapter(m, "b")
    d = tmpdir("full")
    mmpreproj.save_pretrained(m, d)
    r = close(lm_out(mmpreproj.from_pretrained(d).eval()), lm_out(b), "from_pretrained", rtol=0, atol=0)
    exact(lm_out(tf.GPTNeoXForCausalLM.from_pretrained(str(d)).eval()), lm_out(neox()), "top folder = base")
    return r


@case("modules_to_save", "PeftModel two adapters (load_adapter): set_adapter('b') = b alone")
def _():
    d_a, a = mts_folder(0.1, 11)
    d_b, b = mts_folder(-0.2, 22)
    pm = peft.PeftModel.from_pretrained(neox(), str(d_a))
    pm.load_adapter(str(d_b), adapter_name="b")
    pm.set_adapter("b")
    r = close(lm_out(pm), lm_out(b), "b", rtol=0, atol=0)
    pm.set_adapter("default")
    return r + ", " + close(lm_out(pm), lm_out(a), "default", rtol=0, atol=0)


@case("modules_to_save", "adapter_disabled keeps the active adapter's head values (documented)")
def _():
    m, a, b = mts_two()
    with mmpreproj.adapter_disabled(m):
        w = m.lm_head.weight.detach().clone()
    exact(w, a.lm_head.weight.detach(), "head under adapter_disabled")
    return "ok"


@case("modules_to_save", "trainable_report counts the head as trainable (a fresh inject)")
def _():
    m = mmpreproj.inject(neox(), PreProjConfig(modules_to_save=["lm_head"]))
    rep = mmpreproj.trainable_report(m)
    want = sum(p.numel() for p in m.parameters() if p.requires_grad)
    if rep.trainable != want or not m.lm_head.weight.requires_grad:
        raise Fail(f"{rep.trainable} vs {want}, head trainable {m.lm_head.weight.requires_grad}")
    return str(rep)


@case("modules_to_save", "in place: set_peft_model_state_dict(adapter_name='b') while default is active")
def _():
    m, a, b = mts_two()
    sd = {k: v.clone() for k, v in peft.get_peft_model_state_dict(m, adapter_name="b").items()}
    mmpreproj.set_adapter(m, "b")
    perturb(m, "b", seed=98)
    with torch.no_grad():
        m.lm_head.weight.add_(0.2 * noise(m.lm_head.weight, 17))
    mmpreproj.set_adapter(m, "default")
    peft.set_peft_model_state_dict(m, sd, adapter_name="b")
    r = close(lm_out(m), lm_out(a), "default after loading b's state dict", rtol=0, atol=0)
    mmpreproj.set_adapter(m, "b")
    return r + ", " + close(lm_out(m), lm_out(b), "b restored", rtol=0, atol=0)


@case("modules_to_save", "in place: mmpreproj.set_adapter_state_dict(adapter_name='b') while default is active")
def _():
    m, a, b = mts_two()
    mmpreproj.set_adapter(m, "b")
    sd = {k: v.clone() for k, v in mmpreproj.adapter_state_dict(m).items()}
    perturb(m, "b", seed=98)
    with torch.no_grad():
        m.lm_head.weight.add_(0.2 * noise(m.lm_head.weight, 17))
    mmpreproj.set_adapter(m, "default")
    mmpreproj.set_adapter_state_dict(m, sd, adapter_name="b")
    r = close(lm_out(m), lm_out(a), "default after loading b's tensors", rtol=0, atol=0)
    mmpreproj.set_adapter(m, "b")
    return r + ", " + close(lm_out(m), lm_out(b), "b restored", rtol=0, atol=0)


@case("modules_to_save", "PeftModel: set_peft_model_state_dict(adapter_name='b') while default is active")
def _():
    d_a, a = mts_folder(0.1, 11)
    d_b, b = mts_folder(-0.2, 22)
    pm = peft.PeftModel.from_pretrained(neox(), str(d_a))
    pm.load_adapter(str(d_b), adapter_name="b")
    sd = {k: v.clone() for k, v in peft.get_peft_model_state_dict(pm, adapter_name="b").items()}
    heads = [k for k in sd if "lm_head" in k]
    pm.set_adapter("b")
    perturb(pm, "b", seed=98)
    with torch.no_grad():
        pm.base_model.model.lm_head.weight.add_(0.2 * noise(pm.base_model.model.lm_head.weight, 17))
    pm.set_adapter("default")
    peft.set_peft_model_state_dict(pm, sd, adapter_name="b")
    r = close(lm_out(pm), lm_out(a), "default after loading b's state dict", rtol=0, atol=0)
    pm.set_adapter("b")
    return r + ", " + close(lm_out(pm), lm_out(b), f"b restored (head keys {heads})", rtol=0, atol=0)


@case("modules_to_save", "LoRA reference: two adapters' state_dict() -> load_state_dict keeps both heads")
def _():
    def build(seed):
        pm = peft.get_peft_model(
            neox(),
            peft.LoraConfig(
                r=4, target_modules=["query_key_value"], modules_to_save=["lm_head"], init_lora_weights=False
            ),
        )
        pm.add_adapter(
            "b",
            peft.LoraConfig(
                r=4, target_modules=["query_key_value"], modules_to_save=["lm_head"], init_lora_weights=False
            ),
        )
        with torch.no_grad():
            for n in ("default", "b"):
                w = pm.base_model.model.lm_head.modules_to_save[n].weight
                w.add_(0.2 * noise(w, seed + len(n)))
        return pm.eval()

    src, twin = build(1), build(2)
    twin.load_state_dict(src.state_dict())
    src.set_adapter("b")
    twin.set_adapter("b")
    return close(lm_out(twin), lm_out(src), "LoRA b after load_state_dict", rtol=0, atol=0)


@case("modules_to_save", "trained while 'b' is active: the trained head survives a switch away and back")
def _():
    m, a, b = mts_two()
    mmpreproj.set_adapter(m, "b")
    for p in adapter_params(m, "b").values():
        p.requires_grad_(True)
    m.lm_head.weight.requires_grad_(True)
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.5)
    m.train()
    m(input_ids=ids(), labels=ids()).loss.backward()
    opt.step()
    m.eval()
    want = lm_out(m)
    mmpreproj.set_adapter(m, "default")
    close(lm_out(m), lm_out(a), "default", rtol=0, atol=0)
    mmpreproj.set_adapter(m, "b")
    return close(lm_out(m), want, "trained b after a round trip", rtol=0, atol=0)


# ================================================================= more mixed batches and functional calls


@case("mixed batch", "llama: left-padded mixed batch with attention_mask = per-row forwards")
def _():
    m, a, b, *_ = two_adapter_inplace("llama")
    x = ids()
    mask = torch.ones_like(x)
    mask[0, :2] = 0
    mask[2, :3] = 0
    names = ["b", "default", "__base__"]
    with torch.no_grad():
        got = m(x, attention_mask=mask, adapter_names=names).logits
        want = [
            b(x, attention_mask=mask).logits[0],
            a(x, attention_mask=mask).logits[1],
            llama()(x, attention_mask=mask).logits[2],
        ]
    r = [close(got[i][mask[i].bool()], want[i][mask[i].bool()], f"row {i}") for i in range(3)]
    return ", ".join(set(r))


@case("mixed batch", "neox: adapters of different sizes (expansion=0.5, skip_rank=4) mix per row")
def _():
    m, a, b, *_ = two_adapter_inplace("neox", cfg_b=PreProjConfig(expansion=0.5, skip_rank=4))
    return mixed_rows(m, lm_out, ["b", "default", "__base__"], {"default": a, "b": b}, neox())


@case("peft.functional", "in place: after pf.delete_adapter('b') a new 'b' loads and equals its folder")
def _():
    m, a, b, d_a, d_b = two_adapter_inplace("neox")
    pf.delete_adapter(m, "b", prefix="preproj")
    d_c, c = folder_of("neox", PreProjConfig(expansion=0.5), 0, 33)
    mmpreproj.load_adapter(m, d_c, adapter_name="b")
    mmpreproj.set_adapter(m, "b")
    return close(lm_out(m), lm_out(c), "re-added b", rtol=0, atol=0)


@case("peft.functional", "in place: after pf.delete_adapter('b') save_pretrained/from_pretrained = default")
def _():
    m, a, *_ = two_adapter_inplace("neox")
    pf.delete_adapter(m, "b", prefix="preproj")
    d = tmpdir("full")
    mmpreproj.save_pretrained(m, d)
    return close(lm_out(mmpreproj.from_pretrained(d).eval()), lm_out(a), "from_pretrained", rtol=0, atol=0)


@case("peft.functional", "in place: after pf.delete_adapter('b') a mixed batch naming 'b' is refused naming it")
def _():
    m, *_ = two_adapter_inplace("neox")
    pf.delete_adapter(m, "b", prefix="preproj")
    return refused(m, lambda: m(ids(), adapter_names=["default", "b", "default"]), ["b"])


@case("peft.functional", "in place: pf.set_adapter('b') then save_adapter() (no name) writes the active b")
def _():
    m, a, b, *_ = two_adapter_inplace("neox")
    pf.set_adapter(m, "b")
    d = tmpdir("act")
    mmpreproj.save_adapter(m, d)
    return close(lm_out(mmpreproj.load_adapter(neox(), d)), lm_out(b), "saved active", rtol=0, atol=0)


@case("peft.functional", "in place: pf.set_adapter('b') then trainable_report counts b (different size)")
def _():
    m, a, b, *_ = two_adapter_inplace("neox", cfg_b=PreProjConfig(expansion=0.5, skip_rank=4))
    pf.set_adapter(m, "b")
    rep = mmpreproj.trainable_report(m)
    want = sum(p.numel() for p in adapter_params(m, "b").values())
    if rep.injected != want:
        raise Fail(f"injected {rep.injected} vs b's {want}")
    return str(rep)


@case("peft.functional", "cast_adapter_dtype / autocast_adapter_dtype: bf16 adapter loaded into PeftModel as LoRA")
def _():
    d, src = folder_of("neox", PreProjConfig(), 0, 6)
    res = {}
    pm = peft.PeftModel.from_pretrained(neox().to(torch.bfloat16), str(d))
    res["preproj"] = sorted({str(p.dtype) for p in adapter_params(pm).values()})
    lcfg = peft.LoraConfig(r=4, target_modules=["query_key_value"])
    lm = peft.get_peft_model(neox().to(torch.bfloat16), lcfg)
    res["lora"] = sorted({str(p.dtype) for n, p in lm.named_parameters() if "lora_" in n})
    if res["preproj"] != res["lora"]:
        raise Fail(str(res))
    return str(res)


@case("peft.functional", "in place: inject(adapter_name='x') then save/load keeps outputs; active_adapter = 'x'")
def _():
    m = perturb(mmpreproj.inject(neox(), PreProjConfig(), adapter_name="x"), "x", seed=2)
    if mmpreproj.active_adapter(m) != "x":
        raise Fail(f"active {mmpreproj.active_adapter(m)}")
    d = tmpdir("x")
    mmpreproj.save_adapter(m, d)
    return close(lm_out(mmpreproj.load_adapter(neox(), d)), lm_out(m), "x reloaded", rtol=0, atol=0)


# ================================================================= transformers' adapter API, identity and ties


@case(
    "transformers API",
    "model.load_adapter then mmpreproj.unload: base state_dict; model.save_pretrained writes the base",
)
def _():
    d, _ = folder_of("neox", PreProjConfig(), 0, 6)
    m = neox()
    m.load_adapter(str(d))
    mmpreproj.unload(m)
    same_sd(m.state_dict(), neox().state_dict(), "unloaded")
    left = {a: vars(m)[a] for a in ("peft_config", "_hf_peft_config_loaded") if vars(m).get(a)}
    if left:
        left = {k: (list(v) if isinstance(v, dict) else v) for k, v in left.items()}
    out = tmpdir("save")
    try:
        m.save_pretrained(str(out))
    except Exception as e:  # noqa: BLE001
        raise Fail(
            f"save_pretrained of the unloaded model: {type(e).__name__}: {str(e)[:100]}; left on the model: {left}"
        ) from None
    files = sorted(p.name for p in out.iterdir())
    if "config.json" not in files:
        raise Fail(
            f"wrote {files} (not the base: _hf_peft_config_loaded={getattr(m, '_hf_peft_config_loaded', None)})"
        )
    back, info = tf.GPTNeoXForCausalLM.from_pretrained(str(out), output_loading_info=True)
    if any(info.get(k) for k in ("missing_keys", "unexpected_keys")):
        raise Fail(f"reload info {info}")
    exact(lm_out(back.eval()), lm_out(neox()), "saved base")
    if left:
        raise Fail(f"the base saves, but unload left {left} on the model")
    return f"wrote {files}"


@case("transformers API", "model.load_adapter, mmpreproj.unload, then model.load_adapter again reproduces")
def _():
    d, src = folder_of("neox", PreProjConfig(), 0, 6)
    m = neox()
    m.load_adapter(str(d))
    mmpreproj.unload(m)
    try:
        m.load_adapter(str(d))
    except Exception as e:  # noqa: BLE001
        raise Fail(f"second load after unload: {type(e).__name__}: {str(e)[:200]}") from None
    return close(lm_out(m), lm_out(src), "reloaded", rtol=0, atol=0)


@case("transformers API", "model.load_adapter then mmpreproj.unload then mmpreproj.inject works")
def _():
    d, src = folder_of("neox", PreProjConfig(), 0, 6)
    m = neox()
    m.load_adapter(str(d))
    mmpreproj.unload(m)
    try:
        mmpreproj.load_adapter(m, d)
    except Exception as e:  # noqa: BLE001
        raise Fail(f"load_adapter after unload: {type(e).__name__}: {str(e)[:200]}") from None
    return close(lm_out(m), lm_out(src), "reloaded", rtol=0, atol=0)


@case("unload", "neox: unload keeps the base's parameter objects (ids) and tied weights")
def _():
    base = neox()
    ids0 = {n: id(p) for n, p in base.named_parameters()}
    m = perturb(mmpreproj.inject(base, PreProjConfig()), seed=3)
    mmpreproj.unload(m)
    now = {n: id(p) for n, p in m.named_parameters()}
    if now != ids0:
        raise Fail(f"parameter objects replaced: {[n for n in ids0 if now.get(n) != ids0[n]][:3]}")
    return "same objects"


@case("unload", "neox tie_word_embeddings=True: inject/unload keep the tie; save_pretrained reloads cleanly")
def _():
    def tied():
        return zoo.tiny_neox(tie_word_embeddings=True)

    m = tied()
    if m.lm_head.weight is not m.gpt_neox.embed_in.weight:
        return "zoo model not tied on this transformers (skipped)"
    mmpreproj.inject(m, PreProjConfig(modules_to_save=None))
    perturb(m, seed=2)
    want = lm_out(m)
    d = tmpdir("tied")
    mmpreproj.save_pretrained(m, d)
    got = mmpreproj.from_pretrained(d).eval()
    r = close(lm_out(got), want, "from_pretrained", rtol=0, atol=0)
    if got.lm_head.weight is not got.gpt_neox.embed_in.weight:
        raise Fail("reloaded model lost the tie")
    mmpreproj.unload(m)
    if m.lm_head.weight is not m.gpt_neox.embed_in.weight:
        raise Fail("unload lost the tie")
    exact(lm_out(m), lm_out(tied()), "unloaded")
    return r


@case("save_pretrained", "neox: save_pretrained(max_shard_size='20KB') -> from_pretrained reproduces")
def _():
    m = perturb(mmpreproj.inject(neox(), PreProjConfig()), seed=5)
    d = tmpdir("shard")
    mmpreproj.save_pretrained(m, d, max_shard_size="20KB")
    shards = [p.name for p in d.iterdir() if p.name.endswith(".safetensors")]
    r = close(lm_out(mmpreproj.from_pretrained(d).eval()), lm_out(m), "sharded", rtol=0, atol=0)
    return f"{r}, {len(shards)} weight files"


@case("save_pretrained", "neox: from_pretrained(DIR, adapter=False) is the base")
def _():
    m = perturb(mmpreproj.inject(neox(), PreProjConfig()), seed=5)
    d = tmpdir("full")
    mmpreproj.save_pretrained(m, d)
    got = mmpreproj.from_pretrained(d, adapter=False).eval()
    if mmpreproj.is_injected(got):
        raise Fail("injected")
    exact(lm_out(got), lm_out(neox()), "adapter=False")
    return "ok"


@case("save_pretrained", "PeftModel.from_pretrained(adapter_name='x') -> save_pretrained -> from_pretrained")
def _():
    d, src = folder_of("neox", PreProjConfig(), 0, 6)
    pm = peft.PeftModel.from_pretrained(neox(), str(d), adapter_name="x")
    out = tmpdir("x")
    pm.save_pretrained(str(out))
    sub = out / "x" if (out / "x").is_dir() else out
    back = peft.PeftModel.from_pretrained(neox(), str(sub))
    return close(lm_out(back), lm_out(src), "x round trip", rtol=0, atol=0)


@case(
    "peft.functional",
    "PeftModel: load_adapter('b', is_trainable=True) beside frozen default trains once active (as LoRA)",
)
def _():
    res = {}
    for kind in ("lora", "preproj"):
        if kind == "lora":
            src = peft.get_peft_model(neox(), peft.LoraConfig(r=4, target_modules=["query_key_value"]))
            own = lora_params
        else:
            src = peft.get_peft_model(neox(), PreProjConfig())
            own = adapter_params
        d = tmpdir(kind)
        src.save_pretrained(str(d))
        pm = peft.PeftModel.from_pretrained(neox(), str(d))
        pm.load_adapter(str(d), adapter_name="b", is_trainable=True)
        t0 = {n for n, p in pm.named_parameters() if p.requires_grad}
        pm.set_adapter("b")
        t1 = {n for n, p in pm.named_parameters() if p.requires_grad}
        res[kind] = (t0 == set(own(pm, "b")), t1 == set(own(pm, "b")), len(t0), len(t1))
    if res["lora"][:2] != res["preproj"][:2]:
        raise Fail(str(res))
    return str(res)


@case("peft.functional", "pf.set_requires_grad(model, ['default', 'b'], True) flips both adapters (as LoRA)")
def _():
    res = []
    for kind in ("lora", "preproj"):
        m = lora_inplace_two() if kind == "lora" else two_adapter_inplace("neox")[0]
        own = lora_params if kind == "lora" else adapter_params
        for p in m.parameters():
            p.requires_grad_(False)
        pf.set_requires_grad(m, ["default", "b"], requires_grad=True)
        tr = {n for n, p in m.named_parameters() if p.requires_grad}
        want = set(own(m, "default")) | set(own(m, "b"))
        if tr != want:
            raise Fail(f"{kind}: extra {sorted(tr - want)[:2]} missing {sorted(want - tr)[:2]}")
        res.append(f"{kind} {len(tr)}")
    return ", ".join(res)


@case("peft.functional", "PeftModel.get_layer_status reports each wrapper's adapters")
def _():
    pm, *_ = peft_two("neox")
    st = pm.get_layer_status()
    if not st or any(sorted(s.available_adapters) != ["b", "default"] for s in st):
        raise Fail(f"{[(s.name, s.available_adapters) for s in st][:2]}")
    return f"{len(st)} layers"


# ================================================================= further combinations


@case("mixed batch", "neox: active 'b', names ['default', 'default', '__base__'] = default alone / base")
def _():
    m, a, b, *_ = two_adapter_inplace("neox")
    mmpreproj.set_adapter(m, "b")
    return mixed_rows(m, lm_out, ["default", "default", "__base__"], {"default": a, "b": b}, neox())


@case("mixed batch", "neox: under torch.inference_mode() rows = each adapter alone")
def _():
    m, a, b, *_ = two_adapter_inplace("neox")
    with torch.inference_mode():
        got = m(ids(), adapter_names=["b", "default", "__base__"]).logits
    return ", ".join(
        {close(got[0], lm_out(b)[0], "b"), close(got[1], lm_out(a)[1], "a"), close(got[2], lm_out(neox())[2], "base")}
    )


@case("mixed batch", "neox SEQ_CLS PeftModel: rows = each adapter alone (peft's head wrapper mixes per row)")
def _():
    def base():
        torch.manual_seed(0)
        cfg = tf.GPTNeoXConfig(
            vocab_size=128,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            rotary_pct=0.25,
            max_position_embeddings=128,
            num_labels=3,
            pad_token_id=0,
        )
        return tf.GPTNeoXForSequenceClassification(cfg).eval()

    pm = peft.get_peft_model(base(), PreProjConfig(task_type="SEQ_CLS"))
    pm.add_adapter("b", PreProjConfig(task_type="SEQ_CLS"))
    for n, seed in (("default", 1), ("b", 2)):
        perturb(pm, n, seed=seed)
        pm.set_adapter(n)
        head = pm.base_model.model.score.modules_to_save[n].weight
        with torch.no_grad():
            head.add_(0.3 * noise(head, seed))
    pm.set_adapter("default")
    pm.eval()
    x = ids()
    with torch.no_grad():
        got = pm(x, adapter_names=["b", "default", "__base__"]).logits
        pm.set_adapter("b")
        ob = pm(x).logits
        pm.set_adapter("default")
        od = pm(x).logits
        with pm.disable_adapter():
            o0 = pm(x).logits
    differs(ob, od, "b vs default")
    return ", ".join({close(got[0], ob[0], "b"), close(got[1], od[1], "default"), close(got[2], o0[2], "base")})


@case("modules_to_save", "PeftModel two adapters: state_dict() -> load_state_dict into a twin, then 'b' = b")
def _():
    d_a, a = mts_folder(0.1, 11)
    d_b, b = mts_folder(-0.2, 22)
    d_c, _ = mts_folder(0.3, 33)

    def two(second):
        pm = peft.PeftModel.from_pretrained(neox(), str(d_a))
        pm.load_adapter(str(second), adapter_name="b")
        return pm

    src, twin = two(d_b), two(d_c)
    twin.load_state_dict(src.state_dict())
    twin.set_adapter("b")
    return close(lm_out(twin), lm_out(b), "twin b after load_state_dict", rtol=0, atol=0)


@case("modules_to_save", "PeftModel two adapters: save_pretrained writes b's head in b/ (inactive)")
def _():
    d_a, a = mts_folder(0.1, 11)
    d_b, b = mts_folder(-0.2, 22)
    pm = peft.PeftModel.from_pretrained(neox(), str(d_a))
    pm.load_adapter(str(d_b), adapter_name="b")
    out = tmpdir("pmsave")
    pm.save_pretrained(str(out))
    r = close(lm_out(peft.PeftModel.from_pretrained(neox(), str(out / "b"))), lm_out(b), "b/", rtol=0, atol=0)
    return (
        r
        + ", "
        + close(lm_out(peft.PeftModel.from_pretrained(neox(), str(out))), lm_out(a), "default", rtol=0, atol=0)
    )


@case("modules_to_save", "pf.delete_adapter('b') (its head waiting aside) then unload = base; default = a")
def _():
    m, a, b = mts_two()
    try:
        pf.delete_adapter(m, "b", prefix="preproj")
    except Exception as e:  # noqa: BLE001
        return f"refused: {type(e).__name__}: {str(e)[:120]}"
    r = close(lm_out(m), lm_out(a), "default after delete", rtol=0, atol=0)
    if "b" in mmpreproj.adapter_names(m):
        raise Fail("b still listed")
    d = tmpdir("after")
    mmpreproj.save_adapter(m, d)
    r += ", " + close(lm_out(mmpreproj.load_adapter(neox(), d)), lm_out(a), "saved after delete", rtol=0, atol=0)
    mmpreproj.unload(m)
    same_sd(m.state_dict(), neox().state_dict(), "unloaded")
    return r


@case("unload", "mmpreproj.unload(PeftModel) restores the base inside it")
def _():
    pm = perturb(peft.get_peft_model(neox(), PreProjConfig()), seed=3)
    mmpreproj.unload(pm)
    inner = pm.base_model.model
    same_sd(inner.state_dict(), neox().state_dict(), "inner model")
    exact(lm_out(inner), lm_out(neox()), "inner outputs")
    return "ok"


@case("unload", "neox PeftModel two adapters: unload() = the base")
def _():
    return unload_case("neox", route="peft", two=True)


@case("legacy", "preproj_lora_checkpoint: loaded, then unload() gives the legacy base bit-exact")
def _():
    m = mmpreproj.load_adapter(legacy_base(), legacy_copy("preproj_lora_checkpoint"))
    u = m.unload()
    same_sd(u.state_dict(), legacy_base().state_dict(), "unloaded")
    return "ok"


@case("legacy", "preproj_skip: load_adapter(is_trainable=True) trains exactly the adapter, outputs as recorded")
def _():
    m = mmpreproj.load_adapter(legacy_base(), legacy_copy("preproj_skip"), is_trainable=True)
    tr = {n for n, p in m.named_parameters() if p.requires_grad}
    if tr != set(adapter_params(m)):
        raise Fail(f"trainables {sorted(tr ^ set(adapter_params(m)))[:3]}")
    return legacy_check(m, "preproj_skip")


@case("modules_to_save", "a mixed batch naming only the active adapter runs (documented) = a alone")
def _():
    m, a, b = mts_two()
    return close(lm_out(m, adapter_names=["default"] * 3), lm_out(a), "all-default rows")


def new_adapter_head(route):
    """The head of a second adapter (modules_to_save) added after the first one's head trained."""
    cfg = PreProjConfig(modules_to_save=["lm_head"])
    if route == "lora":
        lcfg = peft.LoraConfig(r=4, target_modules=["query_key_value"], modules_to_save=["lm_head"])
        pm = peft.get_peft_model(neox(), lcfg)
        w = pm.base_model.model.lm_head.modules_to_save["default"].weight
        with torch.no_grad():
            w.add_(0.3 * noise(w, 3))
        pm.add_adapter("b", lcfg)
        pm.set_adapter("b")
        return pm.base_model.model.lm_head.modules_to_save["b"].weight.detach().clone()
    if route == "peft":
        pm = peft.get_peft_model(neox(), cfg)
        w = pm.base_model.model.lm_head.weight
        with torch.no_grad():
            w.add_(0.3 * noise(w, 3))
        pm.add_adapter("b", cfg)
        pm.set_adapter("b")
        return pm.base_model.model.lm_head.weight.detach().clone()
    m = mmpreproj.inject(neox(), cfg)
    with torch.no_grad():
        m.lm_head.weight.add_(0.3 * noise(m.lm_head.weight, 3))
    mmpreproj.inject(m, cfg, adapter_name="b")
    mmpreproj.set_adapter(m, "b")
    return m.lm_head.weight.detach().clone()


@case("modules_to_save", "a new adapter's head starts from the base's head, as LoRA's (PeftModel.add_adapter)")
def _():
    base_w = neox().lm_head.weight.detach()
    lora_from_base = torch.equal(new_adapter_head("lora"), base_w)
    ours = new_adapter_head("peft")
    ours_from_base = torch.equal(ours, base_w)
    if lora_from_base != ours_from_base:
        raise Fail(f"LoRA's new head from the base: {lora_from_base}; ours: {ours_from_base}")
    return f"both from the base: {ours_from_base}"


@case("modules_to_save", "a new adapter's head starts from the base's head, as LoRA's (inject(adapter_name='b'))")
def _():
    base_w = neox().lm_head.weight.detach()
    lora_from_base = torch.equal(new_adapter_head("lora"), base_w)
    try:
        ours = new_adapter_head("inject")
    except Exception as e:  # noqa: BLE001
        return f"second inject refused: {type(e).__name__}: {str(e)[:120]}"
    ours_from_base = torch.equal(ours, base_w)
    if lora_from_base != ours_from_base:
        raise Fail(f"LoRA's new head from the base: {lora_from_base}; ours: {ours_from_base}")
    return f"both from the base: {ours_from_base}"


@case("dtype", "neox inject (modules_to_save): .to(bfloat16) then unload = the base in bf16")
def _():
    m = mmpreproj.inject(neox(), PreProjConfig(modules_to_save=["lm_head"]))
    perturb(m, seed=2)
    with torch.no_grad():
        m.lm_head.weight.add_(0.3 * noise(m.lm_head.weight))
    m.to(torch.bfloat16)
    mmpreproj.unload(m)
    same_sd(m.state_dict(), neox().to(torch.bfloat16).state_dict(), "unloaded bf16")
    return "ok"


@case("save_pretrained", "inject(adapter_name='x') -> save_pretrained -> from_pretrained reproduces")
def _():
    m = perturb(mmpreproj.inject(neox(), PreProjConfig(), adapter_name="x"), "x", seed=2)
    d = tmpdir("fx")
    mmpreproj.save_pretrained(m, d)
    got = mmpreproj.from_pretrained(d).eval()
    return close(lm_out(got), lm_out(m), "from_pretrained", rtol=0, atol=0) + f", names {mmpreproj.adapter_names(got)}"


for _host in ("timm_vit", "clip", "llama"):

    @case("mixed batch", f"{_host} in place: set_adapter('b') = b alone; adapter_disabled = base; back = a alone")
    def _(host=_host):
        build, out = HOSTS[host]
        m, a, b, *_ = two_adapter_inplace(host)
        differs(out(a), out(b), "a vs b")
        mmpreproj.set_adapter(m, "b")
        r = [close(out(m), out(b), "b", rtol=0, atol=0)]
        with mmpreproj.adapter_disabled(m):
            r.append(close(out(m), out(build()), "disabled", rtol=0, atol=0))
        mmpreproj.set_adapter(m, "default")
        r.append(close(out(m), out(a), "a", rtol=0, atol=0))
        return ", ".join(r)


@case("dtype", "bf16 host: kept casts follow load_state_dict / set_adapter_state_dict / assign=True")
def _():
    def make(seed):
        m = mmpreproj.inject(neox().to(torch.bfloat16), PreProjConfig())
        return perturb(m, seed=seed)

    src, dst = make(1), make(2)
    want = lm_out(src)
    lm_out(dst)  # fills dst's kept casts
    dst.load_state_dict(src.state_dict())
    r = [close(lm_out(dst), want, "load_state_dict", rtol=0, atol=0)]
    dst2 = make(3)
    lm_out(dst2)
    mmpreproj.set_adapter_state_dict(dst2, {k: v.clone() for k, v in mmpreproj.adapter_state_dict(src).items()})
    r.append(close(lm_out(dst2), want, "set_adapter_state_dict", rtol=0, atol=0))
    dst3 = make(4)
    lm_out(dst3)
    dst3.load_state_dict({k: v.clone() for k, v in src.state_dict().items()}, assign=True)
    r.append(close(lm_out(dst3), want, "assign=True", rtol=0, atol=0))
    return ", ".join(r)


@case("dtype", "bf16 host: mixed batch rows = each adapter alone (kept casts per adapter)")
def _():
    def b16(m):
        return m.to(torch.bfloat16)

    d_a, _ = folder_of("neox", PreProjConfig(), 0, 11)
    d_b, _ = folder_of("neox", PreProjConfig(), 0, 22)
    m = mmpreproj.load_adapter(b16(neox()), d_a)
    mmpreproj.load_adapter(m, d_b, adapter_name="b")
    a = mmpreproj.load_adapter(b16(neox()), d_a)
    b = mmpreproj.load_adapter(b16(neox()), d_b)
    lm_out(m)
    return mixed_rows(m, lm_out, ["b", "default", "__base__"], {"default": a, "b": b}, b16(neox()))


@case("unload", "load_state_dict(assign=True) then unload restores the base's requires_grad flags")
def _():
    m = perturb(mmpreproj.inject(neox(), PreProjConfig()), seed=1)
    m.load_state_dict({k: v.clone() for k, v in m.state_dict().items()}, assign=True)
    mmpreproj.unload(m)
    fl = flags(m)
    want = flags(neox())
    if fl != want:
        bad = [n for n in want if fl.get(n) != want[n]]
        raise Fail(f"requires_grad not restored on {len(bad)} params, e.g. {bad[:2]}")
    same_sd(m.state_dict(), neox().state_dict(), "unloaded")
    return "ok"


@case("promises", "load_adapter(adapter_name='b', is_trainable=True) beside a frozen default: b trains once active")
def _():
    d_a, _ = folder_of("neox", PreProjConfig(), 0, 11)
    d_b, _ = folder_of("neox", PreProjConfig(), 0, 22)
    m = mmpreproj.load_adapter(neox(), d_a)
    mmpreproj.load_adapter(m, d_b, adapter_name="b", is_trainable=True)
    t0 = {n for n, p in m.named_parameters() if p.requires_grad}
    mmpreproj.set_adapter(m, "b")
    t1 = {n for n, p in m.named_parameters() if p.requires_grad}
    want = set(adapter_params(m, "b"))
    if t1 != want:
        raise Fail(f"after set_adapter('b'): {len(t1)} trainable, b has {len(want)}; before: {len(t0)}")
    return f"before switch {len(t0)} trainable, after {len(t1)}"


@case("modules_to_save", "PeftModel (one adapter): save_pretrained -> PeftModel.from_pretrained reproduces the head")
def _():
    pm = peft.get_peft_model(neox(), PreProjConfig(modules_to_save=["lm_head"]))
    perturb(pm, "default", seed=3)
    with torch.no_grad():
        pm.base_model.model.lm_head.weight.add_(0.2 * noise(pm.base_model.model.lm_head.weight, 4))
    d = tmpdir("pm1")
    pm.save_pretrained(str(d))
    r = close(lm_out(peft.PeftModel.from_pretrained(neox(), str(d))), lm_out(pm), "PeftModel", rtol=0, atol=0)
    return r + ", " + close(lm_out(mmpreproj.load_adapter(neox(), d)), lm_out(pm), "load_adapter", rtol=0, atol=0)


@case("modules_to_save", "PeftModel.load_adapter into the loaded active name (a Trainer's resume) restores the head")
def _():
    d_a, a = mts_folder(0.1, 11)
    pm = peft.PeftModel.from_pretrained(neox(), str(d_a), is_trainable=True)
    perturb(pm, "default", seed=50)
    with torch.no_grad():
        pm.base_model.model.lm_head.weight.add_(0.2 * noise(pm.base_model.model.lm_head.weight, 51))
    pm.load_adapter(str(d_a), adapter_name="default", is_trainable=True)
    return close(lm_out(pm), lm_out(a), "after reloading default", rtol=0, atol=0)


@case("modules_to_save", "PeftModel.load_adapter into a loaded inactive name 'b' restores b's waiting head")
def _():
    d_a, a = mts_folder(0.1, 11)
    d_b, b = mts_folder(-0.2, 22)
    d_c, c = mts_folder(0.3, 33)
    pm = peft.PeftModel.from_pretrained(neox(), str(d_a))
    pm.load_adapter(str(d_c), adapter_name="b")
    pm.load_adapter(str(d_b), adapter_name="b")  # over the loaded, inactive 'b'
    r = close(lm_out(pm), lm_out(a), "default untouched", rtol=0, atol=0)
    pm.set_adapter("b")
    return r + ", " + close(lm_out(pm), lm_out(b), "b = the second folder", rtol=0, atol=0)


@case("modules_to_save", "PeftModel.delete_adapter('b') (its head waiting aside) then unload() = base")
def _():
    d_a, a = mts_folder(0.1, 11)
    d_b, b = mts_folder(-0.2, 22)
    pm = peft.PeftModel.from_pretrained(neox(), str(d_a))
    pm.load_adapter(str(d_b), adapter_name="b")
    pm.delete_adapter("b")
    r = close(lm_out(pm), lm_out(a), "default", rtol=0, atol=0)
    u = pm.unload()
    same_sd(u.state_dict(), neox().state_dict(), "unloaded")
    return r


@case("modules_to_save", "PeftModel.from_pretrained(is_trainable=True): the head trains with the adapter")
def _():
    d_a, a = mts_folder(0.1, 11)
    pm = peft.PeftModel.from_pretrained(neox(), str(d_a), is_trainable=True)
    tr = {n for n, p in pm.named_parameters() if p.requires_grad}
    want = set(adapter_params(pm)) | {n for n, _ in pm.named_parameters() if "lm_head" in n}
    if tr != want:
        raise Fail(f"extra {sorted(tr - want)[:2]} missing {sorted(want - tr)[:2]}")
    return f"{len(tr)} tensors"


@case("modules_to_save", "PeftModel.disable_adapter(): head as LoRA's (base head) or the documented active values")
def _():
    lcfg = peft.LoraConfig(r=4, target_modules=["query_key_value"], modules_to_save=["lm_head"])
    lora = peft.get_peft_model(neox(), lcfg)
    w = lora.base_model.model.lm_head.modules_to_save["default"].weight
    with torch.no_grad():
        w.add_(0.3 * noise(w, 3))
    with lora.disable_adapter():
        lora_base = torch.equal(lm_out(lora), lm_out(neox()))
    d_a, a = mts_folder(0.1, 11)
    pm = peft.PeftModel.from_pretrained(neox(), str(d_a))
    with pm.disable_adapter():
        ours_base = torch.equal(lm_out(pm), lm_out(neox()))
        head_active = torch.equal(pm.base_model.model.lm_head.weight, a.lm_head.weight)
    return f"LoRA disabled = base: {lora_base}; ours = base: {ours_base} (head keeps the active values: {head_active})"


# ================================================================= refusals leave the model unchanged


@case("refused", "mmpreproj.delete_adapter of the active adapter")
def _():
    m, *_ = two_adapter_inplace("neox")
    return refused(m, lambda: mmpreproj.delete_adapter(m, "default"), ["default", "active"])


@case("refused", "pf.delete_adapter of the last adapter (documented refusal)")
def _():
    m = mmpreproj.inject(neox(), PreProjConfig())
    return refused(m, lambda: pf.delete_adapter(m, "default", prefix="preproj"), ["default", "last", "unload"])


@case("refused", "PeftModel.delete_adapter of the last adapter")
def _():
    pm = peft.get_peft_model(neox(), PreProjConfig())
    return refused(pm, lambda: pm.delete_adapter("default"), ["default", "last", "unload"])


@case("refused", "load_adapter(adapter_name='default') over an existing adapter")
def _():
    m, _, _, d_a, d_b = two_adapter_inplace("neox")
    return refused(m, lambda: mmpreproj.load_adapter(m, d_b, adapter_name="default"), ["default"])


@case("refused", "load_adapter of an adapter on other blocks (layers=[0]) beside an all-block one")
def _():
    m, *_ = two_adapter_inplace("neox")
    d, _ = folder_of("neox", PreProjConfig(layers=[0]), 0, 3)
    return refused(m, lambda: mmpreproj.load_adapter(m, d, adapter_name="c"), ["layers", "block"])


@case("refused", "PeftModel.add_adapter with other sites (skip=False)")
def _():
    pm, *_ = peft_two("neox")
    return refused(pm, lambda: pm.add_adapter("c", PreProjConfig(skip=False)), ["skip"])


@case("refused", "PeftModel.add_adapter of a LoRA config beside PREPROJ")
def _():
    pm, *_ = peft_two("neox")
    return refused(
        pm,
        lambda: pm.add_adapter("c", peft.LoraConfig(r=2, target_modules=["query_key_value"])),
        ["LORA", "PREPROJ", "type"],
    )


@case("refused", "pf.set_adapter of an unknown name: a no-op (documented) or refused, model unchanged")
def _():
    lora = lora_inplace_two()
    before = snap(lora)
    try:
        pf.set_adapter(lora, "nope")
        lora_says = "no-op" if not diff(before, snap(lora)) else "changed"
    except Exception as e:  # noqa: BLE001
        lora_says = f"refused {type(e).__name__}"
    m, *_ = two_adapter_inplace("neox")
    before = snap(m)
    try:
        pf.set_adapter(m, "nope")
    except Exception:  # noqa: BLE001
        return refused(m, lambda: pf.set_adapter(m, "nope"), ["nope"]) + f" (LoRA: {lora_says})"
    ch = diff(before, snap(m))
    if ch:
        raise Fail(f"ours accepted and changed {ch}; LoRA {lora_says}")
    return f"no-op (LoRA: {lora_says})"


@case("refused", "PeftModel.set_adapter of an unknown name")
def _():
    pm, *_ = peft_two("neox")
    return refused(pm, lambda: pm.set_adapter("nope"), ["nope"])


@case("refused", "pf.set_adapter with modules_to_save for several adapters (documented refusal)")
def _():
    m = mmpreproj.inject(neox(), PreProjConfig(modules_to_save=["lm_head"]))
    d, _ = folder_of("neox", PreProjConfig(modules_to_save=["lm_head"]), 0, 5)
    mmpreproj.load_adapter(m, d, adapter_name="b")
    return refused(m, lambda: pf.set_adapter(m, "b"), ["modules_to_save", "set_adapter"])


@case("refused", "set_peft_model_state_dict with a wrong-shaped tensor (in place)")
def _():
    m = mmpreproj.inject(neox(), PreProjConfig())
    sd = {k: v.clone() for k, v in peft.get_peft_model_state_dict(m).items()}
    k = sorted(sd)[-1]
    sd[k] = torch.zeros(3, 3)
    return refused(m, lambda: peft.set_peft_model_state_dict(m, sd), [k.split(".")[-2], "size", "shape"])


@case("refused", "mmpreproj.save_pretrained(push_to_hub=True) refused, nothing written")
def _():
    m = mmpreproj.inject(neox(), PreProjConfig())
    d = tmpdir("push")
    r = refused(m, lambda: mmpreproj.save_pretrained(m, d, push_to_hub=True), ["push_to_hub"])
    if any(d.iterdir()):
        raise Fail(f"wrote {[p.name for p in d.iterdir()]}")
    return r


@case("refused", "set_adapter_state_dict with a missing key (model unchanged)")
def _():
    m = perturb(mmpreproj.inject(neox(), PreProjConfig()), seed=3)
    sd = dict(mmpreproj.adapter_state_dict(m))
    k = sorted(sd)[0]
    sd = {kk: torch.zeros_like(v) for kk, v in sd.items() if kk != k}
    return refused(m, lambda: mmpreproj.set_adapter_state_dict(m, sd), [k, "missing"])


@case("refused", "unload of an already-unloaded model")
def _():
    m = mmpreproj.inject(neox(), PreProjConfig())
    mmpreproj.unload(m)
    return refused(m, lambda: mmpreproj.unload(m), ["inject", "unload", "no mmpreproj"])


@case("refused", "mixed batch adapter_names='bbb' (a string, batch of 3): refused, or read as LoRA reads it")
def _():
    lora = peft.get_peft_model(
        neox(), peft.LoraConfig(r=4, target_modules=["query_key_value"], init_lora_weights=False)
    )
    lora.add_adapter("b", peft.LoraConfig(r=4, target_modules=["query_key_value"], init_lora_weights=False))
    lora.eval()
    try:
        lora_says = (
            "as ['b']*3"
            if torch.equal(lm_out(lora, adapter_names="bbb"), lm_out(lora, adapter_names=["b"] * 3))
            else "other"
        )
    except Exception as e:  # noqa: BLE001
        lora_says = f"refused {type(e).__name__}"
    m, *_ = two_adapter_inplace("neox")
    try:
        got = lm_out(m, adapter_names="bbb")
    except Exception:  # noqa: BLE001
        return refused(m, lambda: m(ids(), adapter_names="bbb"), ["adapter_names", "list"]) + f" (LoRA: {lora_says})"
    close(got, lm_out(m, adapter_names=["b"] * 3), "'bbb' vs ['b']*3", rtol=0, atol=0)
    return f"accepted as ['b']*3 (LoRA: {lora_says})"


@case("refused", "mixed batch adapter_names=[] on a batch of 3")
def _():
    m, *_ = two_adapter_inplace("neox")
    return refused(m, lambda: m(ids(), adapter_names=[]), ["adapter_names", "batch", "rows"])


@case("refused", "mixed batch adapter_names with a None entry")
def _():
    m, *_ = two_adapter_inplace("neox")
    return refused(m, lambda: m(ids(), adapter_names=["default", None, "b"]), ["None", "adapter_names"])


@case("refused", "save_adapter(adapter_name='nope') names it, nothing written")
def _():
    m, *_ = two_adapter_inplace("neox")
    d = tmpdir("nope")
    r = refused(m, lambda: mmpreproj.save_adapter(m, d, adapter_name="nope"), ["nope"])
    if any(d.iterdir()):
        raise Fail(f"wrote {[p.name for p in d.iterdir()]}")
    return r


@case("refused", "set_adapter_state_dict(adapter_name='nope') names it")
def _():
    m, *_ = two_adapter_inplace("neox")
    sd = mmpreproj.adapter_state_dict(m)
    return refused(m, lambda: mmpreproj.set_adapter_state_dict(m, sd, adapter_name="nope"), ["nope"])


@case("refused", "load_adapter(adapter_name='__base__') (the mixed batch's base name)")
def _():
    m, _, _, d_a, d_b = two_adapter_inplace("neox")
    return refused(m, lambda: mmpreproj.load_adapter(m, d_b, adapter_name="__base__"), ["__base__"])


@case("refused", "PeftModel.add_adapter('__base__') (the mixed batch's base name)")
def _():
    pm, *_ = peft_two("neox")
    return refused(pm, lambda: pm.add_adapter("__base__", PreProjConfig()), ["__base__"])


@case("refused", "load_adapter(adapter_name='') ")
def _():
    m, _, _, d_a, d_b = two_adapter_inplace("neox")
    return refused(m, lambda: mmpreproj.load_adapter(m, d_b, adapter_name=""), ["adapter_name", "name"])


@case("refused", "from_pretrained(DIR, adapter=<missing folder>) names the folder")
def _():
    m = mmpreproj.inject(neox(), PreProjConfig())
    d = tmpdir("full")
    mmpreproj.save_pretrained(m, d)
    missing = d / "no_such_adapter"
    try:
        mmpreproj.from_pretrained(d, adapter=missing)
    except Exception as e:  # noqa: BLE001
        if "no_such_adapter" not in str(e):
            raise Fail(f"message does not name the folder: {type(e).__name__}: {str(e)[:150]}") from None
        return f"{type(e).__name__}: {str(e)[:120]}"
    raise Fail("loaded")


@case("refused", "mmpreproj.delete_adapter of an unknown name names it")
def _():
    m, *_ = two_adapter_inplace("neox")
    return refused(m, lambda: mmpreproj.delete_adapter(m, "nope"), ["nope"])


@case("refused", "mixed batch while training modules_to_save in place naming 'b' (documented)")
def _():
    m, a, b = mts_two()
    return refused(m, lambda: m(ids(), adapter_names=["default", "b", "default"]), ["modules_to_save"])


# ================================================================= main


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=None)
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        for area, name, _ in CASES:
            print(f"{area} | {name}")
        return
    n_pass = n_fail = 0
    for area, name, fn in CASES:
        label = f"{area} | {name}"
        if a.only and a.only not in label:
            continue
        torch.manual_seed(0)
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                det = fn()
            st = "PASS"
        except Fail as e:
            st, det = "FAIL", str(e)
        except Exception as e:  # noqa: BLE001
            st, det = (
                "FAIL",
                f"unexpected {type(e).__name__}: {str(e)[:220]} @ {origin(e).split('site-packages/')[-1]}",
            )
        det = str(det).replace("\n", " ")
        n_pass += st == "PASS"
        n_fail += st == "FAIL"
        print(f"{st} | {label} | {det}", flush=True)
    print(f"TOTAL {n_pass + n_fail}: {n_pass} PASS, {n_fail} FAIL")
    shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    main()
