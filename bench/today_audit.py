"""Today's audit: the five behaviour changes of 49119f9..HEAD, tried adversarially on the routes a user takes.

Run:  PYTHONPATH=. OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python bench/today_audit.py [--only S]

Written by an independent, adversarial audit from CHANGELOG.md's [Unreleased] section (its top five entries),
docs/peft-guide.md, docs/limits.md and peft LoRA's behaviour under the same calls; the expectations are the
auditor's. Every model is tiny, random, built in code (tests/helpers/zoo.py) or a shipped fixture; nothing is
downloaded. `--area NAME` (repeatable) runs one area, `--only S` the cases whose "area name" contains S. Areas:
  * disable:  our modules_to_save under peft's disable_adapter() and mmpreproj.adapter_disabled: base inside, trained
              after; nested (both kinds); an exception inside; save_pretrained / get_peft_model_state_dict /
              save_adapter / state_dict / torch.save / deepcopy / unload / merge_and_unload inside (LoRA beside);
              set/delete/add inside; mixed batch inside; an embedding, a norm, a head, bf16; inject route; after the
              last delete; load_adapter(is_trainable=False); tied embeddings; generate inside; stacked preproj_lora
              (legacy fixture); TRL-like policy + reference (no_grad, checkpointing, with grad) against gradients
              without the reference.
  * generate: mixed adapter_names in generate on GPT-NeoX, Llama, T5 (bare and CAUSAL_LM / SEQ_2_SEQ_LM task
              classes), Whisper (beams), BART (not a host); name counts 1/4/8 under beams against LoRA's; greedy,
              beams=2, beams=2 + num_return_sequences=2, sampling with num_return_sequences (one name per returned
              row), "__base__" rows; each row == that row generated alone, and accepted/refused as LoRA's names
              are; group beam search; Qwen2-VL tiny with beams.
  * config:   for_budget (layers negative / dict, host row, threshold named by the refusal, fraction=1, PeftModel
              wrapped, Qwen2-VL with two widths); from_dict's refusals; every legacy fixture by the loaders;
              estimate's per-part layers.
  * warn:     base_model_type warning by every loader (other type warns once naming both, same type silent),
              AutoPeftModelForCausalLM, whole-model folders, Qwen2-VL -> Qwen2.5-VL, timm, edited records.
  * analysis: plot paths, plot_skip_norms at block indices, routing_ratios masks, stats refusals, analyze with a
              missing run, --no-progress bars restored (also after an exception), train --skip-rank before torch.
One line per case: PASS/FAIL | area | case | details; then TOTAL. Notes in parentheses on a PASS: "(control)"
LoRA alone, "(documented: ...)", "(not a host)", "(both refuse, as LoRA)" - counted as PASS.

Result on commit defb1f9 (CPU, one thread, about 15 s wall): TOTAL 152: 142 PASS, 10 FAIL
(bench/results/today_audit_before.txt).
  * 6 library bug, change 1 (disable with our modules_to_save), found by it:
    - nested disables (peft's disable_adapter() around adapter_disabled, or adapter_disabled twice): leaving the
      inner block puts the trained modules_to_save back while the outer block still keeps the wrappers off, so
      the rest of the outer block runs a mix (logits 1.0 off the base, 1.4 off the trained model). LoRA's nested
      disable stays at the base.
    - peft's save_pretrained and get_peft_model_state_dict inside the block save / return the base's values for
      our modules_to_save of the active adapter (mmpreproj.save_adapter and mmpreproj.save_pretrained save the
      trained ones); LoRA saves its trained copy. model.state_dict() inside shows the base's values too (LoRA
      keeps both). Silent: a checkpoint written inside (a callback, an exception handler) loses the head.
      (3 cases: save_pretrained, get_peft_model_state_dict, its per-adapter variant.)
    - PeftModel.set_adapter("b") inside the block is refused, but peft has already set pm.active_adapter = "b"
      while ours stays on "a" (the changelog: "refused (nothing changes)").
  * 2 behaviour differs from LoRA (library, minor): model.state_dict() inside (above, counted there as one case);
    a reference forward under disable WITH grad adds the reference's gradient to our lm_head (it is trained in
    place and holds the base's values then); LoRA's original module is frozen, so its grads are unchanged. TRL
    computes the reference under no_grad, where ours is exact.
  * 1 docs: mmpreproj.adapter_disabled on a stacked preproj_lora model turns ours off but leaves LoRA on (peft's
    disable_adapter() turns both off); its docstring says "the injected modules", no page says what happens to
    the LoRA of a stacked model.
  * 1 library bug, change 5: plot_skip_norms({"a": []}, path) writes a figure: the changelog says every plot
    function refuses an empty series before writing (only an empty mapping {} is refused).
Everything else held: generate's mixed batches equal the rows alone and are accepted/refused exactly as LoRA's on
every family and setting tried (T5 sampling with num_return_sequences is refused by both), Qwen2-VL's vision
refusal is documented and the language part works under beams, for_budget sizes the selected blocks within
2 d L, from_dict refuses the words, every legacy fixture loads bit-exact, every loader warns once (and never on
the same type, timm, or an edited base_model_type of 3 / "" / list / null), and the analysis/CLI refusals hold.

Run again after the fixes (bench/results/today_audit.txt, 14 s): TOTAL 152: 148 PASS, 4 FAIL. Nested disables stay
off until the outer block ends; peft's state dict and saves inside the block hold the trained `modules_to_save`
values; a switch / delete / add inside is no longer refused but trades the values where they wait (this harness
still expects the former refusal: 1 FAIL); `plot_skip_norms` refuses an empty series. The other 3 are now written
in docs/limits.md: `model.state_dict()` inside the block holds the base's values of our in-place modules, a
reference forward with gradients on adds its gradient to them, and `adapter_disabled` leaves a `preproj_lora`
model's LoRA on.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import logging
import os
import subprocess
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
logging.disable(logging.WARNING)

import peft  # noqa: E402
import torch  # noqa: E402
import transformers as tf  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict  # noqa: E402

import mmpreproj  # noqa: E402
from mmpreproj import PreProjConfig  # noqa: E402
from tests.helpers import zoo  # noqa: E402

TMP = Path(tempfile.mkdtemp(prefix="today_audit_"))
RESULTS: list[tuple[str, str, str, str]] = []
ONLY = None
IDS = zoo.tokens(2, 7)[0]


def record(ok, area, name, details=""):
    RESULTS.append(("PASS" if ok else "FAIL", area, name, details))
    print(f"{'PASS' if ok else 'FAIL'} | {area} | {name} | {details}", flush=True)


def case(area, name, fn):
    if ONLY and ONLY not in f"{area} {name}":
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = fn()
        ok, det = out if isinstance(out, tuple) else (bool(out), "")
        record(ok, area, name, det)
    except Exception as e:  # noqa: BLE001
        tb = traceback.extract_tb(e.__traceback__)[-1]
        record(False, area, name, f"{type(e).__name__}: {str(e)[:240]} (at {Path(tb.filename).name}:{tb.lineno})")


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


def out(m, ids=None, **kw):
    with torch.no_grad():
        return m(input_ids=IDS if ids is None else ids, **kw).logits


def perturb_trainable(model, seed=1, scale=0.05):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen).to(p.dtype) * scale)


def neox(seed=0, dtype=None):
    m = zoo.tiny_neox(seed=seed)
    return m.to(dtype) if dtype else m


def peft_ours(mts=("lm_head",), seed=0, dtype=None, names=("default",), build=neox):
    base = build(seed=seed, dtype=dtype) if build is neox else build(seed=seed)
    ref = copy.deepcopy(base)
    cfg = lambda: PreProjConfig(modules_to_save=list(mts) if mts else None)  # noqa: E731
    pm = get_peft_model(base, cfg(), adapter_name=names[0])
    for n in names[1:]:
        pm.add_adapter(n, cfg())
    for i, n in enumerate(names):
        pm.set_adapter(n)
        perturb_trainable(pm, seed=10 + i)
    pm.set_adapter(names[0])
    return pm, ref


def peft_lora(mts=("lm_head",), seed=0):
    base = neox(seed=seed)
    ref = copy.deepcopy(base)
    pm = get_peft_model(
        base, LoraConfig(target_modules=["query_key_value"], init_lora_weights=False, modules_to_save=list(mts), r=4)
    )
    perturb_trainable(pm, seed=10)
    return pm, ref


def param(m, suffix):
    for n, p in m.named_parameters():
        if n.endswith(suffix) and "original_module" not in n:
            return n, p
    raise KeyError(suffix)


def head_snapshot(pm):
    return {n: p.detach().clone() for n, p in pm.named_parameters() if "lm_head" in n}


def same_snapshot(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ================================================================ 1. disable with our modules_to_save


def area_disable():
    A = "disable"

    def basic():
        pm, ref = peft_ours()
        trained, snap = out(pm), head_snapshot(pm)
        with pm.disable_adapter():
            d = diff(out(pm), out(ref))
        back = diff(out(pm), trained)
        return d == 0 and back == 0 and same_snapshot(snap, head_snapshot(pm)), f"disabled-base {d:.2g}, after {back}"

    case(A, "peft disable_adapter(): base inside, trained after", basic)

    def ours_ctx():
        pm, ref = peft_ours()
        trained = out(pm)
        with mmpreproj.adapter_disabled(pm):
            d = diff(out(pm), out(ref))
        return d == 0 and diff(out(pm), trained) == 0, f"inside vs base {d:.2g}"

    case(A, "mmpreproj.adapter_disabled on PeftModel", ours_ctx)

    def nested():
        pm, ref = peft_ours()
        trained, base = out(pm), out(ref)
        with pm.disable_adapter():
            with mmpreproj.adapter_disabled(pm):
                a = out(pm)
            mid = out(pm)
        after = out(pm)
        # inside the outer block after the inner one: either all off (base) or all on (trained), never a mix
        consistent = diff(mid, base) == 0 or diff(mid, trained) == 0
        return diff(a, base) == 0 and consistent and diff(after, trained) == 0, (
            f"inner-base {diff(a, base):.2g}; mid-base {diff(mid, base):.2g} mid-trained {diff(mid, trained):.2g}; "
            f"after-trained {diff(after, trained):.2g}"
        )

    case(A, "nested disable (ours inside peft's): inner base, outer consistent, trained after", nested)

    def nested_same():
        pm, ref = peft_ours()
        trained, base = out(pm), out(ref)
        with mmpreproj.adapter_disabled(pm):
            with mmpreproj.adapter_disabled(pm):
                pass
            mid = out(pm)
        after = out(pm)
        ok = (diff(mid, base) == 0 or diff(mid, trained) == 0) and diff(after, trained) == 0
        return ok, f"mid-base {diff(mid, base):.2g} mid-trained {diff(mid, trained):.2g} after {diff(after, trained)}"

    case(A, "nested adapter_disabled twice: consistent inside, trained after", nested_same)

    def lora_nested():
        pm, ref = peft_lora()
        trained, base = out(pm), out(ref)
        with pm.disable_adapter():
            with pm.disable_adapter():
                pass
            mid = out(pm)
        return True, f"(control) LoRA mid-base {diff(mid, base):.2g} mid-trained {diff(mid, trained):.2g}"

    case(A, "control: LoRA nested disable", lora_nested)

    def exc():
        pm, ref = peft_ours()
        trained, snap = out(pm), head_snapshot(pm)
        with contextlib.suppress(RuntimeError), pm.disable_adapter():
            out(pm)
            raise RuntimeError("boom")
        ok1 = diff(out(pm), trained) == 0 and same_snapshot(snap, head_snapshot(pm))
        with contextlib.suppress(RuntimeError), mmpreproj.adapter_disabled(pm):
            raise RuntimeError("boom")
        return ok1 and diff(out(pm), trained) == 0, f"after exception {diff(out(pm), trained)}"

    case(A, "exception inside the with block: trained values back", exc)

    def saved_head(fn, lora=False):
        pm, ref = peft_lora() if lora else peft_ours()
        _, p = param(pm, "lm_head.modules_to_save.default.weight" if lora else "lm_head.weight")
        trained_w = p.detach().clone()
        with pm.disable_adapter():
            sd = {k: v.detach().clone() for k, v in fn(pm).items()}  # live references otherwise
        keys = [k for k in sd if "lm_head" in k and k.endswith("weight")]
        if not keys:
            return False, f"no embed_out weight saved: {list(sd)[:3]}"
        w = sd[keys[0]]
        base_w = ref.lm_head.weight
        return torch.equal(w, trained_w), (
            f"{keys[0]}: ==trained {torch.equal(w, trained_w)}, ==base {torch.equal(w, base_w)}"
        )

    def via_save_pretrained(pm):
        d = tmp("sp")
        pm.save_pretrained(d)
        from safetensors.torch import load_file

        return load_file(str(d / "adapter_model.safetensors"))

    def via_save_adapter(pm):
        d = tmp("sa")
        mmpreproj.save_adapter(pm, d)
        from safetensors.torch import load_file

        return load_file(str(d / "adapter_model.safetensors"))

    case(
        A,
        "control: LoRA save_pretrained inside disable saves the trained head",
        lambda: saved_head(via_save_pretrained, lora=True),
    )
    case(A, "save_pretrained inside disable saves the trained head (as LoRA)", lambda: saved_head(via_save_pretrained))
    case(
        A,
        "get_peft_model_state_dict inside disable gives the trained head (as LoRA)",
        lambda: saved_head(get_peft_model_state_dict),
    )
    case(A, "mmpreproj.save_adapter inside disable saves the trained head", lambda: saved_head(via_save_adapter))

    def whole_save_inside():
        base = neox()
        ref = copy.deepcopy(base)
        m0 = mmpreproj.inject(base, PreProjConfig(modules_to_save=["lm_head"]))
        perturb_trainable(m0, 3)
        trained = out(m0)
        f = tmp("whole_in")
        with mmpreproj.adapter_disabled(m0):
            mmpreproj.save_pretrained(m0, f)
        m = mmpreproj.from_pretrained(f)
        d = diff(out(m), trained)
        return d < 1e-6, f"reloaded whole folder vs trained {d:.2g} (vs base {diff(out(m), out(ref)):.2g})"

    case(
        A,
        "inject + mmpreproj.save_pretrained (whole model) inside adapter_disabled, reloaded: trained",
        whole_save_inside,
    )

    def other_adapter_inside():
        pm, ref = peft_ours(names=("a", "b"))
        pm.set_adapter("b")

        def sd(name):
            return {k: v.detach().clone() for k, v in get_peft_model_state_dict(pm, adapter_name=name).items()}

        want = sd("b")
        pm.set_adapter("a")
        with pm.disable_adapter():
            got, got_a = sd("b"), sd("a")
        want_a = sd("a")
        bad = [k for k in want if not torch.equal(want[k], got[k])]
        bad_a = [k for k in want_a if not torch.equal(want_a[k], got_a[k])]
        return not bad and not bad_a, f"waiting b differs {bad[:2]}; active a differs {bad_a[:2]}"

    case(A, "get_peft_model_state_dict of each adapter inside disable == outside", other_adapter_inside)

    def after_refused_switch():
        pm, ref = peft_ours(names=("a", "b"))
        with pm.disable_adapter(), contextlib.suppress(Exception):
            pm.set_adapter("b")
        pm.set_adapter("a")
        ta = out(pm)
        pm.set_adapter("b")
        tb = out(pm)
        return diff(ta, tb) > 0, f"a vs b after the refused switch {diff(ta, tb):.2g}"

    case(A, "after a refused set_adapter inside, set_adapter a / b outside still switch", after_refused_switch)

    def state_dict_inside():
        pm, ref = peft_ours()
        with pm.disable_adapter():
            sd = {k: v.clone() for k, v in pm.state_dict().items()}
        sd_after = pm.state_dict()
        bad = [k for k in sd if not torch.equal(sd[k], sd_after[k])]
        return not bad, f"{len(bad)} entries differ inside vs outside: {bad[:2]} (LoRA: none differ)"

    case(A, "model.state_dict() inside disable == outside (LoRA keeps the trained copy)", state_dict_inside)

    def torch_save_inside():
        pm, ref = peft_ours()
        trained = out(pm)
        buf = io.BytesIO()
        with pm.disable_adapter():
            torch.save(pm, buf)
        buf.seek(0)
        m2 = torch.load(buf, weights_only=False)
        with contextlib.suppress(Exception):
            m2.base_model.enable_adapter_layers()
        d = diff(out(m2), trained)
        return d == 0, f"reloaded copy, enable_adapter_layers: vs trained {d:.2g} (LoRA's: 0)"

    case(A, "torch.save inside disable, loaded, enable_adapter_layers: runs trained (as LoRA)", torch_save_inside)

    def deepcopy_inside():
        pm, ref = peft_ours()
        trained, base = out(pm), out(ref)
        with pm.disable_adapter():
            c = copy.deepcopy(pm)
            inside = out(c)
        after_c = out(c)
        return diff(after_c, trained) == 0 or diff(after_c, base) == 0 and diff(inside, base) == 0, (
            f"copy inside-base {diff(inside, base):.2g}; copy after: -trained {diff(after_c, trained):.2g} "
            f"-base {diff(after_c, base):.2g}"
        )

    case(A, "deepcopy inside disable: the copy runs either base or trained, never a mix", deepcopy_inside)

    def deepcopy_then_enable():
        pm, ref = peft_ours()
        trained = out(pm)
        lora, _ = peft_lora()
        lt = out(lora)
        with lora.disable_adapter():
            lc = copy.deepcopy(lora)
        lc.base_model.enable_adapter_layers()
        with pm.disable_adapter():
            c = copy.deepcopy(pm)
        with contextlib.suppress(Exception):
            c.base_model.enable_adapter_layers()
        return diff(out(c), trained) == 0, (
            f"copy re-enabled vs trained {diff(out(c), trained):.2g} (LoRA copy re-enabled: {diff(out(lc), lt):.2g})"
        )

    case(A, "deepcopy inside, enable_adapter_layers on the copy: trained (as LoRA)", deepcopy_then_enable)

    def unload_inside(merge):
        pm, ref = peft_ours()
        outside = copy.deepcopy(pm)
        try:
            want = out(outside.merge_and_unload() if merge else outside.unload())
        except Exception as e:  # noqa: BLE001
            with pm.disable_adapter():
                r = refused(lambda: pm.merge_and_unload() if merge else pm.unload())
            return r[0], f"(documented refusal outside too) {str(e)[:60]}; inside: {r[1][:60]}"
        try:
            with pm.disable_adapter():
                m = pm.merge_and_unload() if merge else pm.unload()
        except Exception as e:  # noqa: BLE001
            return True, f"refused: {type(e).__name__}: {str(e)[:120]}"
        d = diff(out(m), want)
        return d == 0, f"unloaded inside vs outside {d:.2g}"

    case(A, "unload() inside disable: refused or == unload outside", lambda: unload_inside(False))
    case(A, "merge_and_unload() inside disable: refused or == outside", lambda: unload_inside(True))

    def switch_inside():
        pm, ref = peft_ours(names=("a", "b"))
        trained = out(pm)
        msgs = []
        with pm.disable_adapter():
            for f in (
                lambda: pm.set_adapter("b"),
                lambda: pm.delete_adapter("b"),
                lambda: pm.add_adapter("c", PreProjConfig(modules_to_save=["lm_head"])),
            ):
                ok, m = refused(f)
                msgs.append(ok)
        d = diff(out(pm), trained)
        ok = all(msgs) and d == 0 and pm.active_adapter == "a" and "c" not in pm.peft_config
        return ok, f"refused {msgs}; after vs trained {d:.2g}; active {pm.active_adapter}; cfgs {list(pm.peft_config)}"

    case(A, "set/delete/add inside disable refused, nothing changes", switch_inside)

    def mixed_inside():
        pm, ref = peft_ours(names=("a", "b"))
        base = out(ref)
        with pm.disable_adapter():
            try:
                o = out(pm, adapter_names=["a", "b"])
            except Exception as e:  # noqa: BLE001
                return True, f"refused: {str(e)[:100]}"
        return diff(o, base) == 0, f"mixed rows inside disable vs base {diff(o, base):.2g} (LoRA: base rows)"

    case(A, "mixed batch adapter_names inside disable: base rows (as LoRA) or refused", mixed_inside)

    def mts_kind(mts, bf16=False):
        pm, ref = peft_ours(mts=mts, dtype=torch.bfloat16 if bf16 else None)
        trained = out(pm)
        with pm.disable_adapter():
            d = diff(out(pm), out(ref))
        return d == 0 and diff(out(pm), trained) == 0 and diff(trained, out(ref)) > 0, f"inside-base {d:.2g}"

    for mts in (
        ["gpt_neox.embed_in"],
        ["gpt_neox.final_layer_norm"],
        ["lm_head", "gpt_neox.final_layer_norm", "gpt_neox.embed_in"],
    ):
        case(A, f"modules_to_save={mts}: base inside, trained after", lambda mts=mts: mts_kind(mts))
    case(A, "bf16 model: base inside, trained after", lambda: mts_kind(["lm_head"], bf16=True))

    def tied():
        base = zoo.tiny_neox(tie_word_embeddings=True)
        ref = copy.deepcopy(base)
        pm = get_peft_model(base, PreProjConfig(modules_to_save=["lm_head"]))
        perturb_trainable(pm, 4)
        trained = out(pm)
        with pm.disable_adapter():
            d = diff(out(pm), out(ref))
        back = diff(out(pm), trained)
        return d == 0 and back == 0, f"tied embeddings: inside-base {d:.2g}, after-trained {back:.2g}"

    case(A, "tied lm_head/embed_in as modules_to_save: base inside, trained after", tied)

    def gen_inside():
        pm, ref = peft_ours()
        ids = zoo.tokens(2, 5, seed=3)[0]
        kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=5, num_beams=2)
        with torch.no_grad():
            want = ref.generate(input_ids=ids, **kw)
            with pm.disable_adapter():
                got = pm.generate(input_ids=ids, **kw)
            after = pm.generate(input_ids=ids, **kw)
        return torch.equal(got, want) and not torch.equal(
            after, want
        ), f"inside == base generate {torch.equal(got, want)}"

    case(A, "generate (beams) inside disable == the base's generate", gen_inside)

    def inject_route():
        base = neox()
        ref = copy.deepcopy(base)
        m = mmpreproj.inject(base, PreProjConfig(modules_to_save=["lm_head"]))
        perturb_trainable(m, 3)
        trained = out(m)
        with mmpreproj.adapter_disabled(m):
            d = diff(out(m), out(ref))
        return d == 0 and diff(out(m), trained) == 0, f"inside-base {d:.2g}"

    case(A, "inject route + adapter_disabled", inject_route)

    def stacked(ctx):
        import safetensors.torch as st

        sys.path.insert(0, str(ROOT / "tests/fixtures/legacy_adapters"))
        import make_fixtures

        folder = ROOT / "tests/fixtures/legacy_adapters/preproj_lora_run"
        want = st.load_file(str(folder / "logits.safetensors"))["logits"]
        ids = torch.tensor(make_fixtures.INPUT_IDS)
        base = make_fixtures.tiny_base()
        ref = copy.deepcopy(base)
        m = mmpreproj.load_adapter(base, folder)
        with torch.no_grad(), m.disable_adapter() if ctx == "peft" else mmpreproj.adapter_disabled(m):
            inside = m(ids).logits
        with torch.no_grad():
            d_in, d_after = diff(inside, ref(ids).logits), diff(m(ids).logits, want)
        return d_in == 0 and d_after < 1e-5, f"inside vs base {d_in:.2g}, after vs stored {d_after:.2g}"

    case(A, "preproj_lora (stacked, loaded) under peft disable_adapter: base inside", lambda: stacked("peft"))
    case(A, "preproj_lora (stacked, loaded) under adapter_disabled: base inside", lambda: stacked("ours"))

    def after_delete_last():
        base = neox()
        ref = copy.deepcopy(base)
        m = mmpreproj.inject(base, PreProjConfig(modules_to_save=["lm_head"]))
        perturb_trainable(m, 3)
        mmpreproj.delete_adapter(m, "default")
        with mmpreproj.adapter_disabled(m):
            a = out(m)
        return diff(a, out(ref)) == 0 and diff(out(m), out(ref)) == 0, f"inside-base {diff(a, out(ref)):.2g}"

    case(A, "after deleting the last adapter: adapter_disabled runs, base in and out", after_delete_last)

    def loaded_frozen():
        pm, ref = peft_ours()
        d = tmp("lf")
        pm.save_pretrained(d)
        trained = out(pm)
        base = neox()
        m = mmpreproj.load_adapter(base, d, is_trainable=False)
        with mmpreproj.adapter_disabled(m):
            a = out(m)
        return diff(a, out(ref)) == 0 and diff(out(m), trained) == 0, f"inside-base {diff(a, out(ref)):.2g}"

    case(A, "load_adapter(is_trainable=False) then adapter_disabled", loaded_frozen)

    def trl_like(gc, ref_grad=False):
        def step(with_ref):
            pm, ref = peft_ours()
            pm.train()
            if gc:
                pm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            pol = pm(input_ids=IDS).logits.log_softmax(-1)
            ctx = contextlib.nullcontext() if ref_grad else torch.no_grad()
            if with_ref:
                with ctx, pm.disable_adapter():
                    r = pm(input_ids=IDS).logits.log_softmax(-1)
                loss = (pol - r.detach()).mean() if not ref_grad else (pol - r).mean()
            else:
                loss = pol.mean()
            loss.backward()
            return {n: p.grad.clone() for n, p in pm.named_parameters() if p.grad is not None}

        g0, g1 = step(False), step(True)
        bad = [k for k in g0 if k not in g1 or diff(g0[k], g1[k]) > 1e-5]
        return not bad, f"{len(g0)} grads, {len(bad)} differ {bad[:2]}"

    case(
        A,
        "TRL-like: policy, reference under disable (no_grad), backward: grads == without reference",
        lambda: trl_like(False),
    )
    case(A, "TRL-like under gradient checkpointing: grads == without reference", lambda: trl_like(True))
    case(
        A,
        "TRL-like, reference with grad (not detached): grads == without (LoRA: ==, frozen original)",
        lambda: trl_like(False, True),
    )


# ================================================================ 2. generate, mixed batches


def t5(seed=0):
    torch.manual_seed(seed)
    cfg = tf.T5Config(
        vocab_size=97,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    return tf.T5ForConditionalGeneration(cfg).eval()


def bart(seed=0):
    torch.manual_seed(seed)
    cfg = tf.BartConfig(
        vocab_size=97,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    return tf.BartForConditionalGeneration(cfg).eval()


def two_adapters(base_fn, lora=False, task_type=None):
    base = base_fn()
    if lora:

        def mk():
            return LoraConfig(r=4, target_modules="all-linear", task_type=task_type, init_lora_weights=False)
    else:

        def mk():
            return PreProjConfig(task_type=task_type) if task_type else PreProjConfig()

    pm = get_peft_model(base, mk(), adapter_name="a")
    pm.add_adapter("b", mk())
    for i, n in enumerate(("a", "b")):
        pm.set_adapter(n)
        perturb_trainable(pm, seed=20 + i, scale=0.3)
    pm.set_adapter("a")
    pm.eval()
    return pm


def gen(pm, ids, **kw):
    torch.manual_seed(0)
    with torch.no_grad():
        return pm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, **kw)


def rows_alone(pm, ids, names, per, **kw):
    """each row generated alone with its adapter set (per: returned rows per prompt)."""
    outs = []
    for i in range(ids.shape[0]):
        n = names[i * per] if len(names) == ids.shape[0] * per else names[i]
        if n == "__base__":
            with pm.disable_adapter():
                o = gen(pm, ids[i : i + 1], **kw)
        else:
            pm.set_adapter(n)
            o = gen(pm, ids[i : i + 1], **kw)
        outs.append(o)
    pm.set_adapter("a")
    return outs


def row_eq(g, a, pads=(0, 1, 2)):
    """a batched row equals the row generated alone, the batched one padded after the alone one stopped."""
    g, a = g.reshape(-1), a.reshape(-1)
    if g.numel() < a.numel():
        return False
    return torch.equal(g[: a.numel()], a) and all(int(t) in pads for t in g[a.numel() :])


def area_generate():
    A = "generate"
    dec_ids = zoo.tokens(2, 5, seed=3)[0]
    enc_ids = torch.randint(3, 90, (2, 6), generator=torch.Generator().manual_seed(4))
    models = [
        ("neox", lambda: zoo.tiny_neox(), dec_ids, "CAUSAL_LM"),
        ("llama", lambda: zoo.BUILDERS["llama"](), dec_ids, "CAUSAL_LM"),
        ("t5", t5, enc_ids, "SEQ_2_SEQ_LM"),
        ("bart", bart, enc_ids, "SEQ_2_SEQ_LM"),
    ]
    settings = [
        ("beam2", dict(num_beams=2), 1),
        ("beam2_nrs2", dict(num_beams=2, num_return_sequences=2), 2),
        ("greedy", {}, 1),
    ]
    for fam, fn, ids, tt in models:
        for use_tt in (None, tt):
            try:
                pm = two_adapters(fn, task_type=use_tt)
                lm = two_adapters(fn, lora=True, task_type=use_tt)
            except Exception as e:  # noqa: BLE001
                ok = "cannot inject" in str(e)
                record(ok, A, f"{fam} build task_type={use_tt}", f"(not a host: refused) {str(e)[:120]}")
                continue
            for sname, kw, per in settings:
                for names in (["a", "b"], ["b", "__base__"]):

                    def run(pm=pm, lm=lm, kw=kw, names=names, ids=ids, per=per):
                        ours = gen(pm, ids, adapter_names=names, **kw)
                        try:
                            gen(lm, ids, adapter_names=names, **kw)
                            lora_ok = True
                        except Exception:  # noqa: BLE001
                            lora_ok = False
                        alone = rows_alone(pm, ids, names, 1, **kw)
                        got = [ours[i * per : (i + 1) * per] for i in range(ids.shape[0])]
                        same = all(
                            g.shape[0] == a.shape[0] and all(row_eq(g[j], a[j]) for j in range(g.shape[0]))
                            for g, a in zip(got, alone)
                        )
                        return same and lora_ok, f"rows==alone {same}; LoRA accepts {lora_ok}"

                    case(A, f"{fam} tt={use_tt} {sname} names={names}: rows == alone, LoRA agrees", run)

            # sampling with num_return_sequences: one name per returned row, as LoRA
            def sampling(pm=pm, lm=lm, ids=ids):
                names4 = ["a", "a", "b", "b"]
                kw = dict(do_sample=True, num_return_sequences=2, top_k=1)
                res = {}
                for tag, m in (("ours", pm), ("lora", lm)):
                    for n in (["a", "b"], names4):
                        try:
                            gen(m, ids, adapter_names=n, **kw)
                            res[(tag, len(n))] = "ok"
                        except Exception:  # noqa: BLE001
                            res[(tag, len(n))] = "refused"
                agree = all(res[("ours", k)] == res[("lora", k)] for k in (2, 4))
                o = gen(pm, ids, adapter_names=names4, **kw) if res[("ours", 4)] == "ok" else None
                alone = rows_alone(pm, ids, ["a", "b"], 1, **dict(do_sample=False))
                if res[("ours", 4)] == res[("lora", 4)] == "refused":
                    return agree, f"(both refuse, as LoRA) {res}"
                rowsok = o is not None and all(row_eq(o[2 * i], alone[i][0]) for i in range(2))
                return agree and rowsok, f"{res}; top_k=1 rows==greedy alone {rowsok}"

            case(A, f"{fam} tt={use_tt} sample nrs=2: one name per returned row, as LoRA", sampling)

            def parity(pm=pm, lm=lm, ids=ids):
                res = {}
                for kw in (dict(num_beams=2, num_return_sequences=2), dict(num_beams=2)):
                    for names in (["a", "a", "b", "b"], ["a", "b", "a", "b", "b", "a", "b", "a"], ["a"]):
                        for tag, m in (("ours", pm), ("lora", lm)):
                            try:
                                gen(m, ids, adapter_names=names, **kw)
                                res[(tag, len(names), kw.get("num_return_sequences", 1))] = "ok"
                            except Exception:  # noqa: BLE001
                                res[(tag, len(names), kw.get("num_return_sequences", 1))] = "refused"
                bad = {
                    k[1:]: (v, res[("lora", *k[1:])])
                    for k, v in res.items()
                    if k[0] == "ours"
                    if v != res[("lora", *k[1:])]
                }
                return not bad, f"(ours, LoRA) where they differ: {bad}"

            case(A, f"{fam} tt={use_tt} beams: other name counts (4, 8, 1) accepted/refused as LoRA", parity)

    def whisper():
        torch.manual_seed(0)
        cfg = tf.WhisperConfig(
            vocab_size=97,
            num_mel_bins=8,
            encoder_layers=2,
            decoder_layers=2,
            d_model=32,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_source_positions=16,
            max_target_positions=32,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
            begin_suppress_tokens=None,
            suppress_tokens=None,
        )
        base = tf.WhisperForConditionalGeneration(cfg).eval()
        base.generation_config.forced_decoder_ids = None
        pm = get_peft_model(base, PreProjConfig(), adapter_name="a")
        pm.add_adapter("b", PreProjConfig())
        for i, n in enumerate(("a", "b")):
            pm.set_adapter(n)
            perturb_trainable(pm, seed=40 + i, scale=0.3)
        pm.set_adapter("a")
        feats = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(5))

        def g(x, **kw):
            with torch.no_grad():
                return pm.generate(input_features=x, max_new_tokens=4, **kw)

        o = g(feats, adapter_names=["a", "b"], num_beams=2)
        alone = []
        for i, n in enumerate(("a", "b")):
            pm.set_adapter(n)
            alone.append(g(feats[i : i + 1], num_beams=2))
        same = all(row_eq(o[i], alone[i][0]) for i in range(2))
        return same, f"rows==alone {same}"

    case(A, "Whisper tiny, beams=2, mixed names: rows == alone", whisper)

    def group_beam():
        pm = two_adapters(lambda: zoo.tiny_neox())
        kw = dict(num_beams=4, num_beam_groups=2, diversity_penalty=0.5, trust_remote_code=False)
        try:
            o = gen(pm, dec_ids, adapter_names=["a", "b"], **kw)
        except Exception as e:  # noqa: BLE001
            return True, f"(not supported by this transformers / refused) {type(e).__name__}: {str(e)[:120]}"
        alone = rows_alone(pm, dec_ids, ["a", "b"], 1, **kw)
        same = all(row_eq(o[i], alone[i][0]) for i in range(2))
        return same, f"rows==alone {same}"

    case(A, "group beam search (num_beam_groups=2) mixed", group_beam)

    def vlm_beams(parts=None):
        base = zoo.qwen2_vl()
        pm = get_peft_model(base, PreProjConfig(parts=parts), adapter_name="a")
        pm.add_adapter("b", PreProjConfig(parts=parts))
        for i, n in enumerate(("a", "b")):
            pm.set_adapter(n)
            perturb_trainable(pm, seed=30 + i, scale=0.3)
        pm.set_adapter("a")
        ids1, pix, grid = zoo.vl_inputs()
        ids = torch.cat([ids1, ids1])
        pix2, grid2 = torch.cat([pix, pix]), torch.cat([grid, grid])
        types = (ids == zoo.VOCAB + 2).long()
        kw = dict(pixel_values=pix2, image_grid_thw=grid2, mm_token_type_ids=types, num_beams=2)
        try:
            o = gen(pm, ids, adapter_names=["a", "b"], **kw)
        except ValueError as e:
            if parts is None and "no batch dimension" in str(e):
                return True, "(documented: docs/limits.md, a packed vision tower cannot be split)"
            raise
        alone = []
        for i, n in enumerate(("a", "b")):
            pm.set_adapter(n)
            alone.append(
                gen(
                    pm,
                    ids[i : i + 1],
                    pixel_values=pix,
                    image_grid_thw=grid,
                    mm_token_type_ids=types[i : i + 1],
                    num_beams=2,
                )
            )
        same = all(row_eq(o[i], alone[i][0]) for i in range(2))
        return same, f"rows==alone {same}"

    case(A, "Qwen2-VL tiny, beams=2, mixed names: rows == alone", vlm_beams)
    case(A, "Qwen2-VL tiny parts=['language'], beams=2, mixed names: rows == alone", lambda: vlm_beams(["language"]))


# ================================================================ 3. for_budget / from_dict / estimate


def trainable(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def area_config():
    A = "config"

    def budget_within(kwargs, fraction=0.05, build=lambda: zoo.BUILDERS["llama"](width=64, depth=4)):
        m = build()
        total = sum(p.numel() for p in m.parameters())
        cfg = PreProjConfig.for_budget(m, fraction, **kwargs)
        pm = get_peft_model(m, cfg)
        got = trainable(pm)
        width = 64
        sel = len(cfg.resolve_layers(4)) if cfg.layers is not None else 4
        tol = 2 * width * sel * 2
        return abs(got - fraction * total) <= tol, f"trained {got}, budget {fraction * total:.0f}, tol {tol}"

    case(A, "for_budget llama 4 blocks, no layers", lambda: budget_within({}))
    case(A, "for_budget layers=[-1]", lambda: budget_within({"layers": [-1]}, 0.01))
    case(
        A,
        "for_budget layers=[-2,-1] == layers=[2,3]",
        lambda: (
            PreProjConfig.for_budget(zoo.BUILDERS["llama"](width=64, depth=4), 0.02, layers=[-2, -1]).expansion
            == PreProjConfig.for_budget(zoo.BUILDERS["llama"](width=64, depth=4), 0.02, layers=[2, 3]).expansion,
            "",
        ),
    )

    def dict_layers():
        m = zoo.BUILDERS["llama"](width=64, depth=4)
        try:
            cfg = PreProjConfig.for_budget(m, 0.01, layers={"language": [-1]})
        except Exception as e:  # noqa: BLE001
            return "part" in str(e).lower() or "layers" in str(e).lower(), f"refused: {str(e)[:120]}"
        a = PreProjConfig.for_budget(zoo.BUILDERS["llama"](width=64, depth=4), 0.01, layers=[-1])
        return (cfg.expansion, cfg.skip_rank) == (a.expansion, a.skip_rank), f"{cfg.expansion}/{a.expansion}"

    case(A, "for_budget dict layers {'language':[-1]} == layers=[-1]", dict_layers)

    def threshold():
        m = zoo.BUILDERS["llama"](width=64, depth=4)
        total = sum(p.numel() for p in m.parameters())
        try:
            PreProjConfig.for_budget(m, 1e-6)
            return False, "tiny fraction accepted"
        except ValueError as e:
            msg = str(e)
        import re

        f = float(re.search(r"fraction >= ([0-9.e-]+)", msg).group(1))
        cfg = PreProjConfig.for_budget(m, f)
        got = trainable(get_peft_model(zoo.BUILDERS["llama"](width=64, depth=4), cfg))
        return got <= 2 * f * total, f"named fraction {f}: trains {got} vs budget {f * total:.0f}"

    case(A, "for_budget at the named smallest fraction: accepted, not far over", threshold)
    case(
        A,
        "for_budget fraction=1: sized or refused with a reason",
        lambda: (lambda r: (r[0] or "accepted" in r[1], r[1]))(
            refused(lambda: PreProjConfig.for_budget(zoo.BUILDERS["llama"](width=64, depth=4), 1.0), "fraction")
        ),
    )

    def wrapped():
        m = zoo.BUILDERS["llama"](width=64, depth=4)
        a = PreProjConfig.for_budget(m, 0.05)
        pm = get_peft_model(zoo.BUILDERS["llama"](width=64, depth=4), LoraConfig(r=2, target_modules=["q_proj"]))
        try:
            b = PreProjConfig.for_budget(pm, 0.05)
        except Exception as e:  # noqa: BLE001
            return True, f"refused: {str(e)[:120]}"
        return (a.expansion, a.skip_rank) == (
            b.expansion,
            b.skip_rank,
        ), f"{a.expansion},{a.skip_rank} vs {b.expansion},{b.skip_rank}"

    case(A, "for_budget on a PeftModel(LoRA)-wrapped model == bare or refused", wrapped)

    def host_row():
        m = zoo.BUILDERS["llama"](width=64, depth=4)
        a = PreProjConfig.for_budget(m, 0.05)
        b = PreProjConfig.for_budget(m, 0.05, host="llama")
        return (a.expansion, a.skip_rank) == (b.expansion, b.skip_rank), f"{a.skip_rank} {b.skip_rank}"

    case(A, "for_budget host='llama' row name", host_row)

    def vlm_parts():
        m = zoo.qwen2_vl()
        r = refused(lambda: PreProjConfig.for_budget(m, 0.05))
        names = [p for p in ("language", "vision")]
        c = PreProjConfig.for_budget(m, 0.05, parts=[names[0]])
        return (r[0] or r[1] == "accepted") and c.parts == ["language"], f"no parts: {r[1][:80]}"

    case(A, "for_budget on Qwen2-VL: parts=['language'] sized", vlm_parts)

    def ltt():
        a = PreProjConfig(layers_to_transform=[0]).layers
        b = PreProjConfig.from_dict({"peft_type": "PREPROJ", "layers_to_transform": [0]}).layers
        return a == b, f"(constructor maps it to layers) ctor {a}, from_dict {b}"

    case(A, "from_dict layers_to_transform as the constructor", ltt)

    def vlm_widths():
        torch.manual_seed(0)
        base = zoo.qwen2_vl()
        cfg = base.config
        cfg.vision_config.embed_dim = 32
        cfg.vision_config.hidden_size = 32
        cfg.vision_config.intermediate_size = 64
        m = tf.Qwen2VLForConditionalGeneration(cfg).eval()
        r = refused(lambda: PreProjConfig.for_budget(m, 0.05), "width")
        c = PreProjConfig.for_budget(m, 0.05, parts=["vision"])
        pm = get_peft_model(m, c)
        total = sum(p.numel() for p in tf.Qwen2VLForConditionalGeneration(cfg).parameters())
        got = trainable(pm)
        return r[0] and abs(
            got - 0.05 * total
        ) <= 2 * 32 * 2 * 2, f"no parts: {r[1][:70]}; vision: {got} vs {0.05 * total:.0f}"

    case(
        A,
        "for_budget Qwen2-VL with vision width 32, text 64: refused without parts, parts=['vision'] sized",
        vlm_widths,
    )

    for word in ("target_modules", "exclude_modules", "layers_pattern"):
        case(
            A,
            f"from_dict refuses {word}",
            lambda w=word: refused(
                lambda: PreProjConfig.from_dict(
                    {"peft_type": "PREPROJ", w: ["q_proj"] if w != "layers_to_transform" else [0]}
                ),
                w,
            ),
        )
    for bad in (3, None, ["0.5"]):
        case(
            A,
            f"from_dict refuses library_version={bad!r}",
            lambda b=bad: refused(
                lambda: PreProjConfig.from_dict({"peft_type": "PREPROJ", "library_version": b}), "library_version"
            ),
        )

    def legacy(name, route):
        import safetensors.torch as st

        sys.path.insert(0, str(ROOT / "tests/fixtures/legacy_adapters"))
        import make_fixtures

        folder = ROOT / "tests/fixtures/legacy_adapters" / name
        want = st.load_file(str(folder / "logits.safetensors"))["logits"]
        ids = torch.tensor(make_fixtures.INPUT_IDS)
        base = make_fixtures.tiny_base()
        if route == "mm":
            m = mmpreproj.load_adapter(base, folder)
        else:
            m = PeftModel.from_pretrained(base, folder)
        with torch.no_grad():
            d = diff(m(ids).logits, want)
        return d < 1e-5, f"logits vs stored {d:.2g}"

    for name in ("preproj_skip", "preproj_lora_run", "preproj_lora_checkpoint"):
        case(A, f"legacy {name} via mmpreproj.load_adapter", lambda n=name: legacy(n, "mm"))
    case(
        A,
        "legacy preproj_skip via PeftModel.from_pretrained (format 1: refused with a word or loads)",
        lambda: (lambda r: (True, r[1]))(refused(lambda: legacy("preproj_skip", "peft"))),
    )

    def legacy_from_dict():
        bad = []
        for cfgf in (ROOT / "tests/fixtures/legacy_adapters").rglob("adapter_config.json"):
            d = json.loads(cfgf.read_text())
            if d.get("peft_type") == "PREPROJ":
                try:
                    PreProjConfig.from_dict({k: v for k, v in d.items()})
                except Exception as e:  # noqa: BLE001
                    bad.append(f"{cfgf.parent.name}: {str(e)[:80]}")
        return not bad, f"{bad[:2]}"

    case(A, "from_dict reads every PREPROJ legacy config", legacy_from_dict)

    def save_pretrained_fixture():
        import safetensors.torch as st

        folder = ROOT / "tests/fixtures/legacy_adapters/save_pretrained"
        want = st.load_file(str(folder / "logits.safetensors"))["logits"]
        sys.path.insert(0, str(ROOT / "tests/fixtures/legacy_adapters"))
        import make_fixtures

        m = mmpreproj.from_pretrained(folder)
        with torch.no_grad():
            d = diff(m(torch.tensor(make_fixtures.INPUT_IDS)).logits, want)
        return d < 1e-5, f"{d:.2g}"

    case(A, "legacy save_pretrained folder via mmpreproj.from_pretrained", save_pretrained_fixture)

    def estimate_missing_part():
        from mmpreproj.method.estimate import SHAPES

        shape = next(iter(SHAPES))
        ok = mmpreproj.estimate(PreProjConfig(layers={"language": [0]}), shape)
        r = refused(lambda: mmpreproj.estimate(PreProjConfig(layers={"vision": [0]}), shape), "vision")
        r2 = refused(
            lambda: mmpreproj.estimate(PreProjConfig(layers={"language": [0], "vision": [0]}), shape), "vision"
        )
        return ok is not None and r[0] and r2[0], f"{r[1][:80]} / {r2[1][:60]}"

    case(A, "estimate refuses a per-part layers naming a missing part", estimate_missing_part)


# ================================================================ 4. base_model_type warning


def area_warn():
    A = "warn"
    llama = lambda: zoo.BUILDERS["llama"](width=64, depth=2)  # noqa: E731
    mistral = lambda: zoo.BUILDERS["mistral"](width=64, depth=2)  # noqa: E731
    d = tmp("w")
    pm = get_peft_model(llama(), PreProjConfig())
    pm.save_pretrained(d)

    def warned(fn, want):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            fn()
        hits = [
            str(x.message)
            for x in w
            if issubclass(x.category, UserWarning) and "llama" in str(x.message) and "mistral" in str(x.message)
        ]
        return bool(hits) == want, f"warned {bool(hits)}: {hits[0][:100] if hits else ''}"

    loaders = {
        "mmpreproj.load_adapter": lambda mk: mmpreproj.load_adapter(mk(), d),
        "PeftModel.from_pretrained": lambda mk: PeftModel.from_pretrained(mk(), d),
        "transformers model.load_adapter": lambda mk: mk().load_adapter(str(d)),
        "load_adapter second adapter_name": lambda mk: mmpreproj.load_adapter(
            mmpreproj.load_adapter(mk(), d), d, adapter_name="second"
        ),
        "PeftModel.load_adapter second": lambda mk: PeftModel.from_pretrained(mk(), d).load_adapter(d, "second"),
    }
    for name, fn in loaders.items():
        case(
            A, f"{name}: llama adapter onto mistral warns naming both", lambda fn=fn: warned(lambda: fn(mistral), True)
        )
        case(A, f"{name}: onto llama, no such warning", lambda fn=fn: warned(lambda: fn(llama), False))

    def auto_peft():
        full = tmp("auto")
        pm2 = get_peft_model(llama(), PreProjConfig())
        pm2.save_pretrained(full)
        mistral().save_pretrained(full / "base")
        cfg = json.loads((full / "adapter_config.json").read_text())
        cfg["base_model_name_or_path"] = str(full / "base")
        (full / "adapter_config.json").write_text(json.dumps(cfg))
        return warned(lambda: peft.AutoPeftModelForCausalLM.from_pretrained(str(full)), True)

    case(A, "AutoPeftModelForCausalLM onto a mistral base warns", auto_peft)

    def whole_folder():
        f = tmp("whole")
        m = mmpreproj.inject(llama(), PreProjConfig())
        mmpreproj.save_pretrained(m, f)
        cfgf = f / "config.json"
        c = json.loads(cfgf.read_text())
        return warned(lambda: mmpreproj.from_pretrained(f), False), c.get("model_type")

    case(A, "mmpreproj.from_pretrained whole-model folder, same type: no warning", lambda: whole_folder()[0])

    def edited(value):
        e = tmp("ed")
        for p in d.iterdir():
            (e / p.name).write_bytes(p.read_bytes())
        cfg = json.loads((e / "adapter_config.json").read_text())
        rec = cfg.get("injection") or {}
        if "base_model_type" not in rec:
            return False, f"no injection.base_model_type in the record: {list(cfg)[:8]}"
        rec["base_model_type"] = value
        (e / "adapter_config.json").write_text(json.dumps(cfg))
        res = []
        for tag, fn in (
            ("mm", lambda: mmpreproj.load_adapter(mistral(), e)),
            ("peft", lambda: PeftModel.from_pretrained(mistral(), e)),
        ):
            try:
                fn()
                res.append(f"{tag}: loaded")
            except TypeError as x:
                return False, f"{tag}: TypeError {x}"
            except Exception as x:  # noqa: BLE001
                res.append(f"{tag}: refused {type(x).__name__}: {str(x)[:60]}")
        return True, "; ".join(res)

    for v in (3, "", ["llama"], None):
        case(A, f"edited record base_model_type={v!r}: no TypeError", lambda v=v: edited(v))

    def timm_none():
        try:
            import timm
        except ImportError:
            return True, "(timm not installed)"
        m = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3, img_size=32, patch_size=8)
        f = tmp("timm")
        m2 = mmpreproj.inject(m, PreProjConfig())
        mmpreproj.save_adapter(m2, f)
        m3 = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3, img_size=32, patch_size=8)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            mmpreproj.load_adapter(m3, f)
        hits = [str(x.message) for x in w if "model_type" in str(x.message) or "trained on another" in str(x.message)]
        return not hits, f"{hits[:1]}"

    case(A, "timm ViT: no model_type warning", timm_none)

    def once():
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            PeftModel.from_pretrained(mistral(), d)
        n = sum("trained on another" in str(x.message) for x in w)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            mmpreproj.load_adapter(mistral(), d)
        n2 = sum("trained on another" in str(x.message) for x in w)
        return n == 1 and n2 == 1, f"PeftModel.from_pretrained {n}, mmpreproj.load_adapter {n2} warnings"

    case(A, "one warning per load, not repeated", once)

    def vl_to_25():
        f = tmp("vl")
        pm = get_peft_model(zoo.qwen2_vl(), PreProjConfig())
        pm.save_pretrained(f)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            mmpreproj.load_adapter(zoo.qwen2_vl(cls_name="Qwen2_5_VL"), f)
        hits = [str(x.message) for x in w if "qwen2_vl" in str(x.message) and "qwen2_5_vl" in str(x.message)]
        return bool(hits), f"{hits[:1]}"

    case(A, "Qwen2-VL adapter onto Qwen2.5-VL warns (the changelog's case)", vl_to_25)


# ================================================================ 5. analysis / CLI


def area_analysis():
    A = "analysis"
    from mmpreproj.analysis import plot as P
    from mmpreproj.analysis.skip_norms import routing_ratios

    def png_added():
        d = tmp("pl")
        p = P.plot_skip_norms({"a": [1.0, 2.0]}, d / "fig")
        return Path(p).suffix == ".png" and Path(p).exists() and not (d / "fig").exists(), str(p)

    case(A, "plot path without suffix gets .png", png_added)
    case(A, "plot to a folder refused", lambda: refused(lambda: P.plot_skip_norms({"a": [1.0]}, tmp("f"))))

    def unknown_fmt():
        d = tmp("uf")
        r = refused(lambda: P.plot_skip_norms({"a": [1.0, 2.0]}, d / "fig.xyz"))
        return r[0] and not list(d.iterdir()), r[1]

    case(A, "unknown format refused, nothing written", unknown_fmt)

    def dict_at_blocks():
        import matplotlib.axes

        seen = []
        orig = matplotlib.axes.Axes.plot

        def spy(self, *a, **k):
            seen.append(list(a[0]))
            return orig(self, *a, **k)

        matplotlib.axes.Axes.plot = spy
        try:
            P.plot_skip_norms({"a": {2: 0.1, 3: 0.2}, "b": [0.1, 0.2, 0.3, 0.4]}, tmp("bd") / "f.png")
        finally:
            matplotlib.axes.Axes.plot = orig
        return seen and seen[0] == [2, 3] and seen[1] == [0, 1, 2, 3], f"x: {seen}"

    case(A, "plot_skip_norms {block: v} at block indices beside a list", dict_at_blocks)

    def nested_dir_missing():
        d = tmp("nd")
        try:
            p = P.plot_skip_norms({"a": [1.0, 2.0]}, d / "sub" / "x.png")
            return Path(p).exists(), f"written {p}"
        except Exception as e:  # noqa: BLE001
            return True, f"refused {str(e)[:80]}"

    case(A, "plot into a missing subfolder: written or refused cleanly", nested_dir_missing)

    def rr_empty_mask():
        m = mmpreproj.inject(zoo.tiny_neox(), PreProjConfig())
        batch = {"input_ids": IDS, "keep": torch.zeros_like(IDS, dtype=torch.bool)}
        return refused(lambda: routing_ratios(m, [batch], token_mask_key="keep"))

    case(A, "routing_ratios refuses a mask that keeps no token", rr_empty_mask)

    def rr_partial_mask():
        m = mmpreproj.inject(zoo.tiny_neox(), PreProjConfig())
        keep = torch.zeros_like(IDS, dtype=torch.bool)
        keep[0, 0] = True
        r = routing_ratios(m, [{"input_ids": IDS, "keep": keep}], token_mask_key="keep")
        import math

        return all(math.isfinite(v) for v in r.values()), f"{r}"

    case(A, "routing_ratios with one kept token: finite", rr_partial_mask)

    def cli_skip_rank():
        code = (
            "import runpy,sys\nsys.argv=['mmpreproj','train','--method','preproj','--skip-rank','16']\n"
            "rc=0\ntry:\n runpy.run_module('mmpreproj_cli',run_name='__main__')\nexcept SystemExit as e:\n rc=e.code\n"
            "print('RC',rc,'TORCH','torch' in sys.modules)"
        )
        p = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
        )
        last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr[-200:]
        return "TORCH False" in last and "RC 0" not in last and "skip" in p.stderr.lower(), (
            f"{last}; {p.stderr.strip().splitlines()[-1][:120] if p.stderr.strip() else ''}"
        )

    case(A, "train --method preproj --skip-rank 16 refused before torch loads", cli_skip_rank)

    def no_progress_restores():
        from transformers.utils import logging as tl

        from mmpreproj_cli import run as R  # noqa: F401

        before = tl.is_progress_bar_enabled()
        return True, f"(probe) progress enabled before: {before}"

    def progress(before_on, exc):
        import huggingface_hub.utils as hh
        from transformers.utils import logging as tl

        from mmpreproj.util.progress import library_progress_bars

        (tl.enable_progress_bar if before_on else tl.disable_progress_bar)()
        hub_before = hh.are_progress_bars_disabled()
        inside = None
        with contextlib.suppress(RuntimeError), library_progress_bars(False):
            inside = (tl.is_progress_bar_enabled(), hh.are_progress_bars_disabled())
            if exc:
                raise RuntimeError("x")
        after = (tl.is_progress_bar_enabled(), hh.are_progress_bars_disabled())
        tl.enable_progress_bar()
        ok = inside == (False, True) and after == (before_on, hub_before)
        return ok, f"inside (tf on, hub off)={inside}; after={after}, before=({before_on}, {hub_before})"

    for on in (True, False):
        for exc in (False, True):
            case(
                A,
                f"--no-progress bars: off inside (transformers + hub), restored after (before on={on}, "
                f"exception={exc})",
                lambda on=on, exc=exc: progress(on, exc),
            )

    from mmpreproj.analysis import stats as S

    pairs = [([1.0, 2.0, 3.0], [1.5, 2.0, 2.5]), ([1.0, 2.0, 3.5], [1.0, 2.5, 2.5])]
    case(
        A,
        "paired_bootstrap unknown metric: ValueError",
        lambda: (lambda r: (r[0] and "ValueError" in r[1], r[1]))(refused(lambda: S.paired_bootstrap(pairs, "nope"))),
    )
    case(
        A, "paired_bootstrap n_boot=0 refused", lambda: refused(lambda: S.paired_bootstrap(pairs, "ppl.ppl", n_boot=0))
    )
    case(
        A,
        "paired_bootstrap n_boot=True refused",
        lambda: refused(lambda: S.paired_bootstrap(pairs, "ppl.ppl", n_boot=True)),
    )
    case(
        A,
        "paired_bootstrap NaN item refused",
        lambda: refused(lambda: S.paired_bootstrap([([1.0, float("nan")], [1.0, 2.0])], "ppl.ppl")),
    )
    case(
        A,
        "paired_bootstrap inf item refused",
        lambda: refused(lambda: S.paired_bootstrap([([1.0, 2.0], [1.0, float("inf")])], "ppl.ppl")),
    )
    case(A, "t_interval NaN refused", lambda: refused(lambda: S.t_interval([0.1, float("nan"), 0.2])))
    case(
        A,
        "plot_skip_norms empty series refused, nothing written",
        lambda: (
            lambda d: (lambda r: (r[0] and not list(d.iterdir()), r[1]))(
                refused(lambda: P.plot_skip_norms({"a": []}, d / "e.png"))
            )
        )(tmp("es")),
    )

    def analyze_nothing_written():
        good = tmp("run")
        pm = get_peft_model(zoo.tiny_neox(), PreProjConfig())
        pm.save_pretrained(good)
        outdir = TMP / "analyze_out_never"
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "mmpreproj_cli",
                "analyze",
                str(good),
                str(TMP / "missing_run"),
                "--out",
                str(outdir),
                "--texts",
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
        )
        last = (p.stderr.strip().splitlines() or [""])[-1][:120]
        return p.returncode != 0 and not outdir.exists(), f"rc {p.returncode}; out exists {outdir.exists()}; {last}"

    case(A, "analyze with a missing second run: refused, --out not created", analyze_nothing_written)


def main():
    global ONLY
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    ap.add_argument("--area", action="append")
    a = ap.parse_args()
    ONLY = a.only
    areas = {
        "disable": area_disable,
        "generate": area_generate,
        "config": area_config,
        "warn": area_warn,
        "analysis": area_analysis,
    }
    for name, fn in areas.items():
        if a.area and name not in a.area:
            continue
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            record(False, name, "area crashed", f"{type(e).__name__}: {str(e)[:200]}")
    p = sum(r[0] == "PASS" for r in RESULTS)
    print(f"TOTAL {len(RESULTS)}: {p} PASS, {len(RESULTS) - p} FAIL")


if __name__ == "__main__":
    main()
