"""Family audit: peft's own public API on PREPROJ adapters, host family by host family, judged against LoRA.

Run:  OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 PYTHONPATH=. python bench/family_functional_audit.py [--only SUBSTR] [--list]

Written by an independent audit (not by the library's authors): its expectations are the auditor's, taken from
README.md, docs/peft-guide.md, docs/limits.md and from what peft's LoRA does under the same calls on the same
family. It does not test what the code intends; where LoRA raises the same error on a family the case passes
"as LoRA", and FAILs that docs/limits.md or docs/peft-guide.md already describe are marked "(documented: ...)".

Families (41; tiny, random weights, built from configs in code, nothing downloaded): every decoder of
tests/helpers/zoo.py BUILDERS (18), timm ViT, Eva (RoPE), DeiT distilled, SAM ViT (windowed) and BEiT, open_clip
CLIP and CustomTextCLIP, transformers ViT, DINOv2, Swin, CLIP, SigLIP, T5, Whisper and ModernBERT, the VLMs
Qwen2-VL, Qwen2.5-VL and LLaVA (CLIP tower + Llama), and five models no row claims, injected through the trace
(XGLM, JetMoe, ESM, Qwen3-Next, MPT; tests/helpers/trace_zoo.py). Two routes per family: "inplace"
(`mmpreproj.inject(model)`, a second adapter "b" by `mmpreproj.load_adapter(model, DIR, adapter_name="b")`) and
"peft" (`peft.get_peft_model(model, PreProjConfig())`, `pm.add_adapter("b", PreProjConfig())`). Both adapters are
moved off their init with seeded noise, so outputs differ (checked). LoRA's reference: `peft.LoraConfig(r=2,
init_lora_weights=False)` on every nn.Linear / Conv1D of the same family (outside nn.MultiheadAttention), through
`inject_adapter_in_model` or `get_peft_model` + `add_adapter`. LoRA in place has no mixed batch (the kwarg never
reaches its layers, its rows all run the active adapter), so in place the docs alone judge mixed batches.

Checks per family and route:
  1. set_adapter: `peft.functional.set_adapter(model, "b")` (and `pm.set_adapter("b")`): outputs equal b alone
     (atol 1e-5; "bit-equal" noted), every layer reports b active, requires_grad per adapter as LoRA's.
  2. set_requires_grad: `peft.functional.set_requires_grad(model, "b", True/False)` flips exactly b's parameters
     (LoRA's pattern under the same call on the same family).
  3. state dict: `peft.get_peft_model_state_dict(model, adapter_name="b")` -> `set_peft_model_state_dict(fresh,
     sd)` into a fresh model of the same route: outputs bit-equal to b alone, no unexpected keys.
  4. delete: `peft.functional.delete_adapter(model, "b", prefix="preproj")` (peft route: `pm.delete_adapter`), of a
     waiting and of the ACTIVE adapter: equals the remaining adapter alone, active/return value/flags as LoRA.
  5. mixed batch: `forward(..., adapter_names=["default", "b", "__base__"])`: each row equals that adapter alone /
     the base (1e-5).
  6. unload after all of the above (both adapters loaded, switched, flags flipped, a mixed batch): every state_dict
     tensor bit-equal to a copy taken before inject, requires_grad flags and module types as before, outputs
     bit-equal, no peft_config left.
  7. refusals (bad adapter names, wrong name count, duplicate adapter): the model unchanged (parameters, buffers,
     flags, module tree, peft attributes) and a one-line message naming the bad argument; a call LoRA accepts as a
     no-op passes if ours is a no-op too.
  Also: a b of another size (expansion=0.5, skip_rank=4), the state dict of a waiting adapter, loading into "b" of
  a two-adapter model, deleting "default" while b is active, delete-then-re-add, set_requires_grad of a list,
  set_adapter(inference_mode=True), the PeftModel's own set_requires_grad, gradients after set_adapter,
  get_model_status / get_layer_status, mixed batches with b active, mixed `generate`, unload after a delete,
  deleting the last adapter, and set_peft_model_state_dict refusals (a mis-sized state dict, an unknown name).
One line per case: PASS/FAIL | route | family: case | details; then TOTAL n: p PASS, f FAIL (about 200 s, one core).
Output on the code as it was audited (commit dc58ff1): bench/results/family_functional_audit_before.txt (2,668 cases,
100 FAIL):
  * 82 documented (limits.md): deleting the last adapter is refused where LoRA deletes it (41 families x 2 routes);
  * 2 documented: in place, a mixed batch on Qwen2-VL / Qwen2.5-VL is refused (a packed vision tower);
  * 15 not documented, in place on StableLM, StableLM (parallel residual) and MPT (traced): the decoder layers of
    these transformers classes call their attention without **kwargs, so `model(..., adapter_names=[...])` never
    reaches the wrappers: every row silently runs the active adapter, and an unknown name or a wrong count is
    accepted silently (the docs: "an unknown name is refused, never ignored"); the PeftModel route is right there;
  * 1 not documented, in place on transformers Swin: a mixed batch is refused ("3 names for 27 rows", the windowed
    attention sees windows, not images); peft's LoRA refuses it too on the PeftModel route (where this passes).
After the fixes (the injected model hands a mixed batch's names to every wrapper by its own forward pre-hook,
`method/apply.py`; tests/method/layer/test_mixed_adapter_batch.py), bench/results/family_functional_audit.txt: 86 FAIL,
the 84 documented above and a mixed batch in place on Swin and timm's SAM ViT (windowed attention: now documented).
StableLM and MPT serve mixes in place, and so do the timm and open_clip models whose forward takes no
`adapter_names` (ViT, Eva, DeiT, BEiT, CLIP, CustomTextCLIP: there it raised TypeError before, as LoRA does).
Run again after the last adapter became deletable as LoRA's is (the 82 "delete the last adapter" FAILs above):
TOTAL 2668: 2664 PASS, 4 FAIL: a mixed batch in place through a windowed or packed vision tower (Swin, SAM ViT,
Qwen2-VL, Qwen2.5-VL), refused as docs/limits.md says. A first re-run on the commit before the mend 02c290a gave 86
FAIL again, another 82: there a layer's switch to a name it does not hold (`pf.set_adapter('nope')`) cleared its
active adapter, which the mend (and tests/method/layer/test_peft_layer.py) put right.
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
from functools import partial
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import peft  # noqa: E402
import peft.functional as pf  # noqa: E402
import torch  # noqa: E402
from peft.tuners.tuners_utils import BaseTunerLayer  # noqa: E402

import mmpreproj  # noqa: E402
from mmpreproj import PreProjConfig  # noqa: E402
from tests.helpers import zoo  # noqa: E402
from tests.helpers.trace_zoo import build as trace_build  # noqa: E402

TMP = Path(tempfile.mkdtemp(prefix="family_audit_"))
B = 3  # rows per batch: "default", "b", "__base__"
ATOL = 1e-5
SLOTS = {"preproj", "preproj_skip", "lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B"}
PREFIX = {"preproj": "preproj", "lora": "lora_"}


class Fail(Exception):
    pass


# ================================================================= families


class Fam:
    def __init__(self, name, build, inputs):
        self.name, self.build, self.inputs = name, build, inputs  # inputs(batch) -> (args, kwargs)


def _tok(batch, vocab=zoo.VOCAB, kw=None):
    ids = torch.randint(2, vocab, (batch, 7), generator=torch.Generator().manual_seed(1))
    return (), {"input_ids": ids, **({"use_cache": False} if kw is None else kw)}


def _llava(seed=0):
    from tests.test_host_vlm import _llava as build

    return build()


def _llava_in(batch):
    from tests.test_host_vlm import _ids

    g = torch.Generator().manual_seed(2)
    return (), {"input_ids": _ids(16, g, batch), "pixel_values": torch.randn(batch, 3, 16, 16, generator=g)}


def _t5(seed=0):
    from tests.test_host_encoders import _t5 as build

    return build()


def _t5_in(batch):
    g = torch.Generator().manual_seed(2)
    return (), {
        "input_ids": torch.randint(1, zoo.VOCAB, (batch, 6), generator=g),
        "decoder_input_ids": torch.randint(1, zoo.VOCAB, (batch, 4), generator=g),
        "use_cache": False,
    }


def _whisper(seed=0):
    from tests.test_host_encoders import _whisper as build

    return build()


def _whisper_in(batch):
    g = torch.Generator().manual_seed(6)
    return (), {
        "input_features": torch.randn(batch, 16, 32, generator=g),
        "decoder_input_ids": torch.randint(3, zoo.VOCAB, (batch, 5), generator=g),
        "use_cache": False,
    }


def _modernbert(seed=0):
    from tests.test_host_encoders import _modernbert as build

    return build()


def _custom_text_clip():
    from open_clip.model import CustomTextCLIP

    from tests.test_host_open_clip import build_clip

    return build_clip(cls=CustomTextCLIP, vision={"ls_init_value": 0.5}, text={"ls_init_value": 0.5})


def _img(batch, size=32):
    return (torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1)),), {}


def _pix(batch, size=16):
    return (), {"pixel_values": torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(4))}


def _timm(kind):
    from tests.test_host_timm import BUILDERS as TB

    return TB[kind]


def _clip_oc():
    from tests.test_host_open_clip import build_clip

    return build_clip()


def _clip_oc_in(batch):
    t = torch.randint(1, 99, (batch, 16), generator=torch.Generator().manual_seed(2))
    t[:, -3] = 99
    return (torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1)), t), {}


def _hf_clip_in(batch):
    g = torch.Generator().manual_seed(3)
    return (), {
        "input_ids": torch.randint(1, zoo.VOCAB, (batch, 6), generator=g),
        "pixel_values": torch.randn(batch, 3, 16, 16, generator=g),
    }


def _vl_in(batch):
    g = torch.Generator().manual_seed(2)
    V = zoo.VOCAB
    rows = [
        torch.cat([torch.tensor([V]), torch.full((4,), V + 2), torch.randint(3, V, (5,), generator=g)])
        for _ in range(batch)
    ]
    ids = torch.stack(rows)
    pixels = torch.randn(16 * batch, 3 * 2 * 4 * 4, generator=g)
    return (), {
        "input_ids": ids,
        "pixel_values": pixels,
        "image_grid_thw": torch.tensor([[1, 4, 4]] * batch),
        "mm_token_type_ids": (ids == V + 2).long(),
        "use_cache": False,
    }


def _families():
    from tests.test_host_encoders import _swin
    from tests.test_host_transformers import _clip, _vit

    fams = [Fam(n, b, _tok) for n, b in zoo.BUILDERS.items()]
    fams += [
        Fam("timm_vit", _timm("vit"), _img),
        Fam("timm_eva_rope", _timm("eva_rope"), _img),
        Fam("timm_deit_distilled", _timm("deit_distilled"), _img),
        Fam("open_clip_clip", _clip_oc, _clip_oc_in),
        Fam("hf_vit", _vit, _pix),
        Fam("hf_dinov2", partial(_vit, family="Dinov2"), _pix),
        Fam("hf_swin", _swin, _pix),
        Fam("hf_clip", _clip, _hf_clip_in),
        Fam("qwen2_vl", zoo.qwen2_vl, _vl_in),
        Fam("traced_xglm", lambda seed=0: trace_build("XGLM", "XGLMForCausalLM", seed=seed), _tok),
        Fam("qwen2_5_vl", partial(zoo.qwen2_vl, cls_name="Qwen2_5_VL"), _vl_in),
        Fam("llava_clip_llama", _llava, _llava_in),
        Fam("hf_siglip", partial(_clip, family="Siglip"), _hf_clip_in),
        Fam("hf_t5", _t5, _t5_in),
        Fam("hf_whisper", _whisper, _whisper_in),
        Fam("hf_modernbert", _modernbert, partial(_tok, kw={})),
        Fam("timm_vit_sam", _timm("vit_sam_relpos_padded"), partial(_img, size=40)),
        Fam("timm_beit", _timm("beit_relpos_layerscale"), _img),
        Fam("open_clip_custom_text", _custom_text_clip, _clip_oc_in),
        Fam("traced_jetmoe", partial(trace_build, "JetMoe", "JetMoeForCausalLM", kv_channels=8), _tok),
        Fam(
            "traced_esm",
            partial(trace_build, "Esm", "EsmModel", vocab_size=33, pad_token_id=1, position_embedding_type="rotary"),
            partial(_tok, vocab=33, kw={}),
        ),
        Fam(
            "traced_qwen3_next",
            partial(
                trace_build,
                "Qwen3Next",
                "Qwen3NextForCausalLM",
                layer_types=["linear_attention", "full_attention"],
                linear_num_value_heads=4,
                linear_num_key_heads=2,
                linear_key_head_dim=8,
                linear_value_head_dim=8,
            ),
            _tok,
        ),
        Fam(
            "traced_mpt",
            lambda seed=0: trace_build(
                "Mpt", "MptForCausalLM", seed=seed, d_model=32, n_heads=4, n_layers=2, expansion_ratio=2
            ),
            _tok,
        ),
    ]
    return fams


# ================================================================= outputs, adapters, snapshots


def tensors(out):
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if isinstance(out, dict):  # CLIP's logits_per_image / _text mix rows (row i against every other row): left out
        out = [v for k, v in out.items() if not str(k).startswith("logits_per")]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in tensors(o)]
    return []


def fwd(fam, model, **kw):
    args, kwargs = fam.inputs(B)
    torch.manual_seed(0)
    with torch.no_grad():
        return tensors(model(*args, **kwargs, **kw))


def same(a, b, what, tol=0.0):
    """Outputs (lists of tensors) equal (bit for bit if tol == 0); returns a detail; raises Fail."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        raise Fail(f"{what}: output structure differs")
    d = max(((x.double() - y.double()).abs().max().item() for x, y in zip(a, b)), default=0.0)
    if all(torch.equal(x, y) for x, y in zip(a, b)):
        return "bit-equal"
    if d <= tol:
        return f"close (max {d:.2g})"
    raise Fail(f"{what}: max diff {d:.3g}" + (" (not bit-equal)" if tol == 0 else f" > {tol:g}"))


def differ(a, b, what):
    if all(x.shape == y.shape and torch.allclose(x, y, atol=1e-6, rtol=0) for x, y in zip(a, b)):
        raise Fail(f"harness: {what} are equal (the check would be vacuous)")


def adapter_of(name):
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p in SLOTS:
            return parts[i + 1]
    return None


def aparams(model, name=None):
    out = {}
    for n, p in model.named_parameters():
        a = adapter_of(n)
        if a is not None and (name is None or a == name):
            out[n] = p
    return out


def perturb(model, name, seed, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    ps = aparams(model, name)
    if not ps:
        raise Fail(f"harness: no parameters of adapter {name!r}")
    with torch.no_grad():
        for _, p in sorted(ps.items()):
            p.add_(scale * torch.randn(p.shape, generator=g).to(p.dtype))


def copy_adapter(src, sname, dst, dname):
    """Copy adapter `sname` of `src` into adapter `dname` of `dst` by parameter name (no peft call)."""
    dp = aparams(dst, dname)
    n = 0
    with torch.no_grad():
        for k, p in aparams(src, sname).items():
            key = ".".join(
                dname if (i > 0 and k.split(".")[i - 1] in SLOTS) else x for i, x in enumerate(k.split("."))
            )
            dk = [d for d in dp if d.removeprefix("base_model.model.") == key.removeprefix("base_model.model.")]
            if len(dk) != 1:
                raise Fail(f"harness: no single match for {k} in the target")
            dp[dk[0]].copy_(p)
            n += 1
    if n != len(dp):
        raise Fail("harness: copy_adapter left parameters out")


def flag_pattern(model):
    """Per adapter: the requires_grad values its parameters have ('T', 'F' or 'mixed'), and the base's."""
    d = {}
    for n, p in model.named_parameters():
        d.setdefault(adapter_of(n) or "<base>", set()).add(p.requires_grad)
    return {k: ("mixed" if len(v) > 1 else ("T" if True in v else "F")) for k, v in sorted(d.items())}


def layers(model):
    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


def layer_active(model):
    return sorted({tuple(m.active_adapters) for m in layers(model)})


def peft_attrs(model):
    out = {}
    for obj, tag in ((model, "root"), (getattr(model, "base_model", None), "base_model")):
        if obj is None:
            continue
        pc = obj.__dict__.get("peft_config")
        if pc is not None:
            out[f"{tag}.peft_config"] = tuple(sorted(pc))
        for a in ("active_adapter", "_active_adapter"):
            v = obj.__dict__.get(a)
            if isinstance(v, (str, list, tuple)):
                out[f"{tag}.{a}"] = v if isinstance(v, str) else tuple(v)
    out["layers"] = tuple(
        (tuple(m.active_adapters), tuple(sorted(m._get_available_adapters())), m.disable_adapters)
        for m in layers(model)
    )
    return out


def snap(model):
    return {
        "tree": [(n, type(m).__name__, id(m), m.training) for n, m in model.named_modules()],
        "params": {
            n: (p.detach().clone(), p.dtype, p.requires_grad, id(p))
            for n, p in model.named_parameters(remove_duplicate=False)
        },
        "buffers": {n: (b.detach().clone(), b.dtype) for n, b in model.named_buffers(remove_duplicate=False)},
        "peft": peft_attrs(model),
    }


def snap_diff(a, b):
    d = []
    if a["tree"] != b["tree"]:
        d.append("module tree changed")
    if a["params"].keys() != b["params"].keys():
        gone, new = sorted(a["params"].keys() - b["params"].keys()), sorted(b["params"].keys() - a["params"].keys())
        d.append(f"param names changed (-{gone[:2]} +{new[:2]})")
    for k in a["params"].keys() & b["params"].keys():
        x, y = a["params"][k], b["params"][k]
        if x[1:] != y[1:] or not torch.equal(x[0], y[0]):
            d.append(f"param {k} changed ({'requires_grad' if x[2] != y[2] else 'value/dtype/object'})")
            break
    if a["buffers"].keys() != b["buffers"].keys() or any(
        not torch.equal(a["buffers"][k][0], b["buffers"][k][0]) for k in a["buffers"].keys() & b["buffers"].keys()
    ):
        d.append("buffers changed")
    if a["peft"] != b["peft"]:
        d.append("peft attrs changed: " + ", ".join(k for k in a["peft"] if a["peft"].get(k) != b["peft"].get(k)))
    return d


# ================================================================= building adapted models


def lora_cfg(model):
    from transformers.pytorch_utils import Conv1D

    names = []
    mha = {n for n, m in model.named_modules() if isinstance(m, torch.nn.MultiheadAttention)}
    for n, m in model.named_modules():
        if isinstance(m, (torch.nn.Linear, Conv1D)) and n.rpartition(".")[0] not in mha:
            names.append(n)
    return peft.LoraConfig(r=2, target_modules=names, init_lora_weights=False)


def seed_cfg(seed, cfg_fn):
    torch.manual_seed(seed)
    return cfg_fn()


def two(fam, route, kind="preproj", cfg_b=None):
    """A model (or PeftModel) holding 'default' (active) and 'b', both perturbed; plus, for PREPROJ, the same route's
    models holding each alone (`a`, `b`) and the plain base (`base`). `cfg_b`: b's config (default PreProjConfig())."""
    cfg_b = cfg_b or PreProjConfig
    if kind == "lora":
        m = fam.build()
        cfg = lora_cfg(m)
        torch.manual_seed(100)
        if route == "inplace":
            m = peft.inject_adapter_in_model(cfg, m)
            torch.manual_seed(200)
            peft.inject_adapter_in_model(copy.deepcopy(cfg), m, adapter_name="b")
        else:
            m = peft.get_peft_model(m, cfg)
            torch.manual_seed(200)
            m.add_adapter("b", copy.deepcopy(cfg))
        return {"m": m.eval()}
    if route == "inplace":
        m = fam.build()
        torch.manual_seed(100)
        mmpreproj.inject(m, PreProjConfig())
        perturb(m, "default", 11)
        alone_b = fam.build()
        torch.manual_seed(200)
        mmpreproj.inject(alone_b, cfg_b())
        perturb(alone_b, "default", 22)
        d = Path(tempfile.mkdtemp(dir=TMP))
        mmpreproj.save_adapter(alone_b, d)
        mmpreproj.load_adapter(m, d, adapter_name="b")
        alone_a = fam.build()
        torch.manual_seed(100)
        mmpreproj.inject(alone_a, PreProjConfig())
        perturb(alone_a, "default", 11)
        return {"m": m.eval(), "a": alone_a.eval(), "b": alone_b.eval(), "dir_b": d, "base": fam.build()}
    torch.manual_seed(100)
    pm = peft.get_peft_model(fam.build(), PreProjConfig())
    perturb(pm, "default", 11)
    torch.manual_seed(200)
    pm.add_adapter("b", cfg_b())
    perturb(pm, "b", 22)
    alone = {}
    for name, seed in (("default", 300), ("b", 400)):
        torch.manual_seed(seed)
        x = peft.get_peft_model(fam.build(), cfg_b() if name == "b" else PreProjConfig())
        copy_adapter(pm, name, x, "default")
        alone[name] = x
    return {"m": pm.eval(), "a": alone["default"].eval(), "b": alone["b"].eval(), "base": fam.build()}


def fresh_route(fam, route, seed=500):
    torch.manual_seed(seed)
    if route == "inplace":
        return mmpreproj.inject(fam.build(), PreProjConfig()).eval()
    return peft.get_peft_model(fam.build(), PreProjConfig()).eval()


def lora_run(fam, route, fn):
    """fn(lora_setup) on LoRA's two-adapter model of the same family and route: ('ok', value) or ('raised', exc)."""
    try:
        s = two(fam, route, "lora")
    except Exception as e:  # noqa: BLE001
        return ("nolora", f"{type(e).__name__}: {str(e)[:80]}")
    try:
        return ("ok", fn(s))
    except Exception as e:  # noqa: BLE001
        return ("raised", e)


def emsg(e):
    return f"{type(e).__name__}: {str(e)[:140]}".replace("\n", " / ")


# ================================================================= the checks

CASES: list = []


def case(name):
    def deco(fn):
        CASES.append((name, fn))
        return fn

    return deco


def as_lora_or_fail(fam, route, e, lora_fn):
    """Our call raised `e`: PASS (returned detail) if LoRA raises the same type on the same family, else Fail."""
    lr = lora_run(fam, route, lora_fn)
    if lr[0] == "raised" and type(lr[1]) is type(e):
        return f"as LoRA (both raise {type(e).__name__}; ours: {str(e)[:70]} | LoRA: {str(lr[1])[:70]})".replace(
            "\n", " "
        )
    what = {"ok": "LoRA runs it", "raised": f"LoRA raises {type(lr[1]).__name__}", "nolora": "no LoRA ref"}[lr[0]]
    raise Fail(f"raised {emsg(e)} [{what}] at {where(e)}")


def where(e):
    tb = traceback.extract_tb(e.__traceback__)
    if not tb:
        return "?"
    f = tb[-1]
    return f"{f.filename.split('site-packages/')[-1].split('wt-fam/')[-1]}:{f.lineno}"


def do_set_adapter(route, s, how):
    m = s["m"]
    if how == "pf":
        pf.set_adapter(m, "b")
    else:
        m.set_adapter("b")


@case("set_adapter")
def c_set_adapter(fam, route, how="pf"):
    s = two(fam, route)
    differ(fwd(fam, s["a"]), fwd(fam, s["b"]), "adapters default and b")
    try:
        do_set_adapter(route, s, how)
    except Exception as e:  # noqa: BLE001
        return as_lora_or_fail(fam, route, e, lambda ls: do_set_adapter(route, ls, how))
    det = same(fwd(fam, s["m"]), fwd(fam, s["b"]), "outputs vs b alone", ATOL)
    probs = []
    if layer_active(s["m"]) != [("b",)]:
        probs.append(f"layers report {layer_active(s['m'])}")
    if route == "inplace" and mmpreproj.active_adapter(s["m"]) != "b":
        probs.append(f"mmpreproj.active_adapter = {mmpreproj.active_adapter(s['m'])!r}")
    if route == "peft" and how == "pm" and s["m"].active_adapter != "b":
        probs.append(f"pm.active_adapter = {s['m'].active_adapter!r}")
    ours = {k: v for k, v in flag_pattern(s["m"]).items()}
    lr = lora_run(fam, route, lambda ls: (do_set_adapter(route, ls, how), flag_pattern(ls["m"]))[1])
    keys = ("default", "b", "<base>")
    if lr[0] == "ok" and {k: ours.get(k) for k in keys} != {k: lr[1].get(k) for k in keys}:
        probs.append(f"requires_grad {ours} vs LoRA {lr[1]}")
    if probs:
        raise Fail("; ".join(probs))
    return f"outputs {det}; layers b; flags {ours} as LoRA" if lr[0] == "ok" else f"outputs {det}; flags {ours}"


@case("pm.set_adapter")
def c_pm_set_adapter(fam, route):
    if route != "peft":
        return None
    return c_set_adapter(fam, route, how="pm")


def do_rg(s, value):
    m = s["m"]
    before = {n: p.requires_grad for n, p in m.named_parameters()}
    pf.set_requires_grad(m, "b", requires_grad=value)
    after = {n: p.requires_grad for n, p in m.named_parameters()}
    changed = sorted(n for n in before if before[n] != after[n])
    b_names = set(aparams(m, "b"))
    return {
        "b all": {after[n] for n in b_names},
        "changed outside b": [n for n in changed if n not in b_names],
        "pattern": flag_pattern(m),
    }


for _val in (True, False):

    @case(f"set_requires_grad(b, {_val})")
    def c_rg(fam, route, value=_val):
        s = two(fam, route)
        if not value:
            pf.set_requires_grad(s["m"], "b", requires_grad=True)  # start trainable so that False flips it
        try:
            ours = do_rg(s, value)
        except Exception as e:  # noqa: BLE001
            return as_lora_or_fail(fam, route, e, lambda ls: do_rg(ls, value))
        probs = []
        if ours["b all"] != {value}:
            probs.append(f"b's flags {ours['b all']}")
        if ours["changed outside b"]:
            probs.append(f"also flipped {ours['changed outside b'][:2]} ({len(ours['changed outside b'])})")
        lr = lora_run(
            fam,
            route,
            lambda ls: (
                None if value else pf.set_requires_grad(ls["m"], "b", requires_grad=True),
                do_rg(ls, value),
            )[1],
        )
        if lr[0] == "ok":
            lo = lr[1]
            if (lo["b all"], bool(lo["changed outside b"])) != (ours["b all"], bool(ours["changed outside b"])):
                probs.append(f"LoRA: b {lo['b all']}, outside b {len(lo['changed outside b'])}")
        if probs:
            raise Fail("; ".join(probs))
        return f"exactly b's {len(aparams(s['m'], 'b'))} params -> {value}" + (" as LoRA" if lr[0] == "ok" else "")


@case("get/set_peft_model_state_dict(b) -> fresh")
def c_state_dict(fam, route):
    s = two(fam, route)
    sd = peft.get_peft_model_state_dict(s["m"], adapter_name="b")
    if not sd:
        raise Fail("empty state dict for 'b'")
    fresh = fresh_route(fam, route)
    res = peft.set_peft_model_state_dict(fresh, sd, adapter_name="default")
    unexpected = list(getattr(res, "unexpected_keys", []) or [])
    det = same(fwd(fam, fresh), fwd(fam, s["b"]), "fresh model vs b alone", 0.0)
    if unexpected:
        raise Fail(f"unexpected keys {unexpected[:2]} ({len(unexpected)})")
    n = len(aparams(fresh, "default"))
    if len(sd) < n:
        raise Fail(f"state dict has {len(sd)} tensors for {n} adapter parameters")
    return f"{len(sd)} tensors; outputs {det}"


def do_delete(route, s, active, how="pm"):
    m = s["m"]
    kind = "lora" if any(adapter_of(n) for n in m.state_dict() if ".lora_A." in n) else "preproj"
    if active:
        if route == "peft":
            m.set_adapter("b")
        else:
            pf.set_adapter(m, "b")
    if route == "peft" and how == "pm":
        ret = m.delete_adapter("b")
        act = m.active_adapter
    else:
        ret = pf.delete_adapter(m, "b", prefix=PREFIX[kind])
        act = None
    return {
        "ret": ret,
        "layers": layer_active(m),
        "pm_active": act,
        "b params": len(aparams(m, "b")),
        "pattern": flag_pattern(m),
        "peft_config": tuple(sorted(getattr(m, "peft_config", {}) or {})),
    }


for _act in (False, True):
    for _how in ("pf", "pm"):

        @case(f"{_how}.delete_adapter(b{', active' if _act else ''})")
        def c_delete(fam, route, active=_act, how=_how):
            if route == "inplace" and how == "pm":
                return None
            return delete_case(fam, route, active, how)


def delete_case(fam, route, active, how):
    s = two(fam, route)
    try:
        ours = do_delete(route, s, active, how)
    except Exception as e:  # noqa: BLE001
        return as_lora_or_fail(fam, route, e, lambda ls: do_delete(route, ls, active, how))
    probs = []
    try:
        det = same(fwd(fam, s["m"]), fwd(fam, s["a"]), "outputs vs default alone", ATOL)
    except Fail as f:
        probs.append(str(f))
        det = "?"
    if ours["b params"]:
        probs.append(f"{ours['b params']} params of b left")
    if ours["layers"] != [("default",)]:
        probs.append(f"layers report {ours['layers']}")
    lr = lora_run(fam, route, lambda ls: do_delete(route, ls, active, how))
    if lr[0] == "ok":
        lo = lr[1]
        for k in ("ret", "pm_active", "peft_config"):
            if lo[k] != ours[k]:
                probs.append(f"{k} {ours[k]!r} vs LoRA {lo[k]!r}")
        if lo["pattern"].get("default") != ours["pattern"].get("default"):
            probs.append(f"default's requires_grad {ours['pattern'].get('default')} vs LoRA {lo['pattern']}")
    elif lr[0] == "raised":
        probs.append(f"(LoRA raised {emsg(lr[1])})")
    if probs:
        raise Fail("; ".join(probs))
    return f"outputs {det}; ret {ours['ret']!r}; as LoRA" if lr[0] == "ok" else f"outputs {det}"


def do_mixed(fam, m, names):
    return fwd(fam, m, adapter_names=names)


@case("mixed batch [default, b, __base__]")
def c_mixed(fam, route):
    s = two(fam, route)
    names = ["default", "b", "__base__"]
    try:
        got = do_mixed(fam, s["m"], names)
    except Exception as e:  # noqa: BLE001
        if route == "inplace" and not isinstance(e, TypeError):
            # LoRA in place has no mixed batch (the kwarg never reaches its layers: its rows all run the active
            # adapter, silently), so it is no reference here: the docs are
            doc = (
                " (documented: limits.md / peft-guide.md, a vision tower that packs every image into one sequence)"
                if "no batch dimension" in str(e)
                else " (not documented: docs name only the packed Qwen2-VL tower)"
            )
            raise Fail(f"refused: {emsg(e)} at {where(e)}{doc}") from None
        return as_lora_or_fail(fam, route, e, lambda ls: do_mixed(fam, ls["m"], names))
    refs = {"default": fwd(fam, s["a"]), "b": fwd(fam, s["b"]), "__base__": fwd(fam, s["base"])}
    differ(refs["default"], refs["b"], "adapters default and b")
    det, probs = set(), []
    for i, n in enumerate(names):
        for j, (g, r) in enumerate(zip(got, refs[n])):
            if g.dim() == 0 or g.shape[0] != B:
                continue
            try:
                det.add(same([g[i]], [r[i]], f"row {i} ({n}) tensor {j}", ATOL))
            except Fail as f:
                probs.append(str(f))
    if probs:
        raise Fail("; ".join(probs[:3]) + (f" (+{len(probs) - 3})" if len(probs) > 3 else ""))
    return "rows " + ", ".join(sorted(det))


def base_record(model):
    return (
        {k: v.detach().clone() for k, v in model.state_dict().items()},
        {n: p.requires_grad for n, p in model.named_parameters()},
        [(n, type(m)) for n, m in model.named_modules()],
        hasattr(model, "peft_config"),
    )


def compare_base(before, model, what):
    sd0, fl0, ty0, pc0 = before
    sd1, fl1, ty1, pc1 = base_record(model)
    probs = []
    if sd0.keys() != sd1.keys():
        probs.append(
            f"{what}: state_dict keys -{sorted(sd0.keys() - sd1.keys())[:2]} +{sorted(sd1.keys() - sd0.keys())[:2]}"
        )
    bad = [k for k in sd0.keys() & sd1.keys() if sd0[k].dtype != sd1[k].dtype or not torch.equal(sd0[k], sd1[k])]
    if bad:
        probs.append(f"{what}: {len(bad)} state_dict tensors differ (e.g. {bad[0]})")
    fl = [n for n in fl0 if fl1.get(n) != fl0[n]]
    if fl:
        probs.append(
            f"{what}: requires_grad of {len(fl)} params differs (e.g. {fl[0]}: {fl0[fl[0]]}->{fl1.get(fl[0])})"
        )
    if ty0 != ty1:
        probs.append(f"{what}: module types differ")
    if pc0 != pc1:
        probs.append(f"{what}: peft_config {'left' if pc1 else 'gone'}")
    return probs


def busy_then_unload(fam, route, kind):
    """Adapters 'default' and 'b', switched, flags flipped, a mixed batch; then unload: (before, unloaded, steps)."""
    model = fam.build()
    before = base_record(model)
    if kind == "lora":
        cfg = lora_cfg(model)
        if route == "inplace":
            m = peft.inject_adapter_in_model(cfg, model)
            peft.inject_adapter_in_model(copy.deepcopy(cfg), m, adapter_name="b")
        else:
            m = peft.get_peft_model(model, cfg)
            m.add_adapter("b", copy.deepcopy(cfg))
    elif route == "inplace":
        torch.manual_seed(100)
        m = mmpreproj.inject(model, PreProjConfig())
        src = mmpreproj.inject(fam.build(), PreProjConfig())
        perturb(src, "default", 22)
        d = Path(tempfile.mkdtemp(dir=TMP))
        mmpreproj.save_adapter(src, d)
        mmpreproj.load_adapter(m, d, adapter_name="b")
    else:
        m = peft.get_peft_model(model, PreProjConfig())
        m.add_adapter("b", PreProjConfig())
    perturb(m, "default", 11)
    m.eval()
    steps = []
    for label, call in (
        ("set_adapter b", lambda: pf.set_adapter(m, "b")),
        ("set_requires_grad b False", lambda: pf.set_requires_grad(m, "b", requires_grad=False)),
        ("mixed", lambda: fwd(fam, m, adapter_names=["default", "b", "__base__"])),
        ("set_adapter default", lambda: m.set_adapter("default") if route == "peft" else pf.set_adapter(m, "default")),
    ):
        try:
            call()
        except Exception as e:  # noqa: BLE001
            steps.append(f"{label}: {type(e).__name__}")
    if kind == "lora":
        if route == "peft":
            out = m.unload()
        else:
            out = m
            from peft.tuners.tuners_utils import BaseTuner  # noqa: F401

            for n, mod in list(out.named_modules()):
                if isinstance(mod, BaseTunerLayer):
                    parent = out.get_submodule(n.rpartition(".")[0]) if "." in n else out
                    setattr(parent, n.rpartition(".")[2], mod.get_base_layer())
    elif route == "peft":
        out = m.unload()
    else:
        out = mmpreproj.unload(m)
    return before, out, steps


@case("unload after all of it")
def c_unload(fam, route):
    ref = fwd(fam, fam.build())
    before, out, steps = busy_then_unload(fam, route, "preproj")
    probs = compare_base(before, out, "base")
    try:
        same(fwd(fam, out), ref, "outputs vs the base", 0.0)
    except Fail as f:
        probs.append(str(f))
    if any(isinstance(x, BaseTunerLayer) for x in out.modules()):
        probs.append("tuner layers left")
    if probs and route == "peft":
        try:  # LoRA's own unload of the same sequence, judged the same way
            lb, lo, _ = busy_then_unload(fam, route, "lora")
            lprobs = compare_base(lb, lo, "base")
        except Exception as e:  # noqa: BLE001
            lprobs = [f"LoRA raised {emsg(e)}"]
        ours_req = [p for p in probs if "requires_grad" in p]
        lora_req = [p for p in lprobs if "requires_grad" in p]
        if ours_req and lora_req and len(probs) == len(ours_req):
            return f"as LoRA: {ours_req[0]} (LoRA's unload: {lora_req[0]})"
    if probs:
        raise Fail("; ".join(probs) + (f" [steps that raised: {steps}]" if steps else ""))
    return "state_dict, flags, types, outputs bit-equal" + (f" (steps that raised: {steps})" if steps else "")


# ---------------------------------------------------------------- more sequences (same expectations, other orders)

SMALL_B = partial(PreProjConfig, expansion=0.5, skip_rank=4)  # docs: an added adapter's sizes may differ


@case("b of another size (expansion=0.5, skip_rank=4): set_adapter, mixed, state dict")
def c_other_size(fam, route):
    s = two(fam, route, cfg_b=SMALL_B)
    out = []
    names = ["default", "b", "__base__"]
    refs = {"default": fwd(fam, s["a"]), "b": fwd(fam, s["b"]), "__base__": fwd(fam, s["base"])}
    try:
        got = fwd(fam, s["m"], adapter_names=names)
        probs = []
        for i, n in enumerate(names):
            for g, r in zip(got, refs[n]):
                if g.dim() and g.shape[0] == B:
                    try:
                        same([g[i]], [r[i]], f"mixed row {i} ({n})", ATOL)
                    except Fail as f:
                        probs.append(str(f))
        if probs:
            raise Fail("; ".join(probs[:2]))
        out.append("mixed rows ok")
    except Fail:
        raise
    except Exception as e:  # noqa: BLE001  mixed batches are checked on their own above; here the sizes matter
        out.append(f"mixed raised {type(e).__name__} (see the mixed case)")
    pf.set_adapter(s["m"], "b")
    out.append("set_adapter " + same(fwd(fam, s["m"]), refs["b"], "set_adapter outputs vs b alone", ATOL))
    sd = peft.get_peft_model_state_dict(s["m"], adapter_name="b")
    fresh = (
        mmpreproj.inject(fam.build(), SMALL_B()).eval()
        if route == "inplace"
        else peft.get_peft_model(fam.build(), SMALL_B()).eval()
    )
    peft.set_peft_model_state_dict(fresh, sd, adapter_name="default")
    out.append("state dict " + same(fwd(fam, fresh), refs["b"], "round trip vs b alone", 0.0))
    return "; ".join(out)


@case("state dict of the waiting adapter 'default' (b active) -> fresh")
def c_state_dict_waiting(fam, route):
    s = two(fam, route)
    pf.set_adapter(s["m"], "b")
    sd = peft.get_peft_model_state_dict(s["m"], adapter_name="default")
    fresh = fresh_route(fam, route)
    peft.set_peft_model_state_dict(fresh, sd, adapter_name="default")
    return "outputs " + same(fwd(fam, fresh), fwd(fam, s["a"]), "fresh vs default alone", 0.0)


@case("set_peft_model_state_dict(b's) into 'b' of a fresh two-adapter model, then set_adapter(b)")
def c_state_dict_into_b(fam, route):
    s = two(fam, route)
    sd = peft.get_peft_model_state_dict(s["m"], adapter_name="b")
    f = fresh_route(fam, route, seed=700)
    if route == "inplace":
        src = mmpreproj.inject(fam.build(), PreProjConfig())
        d = Path(tempfile.mkdtemp(dir=TMP))
        mmpreproj.save_adapter(src, d)
        mmpreproj.load_adapter(f, d, adapter_name="b")
    else:
        f.add_adapter("b", PreProjConfig())
    f.eval()
    before_default = {k: v.detach().clone() for k, v in aparams(f, "default").items()}
    res = peft.set_peft_model_state_dict(f, sd, adapter_name="b")
    moved = [k for k, v in aparams(f, "default").items() if not torch.equal(v, before_default[k])]
    if moved:
        raise Fail(f"loading into 'b' changed 'default' ({moved[0]})")
    if list(getattr(res, "unexpected_keys", []) or []):
        raise Fail(f"unexpected keys {list(res.unexpected_keys)[:2]}")
    pf.set_adapter(f, "b")
    return "outputs " + same(fwd(fam, f), fwd(fam, s["b"]), "fresh's b vs b alone", 0.0)


@case("delete 'default' while b is active (pf.delete_adapter)")
def c_delete_default(fam, route):
    def seq(ls, kind):
        pf.set_adapter(ls["m"], "b")
        ret = pf.delete_adapter(ls["m"], "default", prefix=PREFIX[kind])
        return ret, layer_active(ls["m"]), len(aparams(ls["m"], "default")), flag_pattern(ls["m"]).get("b")

    s = two(fam, route)
    try:
        ours = seq(s, "preproj")
    except Exception as e:  # noqa: BLE001
        return as_lora_or_fail(fam, route, e, lambda ls: seq(ls, "lora"))
    probs = []
    det = "?"
    try:
        det = same(fwd(fam, s["m"]), fwd(fam, s["b"]), "outputs vs b alone", ATOL)
    except Fail as f:
        probs.append(str(f))
    lr = lora_run(fam, route, lambda ls: seq(ls, "lora"))
    if lr[0] == "ok" and (lr[1][0], lr[1][1], lr[1][3]) != (ours[0], ours[1], ours[3]):
        probs.append(f"(ret, layers, b's flags) {ours[0], ours[1], ours[3]} vs LoRA {lr[1][0], lr[1][1], lr[1][3]}")
    if ours[2]:
        probs.append(f"{ours[2]} params of 'default' left")
    if probs:
        raise Fail("; ".join(probs))
    return f"outputs {det}; ret {ours[0]!r}" + ("; as LoRA" if lr[0] == "ok" else "")


@case("delete b, then add 'b' again (the same weights): set_adapter(b) = b alone")
def c_readd(fam, route):
    s = two(fam, route)
    sd = peft.get_peft_model_state_dict(s["m"], adapter_name="b")
    if route == "inplace":
        pf.delete_adapter(s["m"], "b", prefix="preproj")
        d = Path(tempfile.mkdtemp(dir=TMP))
        mmpreproj.save_adapter(s["b"], d)
        mmpreproj.load_adapter(s["m"], d, adapter_name="b")
    else:
        s["m"].delete_adapter("b")
        s["m"].add_adapter("b", PreProjConfig())
        peft.set_peft_model_state_dict(s["m"], sd, adapter_name="b")
    s["m"].eval()
    pf.set_adapter(s["m"], "b")
    return "outputs " + same(fwd(fam, s["m"]), fwd(fam, s["b"]), "re-added b vs b alone", ATOL)


@case("set_requires_grad([default, b], True) then ('default', False)")
def c_rg_list(fam, route):
    def seq(ls):
        pf.set_requires_grad(ls["m"], ["default", "b"], requires_grad=True)
        p1 = flag_pattern(ls["m"])
        pf.set_requires_grad(ls["m"], "default", requires_grad=False)
        return p1, flag_pattern(ls["m"])

    s = two(fam, route)
    try:
        ours = seq(s)
    except Exception as e:  # noqa: BLE001
        return as_lora_or_fail(fam, route, e, seq)
    lr = lora_run(fam, route, seq)
    want = ({"default": "T", "b": "T"}, {"default": "F", "b": "T"})
    got = tuple({k: p[k] for k in ("default", "b")} for p in ours)
    if got != want:
        raise Fail(f"flags {got}, expected {want}" + (f"; LoRA {lr[1]}" if lr[0] == "ok" else ""))
    if lr[0] == "ok" and tuple({k: p.get(k) for k in ("default", "b")} for p in lr[1]) != got:
        raise Fail(f"flags {got} vs LoRA {lr[1]}")
    if any(p.get("<base>") != "F" for p in ours):
        raise Fail(f"base flags changed: {ours}")
    return f"{got} as LoRA" if lr[0] == "ok" else str(got)


@case("mixed batch with b active [b, __base__, default], then a plain forward")
def c_mixed_b_active(fam, route):
    s = two(fam, route)
    pf.set_adapter(s["m"], "b") if route == "inplace" else s["m"].set_adapter("b")
    s["m"].eval()
    names = ["b", "__base__", "default"]
    try:
        got = fwd(fam, s["m"], adapter_names=names)
    except Exception as e:  # noqa: BLE001
        return f"raised {type(e).__name__} (judged in the mixed case)"
    refs = {"default": fwd(fam, s["a"]), "b": fwd(fam, s["b"]), "__base__": fwd(fam, s["base"])}
    probs = []
    for i, n in enumerate(names):
        for g, r in zip(got, refs[n]):
            if g.dim() and g.shape[0] == B:
                try:
                    same([g[i]], [r[i]], f"row {i} ({n})", ATOL)
                except Fail as f:
                    probs.append(str(f))
    try:
        same(fwd(fam, s["m"]), refs["b"], "plain forward after the mix vs b alone", ATOL)
    except Fail as f:
        probs.append(str(f))
    if probs:
        raise Fail("; ".join(probs[:3]))
    return "rows ok; the active b runs after"


@case("unload after deleting b (only 'default' left)")
def c_unload_after_delete(fam, route):
    m = fam.build().eval()
    before = base_record(m)
    ref = fwd(fam, m)
    if route == "inplace":
        mmpreproj.inject(m, PreProjConfig())
        src = mmpreproj.inject(fam.build(), PreProjConfig())
        d = Path(tempfile.mkdtemp(dir=TMP))
        mmpreproj.save_adapter(src, d)
        mmpreproj.load_adapter(m, d, adapter_name="b", is_trainable=True)
        pf.set_adapter(m, "b")
        pf.delete_adapter(m, "b", prefix="preproj")
        out = mmpreproj.unload(m)
    else:
        pm = peft.get_peft_model(m, PreProjConfig())
        pm.add_adapter("b", PreProjConfig())
        pm.set_adapter("b")
        pm.delete_adapter("b")
        out = pm.unload()
    probs = compare_base(before, out, "base")
    try:
        same(fwd(fam, out), ref, "outputs vs the base", 0.0)
    except Fail as f:
        probs.append(str(f))
    if probs and route == "peft" and all("requires_grad" in p for p in probs):
        return f"as LoRA? {probs[0]}"
    if probs:
        raise Fail("; ".join(probs))
    return "state_dict, flags, types, outputs bit-equal"


@case("delete the last adapter (pf.delete_adapter twice)")
def c_delete_last(fam, route):
    def seq(ls, kind):
        m = ls["m"]
        if route == "peft":
            m.delete_adapter("b")
            m.delete_adapter("default")
        else:
            pf.delete_adapter(m, "b", prefix=PREFIX[kind])
            pf.delete_adapter(m, "default", prefix=PREFIX[kind])

    s = two(fam, route)
    if route == "peft":
        s["m"].delete_adapter("b")
    else:
        pf.delete_adapter(s["m"], "b", prefix="preproj")
    before = snap(s["m"])
    try:
        if route == "peft":
            s["m"].delete_adapter("default")
        else:
            pf.delete_adapter(s["m"], "default", prefix="preproj")
    except Exception as e:  # noqa: BLE001
        ch = snap_diff(before, snap(s["m"]))
        lr = lora_run(fam, route, lambda ls: seq(ls, "lora"))
        if ch:
            raise Fail(f"refused but changed: {ch} | {emsg(e)}") from None
        if "default" not in str(e):
            raise Fail(f"refused without naming 'default' | {emsg(e)}") from None
        if lr[0] == "raised":
            return f"as LoRA (both refuse) | {emsg(e)}"
        raise Fail(
            "refused where LoRA deletes it (documented: limits.md 'delete_adapter of the last adapter is refused') "
            f"| {emsg(e)[:110]}"
        ) from None
    return "deleted, as LoRA"


@case("set_adapter(b, inference_mode=True): b active and frozen, as LoRA")
def c_set_adapter_inference(fam, route):
    def seq(ls):
        pf.set_adapter(ls["m"], "b", inference_mode=True)
        return flag_pattern(ls["m"]), layer_active(ls["m"])

    s = two(fam, route)
    try:
        ours = seq(s)
    except Exception as e:  # noqa: BLE001
        return as_lora_or_fail(fam, route, e, seq)
    det = same(fwd(fam, s["m"]), fwd(fam, s["b"]), "outputs vs b alone", ATOL)
    lr = lora_run(fam, route, seq)
    pick = lambda pat: {k: pat.get(k) for k in ("default", "b", "<base>")}  # noqa: E731
    if ours[1] != [("b",)]:
        raise Fail(f"layers report {ours[1]}")
    if lr[0] == "ok" and pick(lr[1][0]) != pick(ours[0]):
        raise Fail(f"flags {pick(ours[0])} vs LoRA {pick(lr[1][0])}")
    return f"outputs {det}; flags {pick(ours[0])}" + (" as LoRA" if lr[0] == "ok" else "")


@case("pm.set_requires_grad('b', True/False) (the PeftModel's own)")
def c_pm_rg(fam, route):
    if route != "peft":
        return None

    def seq(ls):
        ls["m"].set_requires_grad("b", requires_grad=True)
        p1 = flag_pattern(ls["m"])
        ls["m"].set_requires_grad("b", requires_grad=False)
        return p1, flag_pattern(ls["m"])

    s = two(fam, route)
    try:
        ours = seq(s)
    except Exception as e:  # noqa: BLE001
        return as_lora_or_fail(fam, route, e, seq)
    lr = lora_run(fam, route, seq)
    got = tuple({k: p.get(k) for k in ("default", "b", "<base>")} for p in ours)
    if got[0]["b"] != "T" or got[1]["b"] != "F":
        raise Fail(f"flags {got}")
    if lr[0] == "ok":
        lo = tuple({k: p.get(k) for k in ("default", "b", "<base>")} for p in lr[1])
        if lo != got:
            raise Fail(f"flags {got} vs LoRA {lo}")
    return f"{got[0]} then {got[1]}" + (" as LoRA" if lr[0] == "ok" else "")


@case("backward after set_adapter(b): gradients reach b alone, as LoRA")
def c_backward(fam, route):
    def seq(ls):
        m = ls["m"]
        pf.set_adapter(m, "b")
        args, kwargs = fam.inputs(B)
        torch.manual_seed(0)
        loss = sum(t.float().square().mean() for t in tensors(m(*args, **kwargs)))
        loss.backward()
        got = {}
        for n, p in m.named_parameters():
            k = adapter_of(n) or "<base>"
            has = p.grad is not None and bool(p.grad.abs().sum() > 0)
            got.setdefault(k, set()).add(has)
        return {k: ("mixed" if len(v) > 1 else ("grad" if True in v else "none")) for k, v in sorted(got.items())}

    s = two(fam, route)
    try:
        ours = seq(s)
    except Exception as e:  # noqa: BLE001
        return as_lora_or_fail(fam, route, e, seq)
    lr = lora_run(fam, route, seq)
    probs = []
    if ours.get("b") not in ("grad", "mixed") or ours.get("default") != "none" or ours.get("<base>") != "none":
        probs.append(f"gradients {ours}")
    if lr[0] == "ok" and {k: lr[1].get(k) for k in ("default", "<base>")} != {
        k: ours.get(k) for k in ("default", "<base>")
    }:
        probs.append(f"vs LoRA {lr[1]}")
    if probs:
        raise Fail("; ".join(probs))
    return f"{ours}" + (" as LoRA" if lr[0] == "ok" else "")


@case("peft status: get_model_status / get_layer_status after pm.set_adapter(b)")
def c_status(fam, route):
    if route != "peft":
        return None

    def seq(ls):
        ls["m"].set_adapter("b")
        st = ls["m"].get_model_status()
        layers_st = ls["m"].get_layer_status()
        return (
            st.active_adapters,
            sorted(st.available_adapters),
            {k: v for k, v in sorted(st.requires_grad.items())},
            sorted({tuple(x.active_adapters) for x in layers_st}),
        )

    s = two(fam, route)
    try:
        ours = seq(s)
    except Exception as e:  # noqa: BLE001
        return as_lora_or_fail(fam, route, e, seq)
    lr = lora_run(fam, route, seq)
    if ours[0] != ["b"] or ours[3] != [("b",)]:
        raise Fail(f"status active {ours[0]}, layers {ours[3]}")
    if lr[0] == "ok" and lr[1] != ours:
        raise Fail(f"status {ours} vs LoRA {lr[1]}")
    return f"active {ours[0]}, available {ours[1]}, requires_grad {ours[2]}" + (" as LoRA" if lr[0] == "ok" else "")


@case("mixed generate(adapter_names=[default, b, __base__]) = each row's own generate")
def c_generate(fam, route):
    args, kwargs = fam.inputs(B)
    if args or set(kwargs) - {"input_ids", "use_cache"} or not hasattr(fam.build(), "generate"):
        return None
    ids = kwargs["input_ids"]
    s = two(fam, route)
    gen = dict(max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0)

    def g(m, **kw):
        with torch.no_grad():
            return m.generate(input_ids=ids, **gen, **kw)

    try:
        got = g(s["m"], adapter_names=["default", "b", "__base__"])
    except Exception as e:  # noqa: BLE001
        if route == "inplace" and "/transformers/" not in traceback.extract_tb(e.__traceback__)[-1].filename:
            raise Fail(f"refused: {emsg(e)} at {where(e)}") from None
        return as_lora_or_fail(fam, route, e, lambda ls: g(ls["m"], adapter_names=["default", "b", "__base__"]))
    want = [g(s["a"])[0], g(s["b"])[1], g(s["base"])[2]]
    bad = [i for i in range(B) if not torch.equal(got[i], want[i])]
    if bad:
        raise Fail(
            f"rows {bad} differ from their own adapter's generate: {got[bad[0]].tolist()} vs {want[bad[0]].tolist()}"
        )
    return "3 rows = each adapter's / the base's tokens"


# ---------------------------------------------------------------- refusals with a bad state dict


def _bad_sd(fam, route):
    """b's state dict from a model whose adapter is another size (expansion=0.5, skip_rank=4)."""
    src = (
        mmpreproj.inject(fam.build(), SMALL_B()) if route == "inplace" else peft.get_peft_model(fam.build(), SMALL_B())
    )
    return peft.get_peft_model_state_dict(src, adapter_name="default")


def _bad_sd_lora(fam, route):
    m = fam.build()
    cfg = lora_cfg(m)
    cfg.r = 3
    src = peft.inject_adapter_in_model(cfg, m) if route == "inplace" else peft.get_peft_model(m, cfg)
    return peft.get_peft_model_state_dict(src, adapter_name="default")


def _refuse_sd(fam, route, name):
    sd = _bad_sd(fam, route)
    lsd = _bad_sd_lora(fam, route)
    return refusal(
        fam,
        route,
        lambda s: peft.set_peft_model_state_dict(s["m"], sd, adapter_name=name),
        ["size", "shape"],
        lambda ls: peft.set_peft_model_state_dict(ls["m"], lsd, adapter_name=name),
    )


@case("refused: set_peft_model_state_dict(a mis-sized adapter's tensors, 'b')")
def c_refuse_sd(fam, route):
    return _refuse_sd(fam, route, "b")


@case("refused: set_peft_model_state_dict(sd, adapter_name='nope')")
def c_refuse_sd_name(fam, route):
    s0 = two(fam, route)
    sd = peft.get_peft_model_state_dict(s0["m"], adapter_name="b")
    return refusal(fam, route, lambda s: peft.set_peft_model_state_dict(s["m"], sd, adapter_name="nope"), ["nope"])


# ---------------------------------------------------------------- refusals


def refusal(fam, route, call, words, lora_call=None):
    """`call(setup)` on our two-adapter model: refused cleanly, or a no-op where LoRA's is a no-op too."""
    s = two(fam, route)
    before = snap(s["m"])
    try:
        call(s)
    except Exception as e:  # noqa: BLE001
        probs = snap_diff(before, snap(s["m"]))
        msg = str(e)
        if isinstance(e, TypeError) and "unexpected keyword argument 'adapter_names'" in msg:
            lr = lora_run(fam, route, call)
            if lr[0] == "raised" and type(lr[1]) is TypeError and not probs:
                return f"as LoRA: the host's forward takes no adapter_names ({msg[:80]})"
        if words and not any(w.lower() in msg.lower() for w in words):
            probs.append(f"message names none of {words}")
        if "\n" in msg.strip():
            probs.append("message is not one line")
        if isinstance(e, (AttributeError, KeyError, IndexError, TypeError, AssertionError)) or "/torch/" in where(e):
            lr = lora_run(fam, route, lora_call or call) if lora_call is not False else ("nolora", "")
            if not (lr[0] == "raised" and type(lr[1]) is type(e)):
                probs.append(f"deep error at {where(e)}")
            else:
                msg = f"(as LoRA) {msg}"
        if probs:
            raise Fail("; ".join(probs) + f" | {emsg(e)}") from None
        return f"refused, unchanged | {type(e).__name__}: {msg[:140]}".replace("\n", " / ")
    ch = snap_diff(before, snap(s["m"]))
    if lora_call is False:
        raise Fail(f"NOT refused; changes: {ch or 'none'}")
    lr = lora_run(fam, route, lora_call or call)
    if lr[0] == "ok" and not ch:
        return "accepted as a no-op, as LoRA"
    lw = {
        "ok": "LoRA accepts it too",
        "raised": f"LoRA refuses: {emsg(lr[1])[:90]}" if lr[0] == "raised" else "",
        "nolora": "no LoRA ref",
    }[lr[0]]
    raise Fail(f"NOT refused; changes: {ch or 'none'} [{lw}]")


def fwd_names(fam, names):
    return lambda s: fwd(fam, s["m"], adapter_names=names)


def no_lora_in_place(r):
    """LoRA in place has no mixed batch (the kwarg never reaches its layers): no reference there, the docs are."""
    return False if r == "inplace" else None


REFUSALS_COMMON = [
    ("pf.set_adapter('nope')", lambda fam, r: lambda s: pf.set_adapter(s["m"], "nope"), ["nope"], None),
    (
        "pf.set_requires_grad('nope')",
        lambda fam, r: lambda s: pf.set_requires_grad(s["m"], "nope", requires_grad=True),
        ["nope"],
        None,
    ),
    (
        "forward(adapter_names=[default, nope, b])",
        lambda fam, r: fwd_names(fam, ["default", "nope", "b"]),
        ["nope"],
        no_lora_in_place,
    ),
    (
        "forward(adapter_names=[default, b]) for 3 rows",
        lambda fam, r: fwd_names(fam, ["default", "b"]),
        ["2", "3"],
        no_lora_in_place,
    ),
    (
        "get_peft_model_state_dict(adapter_name='nope')",
        lambda fam, r: lambda s: peft.get_peft_model_state_dict(s["m"], adapter_name="nope"),
        ["nope"],
        None,
    ),
]
REFUSALS_INPLACE = [
    (
        "pf.delete_adapter('nope')",
        lambda fam, r: lambda s: pf.delete_adapter(s["m"], "nope", prefix="preproj"),
        ["nope"],
        lambda s: pf.delete_adapter(s["m"], "nope", prefix="lora_"),
    ),
    ("mmpreproj.set_adapter('nope')", lambda fam, r: lambda s: mmpreproj.set_adapter(s["m"], "nope"), ["nope"], False),
    (
        "mmpreproj.delete_adapter('nope')",
        lambda fam, r: lambda s: mmpreproj.delete_adapter(s["m"], "nope"),
        ["nope"],
        False,
    ),
    (
        "mmpreproj.load_adapter(adapter_name='b') again",
        lambda fam, r: lambda s: mmpreproj.load_adapter(s["m"], s["dir_b"], adapter_name="b"),
        ["'b'", '"b"', " b "],
        False,
    ),
]
REFUSALS_PEFT = [
    ("pm.set_adapter('nope')", lambda fam, r: lambda s: s["m"].set_adapter("nope"), ["nope"], None),
    ("pm.delete_adapter('nope')", lambda fam, r: lambda s: s["m"].delete_adapter("nope"), ["nope"], None),
    (
        "pm.add_adapter('b') again",
        lambda fam, r: lambda s: s["m"].add_adapter("b", PreProjConfig()),
        ["'b'", '"b"', " b "],
        lambda s: s["m"].add_adapter("b", lora_cfg(s["m"].get_base_model())),
    ),
]


def refusal_cases():
    for label, mk, words, lora in REFUSALS_COMMON + REFUSALS_INPLACE + REFUSALS_PEFT:
        routes = (
            ("inplace",)
            if (label, mk, words, lora) in REFUSALS_INPLACE
            else ("peft",)
            if (label, mk, words, lora) in REFUSALS_PEFT
            else ("inplace", "peft")
        )

        def fn(fam, route, mk=mk, words=words, lora=lora, routes=routes):
            if route not in routes:
                return None
            return refusal(fam, route, mk(fam, route), words, lora(route) if lora is no_lora_in_place else lora)

        CASES.append((f"refused: {label}", fn))


refusal_cases()


# ================================================================= runner


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="run the cases whose line contains this substring")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    n = p = f = 0
    t0 = time.time()
    for fam in _families():
        for route in ("inplace", "peft"):
            for name, fn in CASES:
                label = f"{route} | {fam.name}: {name}"
                if args.only and args.only not in label:
                    continue
                if args.list:
                    print(label)
                    continue
                try:
                    detail = fn(fam, route)
                    if detail is None:
                        continue
                    status = "PASS"
                except Fail as e:
                    status, detail = "FAIL", str(e)
                except Exception as e:  # noqa: BLE001  a crash of the harness itself
                    status, detail = "FAIL", f"HARNESS CRASH {emsg(e)} at {where(e)}"
                n += 1
                p += status == "PASS"
                f += status == "FAIL"
                print(f"{status} | {label} | {detail}".replace("\n", " "), flush=True)
    if not args.list:
        print(f"TOTAL {n}: {p} PASS, {f} FAIL ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
