"""Change audit: the two behaviours added since 9d1ce17, tried on every route a user could take.

Run:  PYTHONPATH=. OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python bench/change_audit.py [--only S]

Written by an independent, adversarial audit from CHANGELOG.md's [Unreleased] section, docs/hosts.md,
docs/limits.md, docs/peft-guide.md and peft LoRA's behaviour under the same calls; the expectations are the
auditor's. Every model is tiny, random, built in code; nothing is downloaded. Areas:
  * join:   `PartSpec.skip_to` / `SkipJoin` on the pre-LN BERTs (XLMRobertaXL, MegatronBert, RobertaPreLayerNorm):
            the paper's `x + W_o attn_out + W_skip x~` against hooks written from the formula, by both routes;
            gradient checkpointing (reentrant and not) vs without; torch.compile; deepcopy + unload one copy;
            torch.save / pickle of the whole model; several adapters and switching; mixed batches in place and
            through peft; adapter_disabled; observe / routing_ratios; every loader; a file without `skip_to`
            (old placement); a bad `skip_to` in host={...} (refused, model unchanged); the inner attention called
            directly; an exception inside the forward, then a normal forward (no stale skip); delete the last.
  * delete: deleting the last adapter on GPT-NeoX, Llama and a timm ViT by every route (inject, get_peft_model,
            mmpreproj.load_adapter, transformers load_adapter, peft.functional), with and without
            modules_to_save: host alone, modules_to_save at base values and frozen, save refused, state dicts,
            trainable_report, mixed batches, adding/loading again, set_adapter, a training step, save again,
            unload; side by side with LoRA doing the same.
  * stack:  `preproj_lora`: LoRA switching / deleting its own adapters leaves ours active.
  * mixgc:  mixed-adapter batches in training mode (limits.md: they run there) under gradient checkpointing, on
            Llama by both routes (not the join; found while trying the join's routes).
One line per case: PASS/FAIL | area | case | details; then TOTAL. `bench/results/change_audit.txt` is its output.

Result on commit 715aabc (CPU, one thread, about 25 s wall): TOTAL 673: 648 PASS, 25 FAIL.
  * 6 library bug, new today: with our own modules_to_save, after the last adapter is deleted and another loaded
    but not set active, a mixed batch naming it (`adapter_names=["tr", ...]`) is not refused and runs its rows
    through the host's modules_to_save at the base's values (logits off by 1.4 to 2.7); the refusal in
    `PreProjAttention._mixed_batch` is skipped when no adapter is active (`self.values_aside and
    self.active_adapters`). limits.md: such a batch is refused while our modules_to_save train in place.
  * 8 library bug, older than today (same at 9d1ce17): a mixed-adapter batch in training mode under gradient
    checkpointing gives other gradients (reentrant: Llama, XLM-RoBERTa-XL; the other two BERTs happened to agree)
    or torch's CheckpointError (non-reentrant: every host tried), by both routes; by the look of it the
    recomputation in backward runs without the `adapter_names` the forward hooks handed over (not traced further).
    LoRA refuses mixed batches in training mode; ours accepts them and, reentrant, gives wrong gradients silently.
  * 8 minor: after deleting the last adapter with own modules_to_save, `mmpreproj.adapter_state_dict` returns the
    host's modules_to_save at base values as though an adapter held them (without modules_to_save: {}); the save
    calls and `set_adapter_state_dict` refuse with "no adapter is loaded", peft's `get_peft_model_state_dict`
    raises for LoRA and ours alike.
  * 3 docs: on the skip_to hosts `observe` hands the inner attention's output (before `W_o`) as attn_out, while
    its docstring says "the two terms it adds" and on every other host attn_out comes after the output projection:
    `routing_ratios` measures a different quantity on these three families; no page says so.
Everything else held: the join equals the paper's formula (difference 0) by both routes, in every loader, under
both checkpointing variants, torch.compile, deepcopy/pickle/torch.save, switching, mixed batches in eval,
adapter_disabled, exceptions and stray inner calls; an old file keeps the old placement; bad skip_to is refused
with the model unchanged. Deleting the last adapter matches LoRA's peft calls step for step (where LoRA's own
add_adapter with modules_to_save raises in peft 0.21, ours goes on), and a stacked preproj_lora keeps ours active.

Re-run after the fixes (bench/results/change_audit.txt; the first run: change_audit_before.txt): TOTAL 673: 664
PASS, 9 FAIL. Fixed: the mixed batch naming a waiting adapter after the last delete (refused), adapter_state_dict
after the last delete (refused), and a mixed batch under gradient checkpointing (refused at the call: the `mixgc`
cases accept that). Left: the three `observe` cases (docs/hosts.md and `observe`'s docstring now say `attn_out` is
the attention's output before `W_o` on the skip_to hosts) and the six `join` cases of a mixed batch under
checkpointing, which expect equality and get the refusal.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import logging
import os
import pickle
import sys
import tempfile
import traceback
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
from peft import LoraConfig, get_peft_model_state_dict, set_peft_model_state_dict  # noqa: E402

import mmpreproj  # noqa: E402
from mmpreproj import PreProjConfig  # noqa: E402
from mmpreproj.analysis.skip_norms import routing_ratios  # noqa: E402
from mmpreproj.hosts.example_input import example_input  # noqa: E402
from mmpreproj.method import trace_seams  # noqa: E402
from mmpreproj.method.layer import TUNER_PREFIX, PreProjAttention  # noqa: E402
from tests.helpers import zoo  # noqa: E402
from tests.helpers.trace_zoo import build  # noqa: E402

TMP = Path(tempfile.mkdtemp(prefix="change_audit_"))
RESULTS: list[tuple[str, str, str, str]] = []
ONLY = None


def record(ok, area, name, details=""):
    RESULTS.append(("PASS" if ok else "FAIL", area, name, details))
    print(f"{'PASS' if ok else 'FAIL'} | {area} | {name} | {details}", flush=True)


def case(area, name, fn):
    if ONLY and ONLY not in f"{area} {name}":
        return
    try:
        out = fn()
        ok, det = out if isinstance(out, tuple) else (bool(out), "")
        record(ok, area, name, det)
    except Exception as e:  # noqa: BLE001
        tb = traceback.extract_tb(e.__traceback__)[-1]
        record(False, area, name, f"{type(e).__name__}: {str(e)[:300]} (at {Path(tb.filename).name}:{tb.lineno})")


def tmp(tag):
    return Path(tempfile.mkdtemp(prefix=f"{tag}_", dir=TMP))


def diff(a, b):
    return (a.float() - b.float()).abs().max().item()


def refused(fn, *words):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        msg = str(e)
        ok = all(w.lower() in msg.lower() for w in words)
        return ok, f"{type(e).__name__}: {msg[:160]}"
    return False, "accepted"


def sd_equal(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    if sa.keys() != sb.keys():
        return False, f"keys differ: {sorted(set(sa) ^ set(sb))[:4]}"
    bad = [k for k in sa if not torch.equal(sa[k], sb[k])]
    return not bad, f"{len(bad)} tensors differ {bad[:3]}"


def perturb(model, seed=1, scale=0.05, names=None):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in mmpreproj.injected_modules(model):
            for n in names or w.adapter_names():
                for m in w.slots(n):
                    if m is not None:
                        for p in m.parameters():
                            p.copy_(torch.randn(p.shape, generator=gen) * scale)


# ================================================================ join: pre-LN BERTs

BERTS = [
    ("XLMRobertaXL", "XLMRobertaXLModel"),
    ("MegatronBert", "MegatronBertModel"),
    ("RobertaPreLayerNorm", "RobertaPreLayerNormModel"),
]
NODROP = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def layers_of(model):
    for m in model.modules():
        if hasattr(m, "layer") and isinstance(m.layer, torch.nn.ModuleList):
            return m.layer
    raise RuntimeError("no encoder.layer")


def hidden(model, inputs, **kw):
    with torch.no_grad():
        o = model(**inputs, **kw)
    return o.last_hidden_state if hasattr(o, "last_hidden_state") else o[0]


def paper_ref(base, slots_per_layer, old=False):
    """A copy of `base` computing x + W_o attn_out + W_skip x~ (old=True: x + W_o (attn_out + W_skip x~)) with
    the given (pre, skip) modules, by hooks written from the formula."""
    ref = copy.deepcopy(base)
    for layer, (pre, skip) in zip(layers_of(ref), slots_per_layer, strict=True):
        if pre is None and skip is None:  # a block without an adapter
            continue
        kept = {}

        def feed(module, args, kwargs, pre=pre, kept=kept):
            if args:
                kept["x"] = x = pre(args[0]) if pre is not None else args[0]
                return (x, *args[1:]), kwargs
            x = kwargs["hidden_states"]
            kept["x"] = kwargs["hidden_states"] = pre(x) if pre is not None else x
            return args, kwargs

        def join(module, args, out, skip=skip, kept=kept):
            s = skip(kept.pop("x"))
            return (out[0] + s, *out[1:]) if isinstance(out, tuple) else out + s

        layer.attention.self.register_forward_pre_hook(feed, with_kwargs=True)
        (layer.attention.self if old else layer.attention).register_forward_hook(join)
    return ref


def slots_of(model, name=None):
    return [w.slots(name) for w in mmpreproj.injected_modules(model)]


def join_cases(fam):
    cls, mcls = fam
    A = f"join[{cls}]"
    base = build(cls, mcls, **NODROP)
    x = example_input(base)
    base_out = hidden(base, x)
    torch.manual_seed(0)
    model = copy.deepcopy(base)
    mmpreproj.inject(model, PreProjConfig())
    perturb(model)
    trained = hidden(model, x)
    want = hidden(paper_ref(base, slots_of(model)), x)

    case(
        A,
        "inject: trace sets skip_to='attention'",
        lambda: ([p.get("skip_to") for p in trace_seams(base, **x)["parts"]] == ["attention"], ""),
    )
    case(
        A,
        "inject: output == paper formula (hooks)",
        lambda: (diff(trained, want) < 1e-6 and diff(trained, base_out) > 1e-3, f"max|d|={diff(trained, want):.2e}"),
    )

    def peft_route():
        pm = peft.get_peft_model(copy.deepcopy(base), PreProjConfig())
        perturb(pm)
        got = hidden(pm, x)
        w = hidden(paper_ref(base, slots_of(pm)), x)
        return diff(got, w) < 1e-6, f"max|d|={diff(got, w):.2e}"

    case(A, "get_peft_model: output == paper formula", peft_route)

    def disabled():
        with mmpreproj.adapter_disabled(model):
            d = hidden(model, x)
        after = hidden(model, x)
        return diff(d, base_out) == 0 and diff(after, trained) == 0, f"disabled-base {diff(d, base_out):.1e}"

    case(A, "adapter_disabled == base, then trained again", disabled)

    def exception_then_normal():
        res = []
        for where in ("attention.output.dense", "attention.output", "attention(post-hook,before join)"):
            lay = layers_of(model)[0]
            if where == "attention.output.dense":
                target = lay.attention.output.dense
            elif where == "attention.output":
                target = lay.attention.output
            else:
                target = None

            def boom(*a, **k):
                raise RuntimeError("boom")

            h = (
                target.register_forward_hook(boom)
                if target is not None
                else lay.attention.self.register_forward_hook(
                    lambda m, a, o: (_ for _ in ()).throw(RuntimeError("boom"))
                )
            )
            with contextlib.suppress(RuntimeError):
                hidden(model, x)
            h.remove()
            res.append(diff(hidden(model, x), trained))
        return max(res) == 0, f"max|d| after each exception {res}"

    case(A, "exception inside forward then normal forward: no stale skip", exception_then_normal)

    def inner_direct():
        lay = layers_of(model)[0]
        w = lay.attention.self
        h = torch.randn(x["input_ids"].shape + (w.adapter_width,))
        with torch.no_grad():
            w(h)  # the wrapped inner attention called alone: hands a skip nobody joins
        after = hidden(model, x)
        return diff(after, trained) == 0, f"|d|={diff(after, trained):.1e}"

    case(A, "inner attention called directly, then a normal forward == trained", inner_direct)

    def inner_direct_then_other_module():
        # the handed skip stays held until the next `attention` call: then the attention module is called on
        # its own (as a user reading one block would) and must be base attention + its own skip, not a stale one
        lay = layers_of(model)[0]
        w = lay.attention.self
        h = torch.randn(x["input_ids"].shape + (w.adapter_width,))
        ref_lay = layers_of(paper_ref(base, slots_of(model)))[0]
        with torch.no_grad():
            w(torch.randn_like(h))
            got = lay.attention(h)[0]
            exp = ref_lay.attention(h)[0]
        return diff(got, exp) < 1e-6, f"|d|={diff(got, exp):.1e}"

    case(A, "attention module called alone == formula (after a stray inner call)", inner_direct_then_other_module)

    def deep_unload():
        twin = copy.deepcopy(model)
        ok1 = diff(hidden(twin, x), trained) == 0
        mmpreproj.unload(twin)
        return (
            ok1 and diff(hidden(twin, x), base_out) == 0 and diff(hidden(model, x), trained) == 0,
            f"twin-unloaded vs base {diff(hidden(twin, x), base_out):.1e}, orig {diff(hidden(model, x), trained):.1e}",
        )

    case(A, "deepcopy, unload the copy: copy == base, original trained", deep_unload)

    def deep_unload_orig():
        m2 = copy.deepcopy(model)
        twin = copy.deepcopy(m2)
        mmpreproj.unload(m2)
        return diff(hidden(twin, x), trained) == 0 and diff(hidden(m2, x), base_out) == 0, ""

    case(A, "deepcopy, unload the original: copy still trained", deep_unload_orig)

    def torch_save():
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        m2 = torch.load(buf, weights_only=False)
        ok = diff(hidden(m2, x), trained) == 0
        mmpreproj.unload(m2)
        hooks = sum(len(lay.attention._forward_hooks) for lay in layers_of(m2))
        return ok and diff(hidden(m2, x), base_out) == 0 and hooks == 0 and diff(hidden(model, x), trained) == 0, (
            f"loaded==trained {ok}, hooks left after unload {hooks}"
        )

    case(A, "torch.save whole model / torch.load, then unload", torch_save)

    def pickled():
        m2 = pickle.loads(pickle.dumps(model))
        return diff(hidden(m2, x), trained) == 0, ""

    case(A, "pickle round trip of whole model", pickled)

    # several adapters, switching
    d_def = tmp("bert")
    mmpreproj.save_adapter(model, d_def)

    def several():
        m = copy.deepcopy(model)
        torch.manual_seed(3)
        mmpreproj.load_adapter(m, d_def, adapter_name="b")
        perturb(m, seed=5, names=["b"])
        mmpreproj.set_adapter(m, "b")
        got_b = hidden(m, x)
        want_b = hidden(paper_ref(base, slots_of(m, "b")), x)
        mmpreproj.set_adapter(m, "default")
        back = hidden(m, x)
        return diff(got_b, want_b) < 1e-6 and diff(back, trained) == 0 and diff(got_b, trained) > 1e-4, (
            f"b vs formula {diff(got_b, want_b):.1e}, back {diff(back, trained):.1e}"
        )

    case(A, "two adapters: set_adapter b == formula(b), back to default", several)

    x3 = dict(x)
    x3["input_ids"] = torch.randint(3, 90, (3, x["input_ids"].shape[1]), generator=torch.Generator().manual_seed(7))
    x3.pop("attention_mask", None)
    x3.pop("token_type_ids", None)

    def mixed_inplace():
        x = x3
        base_out = hidden(base, x)
        trained = hidden(model, x)
        m = copy.deepcopy(model)
        mmpreproj.load_adapter(m, d_def, adapter_name="b")
        perturb(m, seed=5, names=["b"])
        mmpreproj.set_adapter(m, "b")
        only_b = hidden(m, x)
        mmpreproj.set_adapter(m, "default")
        names = ["b", "__base__"] + ["default"] * (x["input_ids"].shape[0] - 2)
        got = hidden(m, x, adapter_names=names)
        d = [diff(got[0], only_b[0]), diff(got[1], base_out[1])] + [
            diff(got[i], trained[i]) for i in range(2, len(names))
        ]
        return max(d) < 1e-5, f"rows {[f'{v:.1e}' for v in d]}"

    if True:
        case(A, "mixed batch in place [b, __base__, default..] == per-adapter rows", mixed_inplace)

    def mixed_peft():
        x = x3
        base_out = hidden(base, x)
        pm = peft.get_peft_model(copy.deepcopy(base), PreProjConfig())
        perturb(pm)
        one = hidden(pm, x)
        pm.add_adapter("b", PreProjConfig())
        perturb(pm, seed=5, names=["b"])
        pm.set_adapter("b")
        only_b = hidden(pm, x)
        pm.set_adapter("default")
        n = x["input_ids"].shape[0]
        names = (["b", "__base__", "default"] * n)[:n]
        got = hidden(pm, x, adapter_names=names)
        refs = {"b": only_b, "__base__": base_out, "default": one}
        d = [diff(got[i], refs[nm][i]) for i, nm in enumerate(names)]
        return max(d) < 1e-5, f"rows {[f'{v:.1e}' for v in d]}"

    case(A, "mixed batch through peft == per-adapter rows", mixed_peft)

    def observe():
        seen = []
        hs = [w.observe(lambda w, a, s: seen.append((a, s))) for w in mmpreproj.injected_modules(model)]
        captured = {}
        lay = layers_of(model)[0]
        h2 = lay.attention.output.dense.register_forward_hook(lambda m, a, o: captured.setdefault("wo", o))
        hidden(model, x)
        h2.remove()
        for h in hs:
            h.remove()
        n = len(layers_of(model))
        # the two terms the block adds beside x: W_o attn_out (dense's output) and W_skip x~ (docs: "the two terms
        # it adds")
        a0 = seen[0][0]
        return len(seen) == n and diff(a0, captured["wo"]) < 1e-6, (
            f"{len(seen)} calls for {n} blocks; observed attn_out vs W_o attn_out: "
            f"max|d|={diff(a0, captured['wo']):.2e}"
        )

    case(A, "observe hands the two terms the block adds beside x (W_o attn_out, W_skip x~)", observe)

    def ratios():
        r = routing_ratios(model, [x])
        return len(r) == len(layers_of(model)) and all(v > 0 and v == v for v in r.values()), str(
            {k: round(v, 4) for k, v in r.items()}
        )

    case(A, "routing_ratios runs, one finite ratio per block", ratios)

    # gradient checkpointing
    def gc(reentrant):
        def run():
            res = {}
            for tag in ("plain", "gc"):
                m = copy.deepcopy(model)
                m.train()
                if tag == "gc":
                    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
                    m.enable_input_require_grads()
                o = m(**x).last_hidden_state
                loss = o.pow(2).mean()
                loss.backward()
                res[tag] = (loss.detach(), {n: p.grad for n, p in m.named_parameters() if p.requires_grad})
            lp, gp = res["plain"]
            lg, gg = res["gc"]
            missing = [n for n in gp if gg.get(n) is None or gp[n] is None]
            md = max(diff(gp[n], gg[n]) for n in gp if n not in missing) if len(missing) < len(gp) else float("nan")
            return (
                not missing and diff(lp, lg) < 1e-6 and md < 1e-6,
                f"loss d={diff(lp, lg):.1e}, grad max d={md:.1e}, {len(missing)}/{len(gp)} grads missing",
            )

        return run

    case(A, "gradient checkpointing use_reentrant=True == without", gc(True))
    case(A, "gradient checkpointing use_reentrant=False == without", gc(False))

    # loaders
    def loaders():
        out = {}
        m = copy.deepcopy(base)
        mmpreproj.load_adapter(m, d_def)
        out["mmpreproj.load_adapter"] = diff(hidden(m, x), trained)
        pm = peft.PeftModel.from_pretrained(copy.deepcopy(base), d_def)
        out["PeftModel.from_pretrained"] = diff(hidden(pm, x), trained)
        m = copy.deepcopy(base)
        m.load_adapter(str(d_def))
        out["transformers load_adapter"] = diff(hidden(m, x), trained)
        d2 = tmp("sp")
        mmpreproj.save_pretrained(model, d2)
        m = mmpreproj.from_pretrained(d2, model_cls=type(base))
        out["save_pretrained/from_pretrained"] = diff(hidden(m, x), trained)
        d3 = tmp("psp")
        pm.save_pretrained(d3)
        pm2 = peft.PeftModel.from_pretrained(copy.deepcopy(base), d3)
        out["peft save_pretrained -> from_pretrained"] = diff(hidden(pm2, x), trained)
        return max(out.values()) == 0, str({k: f"{v:.1e}" for k, v in out.items()})

    case(A, "every loader reproduces the trained output (with skip_to)", loaders)

    def old_file():
        d = tmp("old")
        mmpreproj.save_adapter(model, d)
        f = d / "adapter_config.json"
        cfg = json.loads(f.read_text())
        parts = cfg["injection"]["host_description"]["parts"]
        for p in parts:
            p.pop("skip_to", None)
        f.write_text(json.dumps(cfg))
        want_old = hidden(paper_ref(base, slots_of(model), old=True), x)
        out = {}
        m = copy.deepcopy(base)
        mmpreproj.load_adapter(m, d)
        out["mmpreproj.load_adapter"] = diff(hidden(m, x), want_old)
        pm = peft.PeftModel.from_pretrained(copy.deepcopy(base), d)
        out["PeftModel.from_pretrained"] = diff(hidden(pm, x), want_old)
        m = copy.deepcopy(base)
        m.load_adapter(str(d))
        out["transformers load_adapter"] = diff(hidden(m, x), want_old)
        old_dir[0] = d
        return max(out.values()) < 1e-6, str({k: f"{v:.1e}" for k, v in out.items()})

    old_dir = [None]
    case(A, "file without skip_to loads with the old placement (every loader)", old_file)

    def old_as_second():
        # one injection cannot hold both placements: a refusal naming the description, or the old placement
        m2 = copy.deepcopy(model)
        before = hidden(m2, x)
        try:
            mmpreproj.load_adapter(m2, old_dir[0], adapter_name="old")
        except Exception as e:  # noqa: BLE001
            same = diff(hidden(m2, x), before) == 0 and mmpreproj.adapter_names(m2) == ["default"]
            return same and "description" in str(e), f"refused ({type(e).__name__}), model unchanged={same}"
        mmpreproj.set_adapter(m2, "old")
        want_old = hidden(paper_ref(base, slots_of(model), old=True), x)
        return diff(hidden(m2, x), want_old) < 1e-6, f"accepted; vs old placement {diff(hidden(m2, x), want_old):.1e}"

    case(A, "file without skip_to as a 2nd adapter onto a skip_to injection: refused or old placement", old_as_second)

    def new_onto_old():
        m2 = copy.deepcopy(base)
        mmpreproj.load_adapter(m2, old_dir[0])
        before = hidden(m2, x)
        try:
            mmpreproj.load_adapter(m2, d_def, adapter_name="new")
        except Exception as e:  # noqa: BLE001
            same = diff(hidden(m2, x), before) == 0
            return same and "description" in str(e), f"refused ({type(e).__name__}), model unchanged={same}"
        mmpreproj.set_adapter(m2, "new")
        return diff(
            hidden(m2, x), trained
        ) < 1e-6, f"accepted; vs its trained output {diff(hidden(m2, x), trained):.1e}"

    case(A, "skip_to file as a 2nd adapter onto an old-placement injection: refused or as trained", new_onto_old)

    def bad_host():
        desc = trace_seams(base, **x)
        res = []
        for bad in ("intermediate", "attention.self", "attention.output", "nope", "attention.", 5, ""):
            d = copy.deepcopy(desc)
            d["parts"][0]["skip_to"] = bad
            m = copy.deepcopy(base)
            ok_ref, msg = refused(lambda m=m, d=d: mmpreproj.inject(m, PreProjConfig(), host=d), "skip_to")
            same, _ = sd_equal(m, base)
            hooks = sum(
                len(lay.attention._forward_hooks) + len(lay.attention._forward_pre_hooks) for lay in layers_of(m)
            )
            unchanged = same and hooks == 0 and not mmpreproj.is_injected(m) and diff(hidden(m, x), base_out) == 0
            res.append((bad, ok_ref, unchanged, msg[:70]))
        return all(r[1] and r[2] for r in res), "; ".join(
            f"{r[0]!r}: refused={r[1]} unchanged={r[2]}" for r in res if not (r[1] and r[2])
        ) or "all refused naming skip_to"

    case(A, "host={...} with a bad skip_to: refused naming skip_to, model unchanged", bad_host)

    def delete_last():
        m = copy.deepcopy(model)
        mmpreproj.delete_adapter(m, "default")
        alone = hidden(m, x)
        mmpreproj.load_adapter(m, d_def, adapter_name="again")
        mmpreproj.set_adapter(m, "again")
        again = hidden(m, x)
        return diff(alone, base_out) == 0 and diff(again, trained) == 0, (
            f"alone-base {diff(alone, base_out):.1e}, again-trained {diff(again, trained):.1e}"
        )

    case(A, "delete last: host alone; load again joins after attention", delete_last)

    def unload_clean():
        m = copy.deepcopy(model)
        mmpreproj.unload(m)
        hooks = sum(len(lay.attention._forward_hooks) + len(lay.attention._forward_pre_hooks) for lay in layers_of(m))
        same, det = sd_equal(m, base)
        return same and hooks == 0, f"{det}; hooks left {hooks}"

    case(A, "unload: base state_dict, no hooks left on attention", unload_clean)

    def one_layer():
        m = copy.deepcopy(base)
        mmpreproj.inject(m, PreProjConfig(layers=[1]))
        perturb(m)
        (w,) = mmpreproj.injected_modules(m)
        got = hidden(m, x)
        exp = hidden(paper_ref(base, [(None, None), w.slots()]), x)
        hooks0 = len(layers_of(m)[0].attention._forward_hooks)
        return diff(got, exp) < 1e-6 and hooks0 == 0, f"|d|={diff(got, exp):.1e}, hooks on block 0: {hooks0}"

    case(A, "layers=[1] only: block 1 joins after attention, block 0 untouched", one_layer)

    def stray_then_disabled():
        lay = layers_of(model)[0]
        w = lay.attention.self
        with torch.no_grad():
            w(torch.randn(x["input_ids"].shape + (w.adapter_width,)))
        with mmpreproj.adapter_disabled(model):
            d = hidden(model, x)
        return diff(d, base_out) == 0, f"|d|={diff(d, base_out):.1e}"

    case(A, "stray inner call, then adapter_disabled forward == base (no stale skip)", stray_then_disabled)

    def peft_gc_mixed_train(reentrant):
        res = {}
        for tag in ("plain", "gc"):
            pm = peft.get_peft_model(copy.deepcopy(base), PreProjConfig())
            perturb(pm)
            pm.add_adapter("b", PreProjConfig())
            perturb(pm, seed=5, names=["b"])
            pm.train()
            if tag == "gc":
                pm.base_model.model.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": reentrant}
                )
                pm.base_model.model.enable_input_require_grads()
            try:
                o = pm(**x3, adapter_names=["b", "default", "__base__"]).last_hidden_state
                o.pow(2).mean().backward()
            except Exception as e:  # noqa: BLE001
                return False, f"{tag}: {type(e).__name__}: {str(e)[:110]}"
            res[tag] = (o.detach(), {n: p.grad for n, p in pm.named_parameters() if p.requires_grad})
        (op, gp), (og, gg) = res["plain"], res["gc"]
        missing = [n for n in gp if gp[n] is None or gg.get(n) is None]
        md = max((diff(gp[n], gg[n]) for n in gp if n not in missing), default=float("nan"))
        return diff(op, og) < 1e-6 and not missing and md < 1e-6, (
            f"out d={diff(op, og):.1e}, grad max d={md:.1e}, missing {missing[:2]}"
        )

    for reentrant in (True, False):
        case(
            A,
            f"peft route, train mode, mixed batch + checkpointing use_reentrant={reentrant} == without",
            lambda reentrant=reentrant: peft_gc_mixed_train(reentrant),
        )
    return model, base, x, trained


def compile_case(model, base, x, trained):
    def run():
        torch._dynamo.reset()
        c = torch.compile(model)
        a = hidden(c, x)
        b = hidden(c, x)
        return diff(a, trained) < 1e-5 and diff(
            b, trained
        ) < 1e-5, f"|d| {diff(a, trained):.1e} / {diff(b, trained):.1e}"

    case("join[RobertaPreLayerNorm]", "torch.compile == eager (two calls)", run)

    def run_disabled():
        c = torch.compile(model)
        with mmpreproj.adapter_disabled(model):
            a = hidden(c, x)
        b = hidden(c, x)
        return diff(a, hidden(base, x)) < 1e-5 and diff(b, trained) < 1e-5, (
            f"disabled-base {diff(a, hidden(base, x)):.1e}, after {diff(b, trained):.1e}"
        )

    case("join[RobertaPreLayerNorm]", "torch.compile: adapter_disabled then enabled", run_disabled)


# ================================================================ delete the last adapter


def neox():
    return zoo.BUILDERS["gpt_neox"]()


def llama():
    return zoo.BUILDERS["llama"]()


def vit():
    from tests.test_host_timm import BUILDERS as TB

    return TB["vit"]().eval()


IDS = torch.randint(1, zoo.VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
IMG = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
HOSTS = {
    "neox": (neox, "lm_head", ["query_key_value"]),
    "llama": (llama, "lm_head", ["q_proj", "v_proj"]),
    "vit": (vit, "head", ["qkv"]),
}


def fwd(model, host, **kw):
    with torch.no_grad():
        if host == "vit":
            return model(IMG, **kw)
        return model(input_ids=IDS, **kw).logits


def loss_of(model, host):
    o = model(IMG) if host == "vit" else model(input_ids=IDS).logits
    return o.float().pow(2).mean()


def mts_params(model, name):
    return {
        n: p for n, p in model.named_parameters(remove_duplicate=False) if n.split(".")[0] == name or f".{name}." in n
    }


def perturb_mts(model, name):
    """Move the host's modules_to_save off the base (random, not uniform: a uniform shift after a LayerNorm, as in
    GPT-NeoX, moves every logit of a token alike and hides in the comparison)."""
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in mts_params(model, name).values():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)


def delete_cases(host, route, with_mts):
    make, mts_name, targets = HOSTS[host]
    A = f"delete[{host}/{route}{'/mts' if with_mts else ''}]"
    base = make()
    base_out = fwd(base, host)
    cfg = lambda: PreProjConfig(modules_to_save=[mts_name] if with_mts else None)  # noqa: E731
    # a trained adapter, saved
    torch.manual_seed(0)
    src = copy.deepcopy(base)
    mmpreproj.inject(src, cfg())
    perturb(src)
    if with_mts:
        perturb_mts(src, mts_name)
    trained = fwd(src, host)
    d_tr = tmp("tr")
    mmpreproj.save_adapter(src, d_tr)

    pm = None
    m = copy.deepcopy(base)
    if route == "inject":
        mmpreproj.inject(m, cfg())
    elif route == "peft":
        pm = peft.get_peft_model(m, cfg())
        m = pm.base_model.model
    elif route == "load":
        mmpreproj.load_adapter(m, d_tr, is_trainable=True)
    elif route == "tf_load":
        m.load_adapter(str(d_tr))
    elif route == "functional":
        mmpreproj.inject(m, cfg())
    perturb(m)
    if with_mts:
        perturb_mts(m, mts_name)

    def do_delete():
        if route == "peft":
            pm.delete_adapter("default")
        elif route == "functional":
            pf.delete_adapter(m, "default", prefix=TUNER_PREFIX, layer_cls=PreProjAttention)
        else:
            mmpreproj.delete_adapter(m, "default")

    if route == "functional" and with_mts:

        def functional_refused():
            before = copy.deepcopy(m)
            ok, msg = refused(do_delete, "last adapter")
            same, det = sd_equal(m, before)
            still = diff(fwd(m, host), fwd(before, host)) == 0
            return ok and same and still, f"{msg}; {det}"

        case(A, "peft.functional delete of last with own modules_to_save refused, unchanged", functional_refused)
        return
    if route == "tf_load":

        def tf_delete():
            # transformers' own delete_adapter (docs/peft-guide.md: transformers asks for peft >= 0.22 here): it
            # must refuse before changing anything; the model's delete then goes through mmpreproj.delete_adapter
            before = fwd(m, host)
            try:
                m.delete_adapter("default")
            except Exception as e:  # noqa: BLE001
                same = diff(fwd(m, host), before) == 0 and mmpreproj.adapter_names(m) == ["default"]
                return same, f"refused by transformers ({str(e)[:70]}); unchanged={same}"
            return mmpreproj.adapter_names(m) == [] and diff(fwd(m, host), base_out) == 0, "accepted"

        case(A, "transformers model.delete_adapter: refused unchanged (peft < 0.22) or host alone", tf_delete)
    try:
        if not (route == "tf_load" and mmpreproj.adapter_names(m) == []):
            do_delete()
    except Exception as e:  # noqa: BLE001
        record(False, A, "delete the last adapter", f"{type(e).__name__}: {str(e)[:300]}")
        return
    record(True, A, "delete the last adapter", "")

    case(
        A,
        "host runs alone (== base output)",
        lambda: (diff(fwd(m, host), base_out) == 0, f"|d|={diff(fwd(m, host), base_out):.1e}"),
    )
    if with_mts:

        def mts_back():
            bp = mts_params(base, mts_name)
            mp = mts_params(m, mts_name)
            same = all(torch.equal(mp[n], bp[n]) for n in bp if n in mp) and len(mp) == len(bp)
            frozen = not any(p.requires_grad for p in mp.values())
            return same and frozen, f"values base={same}, frozen={frozen}, n={len(mp)}/{len(bp)}"

        case(A, "modules_to_save back at base values and frozen", mts_back)
    case(
        A,
        "nothing trainable",
        lambda: (
            not any(p.requires_grad for p in m.parameters()),
            str([n for n, p in m.named_parameters() if p.requires_grad][:3]),
        ),
    )
    case(
        A,
        "mmpreproj.save_adapter refused: no adapter is loaded",
        lambda: refused(lambda: mmpreproj.save_adapter(m, tmp("s")), "no adapter"),
    )
    if pm is not None:

        def peft_save():
            d = tmp("ps")
            ok, msg = refused(lambda: pm.save_pretrained(d))  # LoRA here: KeyError 'default' (peft's own)
            left = [p.name for p in d.rglob("*") if p.is_file()]
            return ok and not left, f"{msg}; files {left}"

        case(A, "peft save_pretrained refused (as LoRA's), nothing written", peft_save)
        case(
            A,
            "get_peft_model_state_dict: refused or empty",
            lambda: _sd_empty_or_refused(lambda: get_peft_model_state_dict(pm)),
        )
    else:

        def inplace_save_pretrained():
            d = tmp("sp")
            ok, msg = refused(lambda: mmpreproj.save_pretrained(m, d), "no adapter")
            left = [p.name for p in d.rglob("*") if p.is_file()]
            return ok and not left, f"{msg}; files {left}"

        if host != "vit":  # a timm model has no save_pretrained of its own
            case(A, "mmpreproj.save_pretrained refused clearly, nothing written", inplace_save_pretrained)
        case(
            A,
            "adapter_state_dict after delete: refused or empty (no adapter left)",
            lambda: _sd_empty_or_refused(lambda: mmpreproj.adapter_state_dict(m)),
        )
        case(
            A,
            "set_adapter_state_dict after delete: refused (no adapter is loaded)",
            lambda: refused(lambda: mmpreproj.set_adapter_state_dict(m, {}), "no adapter"),
        )

    def report():
        r = mmpreproj.trainable_report(m)
        return r.trainable == 0 and (r.preproj + r.skip) == 0, str(r)[:200]

    case(A, "trainable_report: 0 adapter, 0 trainable", report)
    case(A, "adapter_names == [] / active_adapter refused or None", lambda: _names_after(m))
    if route != "peft":
        case(
            A,
            "mixed batch ['__base__']*B == base",
            lambda: (diff(fwd(m, host, adapter_names=["__base__"] * 2), base_out) == 0, ""),
        )
    case(A, "repr/print of the model works", lambda: (len(repr(m)) > 0, ""))

    def disabled_after():
        with mmpreproj.adapter_disabled(m):
            a = fwd(m, host)
        return diff(a, base_out) == 0 and diff(fwd(m, host), base_out) == 0, ""

    case(A, "adapter_disabled after delete: host alone", disabled_after)
    case(
        A,
        "routing_ratios after delete: refused (no skip)",
        lambda: refused(lambda: routing_ratios(m, [{"input_ids": IDS}] if host != "vit" else [{"x": IMG}]), "skip"),
    )
    case(
        A,
        "delete_adapter('default') again: refused naming it",
        lambda: refused(lambda: mmpreproj.delete_adapter(m, "default"), "default"),
    )
    case(
        A,
        "set_adapter('default') after delete: refused naming it",
        lambda: refused(lambda: mmpreproj.set_adapter(m, "default"), "default"),
    )

    # add / load again
    def again():
        if pm is not None:
            pm.add_adapter("again", cfg())
            pm.set_adapter("again")
            pm.load_adapter(str(d_tr), adapter_name="tr")
            pm.set_adapter("tr")
            got_tr = fwd(m, host)
            pm.set_adapter("again")
        else:
            mmpreproj.load_adapter(m, d_tr, adapter_name="tr")
            mmpreproj.set_adapter(m, "tr")
            got_tr = fwd(m, host)
            mmpreproj.load_adapter(m, d_tr, adapter_name="again", is_trainable=True)
            mmpreproj.set_adapter(m, "again")
        return diff(got_tr, trained) < 1e-6, f"loaded-again vs trained {diff(got_tr, trained):.1e}"

    ok_again = [False]

    def again_w():
        r = again()
        ok_again[0] = True
        return r

    case(A, "load again (adapter_name=tr), set_adapter: == trained output", again_w)
    if not ok_again[0]:
        return

    def mixed_after():
        if pm is not None:
            got = fwd(pm, host, adapter_names=["tr", "__base__"])
        else:
            got = fwd(m, host, adapter_names=["tr", "__base__"])
        return diff(got[1], base_out[1]) < 1e-5, f"base row {diff(got[1], base_out[1]):.1e}"

    if not with_mts:
        case(A, "mixed batch [tr, __base__] after re-add: base row == base", mixed_after)

    def train_step():
        model = pm if pm is not None else m
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        if not params:
            return False, "nothing trainable after re-add + set_adapter"
        before = fwd(model, host)
        loss = loss_of(model, host)
        loss.backward()
        nograd = [
            n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0)
        ]
        opt = torch.optim.SGD(params, lr=1.0)
        opt.step()
        model.eval()
        moved = diff(fwd(model, host), before)
        has_mts = any(mts_name in n for n in names)
        return not nograd and moved > 0 and (has_mts == with_mts), (
            f"{len(params)} trainable, mts trainable={has_mts}, no grad: {nograd[:3]}, moved {moved:.1e}"
        )

    case(A, "training step on the re-added adapter: grads flow, output moves", train_step)

    def save_again():
        d = tmp("sa")
        if pm is not None:
            pm.save_pretrained(d)
            sd = get_peft_model_state_dict(pm, adapter_name="again")
            set_peft_model_state_dict(pm, sd, adapter_name="again")
        else:
            mmpreproj.save_adapter(m, d)
        now = fwd(m, host)
        fresh = copy.deepcopy(base)
        sub = d / "again" if (d / "again").is_dir() else d
        mmpreproj.load_adapter(fresh, sub)
        return diff(fwd(fresh, host), now) < 1e-6, f"reloaded vs live {diff(fwd(fresh, host), now):.1e}"

    case(A, "save again after re-add, reload == live", save_again)

    def unload():
        mm = (pm.unload() if pm is not None else mmpreproj.unload(m)) or m
        wr = [mod for mod in mm.modules() if isinstance(mod, PreProjAttention)]
        if with_mts:  # trained values of modules_to_save may stay (as LoRA's unload keeps them): compare the rest
            sb = {k: v for k, v in base.state_dict().items() if not k.startswith(mts_name)}
            sm = {k: v for k, v in mm.state_dict().items() if not k.startswith(mts_name)}
            same = sb.keys() == sm.keys() and all(torch.equal(sb[k], sm[k]) for k in sb)
            det = ""
        else:
            same, det = sd_equal(mm, base)
        return same and not wr, f"{det} wrappers left {len(wr)}"

    case(A, "unload after delete + re-add + train: base restored", unload)


def mts_after_delete(host, route):
    """Own modules_to_save in place, the last adapter deleted, another loaded but not (yet) active: limits.md says a
    mixed batch naming any adapter but the active one is refused while our modules_to_save train in place (the host's
    module holds one adapter's values); with none active, it holds the base's. Then switching among re-added ones."""
    make, mts_name, _ = HOSTS[host]
    A = f"delete[{host}/{route}/mts]"
    base = make()
    base_out = fwd(base, host)
    cfg = lambda: PreProjConfig(modules_to_save=[mts_name])  # noqa: E731
    torch.manual_seed(0)
    src = copy.deepcopy(base)
    mmpreproj.inject(src, cfg())
    perturb(src)
    perturb_mts(src, mts_name)
    trained = fwd(src, host)
    d_tr = tmp("tr")
    mmpreproj.save_adapter(src, d_tr)

    def build_deleted():
        m = copy.deepcopy(base)
        pm = None
        if route == "peft":
            pm = peft.get_peft_model(m, cfg())
            m = pm.base_model.model
        else:
            mmpreproj.inject(m, cfg())
        perturb(m)
        perturb_mts(m, mts_name)
        (pm.delete_adapter if pm is not None else lambda n: mmpreproj.delete_adapter(m, n))("default")
        if pm is not None:
            pm.load_adapter(str(d_tr), adapter_name="tr")
        else:
            mmpreproj.load_adapter(m, d_tr, adapter_name="tr")
        return m, pm

    def mixed_inactive():
        m, pm = build_deleted()
        active = list(mmpreproj.injected_modules(m)[0].active_adapters)
        try:
            got = fwd(m, host, adapter_names=["tr", "tr"])
        except Exception as e:  # noqa: BLE001
            return "modules_to_save" in str(e), f"refused: {str(e)[:120]}"
        return diff(got, trained) < 1e-5, (
            f"active={active}; rows of 'tr' vs tr's own output max|d|={diff(got, trained):.2e} "
            f"(host {mts_name} holds the base's values: {diff(got, base_out) >= 0})"
        )

    case(A, "after delete + load 'tr' (not active): mixed batch [tr, tr] refused or == tr's output", mixed_inactive)

    def mixed_base_rows():
        m, pm = build_deleted()
        got = fwd(m, host, adapter_names=["__base__", "__base__"])
        return diff(got, base_out) == 0, f"|d|={diff(got, base_out):.1e}"

    case(A, "after delete + load 'tr' (not active): mixed batch of __base__ rows == base", mixed_base_rows)

    def switch_readded():
        m, pm = build_deleted()
        sw = pm.set_adapter if pm is not None else (lambda n: mmpreproj.set_adapter(m, n))
        if pm is not None:
            pm.add_adapter("a", cfg())
        else:
            mmpreproj.load_adapter(m, d_tr, adapter_name="a", is_trainable=True)
            with torch.no_grad():  # make 'a' its own: every adapter weight of it, and its modules_to_save
                pass
        sw("a")
        a_mts = {n: p.detach().clone() for n, p in mts_params(m, mts_name).items()}
        a_out = fwd(m, host)
        sw("tr")
        tr_out = fwd(m, host)
        sw("a")
        a2 = fwd(m, host)
        same_mts = all(torch.equal(p, a_mts[n]) for n, p in mts_params(m, mts_name).items())
        fresh_at_base = pm is None or all(
            torch.equal(a_mts[n], p) for n, p in mts_params(base, mts_name).items() if n in a_mts
        )
        return diff(tr_out, trained) == 0 and diff(a2, a_out) == 0 and same_mts and fresh_at_base, (
            f"tr {diff(tr_out, trained):.1e}, a back {diff(a2, a_out):.1e}, a's mts kept {same_mts}, "
            f"a fresh mts at base {fresh_at_base}"
        )

    case(A, "after delete: re-added a / tr switch back and forth, each keeps its own values", switch_readded)


def mixed_gc_cases():
    """limits.md: mixed-adapter batches also run in training mode (LoRA refuses them there). Under gradient
    checkpointing the block is recomputed in backward: the gradients must equal those without it, or the call must
    be refused. Llama (no skip_to: this is not the join), both routes, both transformers variants."""
    base = zoo.BUILDERS["llama"]()
    ids = torch.randint(1, zoo.VOCAB, (3, 7), generator=torch.Generator().manual_seed(1))

    def run(route, gc, reentrant):
        torch.manual_seed(0)
        if route == "peft":
            model = peft.get_peft_model(copy.deepcopy(base), PreProjConfig())
            inner = model.base_model.model
            perturb(model)
            model.add_adapter("b", PreProjConfig())
        else:
            model = copy.deepcopy(base)
            mmpreproj.inject(model, PreProjConfig())
            inner = model
            perturb(model)
            d = tmp("mg")
            mmpreproj.save_adapter(model, d)
            mmpreproj.load_adapter(model, d, adapter_name="b")
        perturb(model, seed=5, names=["b"])
        model.train()
        if gc:
            inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
            inner.enable_input_require_grads()
        o = model(input_ids=ids, adapter_names=["b", "default", "__base__"]).logits
        o.float().pow(2).mean().backward()
        return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}

    for route in ("inject", "peft"):
        for reentrant in (True, False):

            def check(route=route, reentrant=reentrant):
                a = run(route, False, reentrant)
                try:
                    b = run(route, True, reentrant)
                except Exception as e:  # noqa: BLE001
                    refused_ok = "adapter_names" in str(e) or "mixed" in str(e)
                    return refused_ok, f"{type(e).__name__}: {str(e)[:110]}"
                missing = [n for n in a if a[n] is None or b.get(n) is None]
                md = max((diff(a[n], b[n]) for n in a if n not in missing), default=float("nan"))
                return not missing and md < 1e-5, f"grad max|d| with vs without checkpointing {md:.2e}"

            case(
                f"mixgc[llama/{route}]",
                f"train-mode mixed batch, checkpointing use_reentrant={reentrant}: grads == without, or refused",
                check,
            )


def _sd_empty_or_refused(fn):
    try:
        sd = fn()
    except Exception as e:  # noqa: BLE001
        return True, f"refused: {type(e).__name__}: {str(e)[:100]}"
    return len(sd) == 0, f"returned {len(sd)} tensors {list(sd)[:2]}"


def _names_after(m):
    names = mmpreproj.adapter_names(m)
    try:
        a = mmpreproj.active_adapter(m)
        return names == [] and a is None, f"names={names}, active={a!r}"
    except Exception as e:  # noqa: BLE001
        return names == [], f"names={names}, active refused: {type(e).__name__}: {str(e)[:80]}"


def lora_side_by_side(host, with_mts):
    """The same sequence on peft with LoRA and with ours: the observable outcomes should agree."""
    make, mts_name, targets = HOSTS[host]
    A = f"vsLoRA[{host}{'/mts' if with_mts else ''}]"
    base = make()
    base_out = fwd(base, host)
    outcomes = {}
    for kind in ("lora", "ours"):
        mk = (
            (lambda: LoraConfig(target_modules=targets, modules_to_save=[mts_name] if with_mts else None))
            if kind == "lora"
            else (lambda: PreProjConfig(modules_to_save=[mts_name] if with_mts else None))
        )
        pm = peft.get_peft_model(copy.deepcopy(base), mk())
        o = {}

        def step(key, fn, o=o):
            try:
                o[key] = fn()
            except Exception as e:  # noqa: BLE001
                o[key] = f"raises {type(e).__name__}"

        step("delete_adapter('default')", lambda pm=pm: pm.delete_adapter("default") or "ok")
        step("active_adapters", lambda pm=pm: list(pm.active_adapters))
        step("peft_config", lambda pm=pm: sorted(pm.peft_config))
        step("base model == base", lambda pm=pm: diff(fwd(pm.base_model.model, host), base_out) == 0)
        step("n_trainable", lambda pm=pm: sum(p.requires_grad for p in pm.parameters()))
        step("peft forward", lambda pm=pm: fwd(pm, host).shape == base_out.shape)
        step("add_adapter('n')", lambda pm=pm, mk=mk: pm.add_adapter("n", mk()) or list(pm.active_adapters))
        step("set_adapter('n')", lambda pm=pm: pm.set_adapter("n") or list(pm.active_adapters))
        step("n trains", lambda pm=pm: sum(p.requires_grad for p in pm.parameters()) > 0)
        step("mts trains", lambda pm=pm: any(mts_name in n and p.requires_grad for n, p in pm.named_parameters()))
        step("forward after set", lambda pm=pm: fwd(pm, host).shape == base_out.shape)
        outcomes[kind] = o
    broke = None  # the first step where LoRA's own call raised: later steps have no LoRA reference
    for key in outcomes["lora"]:
        a, b = outcomes["lora"][key], outcomes["ours"][key]
        lora_raised = isinstance(a, str) and a.startswith("raises")
        ours_raised = isinstance(b, str) and b.startswith("raises")
        if broke is None and lora_raised and not ours_raised:
            broke = key
        ok = a == b or (broke is not None and not ours_raised)
        note = f" (no LoRA reference: LoRA's own {broke} raised, peft's ModulesToSaveWrapper)" if a != b and ok else ""
        record(ok, A, f"same as LoRA: {key}", f"lora={a!r} ours={b!r}{note}")


# ================================================================ stacked preproj_lora


def stack_cases():
    from mmpreproj.train import apply_method

    A = "stack[llama]"
    base = zoo.BUILDERS["llama"]()
    pm = apply_method(copy.deepcopy(base), "preproj_lora")
    ours = mmpreproj.injected_modules(pm)
    ours_names = {tuple(w.active_adapters) for w in ours}
    perturb(pm)
    before = fwd(pm, "llama")
    lcfg = copy.deepcopy(pm.peft_config["default"])

    def state():
        return {tuple(w.active_adapters) for w in ours}, all(
            w.slots()[0] is not None or w.slots()[1] is not None for w in ours
        )

    def lora_add_switch():
        pm.add_adapter("l2", copy.deepcopy(lcfg))
        pm.set_adapter("l2")
        s = state()
        return s[0] == ours_names and s[1], f"ours active {s[0]} (was {ours_names})"

    case(A, "LoRA add_adapter + set_adapter('l2'): ours stays active", lora_add_switch)

    def functional_set():
        pf.set_adapter(pm.base_model.model, "l2")
        s1 = state()
        pf.set_adapter(pm.base_model.model, ["default"])
        s2 = state()
        return s1[0] == ours_names and s2[0] == ours_names, f"{s1[0]} / {s2[0]}"

    case(A, "peft.functional.set_adapter with LoRA names: ours unchanged", functional_set)

    def lora_back():
        pm.set_adapter("default")
        return diff(fwd(pm, "llama"), before) == 0, f"|d|={diff(fwd(pm, 'llama'), before):.1e}"

    case(A, "back to LoRA default: output as before", lora_back)

    def lora_delete():
        pm.delete_adapter("l2")
        s = state()
        return s[0] == ours_names and diff(fwd(pm, "llama"), before) == 0, f"ours {s[0]}"

    case(A, "LoRA delete_adapter('l2'): ours unchanged, output as before", lora_delete)

    def lora_delete_last():
        p2 = apply_method(copy.deepcopy(base), "preproj_lora")
        o2 = mmpreproj.injected_modules(p2)
        names = {tuple(w.active_adapters) for w in o2}
        lora_names = [n for n, c in p2.peft_config.items() if isinstance(c, LoraConfig)]
        for n in lora_names:
            p2.base_model.delete_adapter(n) if hasattr(p2.base_model, "delete_adapter") else p2.delete_adapter(n)
        from peft.tuners.lora import LoraLayer

        now = {tuple(w.active_adapters) for w in o2}
        slots = all(any(s is not None for s in w.slots()) for w in o2)
        lora_left = {n for mod in p2.modules() if isinstance(mod, LoraLayer) for n in mod.lora_A}
        return now == names and slots and not lora_left, (
            f"LoRA {lora_names} deleted (left in LoRA layers: {lora_left}); ours {now} (was {names}), slots={slots}"
        )

    case(A, "LoRA deletes its last adapter: ours stays active", lora_delete_last)

    def set_empty():
        p2 = apply_method(copy.deepcopy(base), "preproj_lora")
        o2 = mmpreproj.injected_modules(p2)
        names = {tuple(w.active_adapters) for w in o2}
        from peft.tuners.lora import LoraLayer

        pf.set_adapter(p2.base_model.model, [], layer_cls=LoraLayer)
        now = {tuple(w.active_adapters) for w in o2}
        return now == names, f"ours {now} (was {names})"

    case(A, "peft.functional.set_adapter([], layer_cls=LoraLayer): ours unchanged", set_empty)


def main():
    global ONLY
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=None)
    ONLY = ap.parse_args().only
    keep = None
    for fam in BERTS:
        r = join_cases(fam)
        if fam[0] == "RobertaPreLayerNorm":
            keep = r
    if keep is not None and (not ONLY or "compile" in ONLY or "join" in ONLY):
        compile_case(*keep)
    for host in HOSTS:
        for route in ("inject", "peft", "load", "tf_load", "functional"):
            if host == "vit" and route == "tf_load":
                continue
            for with_mts in (False, True):
                if ONLY and ONLY not in f"delete[{host}/{route}{'/mts' if with_mts else ''}]":
                    continue
                try:
                    delete_cases(host, route, with_mts)
                except Exception as e:  # noqa: BLE001
                    record(False, f"delete[{host}/{route}]", "setup", f"{type(e).__name__}: {str(e)[:300]}")
        for route in ("inject", "peft"):
            if ONLY and ONLY not in f"delete[{host}/{route}/mts]":
                continue
            try:
                mts_after_delete(host, route)
            except Exception as e:  # noqa: BLE001
                record(False, f"delete[{host}/{route}/mts]", "setup (mts after delete)", f"{type(e).__name__}: {e}")
        for with_mts in (False, True):
            if ONLY and ONLY not in f"vsLoRA[{host}":
                continue
            try:
                lora_side_by_side(host, with_mts)
            except Exception as e:  # noqa: BLE001
                record(False, f"vsLoRA[{host}]", "setup", f"{type(e).__name__}: {str(e)[:300]}")
    if not ONLY or "mixgc" in ONLY:
        mixed_gc_cases()
    if not ONLY or "stack" in ONLY:
        try:
            stack_cases()
        except Exception as e:  # noqa: BLE001
            record(False, "stack", "setup", f"{type(e).__name__}: {str(e)[:300]}")
    n = len(RESULTS)
    p = sum(r[0] == "PASS" for r in RESULTS)
    print(f"TOTAL {n}: {p} PASS, {n - p} FAIL")


if __name__ == "__main__":
    main()
