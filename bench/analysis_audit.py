"""Analysis audit: `mmpreproj.analysis` (skip norms, routing ratios, plots), `mmpreproj.analysis.stats` (the
seed / item intervals of `reproduce --seeds K`) and `mmpreproj analyze`, against hand computations and references
this project did not write (numpy, scipy.stats, torch forward hooks).

Run:  PYTHONPATH=. OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \\
          python bench/analysis_audit.py [--only SUBSTR]

Written by an independent, adversarial audit from the docs alone (README.md, docs/api.md, docs/cli.md,
docs/results.md, docs/numbers.md, docs/limits.md, docs/getting-started.md and the public docstrings of
`mmpreproj.analysis` and `mmpreproj.analysis.stats`); the expectations are the auditor's. Tiny random models built here
(GPT-NeoX, Llama, transformers ViT, timm ViT, CLIP) and the shipped assets/mini-pythia + assets/data; nothing is
downloaded. bench/eval_audit.py already covers the evaluators and `adapters_table`; they are not repeated. Areas:
  * norms:   skip_norms == ||W_skip||_F computed from the model's own parameters (proj.weight, or up @ down for
             skip_rank; Frobenius, not spectral, not the factors' norm) on 4 hosts; skip-only, preproj-only ({}),
             layers subset, bare / unloaded model ({}), PeftModel route, several adapters (the active one is
             measured; PeftModel add_adapter and in-place load_adapter(adapter_name=)), bf16 host;
             skip_norms_from_adapter == the model for save_adapter / PeftModel.save_pretrained folders (full and
             rank-r skip, second adapter's subfolder), preproj-only folder, missing / non-adapter folder, run
             folder; PAPER_SKIP_NORMS and the README / results.md skip-norm sentences recomputed from the evidence.
  * routing: routing_ratios == sum||x~ W_skip^T|| / sum||attn_out|| from forward hooks on each wrapper's base
             attention (x~ itself checked against x^ + W_down SiLU(W_up x^)) on 4 hosts + CLIP; right and left
             padding (== the rows unpadded), token_mask_key, a wrong-shape / absent / all-False mask, batching,
             skip_rank and skip-only, bf16, the documented ValueError / RuntimeError (no skip, no batches,
             adapter_disabled, PeftModel.disable_adapter), several adapters, train mode and observers restored.
  * stats:   t_quantile / mean_std / t_interval / paired_bootstrap / compare / Comparison against scipy.stats 1.17
             (t.ppf, t.interval, sem, tstd, ttest_1samp, bootstrap(paired=True, method="percentile")) and numpy:
             ddof, n=1, constant data, empty, NaN / inf, coverage (t: 2000 sets; bootstrap: 300 sets), seed
             determinism, several seeds, metric definitions, refusals; the evidence intervals of
             docs/evidence/mini-study/study.json (72 comparisons) and mini-vit-probe/summary.json recomputed.
  * plots:   every public plot function writes a PNG at the path (parent folders made) and returns it; headless
             (MPLBACKEND=TkAgg, no DISPLAY); what the figure holds (x = relative depth as documented, bars,
             sorted LRs); bad paths / args (folder, .txt, .pdf, no extension, empty series, log axes with <= 0);
             no file / folder / open figure left after a failure.
  * cli:     `python -m mmpreproj_cli analyze` on run folders made by `mmpreproj train --preset mini --steps 3`
             (preproj_skip, --skip-rank 4, --method preproj, --layers=-2,-1, --model-dtype bfloat16): the JSON equals
             the API and the hand computation, --texts 0, default --out, two runs, the figures' x axis; refusals
             (missing folder, not a run, --texts -1 / abc, a skip-less run alone or after a good one, --out a
             file, an adapter folder with --texts) in one line with rc != 0 and nothing created at --out.
One line per case: PASS/FAIL | area | case | details; then TOTAL. About 2.5-3 min on one thread (five 3-step
trainings and six `mmpreproj analyze` subprocesses). Output: bench/results/analysis_audit_before.txt.

Result on commit 49119f9 (the library as audited; this harness is committed on top of it), CPU, one thread:
TOTAL 118: 99 PASS, 19 FAIL. Every number the analysis reports equals its reference: skip norms == the hand
Frobenius norm (rel <= 1.2e-7, file == model == reload), routing ratios == the hooks (rel <= 1.4e-7 fp32, 4e-4 bf16),
`analyze`'s JSON == the API bit for bit, t intervals == scipy (|d| 4e-16), paired bootstrap == scipy's percentile
bootstrap within Monte Carlo noise (1.3% of the width) with 95.0% coverage, the evidence's 72 + 10 intervals
recomputed (|d| <= 1.8e-6, float32-rounded inputs). The FAILs, grouped:
  1. library bug (figure content), 2 cases: the skip-norm / routing figures plot list positions, not block indices:
     `analyze` on a `--layers=-2,-1` run draws blocks 2, 3 at x = 0, 1 under the x label "layer"; and
     `plot_skip_norms`'s docstring promises "x = relative depth when depths differ", but x is always 0..n-1
     (docs wrong or feature missing).
  2. library bug (return value), 2 cases: `_save` returns the path it was given, but matplotlib appends ".png" to an
     extension-less path: `plot_skip_norms(..., "fig")` writes fig.png and returns "fig" (a missing file); a path
     that is an existing folder is not refused: it writes "<folder>.png" beside it and returns the folder.
  3. library bug, minor (cleanup on failure), 2 plot cases + 2 CLI cases: a plot that fails (bad panel value,
     unsupported format) leaves its pyplot figure open (leaks in a long process) and the parent folder `_save` made;
     `mmpreproj analyze` creates --out (empty) before refusing a skip-less run (cli.md: refused "before anything is
     written to --out").
  4. harness expectation / docs silent (the brief's rule: no silent NaN, clear errors naming the argument), 7 cases:
     mean_std / t_interval / paired_bootstrap pass NaN and inf through silently; routing_ratios returns NaN for a
     block whose mask keeps no token; paired_bootstrap raises a bare KeyError('bogus.metric') for an unknown metric
     and an IndexError for n_boot=0.
  5. harness expectation (docstring "save a PNG"), 4 cases: a ".pdf" path writes a PDF; plot_skip_norms({}) writes an
     empty figure (plot_results refuses no panel); plot_lr_sweep / plot_skip_growth accept values <= 0 on log axes
     (matplotlib drops them with a warning).

Run again after the fixes (bench/results/analysis_audit.txt): TOTAL 118: 115 PASS, 3 FAIL. `plot_skip_norms` draws a
`{block: value}` series at its block indices (`analyze` passes them) and lists of different lengths at the relative
depth; every plot function resolves its path first (`.png` added to a path without a suffix and returned; a folder or
a format matplotlib cannot write refused before any folder is made), refuses x values a log axis cannot show and an
empty series, and closes its figure when it fails; `analyze` reads every run before it creates --out;
`routing_ratios` refuses a mask that keeps no token of a block; `paired_bootstrap` refuses an unknown metric, n_boot
< 1 and non-finite items, `t_interval` non-finite differences, and `compare` gives no interval ("not comparable")
for a diverged run. The 3 FAILs left check sentences the fixes changed: `mean_std` now documents that a diverged
seed's inf/NaN passes through (the report shows it rather than hide it), and the plot module's docstring that a
`.pdf` / `.svg` suffix writes that format.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import peft  # noqa: E402
import torch  # noqa: E402
from scipy import stats as sst  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    ViTConfig,
    ViTModel,
)
from transformers.utils import logging as hf_logging  # noqa: E402

import mmpreproj  # noqa: E402
from mmpreproj import analysis as ana  # noqa: E402
from mmpreproj.analysis import stats as st  # noqa: E402

hf_logging.set_verbosity_error()
MINI = str(ROOT / "assets" / "mini-pythia")
CASES: list[tuple[str, str, object]] = []
RESULTS: list[bool] = []
TMP = Path(tempfile.mkdtemp(prefix="analysis_audit_"))
CACHE: dict[str, object] = {}
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH=str(ROOT))
PY = sys.executable


def case(area, name):
    def deco(fn):
        CASES.append((area, name, fn))
        return fn

    return deco


def check(cond, detail):
    if not cond:
        raise AssertionError(detail)
    return detail


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def raises(fn, exc=Exception):
    """The exception `fn()` raises (AssertionError when it raises none or another type)."""
    try:
        out = fn()
    except exc as e:  # noqa: BLE001
        return e
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"raised {type(e).__name__}: {str(e)[:120]}, wanted {exc.__name__}") from None
    raise AssertionError(f"no error; returned {str(out)[:120]}")


# ----------------------------------------------------------------------------------------------- models
def neox(layers=3, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    cfg = GPTNeoXConfig(
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=128,
        max_position_embeddings=64,
    )
    return GPTNeoXForCausalLM(cfg).to(dtype).eval()


def llama(layers=3, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=48,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        vocab_size=128,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg).eval()


def vit(layers=2, seed=0):
    torch.manual_seed(seed)
    cfg = ViTConfig(
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
    )
    return ViTModel(cfg).eval()


def timm_vit(seed=0):
    import timm

    torch.manual_seed(seed)
    return timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=4
    ).eval()


def perturb_(model, seed=1, scale=0.3):
    """Move every trainable (adapter) weight so norms and ratios differ per block."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "preproj" in n:
                p.add_(torch.randn(p.shape, generator=g).to(p.dtype) * scale)
    return model


def wrappers(model):
    return [m for m in model.modules() if isinstance(m, mmpreproj.PreProjAttention)]


def hand_skip_weight(w, adapter="default"):
    """The effective W_skip of wrapper `w` for `adapter`, from its parameters by name (proj, or up @ down)."""
    ps = {n: p.detach().float() for n, p in w.named_parameters() if f"preproj_skip.{adapter}." in n}
    full = [p for n, p in ps.items() if n.endswith("proj.weight") and ".up." not in n]
    if full:
        return full[0]
    up = next(p for n, p in ps.items() if n.endswith("up.weight"))
    down = next(p for n, p in ps.items() if n.endswith("down.weight"))
    return up @ down


def hand_norms(model, adapter="default", kind="fro"):
    out = {}
    for w in wrappers(model):
        if any(f"preproj_skip.{adapter}." in n for n, _ in w.named_parameters()):
            W = hand_skip_weight(w, adapter).numpy().astype(np.float64)
            out[w.block_index] = float(np.linalg.norm(W, kind))
    return out


def cmp_dicts(got, want, tol=1e-5):
    check(set(got) == set(want), f"keys {sorted(got)} != {sorted(want)}")
    d = max((rel(got[k], want[k]) for k in want), default=0.0)
    check(d <= tol, f"max rel diff {d:.2e} > {tol:g}: got {_short(got)} want {_short(want)}")
    return d


def _short(d):
    return "{" + ", ".join(f"{k}: {v:.4g}" for k, v in d.items()) + "}"


def first_tensor(args, kwargs):
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    return kwargs.get("hidden_states")


@contextlib.contextmanager
def hand_hooks(model, adapter="default"):
    """Hooks on each wrapper's base attention: the input it receives (x~) and its output (attn_out)."""
    seen: dict[int, list] = {}
    hs = []
    for w in wrappers(model):
        if not any(f"preproj_skip.{adapter}." in n for n, _ in w.named_parameters()):
            continue
        rec = seen.setdefault(w.block_index, [])

        def pre(mod, args, kwargs, rec=rec):
            rec.append({"x": first_tensor(args, kwargs).detach()})

        def post(mod, args, kwargs, out, rec=rec):
            rec[-1]["attn"] = (out if isinstance(out, torch.Tensor) else out[0]).detach()

        hs.append(w.base_layer.register_forward_pre_hook(pre, with_kwargs=True))
        hs.append(w.base_layer.register_forward_hook(post, with_kwargs=True))
    try:
        yield seen
    finally:
        for h in hs:
            h.remove()


def hand_ratios(model, batches, adapter="default", mask_key=None, use_attention_mask=True):
    """sum ||W_skip x~|| / sum ||attn_out|| over kept tokens, x~ and attn_out from hooks, W_skip from parameters."""
    sums: dict[int, list[float]] = {}
    ws = {w.block_index: hand_skip_weight(w, adapter) for w in wrappers(model) if _has_skip(w, adapter)}
    with torch.no_grad():
        for b in batches:
            b = dict(b)
            mask = b.pop(mask_key) if mask_key else (b.get("attention_mask") if use_attention_mask else None)
            with hand_hooks(model, adapter) as seen:
                model(**b)
            for i, recs in seen.items():
                for r in recs:
                    x, a = r["x"].float(), r["attn"].float()
                    s = (x @ ws[i].T).norm(dim=-1)
                    an = a.norm(dim=-1)
                    m = torch.ones_like(s, dtype=torch.bool) if mask is None else mask.bool()
                    acc = sums.setdefault(i, [0.0, 0.0])
                    acc[0] += s[m].double().sum().item()
                    acc[1] += an[m].double().sum().item()
    return {i: s / a for i, (s, a) in sorted(sums.items())}


def _has_skip(w, adapter):
    return any(f"preproj_skip.{adapter}." in n for n, _ in w.named_parameters())


def ids_batch(n=2, length=7, seed=0, vocab=128):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, vocab, (n, length), generator=g)}


def injected(kind="neox", seed=1, **cfg):
    base = {"neox": neox, "llama": llama, "vit": vit, "timm": timm_vit}[kind]()
    m = mmpreproj.inject(base, mmpreproj.PreProjConfig(**cfg))
    return perturb_(m, seed)


@contextlib.contextmanager
def captured_figs():
    """Record every saved figure's axes: [(xlabel, [(label, xdata, ydata) per line], [bar heights])]."""
    import matplotlib.figure as mfig

    rec: list = []
    orig = mfig.Figure.savefig

    def patched(self, *a, **k):
        rec.append(
            [
                (
                    ax.get_xlabel(),
                    [
                        (ln.get_label(), [float(v) for v in ln.get_xdata()], [float(v) for v in ln.get_ydata()])
                        for ln in ax.get_lines()
                    ],
                    [float(b.get_height()) for b in ax.patches],
                )
                for ax in self.axes
            ]
        )
        return orig(self, *a, **k)

    mfig.Figure.savefig = patched
    try:
        yield rec
    finally:
        mfig.Figure.savefig = orig


def png_ok(path):
    p = Path(path)
    return p.is_file() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ================================================================================================ skip norms
HOSTS = ["neox", "llama", "vit", "timm"]

for _host in HOSTS:

    @case("norms", f"skip_norms == hand ||W_skip||_F ({_host}, full skip, in place)")
    def _(h=_host):
        m = injected(h)
        got = ana.skip_norms(m)
        d = cmp_dicts(got, hand_norms(m))
        check(len(got) == len(wrappers(m)), f"{len(got)} norms for {len(wrappers(m))} wrappers")
        return f"{len(got)} blocks, rel diff {d:.1e}"


for _host in ("neox", "llama", "timm"):

    @case("norms", f"skip_norms == hand ||B A||_F ({_host}, skip_rank=4)")
    def _(h=_host):
        m = injected(h, skip_rank=4)
        got = ana.skip_norms(m)
        d = cmp_dicts(got, hand_norms(m))
        # not the norm of the factors stacked (a plausible wrong reading)
        w = wrappers(m)[0]
        ps = [p.detach().float() for n, p in w.named_parameters() if "preproj_skip.default." in n]
        stacked = math.sqrt(sum(float(p.norm()) ** 2 for p in ps))
        check(abs(got[w.block_index] - stacked) > 1e-3 * stacked, "equals the norm of the factors, not of B A")
        return f"rel diff {d:.1e}"


@case("norms", "skip_norms: Frobenius, not spectral (docstring: ||W_skip||_F)")
def _():
    m = injected("neox")
    got = ana.skip_norms(m)
    spec = hand_norms(m, kind=2)
    check(all(abs(got[k] - spec[k]) > 1e-6 for k in got), "equals the spectral norm")
    return cmp_dicts(got, hand_norms(m)) and "Frobenius"


@case("norms", "skip-only config (preproj=False): norms of the skip")
def _():
    m = injected("neox", preproj=False)
    return f"rel diff {cmp_dicts(ana.skip_norms(m), hand_norms(m)):.1e}"


@case("norms", "preproj-only config (skip=False): skip_norms == {} (getting-started: 'whose skip norms are {}')")
def _():
    m = injected("neox", skip=False)
    got = ana.skip_norms(m)
    check(got == {}, f"got {got}")
    return "{}"


@case("norms", "layers=[0, 2]: only those block indices")
def _():
    m = injected("neox", layers=[0, 2])
    got = ana.skip_norms(m)
    check(sorted(got) == [0, 2], f"keys {sorted(got)}")
    return f"keys {sorted(got)}, rel diff {cmp_dicts(got, hand_norms(m)):.1e}"


@case("norms", "skip_norms of a bare (never injected) model == {}")
def _():
    got = ana.skip_norms(neox())
    check(got == {}, f"got {got}")
    return "{}"


@case("norms", "PeftModel route (get_peft_model): == hand, == in-place on the same weights")
def _():
    torch.manual_seed(0)
    pm = peft.get_peft_model(neox(), mmpreproj.PreProjConfig())
    perturb_(pm, 3)
    got = ana.skip_norms(pm)
    return f"rel diff {cmp_dicts(got, hand_norms(pm)):.1e}"


@case("norms", "several adapters (PeftModel): skip_norms follows the active adapter")
def _():
    pm = peft.get_peft_model(neox(), mmpreproj.PreProjConfig())
    pm.add_adapter("b", mmpreproj.PreProjConfig(skip_rank=2))
    perturb_(pm, 4)
    a = ana.skip_norms(pm)
    cmp_dicts(a, hand_norms(pm, "default"))
    pm.set_adapter("b")
    b = ana.skip_norms(pm)
    cmp_dicts(b, hand_norms(pm, "b"))
    check(a != b, "same norms for both adapters")
    return f"default {_short(a)}; b {_short(b)}"


@case("norms", "several adapters (in place, load_adapter adapter_name=b + set_adapter)")
def _():
    m = injected("neox", seed=5)
    d = TMP / "inplace_a"
    mmpreproj.save_adapter(m, d)
    m2 = injected("neox", seed=6)
    mmpreproj.load_adapter(m2, d, adapter_name="b")
    want_b = hand_norms(m2, "b")
    cmp_dicts(want_b, hand_norms(m))  # b is what was saved
    mmpreproj.set_adapter(m2, "b")
    got = ana.skip_norms(m2)
    return f"rel diff {cmp_dicts(got, want_b):.1e}"


@case("norms", "bf16 host: skip_norms == hand (fp32 adapter weights)")
def _():
    m = mmpreproj.inject(neox(dtype=torch.bfloat16), mmpreproj.PreProjConfig())
    perturb_(m, 7)
    return f"rel diff {cmp_dicts(ana.skip_norms(m), hand_norms(m)):.1e}"


for _rank in (None, 3):

    @case("norms", f"skip_norms_from_adapter(saved folder) == skip_norms(model) (skip_rank={_rank})")
    def _(r=_rank):
        m = injected("llama", skip_rank=r)
        d = TMP / f"saved_r{r}"
        mmpreproj.save_adapter(m, d)
        got = ana.skip_norms_from_adapter(d)
        cmp_dicts(got, ana.skip_norms(m), tol=1e-6)
        re = mmpreproj.load_adapter(llama(), d)
        d2 = cmp_dicts(ana.skip_norms(re), hand_norms(m), tol=1e-6)
        return f"file == model == reloaded (rel {d2:.1e})"


@case("norms", "skip_norms_from_adapter of a PeftModel.save_pretrained folder (2 adapters: default and b/)")
def _():
    pm = peft.get_peft_model(neox(), mmpreproj.PreProjConfig())
    pm.add_adapter("b", mmpreproj.PreProjConfig(skip_rank=2))
    perturb_(pm, 8)
    d = TMP / "peft_saved"
    pm.save_pretrained(d)
    got = ana.skip_norms_from_adapter(d)
    cmp_dicts(got, hand_norms(pm, "default"))
    got_b = ana.skip_norms_from_adapter(d / "b")
    da, db = cmp_dicts(got, hand_norms(pm, "default")), cmp_dicts(got_b, hand_norms(pm, "b"))
    return f"default rel {da:.1e}, b rel {db:.1e}"


@case("norms", "skip_norms_from_adapter of a preproj-only folder == {} (as skip_norms)")
def _():
    m = injected("neox", skip=False)
    d = TMP / "preproj_only"
    mmpreproj.save_adapter(m, d)
    got = ana.skip_norms_from_adapter(d)
    check(got == {}, f"got {got}")
    return "{}"


@case("norms", "skip_norms_from_adapter(missing folder): an error naming the path")
def _():
    e = raises(lambda: ana.skip_norms_from_adapter(TMP / "no_such_adapter"))
    check("no_such_adapter" in str(e), f"{type(e).__name__}: {str(e)[:120]}")
    return f"{type(e).__name__}: {str(e)[:80]}"


@case("norms", "skip_norms_from_adapter(an empty folder / a non-adapter folder): an error, not {}")
def _():
    d = TMP / "not_an_adapter"
    d.mkdir(exist_ok=True)
    (d / "notes.txt").write_text("hello")
    e = raises(lambda: ana.skip_norms_from_adapter(d))
    return f"{type(e).__name__}: {str(e)[:80]}"


@case("norms", "skip_norms_from_adapter(run folder): reads run/adapter (analyze takes run folders) or refuses")
def _():
    run = CACHE.get("run_ps")
    if run is None:
        return "skipped (no run folder)"
    try:
        got = ana.skip_norms_from_adapter(run)
    except Exception as e:  # noqa: BLE001
        return f"refused: {type(e).__name__}: {str(e)[:80]}"
    check(got, "returned {} for a run folder whose adapter has a skip (silently empty)")
    return f"{len(got)} blocks"


@case("norms", "skip_norms after unload == {} (the base is bare again)")
def _():
    m = injected("neox")
    mmpreproj.unload(m)
    got = ana.skip_norms(m)
    check(got == {}, f"got {got}")
    return "{}"


@case("norms", "PAPER_SKIP_NORMS: 12 (160m) and 24 (410m) layers; last/first 160m = 2.3x (README 'the paper: 2.3x')")
def _():
    p = ana.PAPER_SKIP_NORMS
    check(len(p["pythia-160m"]) == 12 and len(p["pythia-410m"]) == 24, {k: len(v) for k, v in p.items()})
    r = p["pythia-160m"][-1] / p["pythia-160m"][0]
    check(round(r, 1) == 2.3, f"ratio {r:.3f}")
    return f"160m last/first {r:.3f}; 410m {p['pythia-410m'][-1] / p['pythia-410m'][0]:.3f}"


@case("norms", "README smollm2-norms: flat 20.7x init through layer 19, 25.7x at 29 (+24%, every seed), skip +30%")
def _():
    d = json.loads((ROOT / "docs/evidence/smollm2-135m/study.json").read_text())
    groups = {g["label"]: g for g in d["groups"]}
    per = [v["skip_norms"] for v in groups["preproj_skip"]["seeds"].values()]
    init = 1e-4 * 576  # E||W||_F of a d x d N(0, 1e-4) matrix, d = 576 (the skip's documented init)
    mean = np.mean(per, axis=0)
    flat, last = mean[:20].mean() / init, mean[29] / init
    check(round(flat, 1) == 20.7 and round(last, 1) == 25.7, f"flat {flat:.2f}x last {last:.2f}x")
    rises = [s[29] / np.mean(s[:20]) - 1 for s in per]
    check(round(last / flat - 1, 2) == 0.24 and all(r > 0 for r in rises), f"rise {last / flat - 1:.3f} {rises}")
    sk = next(iter(groups["skip"]["seeds"].values()))["skip_norms"]
    rs = sk[29] / np.mean(sk[:20]) - 1
    check(round(rs, 2) == 0.30, f"skip alone rises {rs:.3f}")
    return f"flat {flat:.2f}x, last {last:.2f}x, +{last / flat - 1:.1%}, skip +{rs:.1%}"


@case("norms", "README smollm2-gpu: skip norms rise to 1.7x the first layer's at the last")
def _():
    d = json.loads((ROOT / "docs/evidence/smollm2-135m/gpu/results.json").read_text())
    r = next(r for r in d["rows"] if r["method"] == "preproj_skip")["skip_norms"]
    check(round(r[-1] / r[0], 1) == 1.7, f"{r[-1] / r[0]:.3f}")
    return f"{r[-1] / r[0]:.3f}"


@case("norms", "results.md mini-ViT: ||W_skip||_F ends 60-180x its init (d=128); routing highest in block 0, falls")
def _():
    d = json.loads((ROOT / "docs/evidence/mini-vit-probe/summary.json").read_text())["summary"]
    width = json.loads((ROOT / "assets/mini-vit/config.json").read_text())["model_args"]["embed_dim"]
    x = [v / (1e-4 * width) for a in ("skip", "preproj_skip") for v in d[a]["skip_norms"]]
    check(round(min(x), -1) >= 60 and round(max(x), -1) <= 180, f"{min(x):.1f}x-{max(x):.1f}x")
    ps, sk = d["preproj_skip"]["routing_ratios"], d["skip"]["routing_ratios"]
    check(ps[0] == max(ps) and sk[0] == max(sk), "not highest in the first block")
    check(all(a > b for a, b in zip(ps, ps[1:])), f"preproj_skip ratios do not fall: {ps}")
    check(all(r > 1 for r in ps[:5]), f"preproj_skip blocks 0-4 not above 1: {ps}")
    mono = all(a > b for a, b in zip(sk, sk[1:]))
    return f"{min(x):.1f}x-{max(x):.1f}x; preproj_skip falls, >1 in 0-4; skip arm monotone: {mono} ({sk[-1]:.2f} last)"


# ================================================================================================ routing ratios
for _host in ("neox", "llama", "vit", "timm"):

    @case("routing", f"routing_ratios == hand hooks ({_host})")
    def _(h=_host):
        m = injected(h)
        if h in ("vit", "timm"):
            g = torch.Generator().manual_seed(0)
            batches = [{("pixel_values" if h == "vit" else "x"): torch.randn(2, 3, 32, 32, generator=g)}]
            if h == "timm":
                got = ana.routing_ratios(_TimmKw(m), batches)
                want = hand_ratios(_TimmKw(m), batches)
            else:
                got = ana.routing_ratios(m, batches)
                want = hand_ratios(m, batches)
        else:
            batches = [ids_batch(2, 7, 0), ids_batch(1, 5, 1)]
            got = ana.routing_ratios(m, batches)
            want = hand_ratios(m, batches)
        return f"{len(got)} blocks, rel diff {cmp_dicts(got, want, 1e-4):.1e}"


class _TimmKw(torch.nn.Module):
    """timm's forward takes `x` positionally; routing_ratios calls model(**batch)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x)


@case("routing", "hook check: the attention receives x~ = x^ + W_down SiLU(W_up x^) (neox, from parameters)")
def _():
    m = injected("neox")
    w = wrappers(m)[1]
    got = {}

    def keep(key):
        def hook(mod, a, k):
            got.setdefault(key, first_tensor(a, k))

        return hook

    h1 = w.register_forward_pre_hook(keep("xh"), with_kwargs=True)
    h2 = w.base_layer.register_forward_pre_hook(keep("xt"), with_kwargs=True)
    with torch.no_grad():
        m(**ids_batch())
    h1.remove(), h2.remove()
    ps = {n.split("preproj.default.")[-1]: p.detach() for n, p in w.named_parameters() if "preproj.default." in n}
    xh = got["xh"]
    want = xh + torch.nn.functional.silu(xh @ ps["up.weight"].T) @ ps["down.weight"].T
    d = (got["xt"] - want).abs().max().item()
    check(d < 1e-5, f"max |d| {d:.2e}")
    return f"max |d| {d:.1e}"


@case("routing", "right-padded batch with attention_mask == the rows run unpadded (pads ignored)")
def _():
    m = injected("neox")
    a, b = ids_batch(1, 9, 0)["input_ids"], ids_batch(1, 5, 1)["input_ids"]
    padded = torch.zeros(2, 9, dtype=torch.long)
    padded[0], padded[1, :5] = a[0], b[0]
    mask = torch.zeros(2, 9, dtype=torch.long)
    mask[0], mask[1, :5] = 1, 1
    got = ana.routing_ratios(m, [{"input_ids": padded, "attention_mask": mask}])
    want = ana.routing_ratios(m, [{"input_ids": a}, {"input_ids": b}])
    hand = hand_ratios(m, [{"input_ids": padded, "attention_mask": mask}])
    cmp_dicts(got, hand, 1e-4)
    return f"padded vs unpadded rel {cmp_dicts(got, want, 1e-4):.1e}"


@case("routing", "left-padded batch: pads ignored (== unpadded rows)")
def _():
    m = injected("llama")
    a, b = ids_batch(1, 9, 0)["input_ids"], ids_batch(1, 5, 1)["input_ids"]
    padded = torch.zeros(2, 9, dtype=torch.long)
    padded[0], padded[1, 4:] = a[0], b[0]
    mask = torch.zeros(2, 9, dtype=torch.long)
    mask[0], mask[1, 4:] = 1, 1
    got = ana.routing_ratios(m, [{"input_ids": padded, "attention_mask": mask}])
    want = ana.routing_ratios(m, [{"input_ids": a}, {"input_ids": b}])
    return f"rel {cmp_dicts(got, want, 1e-3):.1e}"


@case("routing", "token_mask_key: a bool mask popped before the call, tokens where False ignored")
def _():
    m = injected("neox")
    b = ids_batch(2, 8, 3)
    tm = torch.zeros(2, 8, dtype=torch.bool)
    tm[:, 2:6] = True
    got = ana.routing_ratios(m, [dict(b, tm=tm)], token_mask_key="tm")
    want = hand_ratios(m, [dict(b, tm=tm)], mask_key="tm")
    allt = ana.routing_ratios(m, [b])
    check(any(rel(got[k], allt[k]) > 1e-4 for k in got), "mask had no effect")
    return f"rel {cmp_dicts(got, want, 1e-4):.1e}"


@case("routing", "a mask of the wrong shape: ValueError naming the mask")
def _():
    m = injected("neox")
    b = dict(ids_batch(2, 8), tm=torch.ones(2, 7, dtype=torch.bool))
    e = raises(lambda: ana.routing_ratios(m, [b], token_mask_key="tm"), ValueError)
    check("mask" in str(e), str(e))
    return str(e)[:90]


@case("routing", "token_mask_key absent from a batch: an error naming the key")
def _():
    m = injected("neox")
    e = raises(lambda: ana.routing_ratios(m, [ids_batch()], token_mask_key="image_mask"))
    check("image_mask" in str(e), f"{type(e).__name__}: {str(e)[:80]}")
    return f"{type(e).__name__}: {str(e)[:80]}"


@case("routing", "a mask that keeps no token of a block: an error, not a silent NaN (undocumented)")
def _():
    m = injected("neox")
    b = dict(ids_batch(2, 6), tm=torch.zeros(2, 6, dtype=torch.bool))
    try:
        out = ana.routing_ratios(m, [b], token_mask_key="tm")
    except (ValueError, RuntimeError) as e:
        return str(e)[:80]
    raise AssertionError(f"returned {out}")


@case("routing", "batching does not change the ratio (sums over tokens: one batch of 2 == two of 1)")
def _():
    m = injected("neox")
    b = ids_batch(2, 6, 4)["input_ids"]
    one = ana.routing_ratios(m, [{"input_ids": b}])
    two = ana.routing_ratios(m, [{"input_ids": b[:1]}, {"input_ids": b[1:]}])
    return f"rel {cmp_dicts(one, two, 1e-5):.1e}"


@case("routing", "ratio is of sums, not a mean of per-token ratios (docstring: sum ||.|| / sum ||.||)")
def _():
    m = injected("neox")
    batches = [ids_batch(2, 6, 5)]
    got = ana.routing_ratios(m, batches)
    want = hand_ratios(m, batches)
    return f"rel {cmp_dicts(got, want, 1e-4):.1e}"


@case("routing", "skip_rank=4 and skip-only (preproj=False) configs == hand")
def _():
    out = []
    for cfg in ({"skip_rank": 4}, {"preproj": False}):
        m = injected("llama", **cfg)
        batches = [ids_batch(2, 6, 6)]
        out.append(f"{cfg}: {cmp_dicts(ana.routing_ratios(m, batches), hand_ratios(m, batches), 1e-4):.1e}")
    return "; ".join(out)


@case("routing", "bf16 host: ratio == hand fp32 computation on the bf16 tensors (rel <= 2e-2)")
def _():
    m = mmpreproj.inject(neox(dtype=torch.bfloat16), mmpreproj.PreProjConfig())
    perturb_(m, 9)
    batches = [ids_batch(2, 8, 7)]
    got = ana.routing_ratios(m, batches)
    check(all(math.isfinite(v) for v in got.values()), f"{got}")
    return f"rel {cmp_dicts(got, hand_ratios(m, batches), 2e-2):.1e}"


@case("routing", "preproj-only model: ValueError (documented), not {}")
def _():
    m = injected("neox", skip=False)
    e = raises(lambda: ana.routing_ratios(m, [ids_batch()]), ValueError)
    return str(e)[:90]


@case("routing", "no batches: RuntimeError (documented), not {}")
def _():
    e = raises(lambda: ana.routing_ratios(injected("neox"), []), RuntimeError)
    return str(e)[:90]


@case("routing", "inside mmpreproj.adapter_disabled: RuntimeError (documented)")
def _():
    m = injected("neox")
    with mmpreproj.adapter_disabled(m):
        e = raises(lambda: ana.routing_ratios(m, [ids_batch()]), RuntimeError)
    after = ana.routing_ratios(m, [ids_batch()])
    check(len(after) == 3, f"after the block: {after}")
    return str(e)[:80]


@case("routing", "PeftModel: disable_adapter() -> RuntimeError; enabled == hand")
def _():
    pm = peft.get_peft_model(neox(), mmpreproj.PreProjConfig())
    perturb_(pm, 10)
    with pm.disable_adapter():
        raises(lambda: ana.routing_ratios(pm, [ids_batch()]), RuntimeError)
    b = [ids_batch(2, 6, 8)]
    return f"rel {cmp_dicts(ana.routing_ratios(pm, b), hand_ratios(pm, b), 1e-4):.1e}"


@case("routing", "several adapters: the active adapter's ratio (PeftModel set_adapter b)")
def _():
    pm = peft.get_peft_model(neox(), mmpreproj.PreProjConfig())
    pm.add_adapter("b", mmpreproj.PreProjConfig(skip_rank=2))
    perturb_(pm, 11)
    b = [ids_batch(2, 6, 9)]
    ra = ana.routing_ratios(pm, b)
    cmp_dicts(ra, hand_ratios(pm, b, "default"), 1e-4)
    pm.set_adapter("b")
    rb = ana.routing_ratios(pm, b)
    return f"default ok; b rel {cmp_dicts(rb, hand_ratios(pm, b, 'b'), 1e-4):.1e}"


@case("routing", "training mode restored after the call, and after a failing forward; observers removed")
def _():
    m = injected("neox")
    m.train()
    ana.routing_ratios(m, [ids_batch()])
    check(m.training and all(x.training for x in m.modules()), "not back in training mode")
    with contextlib.suppress(Exception):
        ana.routing_ratios(m, [{"input_ids": ids_batch()["input_ids"], "bogus_kw": 1}])
    check(m.training, "training flag lost after a failing forward")
    left = sum(len(getattr(w, "_observers", {})) for w in wrappers(m))
    check(left == 0, f"{left} observers left registered")
    calls = []
    for w in wrappers(m):
        w.observe(lambda *a: calls.append(1)).remove()
    m(**ids_batch())
    check(not calls, "a removed observer ran")
    return "training restored, 0 observers left"


@case("routing", "eval-mode ratio == ratio of the same model in train mode with dropout 0 (model.eval inside)")
def _():
    torch.manual_seed(0)
    cfg = GPTNeoXConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=128,
        attention_dropout=0.5,
        hidden_dropout=0.5,
    )
    m = perturb_(mmpreproj.inject(GPTNeoXForCausalLM(cfg), mmpreproj.PreProjConfig()), 12)
    m.train()
    b = [ids_batch(2, 6, 10)]
    r1, r2 = ana.routing_ratios(m, b), ana.routing_ratios(m, b)
    m.eval()
    want = hand_ratios(m, b)
    return f"deterministic under dropout: rel {cmp_dicts(r1, r2, 0):.0e}, vs eval hand {cmp_dicts(r1, want, 1e-4):.1e}"


@case("routing", "CLIP (two towers): block indices distinct across towers, default attention_mask refused in one line")
def _():
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(0)
    c = CLIPModel(
        CLIPConfig(
            text_config=dict(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                vocab_size=100,
                bos_token_id=0,
                eos_token_id=1,
                pad_token_id=1,
            ),
            vision_config=dict(
                hidden_size=32,
                num_hidden_layers=3,
                num_attention_heads=4,
                intermediate_size=64,
                image_size=32,
                patch_size=8,
            ),
            projection_dim=16,
        )
    ).eval()
    mmpreproj.inject(c, mmpreproj.PreProjConfig())
    perturb_(c, 13)
    n = ana.skip_norms(c)
    check(len(n) == len(wrappers(c)) == 5, f"{len(n)} norms for {len(wrappers(c))} wrappers")
    g = torch.Generator().manual_seed(0)
    b = {
        "input_ids": torch.randint(2, 100, (2, 5), generator=g),
        "pixel_values": torch.randn(2, 3, 32, 32, generator=g),
    }
    e = raises(lambda: ana.routing_ratios(c, [dict(b, attention_mask=torch.ones(2, 5, dtype=torch.long))]), ValueError)
    got = ana.routing_ratios(c, [b])
    want = hand_ratios(c, [b], use_attention_mask=False)
    return f"5 blocks; mask refused ({str(e)[:50]}...); no mask rel {cmp_dicts(got, want, 1e-4):.1e}"


# ================================================================================================ stats
@case("stats", "t_quantile == scipy.stats.t.ppf (df 1, 2, 5, 31, 1000; level 0.95, 0.9, 0.99) and docstring values")
def _():
    d = 0.0
    for df in (1, 2, 5, 31, 1000):
        for lv in (0.95, 0.9, 0.99):
            d = max(d, rel(st.t_quantile(df, lv), sst.t.ppf(0.5 + lv / 2, df)))
    check(d < 1e-12, f"rel {d}")
    doc = [round(st.t_quantile(k), 3) for k in (1, 2, 31)]
    check(doc == [12.706, 4.303, 2.040], f"{doc}")
    check(abs(st.t_quantile(10**6) - 1.960) < 1e-3, "large df not 1.960")
    return f"rel {d:.0e}; {doc}"


@case("stats", "t_quantile refuses df 0, -1, 1.5, True and level 0, 1, 1.5 with ValueError naming the argument")
def _():
    out = []
    for args in ((0,), (-1,), (1.5,), (True,), (3, 0.0), (3, 1.0), (3, 1.5)):
        e = raises(lambda a=args: st.t_quantile(*a), ValueError)
        check(("df" if len(args) == 1 else "level") in str(e), str(e))
        out.append(str(e)[:20])
    return f"{len(out)} refused"


@case("stats", "mean_std == numpy (mean, std ddof=1, n)")
def _():
    rng = np.random.default_rng(0)
    for n in (2, 3, 10):
        x = rng.normal(5, 2, n)
        m, s, k = st.mean_std(list(x))
        check(rel(m, x.mean()) < 1e-12 and rel(s, x.std(ddof=1)) < 1e-12 and k == n, f"n={n}: {m, s, k}")
        check(rel(s, sst.tstd(x)) < 1e-12, "not scipy.stats.tstd")
    return "ddof=1"


@case("stats", "mean_std: one value -> std 0.0 (documented); constant data -> std 0.0")
def _():
    check(st.mean_std([3.5]) == (3.5, 0.0, 1), f"{st.mean_std([3.5])}")
    m, s, n = st.mean_std([2.0, 2.0, 2.0])
    check(s == 0.0 and m == 2.0, f"{m, s}")
    return "ok"


@case("stats", "mean_std([]): ValueError")
def _():
    return str(raises(lambda: st.mean_std([]), ValueError))


@case("stats", "mean_std with a NaN: an error naming the argument, not a silent NaN (undocumented)")
def _():
    try:
        out = st.mean_std([1.0, float("nan"), 2.0])
    except ValueError as e:
        return str(e)[:80]
    raise AssertionError(f"returned {out} (silent NaN; nothing in the docstring says NaN passes through)")


@case("stats", "mean_std with an inf: an error, not inf/NaN (undocumented)")
def _():
    try:
        out = st.mean_std([1.0, float("inf")])
    except ValueError as e:
        return str(e)[:80]
    raise AssertionError(f"returned {out}")


@case("stats", "t_interval == scipy.stats.t.interval(0.95, n-1, mean, sem) for n = 2, 3, 5, 30")
def _():
    rng = np.random.default_rng(1)
    d = 0.0
    for n in (2, 3, 5, 30):
        x = rng.normal(-1, 3, n)
        lo, hi = st.t_interval(list(x))
        wlo, whi = sst.t.interval(0.95, n - 1, loc=x.mean(), scale=sst.sem(x))
        d = max(d, abs(lo - wlo), abs(hi - whi))
    check(d < 1e-10, f"max |d| {d}")
    return f"max |d| {d:.1e}"


@case("stats", "t_interval excludes 0 iff scipy ttest_1samp p < 0.05 (200 random sets)")
def _():
    rng = np.random.default_rng(2)
    bad = 0
    for _ in range(200):
        x = rng.normal(rng.normal(0, 1), 1, int(rng.integers(2, 8)))
        lo, hi = st.t_interval(list(x))
        p = sst.ttest_1samp(x, 0).pvalue
        if (lo > 0 or hi < 0) != (p < 0.05) and abs(p - 0.05) > 1e-9:
            bad += 1
    check(bad == 0, f"{bad} disagree")
    return "200 agree"


@case("stats", "t_interval: one value -> None (documented); constant diffs -> zero-width interval")
def _():
    check(st.t_interval([1.0]) is None, "n=1 not None")
    iv = st.t_interval([2.0, 2.0, 2.0])
    check(iv == (2.0, 2.0), f"{iv}")
    return f"None; {iv}"


@case("stats", "t_interval([]): ValueError")
def _():
    return str(raises(lambda: st.t_interval([]), ValueError))


@case("stats", "t_interval with a NaN: an error, not (nan, nan) (undocumented)")
def _():
    try:
        out = st.t_interval([1.0, float("nan"), 2.0])
    except ValueError as e:
        return str(e)[:80]
    raise AssertionError(f"returned {out}")


@case("stats", "t_interval coverage of the true mean ~95% (2000 sets of n=4, N(0.3, 1))")
def _():
    rng = np.random.default_rng(3)
    hits = 0
    for _ in range(2000):
        lo, hi = st.t_interval(list(rng.normal(0.3, 1, 4)))
        hits += lo <= 0.3 <= hi
    cov = hits / 2000
    check(0.935 <= cov <= 0.965, f"coverage {cov}")
    return f"coverage {cov:.3f}"


def _pairs(n_items=40, n_seeds=1, shift=0.1, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_seeds):
        b = rng.normal(3.0, 0.5, n_items)
        a = b - shift + rng.normal(0, 0.2, n_items)
        out.append((list(a), list(b)))
    return out


@case("stats", "paired_bootstrap: same seed -> same interval; other seed -> other interval")
def _():
    p = _pairs()
    a1, a2 = st.paired_bootstrap(p, "ppl.ppl", seed=5), st.paired_bootstrap(p, "ppl.ppl", seed=5)
    b = st.paired_bootstrap(p, "ppl.ppl", seed=6)
    check(a1 == a2, f"{a1} != {a2}")
    check(a1 != b, "seed ignored")
    return f"{a1}"


@case("stats", "paired_bootstrap one seed == scipy.stats.bootstrap(paired, percentile) within MC noise (ppl.ppl)")
def _():
    p = _pairs(60, 1, 0.1, 1)
    a, b = np.array(p[0][0]), np.array(p[0][1])
    got = st.paired_bootstrap(p, "ppl.ppl", n_boot=20000, seed=0)
    ref = sst.bootstrap(
        (a, b),
        lambda x, y, axis=-1: np.exp(x.mean(axis=axis)) - np.exp(y.mean(axis=axis)),
        paired=True,
        vectorized=True,
        n_resamples=20000,
        method="percentile",
        confidence_level=0.95,
        random_state=np.random.default_rng(1),
    ).confidence_interval
    width = ref.high - ref.low
    d = max(abs(got[0] - ref.low), abs(got[1] - ref.high)) / width
    check(d < 0.03, f"ours {got}, scipy ({ref.low:.4f}, {ref.high:.4f}): off by {d:.3f} of the width")
    return f"off by {d:.3f} of the width"


@case("stats", "paired_bootstrap metrics: lambada.ppl = exp(-mean), *.acc = mean (constant items: exact)")
def _():
    pairs = [([-1.0] * 5, [-2.0] * 5)]
    lo, hi = st.paired_bootstrap(pairs, "lambada.ppl")
    want = math.exp(1.0) - math.exp(2.0)
    check(abs(lo - want) < 1e-9 and abs(hi - want) < 1e-9, f"{lo, hi} != {want}")
    lo, hi = st.paired_bootstrap([([1.0] * 4, [0.0] * 4)], "hellaswag.acc")
    check(lo == hi == 1.0, f"acc {lo, hi}")
    lo, hi = st.paired_bootstrap([([2.0] * 3, [1.0] * 3)], "ppl.ppl")
    check(abs(lo - (math.e**2 - math.e)) < 1e-9, f"ppl {lo}")
    return "exact"


@case("stats", "paired_bootstrap several seeds: the mean over seeds of each seed's difference (constant items)")
def _():
    pairs = [([1.0] * 4, [0.0] * 4), ([0.0] * 6, [0.0] * 6), ([0.5] * 3, [0.0] * 3)]
    lo, hi = st.paired_bootstrap(pairs, "image.acc")
    check(abs(lo - 0.5) < 1e-12 and abs(hi - 0.5) < 1e-12, f"{lo, hi}")
    return f"({lo}, {hi})"


@case("stats", "paired_bootstrap several seeds == hand bootstrap (same scheme, independent RNG) within MC noise")
def _():
    pairs = _pairs(30, 3, 0.05, 2)
    got = st.paired_bootstrap(pairs, "ppl.ppl", n_boot=20000, seed=0)
    rng = np.random.default_rng(12345)
    tot = np.zeros(20000)
    for a, b in pairs:
        a, b = np.array(a), np.array(b)
        idx = rng.integers(0, len(a), (20000, len(a)))
        tot += np.exp(a[idx].mean(1)) - np.exp(b[idx].mean(1))
    ref = np.percentile(tot / 3, [2.5, 97.5])
    d = max(abs(got[0] - ref[0]), abs(got[1] - ref[1])) / (ref[1] - ref[0])
    check(d < 0.03, f"{got} vs {ref}")
    return f"off by {d:.3f} of the width"


@case("stats", "paired_bootstrap coverage of the true difference ~95% (300 data sets, acc metric)")
def _():
    rng = np.random.default_rng(4)
    hits = 0
    p_a, p_b = 0.6, 0.5
    for i in range(300):
        n = 200
        a = (rng.random(n) < p_a).astype(float)
        b = (rng.random(n) < p_b).astype(float)
        lo, hi = st.paired_bootstrap([(a, b)], "image.acc", n_boot=400, seed=i)
        hits += lo <= p_a - p_b <= hi
    cov = hits / 300
    check(0.91 <= cov <= 0.98, f"coverage {cov}")
    return f"coverage {cov:.3f}"


@case("stats", "paired_bootstrap refuses: no pairs, unequal lengths, empty items (ValueError)")
def _():
    raises(lambda: st.paired_bootstrap([], "ppl.ppl"), ValueError)
    raises(lambda: st.paired_bootstrap([([1.0, 2.0], [1.0])], "ppl.ppl"), ValueError)
    raises(lambda: st.paired_bootstrap([([], [])], "ppl.ppl"), ValueError)
    return "3 refused"


@case("stats", "paired_bootstrap unknown metric: an error naming the metric and the known ones")
def _():
    e = raises(lambda: st.paired_bootstrap(_pairs(5), "bogus.metric"))
    msg = str(e)
    check("bogus.metric" in msg and "ppl.ppl" in msg, f"{type(e).__name__}: {msg[:100]}")
    return msg[:80]


@case("stats", "paired_bootstrap n_boot 0 / -1: an error naming n_boot")
def _():
    out = []
    for nb in (0, -1):
        e = raises(lambda nb=nb: st.paired_bootstrap(_pairs(5), "ppl.ppl", n_boot=nb))
        check("n_boot" in str(e), f"n_boot={nb}: {type(e).__name__}: {str(e)[:80]}")
        out.append(str(e)[:40])
    return "; ".join(out)


@case("stats", "paired_bootstrap with a NaN item: an error, not (nan, nan) (undocumented)")
def _():
    try:
        out = st.paired_bootstrap([([1.0, float("nan"), 2.0], [1.0, 2.0, 3.0])], "ppl.ppl")
    except ValueError as e:
        return str(e)[:80]
    raise AssertionError(f"returned {out}")


@case("stats", "paired_bootstrap percentiles: 2.5/97.5 of the replicates (n=1 item: the one difference)")
def _():
    lo, hi = st.paired_bootstrap([([3.0], [1.0])], "arc_easy.acc")
    check(lo == hi == 2.0, f"{lo, hi}")
    return "(2.0, 2.0)"


@case("stats", "compare == hand (diff = mean of seed diffs, t interval from scipy, bootstrap, verdict words)")
def _():
    vals = {1: 200.0, 2: 203.0, 3: 199.0}
    ref = {1: 210.0, 2: 212.5, 3: 211.0, 9: 1.0}
    c = st.compare(vals, ref, method="m", reference="r", metric="ppl.ppl")
    diffs = np.array([-10.0, -9.5, -12.0])
    check(abs(c.diff - diffs.mean()) < 1e-12, f"diff {c.diff}")
    wlo, whi = sst.t.interval(0.95, 2, loc=diffs.mean(), scale=sst.sem(diffs))
    check(abs(c.seeds[0] - wlo) < 1e-9 and abs(c.seeds[1] - whi) < 1e-9, f"{c.seeds} vs {wlo, whi}")
    check(c.items is None, "items without item scores")
    check(c.beyond_noise and c.better and c.words() == "better than r, beyond the noise", c.words())
    c2 = st.compare({1: 0.5, 2: 0.6}, {1: 0.4, 2: 0.45}, method="m", reference="r", metric="lambada.acc")
    check(c2.better, "higher acc not better")
    return c.words()


@case("stats", "compare with item scores: items interval == paired_bootstrap on the shared seeds")
def _():
    p = _pairs(20, 2, 0.1, 5)
    items, ref_items = {1: p[0][0], 2: p[1][0]}, {1: p[0][1], 2: p[1][1]}
    c = st.compare(
        {1: 1.0, 2: 1.1},
        {1: 2.0, 2: 2.2},
        method="m",
        reference="r",
        metric="ppl.ppl",
        items=items,
        ref_items=ref_items,
        n_boot=500,
    )
    want = st.paired_bootstrap([p[0], p[1]], "ppl.ppl", n_boot=500)
    check(c.items == want, f"{c.items} != {want}")
    return f"{c.items}"


@case("stats", "compare: no shared seed -> ValueError; one seed -> seeds None; nothing -> within the noise")
def _():
    raises(lambda: st.compare({1: 1.0}, {2: 1.0}, method="m", reference="r", metric="ppl.ppl"), ValueError)
    c = st.compare({1: 1.0}, {1: 2.0}, method="m", reference="r", metric="ppl.ppl")
    check(c.seeds is None and c.items is None and not c.beyond_noise, f"{c}")
    check(c.words() == "within the noise of r", c.words())
    return c.words()


@case("stats", "Comparison.beyond_noise: an interval touching 0 ([0, x]) is not beyond the noise")
def _():
    c = st.Comparison("m", "r", "ppl.ppl", -1.0, (-2.0, 0.0), None)
    c2 = st.Comparison("m", "r", "ppl.ppl", -1.0, (-2.0, -0.5), (-1.5, 0.1))
    check(not c.beyond_noise and not c2.beyond_noise, "")
    return "ok"


@case("stats", "evidence mini-study: every comparison's seeds interval and diff == scipy on study.json's seeds")
def _():
    d = json.loads((ROOT / "docs/evidence/mini-study/study.json").read_text())
    groups = {g["label"]: g for g in d["groups"]}
    n = worst = 0
    for c in d["comparisons"]:
        mg = groups.get(c["method"])
        if mg is None:
            continue
        vals = {s: v[c["metric"]] for s, v in mg["seeds"].items() if c["metric"] in v}
        if c["reference"] == "baseline":
            ref = dict.fromkeys(vals, d["baseline"][c["metric"]])
        elif c["reference"] in groups:
            ref = {s: v[c["metric"]] for s, v in groups[c["reference"]]["seeds"].items() if c["metric"] in v}
        else:
            continue
        seeds = sorted(set(vals) & set(ref))
        diffs = np.array([vals[s] - ref[s] for s in seeds])
        worst = max(worst, abs(diffs.mean() - c["diff"]))
        if len(diffs) > 1 and c["seeds"] is not None:
            if diffs.std() == 0:
                want = (diffs.mean(), diffs.mean())
            else:
                want = sst.t.interval(0.95, len(diffs) - 1, loc=diffs.mean(), scale=sst.sem(diffs))
            worst = max(worst, abs(want[0] - c["seeds"][0]), abs(want[1] - c["seeds"][1]))
        ivs = [iv for iv in (c["seeds"], c["items"]) if iv is not None]
        verdict = bool(ivs) and all(lo > 0 or hi < 0 for lo, hi in ivs)
        check(verdict == c["beyond_noise"], f"{c['method']} vs {c['reference']} {c['metric']}: verdict")
        n += 1
    check(n > 10 and worst < 1e-6, f"{n} comparisons, worst |d| {worst}")
    return f"{n} comparisons, worst |d| {worst:.1e}"


@case("stats", "evidence mini-vit-probe: test_mean/test_std == mean/std(ddof=1) of test_by_seed; seeds_ci == scipy")
def _():
    d = json.loads((ROOT / "docs/evidence/mini-vit-probe/summary.json").read_text())["summary"]
    worst, n = 0.0, 0
    for s in d.values():
        x = np.array(list(s["test_by_seed"].values()))
        worst = max(worst, abs(x.mean() - s["test_mean"]), abs(x.std(ddof=1) - s["test_std"]))
        for k, v in s.items():
            if k.startswith("vs_") and isinstance(v, dict) and v.get("seeds_ci") and k[3:] in d:
                other = d[k[3:]]["test_by_seed"]
                diffs = np.array([s["test_by_seed"][t] - other[t] for t in s["test_by_seed"] if t in other])
                lo, hi = sst.t.interval(0.95, len(diffs) - 1, loc=diffs.mean(), scale=sst.sem(diffs))
                worst = max(
                    worst, abs(lo - v["seeds_ci"][0]), abs(hi - v["seeds_ci"][1]), abs(diffs.mean() - v["diff"])
                )
                n += 1
    check(worst < 1e-5 and n > 3, f"{n} intervals, worst |d| {worst}")  # test_by_seed is float32-rounded
    return f"{len(d)} arms, {n} intervals, worst |d| {worst:.1e}"


# ================================================================================================ plots
PLOTS = {
    "plot_skip_norms": lambda p: ana.plot_skip_norms({"a": [1.0, 2.0, 3.0], "b": [1.5, 1.0]}, p),
    "plot_skip_growth": lambda p: ana.plot_skip_growth({"a": [1.0, 2.0, 3.0], "paper": [1.0, 1.2], "one": [2.0]}, p),
    "plot_results": lambda p: ana.plot_results(
        {"ppl": {"a": (200.0, 3.0), "b": (210.0, 1.0)}}, p, refs={"ppl": {"a": 1}}
    ),
    "plot_lr_sweep": lambda p: ana.plot_lr_sweep(
        {"a": [(1e-3, 200.0), (1e-2, 180.0)]}, p, baseline=900.0, marks={"x": 1e-3}
    ),
    "plot_loss_curves": lambda p: ana.plot_loss_curves({"a": [([1, 2, 3], [5.0, 4.0, 3.5])]}, p),
}

for _name in PLOTS:

    @case("plots", f"{_name}: writes a PNG at the path, creating parent folders, returns the path")
    def _(name=_name):
        p = TMP / "plots" / name / "sub" / "fig.png"
        out = PLOTS[name](p)
        check(Path(out) == p and png_ok(p), f"returned {out}; png {png_ok(p)}")
        return f"{p.stat().st_size} B"


@case("plots", "plot_skip_norms: 'x = relative depth when depths differ' (docstring), 3 and 6 layers")
def _():
    with captured_figs() as rec:
        ana.plot_skip_norms({"a": [1.0, 2.0, 3.0], "b": [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]}, TMP / "depths.png")
    lines = {lab: xs for lab, xs, _ in rec[0][0][1]}
    want = {"a": [0.0, 0.5, 1.0], "b": [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]}
    ok = all(np.allclose(lines[k], v) for k, v in want.items())
    check(ok, f"x data {lines} (xlabel {rec[0][0][0]!r}); the docstring says relative depth when depths differ")
    return "relative depth"


@case("plots", "plot_results: bar heights == means, one bar per method; plot_lr_sweep: points sorted by LR")
def _():
    with captured_figs() as rec:
        ana.plot_results({"ppl": {"a": (200.0, 3.0), "b": (210.0, 1.0)}, "acc": {"a": (0.5, 0.1)}}, TMP / "bars.png")
        ana.plot_lr_sweep({"m": [(1e-2, 3.0), (1e-4, 1.0), (1e-3, 2.0)]}, TMP / "lrs.png")
    bars = [ax[2] for ax in rec[0]]
    check(bars == [[200.0, 210.0], [0.5]], f"bars {bars}")
    xs = rec[1][0][1][0][1]
    check(xs == sorted(xs), f"lr x {xs}")
    return f"bars {bars}; lrs {xs}"


@case("plots", "plot_loss_curve(run) writes run/loss_curve.png from log.jsonl; every run folder has one")
def _():
    run = CACHE.get("run_ps")
    check(run is not None, "no run folder")
    check(png_ok(Path(run) / "loss_curve.png"), "train left no loss_curve.png")
    d = TMP / "runcopy"
    shutil.copytree(run, d, dirs_exist_ok=True)
    (d / "loss_curve.png").unlink()
    out = ana.plot_loss_curve(d, heldout=(3, 5.0))
    check(Path(out) == d / "loss_curve.png" and png_ok(out), f"{out}")
    return "ok"


@case("plots", "plot_loss_curve on a folder without log.jsonl: an error naming the file, nothing written")
def _():
    d = TMP / "emptyrun"
    d.mkdir(exist_ok=True)
    e = raises(lambda: ana.plot_loss_curve(d))
    check("log.jsonl" in str(e), f"{type(e).__name__}: {str(e)[:100]}")
    check(not list(d.iterdir()), f"left {list(d.iterdir())}")
    return f"{type(e).__name__}"


@case("plots", "a display-less process with MPLBACKEND=TkAgg and pyplot imported first still writes the PNG (Agg)")
def _():
    out = TMP / "nodisplay.png"
    code = (
        "import matplotlib.pyplot as plt; from mmpreproj.analysis import plot_skip_norms; "
        f"plot_skip_norms({{'a': [1.0, 2.0]}}, {str(out)!r}); print('ok')"
    )
    env = {k: v for k, v in ENV.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["MPLBACKEND"] = "TkAgg"
    r = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    check(r.returncode == 0 and png_ok(out), f"rc {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
    return "ok"


@case("plots", "plot_skip_norms to a path that is an existing folder: an error, the folder unchanged")
def _():
    d = TMP / "is_a_dir"
    d.mkdir(exist_ok=True)
    try:
        out = ana.plot_skip_norms({"a": [1.0]}, d)
    except Exception as e:  # noqa: BLE001
        check(d.is_dir() and not list(d.iterdir()), "folder changed")
        return f"{type(e).__name__}: {str(e)[:60]}"
    beside = sorted(x.name for x in d.parent.iterdir() if x.name.startswith(d.name))
    raise AssertionError(f"no error; returned {Path(out).name!r} (a folder); written beside it: {beside}")


@case("plots", "plot_skip_norms to 'fig.txt' (docstring: save a PNG): refused or a PNG; nothing else left behind")
def _():
    p = TMP / "txtplot" / "fig.txt"
    try:
        ana.plot_skip_norms({"a": [1.0]}, p)
    except Exception as e:  # noqa: BLE001
        left = list((TMP / "txtplot").iterdir()) if (TMP / "txtplot").exists() else []
        check(not left, f"refused ({type(e).__name__}) but left {left}")
        check(not (TMP / "txtplot").exists(), f"refused ({type(e).__name__}: {str(e)[:50]}) but created the folder")
        return f"refused: {type(e).__name__}"
    check(png_ok(p), "wrote a non-PNG file")
    return "wrote a PNG"


@case("plots", "plot_skip_norms to 'fig.pdf' (docstring: save a PNG): a PNG or refused")
def _():
    p = TMP / "pdfplot.pdf"
    try:
        ana.plot_skip_norms({"a": [1.0]}, p)
    except Exception as e:  # noqa: BLE001
        check(not p.exists(), "refused but left the file")
        return f"refused: {type(e).__name__}"
    check(png_ok(p), f"wrote {p.read_bytes()[:5]!r}, not a PNG")
    return "PNG"


@case("plots", "plot_skip_norms({}) (no series): refused, no file (as plot_results refuses no panel)")
def _():
    p = TMP / "empty_series.png"
    e = raises(lambda: ana.plot_skip_norms({}, p))
    check(not p.exists(), "file written")
    return f"{type(e).__name__}: {str(e)[:60]}"


@case("plots", "plot_results({}): ValueError (documented in code), no file")
def _():
    p = TMP / "empty_results.png"
    raises(lambda: ana.plot_results({}, p), ValueError)
    check(not p.exists(), "file written")
    return "refused"


@case("plots", "plot_results with a malformed value (not (mean, std)): an error, no file left")
def _():
    p = TMP / "bad_results.png"
    raises(lambda: ana.plot_results({"ppl": {"a": 3.0}}, p))
    check(not p.exists(), "file written")
    return "refused, nothing written"


@case("plots", "plot_lr_sweep with lr <= 0 (log axis): refused, not a silently broken figure")
def _():
    p = TMP / "bad_lr.png"
    e = raises(lambda: ana.plot_lr_sweep({"a": [(0.0, 1.0), (-1.0, 2.0)]}, p))
    check(not p.exists(), "file written")
    return f"{type(e).__name__}"


@case("plots", "plot_skip_growth with a zero value (log y): refused, not a silently broken figure")
def _():
    p = TMP / "bad_growth.png"
    e = raises(lambda: ana.plot_skip_growth({"a": [0.0, 1.0]}, p))
    check(not p.exists(), "file written")
    return f"{type(e).__name__}"


@case("plots", "figures do not accumulate: 30 plots leave no new open pyplot figure")
def _():
    import matplotlib.pyplot as plt

    before = len(plt.get_fignums())
    for i in range(30):
        ana.plot_skip_norms({"a": [1.0, float(i)]}, TMP / "many" / f"{i}.png")
    check(len(plt.get_fignums()) == before, f"{len(plt.get_fignums()) - before} new figures open")
    return f"0 new ({before} open from earlier cases)"


@case("plots", "a plot that fails (bad value / unsupported format) closes its figure")
def _():
    import matplotlib.pyplot as plt

    plt.close("all")
    out = []
    for what, fn in (
        ("plot_results({'ppl': {'a': 3.0}})", lambda: ana.plot_results({"ppl": {"a": 3.0}}, TMP / "leak1.png")),
        ("plot_skip_norms(..., 'x.txt')", lambda: ana.plot_skip_norms({"a": [1.0]}, TMP / "leak2.txt")),
    ):
        with contextlib.suppress(Exception):
            fn()
        out.append(f"{what}: {len(plt.get_fignums())} open")
        plt.close("all")
    check(all(o.endswith(": 0 open") for o in out), "; ".join(out))
    return "; ".join(out)


@case("plots", "plot_skip_norms to an extension-less path 'fig': the returned path is the file written")
def _():
    p = TMP / "noext" / "fig"
    out = Path(ana.plot_skip_norms({"a": [1.0, 2.0]}, p))
    written = sorted(x.name for x in p.parent.iterdir())
    check(out.is_file(), f"returned {out.name!r}, which does not exist; the folder holds {written}")
    return f"{out.name}"


# ================================================================================================ CLI analyze
def cli(*args, timeout=300):
    r = subprocess.run(
        [PY, "-m", "mmpreproj_cli", *args], env=ENV, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT)
    )
    return r.returncode, r.stdout, r.stderr


def train_run(name, *extra):
    out = TMP / name
    rc, so, se = cli(
        "train",
        "--preset",
        "mini",
        "--steps",
        "3",
        "--warmup-steps",
        "1",
        "--lr",
        "0.05",
        "--num-lines",
        "64",
        "--save-every",
        "0",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    )
    if rc != 0:
        raise RuntimeError(f"train {name} failed: {se.strip().splitlines()[-1:]}")
    return out


def err_lines(se):
    return [ln for ln in se.strip().splitlines() if ln.strip() and "offline:" not in ln]


def mini_ratios(run, n, dtype=torch.float32):
    """The Python API on the same run: base from assets, the run's adapter, the first n test rows > 50 chars."""
    from mmpreproj.data import wikitext_lines

    cfg = json.loads((Path(run) / "train_config.json").read_text())
    tok = AutoTokenizer.from_pretrained(MINI)
    model = mmpreproj.load_adapter(AutoModelForCausalLM.from_pretrained(MINI, dtype=dtype), run)
    texts = [t for t in wikitext_lines("test", "local") if len(t.strip()) > 50][:n]
    batches = [
        {
            k: v
            for k, v in tok(t, return_tensors="pt", truncation=True, max_length=cfg["max_len"]).items()
            if k in ("input_ids", "attention_mask")
        }
        for t in texts
    ]
    return ana.routing_ratios(model, batches), hand_ratios(model, batches)


@case(
    "cli",
    "setup: five mini runs (preproj_skip, --skip-rank 4, --method preproj, --layers=-2,-1, bf16) by `mmpreproj train`",
)
def _():
    t = time.time()
    CACHE["run_ps"] = train_run("run_ps")
    CACHE["run_r4"] = train_run("run_r4", "--skip-rank", "4")
    CACHE["run_pre"] = train_run("run_pre", "--method", "preproj")
    CACHE["run_last2"] = train_run("run_last2", "--layers=-2,-1")
    CACHE["run_bf16"] = train_run("run_bf16", "--model-dtype", "bfloat16")
    return f"{time.time() - t:.0f} s"


@case("cli", "analyze RUN --texts 4 --out O: skip_norms == API == hand; routing ratios == API == hand hooks")
def _():
    run, out = CACHE["run_ps"], TMP / "an1"
    rc, so, se = cli("analyze", str(run), "--texts", "4", "--out", str(out))
    check(rc == 0, f"rc {rc}: {err_lines(se)[-1:]}")
    rep = json.loads((out / "skip_norms.json").read_text())
    e = rep[str(run)]
    norms = {int(k): v for k, v in e["skip_norms"].items()}
    cmp_dicts(norms, ana.skip_norms_from_adapter(Path(run) / "adapter"), 0)
    model = mmpreproj.load_adapter(AutoModelForCausalLM.from_pretrained(MINI), run)
    cmp_dicts(norms, hand_norms(model), 1e-6)
    api, hand = mini_ratios(run, 4)
    rr = {int(k): v for k, v in e["routing_ratios"].items()}
    d1, d2 = cmp_dicts(rr, api, 1e-5), cmp_dicts(rr, hand, 1e-4)
    for f in ("skip_norms.png", "routing_ratios.png"):
        check(png_ok(out / f), f"{f} missing")
    return f"norms exact; ratios rel {d1:.1e} (API), {d2:.1e} (hand)"


@case("cli", "analyze a --model-dtype bfloat16 run: ratios == API on the bf16 base (and == hand within 2e-2)")
def _():
    run, out = CACHE["run_bf16"], TMP / "an_bf16"
    rc, so, se = cli("analyze", str(run), "--texts", "3", "--out", str(out))
    check(rc == 0, f"rc {rc}: {err_lines(se)[-1:]}")
    rr = {int(k): v for k, v in json.loads((out / "skip_norms.json").read_text())[str(run)]["routing_ratios"].items()}
    api, hand = mini_ratios(run, 3, torch.bfloat16)
    return f"rel {cmp_dicts(rr, api, 1e-5):.1e} (API), {cmp_dicts(rr, hand, 2e-2):.1e} (hand)"


@case("cli", "analyze RUN --texts 0: no routing ratios, no routing_ratios.png; default --out = the run folder")
def _():
    src = CACHE["run_ps"]
    run = TMP / "run_ps_copy"
    shutil.copytree(src, run, dirs_exist_ok=True)
    rc, so, se = cli("analyze", str(run), "--texts", "0")
    check(rc == 0, f"rc {rc}: {err_lines(se)[-1:]}")
    rep = json.loads((run / "skip_norms.json").read_text())
    check("routing_ratios" not in rep[str(run)], "routing_ratios written with --texts 0")
    check(png_ok(run / "skip_norms.png") and not (run / "routing_ratios.png").exists(), "files")
    return "ok"


@case("cli", "analyze on a --skip-rank 4 run: norms == hand ||B A||_F")
def _():
    run, out = CACHE["run_r4"], TMP / "an_r4"
    rc, so, se = cli("analyze", str(run), "--texts", "0", "--out", str(out))
    check(rc == 0, f"rc {rc}: {err_lines(se)[-1:]}")
    norms = {int(k): v for k, v in json.loads((out / "skip_norms.json").read_text())[str(run)]["skip_norms"].items()}
    model = mmpreproj.load_adapter(AutoModelForCausalLM.from_pretrained(MINI), run)
    return f"rel {cmp_dicts(norms, hand_norms(model), 1e-6):.1e}"


@case("cli", "analyze two runs: one entry per run in one JSON at --out, both == API")
def _():
    a, b, out = CACHE["run_ps"], CACHE["run_r4"], TMP / "an_two"
    rc, so, se = cli("analyze", str(a), str(b), "--texts", "0", "--out", str(out))
    check(rc == 0, f"rc {rc}: {err_lines(se)[-1:]}")
    rep = json.loads((out / "skip_norms.json").read_text())
    check(set(rep) == {str(a), str(b)}, f"{list(rep)}")
    for r in (a, b):
        cmp_dicts(
            {int(k): v for k, v in rep[r if isinstance(r, str) else str(r)]["skip_norms"].items()},
            ana.skip_norms_from_adapter(Path(r) / "adapter"),
            0,
        )
    return "ok"


@case("cli", "analyze a --layers=-2,-1 run: JSON keys 2, 3 (== API); the figures put blocks 2, 3 at x = 2, 3")
def _():
    from mmpreproj_cli.command import main as cli_main

    run, out = CACHE["run_last2"], TMP / "an_last2"
    with captured_figs() as rec, contextlib.redirect_stdout(open(os.devnull, "w")):
        rc = cli_main(["analyze", str(run), "--texts", "2", "--out", str(out)])
    check(rc == 0, f"rc {rc}")
    e = json.loads((out / "skip_norms.json").read_text())[str(run)]
    check(sorted(e["skip_norms"]) == ["2", "3"] and sorted(e["routing_ratios"]) == ["2", "3"], f"keys {list(e)}")
    api, _ = mini_ratios(run, 2)
    cmp_dicts({int(k): v for k, v in e["routing_ratios"].items()}, api, 1e-5)
    xs = [fig[0][1][0][1] for fig in rec]
    check(
        all(x == [2.0, 3.0] for x in xs), f"x data of the {len(rec)} figures: {xs} (x label 'layer'), blocks are 2, 3"
    )
    return f"x {xs}"


def _refused(args, flag_words, out=None):
    rc, so, se = cli(*args, timeout=120)
    lines = err_lines(se)
    check(rc != 0, f"rc 0 (stdout {so.strip()[:80]})")
    check(len(lines) == 1, f"{len(lines)} lines: {lines[-2:]}")
    check(any(w in lines[0] for w in flag_words), f"does not name {flag_words}: {lines[0][:120]}")
    check("Traceback" not in se, "traceback")
    if out is not None and Path(out).exists():
        raise AssertionError(
            f"refused in one line ({lines[0][:60]}...) but {Path(out).name}/ was created, holding "
            f"{sorted(x.name for x in Path(out).iterdir())}"
        )
    return f"rc {rc}: {lines[0][:90]}"


@case("cli", "analyze a missing folder: one line naming it, rc != 0, --out not created")
def _():
    return _refused(["analyze", str(TMP / "nope"), "--out", str(TMP / "out_missing")], ["nope"], TMP / "out_missing")


@case("cli", "analyze --texts -1: one line naming --texts, rc != 0, nothing written")
def _():
    return _refused(
        ["analyze", str(CACHE["run_ps"]), "--texts", "-1", "--out", str(TMP / "out_neg")], ["--texts"], TMP / "out_neg"
    )


@case("cli", "analyze --texts abc: one line naming --texts")
def _():
    return _refused(
        ["analyze", str(CACHE["run_ps"]), "--texts", "abc", "--out", str(TMP / "out_abc")],
        ["--texts"],
        TMP / "out_abc",
    )


@case("cli", "analyze a folder that is not a run (a text file inside): one line, rc != 0, --out not created")
def _():
    d = TMP / "notrun"
    d.mkdir(exist_ok=True)
    (d / "x.txt").write_text("x")
    return _refused(
        ["analyze", str(d), "--out", str(TMP / "out_notrun")], ["notrun", "run folder"], TMP / "out_notrun"
    )


@case("cli", "analyze a run without a skip (method preproj): one line, rc != 0, --out not created")
def _():
    return _refused(
        ["analyze", str(CACHE["run_pre"]), "--texts", "0", "--out", str(TMP / "out_pre")], ["skip"], TMP / "out_pre"
    )


@case("cli", "analyze a good run then a skip-less one: refused, nothing written at --out")
def _():
    return _refused(
        ["analyze", str(CACHE["run_ps"]), str(CACHE["run_pre"]), "--texts", "0", "--out", str(TMP / "out_mixed")],
        ["skip"],
        TMP / "out_mixed",
    )


@case("cli", "analyze --out pointing at an existing file: one line naming --out")
def _():
    f = TMP / "afile.txt"
    f.write_text("keep")
    r = _refused(["analyze", str(CACHE["run_ps"]), "--texts", "0", "--out", str(f)], ["--out"])
    check(f.read_text() == "keep", "file changed")
    return r


@case("cli", "analyze an adapter folder (not a run) with --texts 4: works, or one line saying a run folder is needed")
def _():
    ad, out = Path(CACHE["run_ps"]) / "adapter", TMP / "out_adapter"
    rc, so, se = cli("analyze", str(ad), "--texts", "4", "--out", str(out))
    lines = err_lines(se)
    if rc == 0:
        return "works"
    check(len(lines) == 1 and "Traceback" not in se, f"rc {rc}, {len(lines)} lines: {lines[-1:]}")
    return f"refused: {lines[0][:80]}"


@case("cli", "analyze --help lists runs, --out, --texts, --data-source")
def _():
    rc, so, se = cli("analyze", "--help", timeout=60)
    check(rc == 0 and all(w in so for w in ("--out", "--texts", "--data-source", "runs")), so[:200])
    return "ok"


# ================================================================================================ main
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    t0 = time.time()
    order = [c for c in CASES if c[0] == "cli" and c[1].startswith("setup")] + [
        c for c in CASES if not (c[0] == "cli" and c[1].startswith("setup"))
    ]
    for area, name, fn in order:
        label = f"{area} | {name}"
        if args.only and args.only not in label and not (area == "cli" and name.startswith("setup")):
            continue
        try:
            with contextlib.redirect_stderr(open(os.devnull, "w")):
                detail = fn()
            ok = True
        except AssertionError as err:
            ok, detail = False, str(err)
        except Exception as err:  # noqa: BLE001
            ok = False
            tb = traceback.extract_tb(err.__traceback__)[-1]
            first = (str(err).strip().splitlines() or [""])[0][:150]
            detail = f"CRASH {type(err).__name__}: {first} @ {Path(tb.filename).name}:{tb.lineno}"
        RESULTS.append(ok)
        print(f"{'PASS' if ok else 'FAIL'} | {label} | {detail}", flush=True)
    n, p = len(RESULTS), sum(RESULTS)
    print(f"TOTAL {n}: {p} PASS, {n - p} FAIL ({time.time() - t0:.0f} s)")
    shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    main()
