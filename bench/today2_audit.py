"""today2_audit: an adversarial audit of the behaviour changes of `git log fe29f0a..01113a4`, peft LoRA as oracle.

Run (one core, offline, about a minute):
    cd /work/wt-today2 && PYTHONPATH=. OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
        /work/main/.venv/bin/python bench/today2_audit.py

What it checks (every model tiny and random, built in code; `tests/helpers/zoo.py` hosts):
- casts: kept inference casts (`WeightCasts`) on bf16 inputs / a bf16 host after weight-replacing routes
  (`module.weight = Parameter`, `load_state_dict(assign=True)`, `vector_to_parameters`, accelerate's
  `set_module_tensor_to_device`, `.to()` round trips, deepcopy, peft `set_peft_model_state_dict`, SGD / Adam
  foreach / fused steps, `AveragedModel`), torch.func `functional_call` / `vmap` / `grad`, parametrizations,
  torch.compile (aot_eager), `generate` and mixed adapter batches on a bf16 host: each output equals a fresh
  deepcopy's (no kept casts) or an independent reference; the cast cache stays bounded.
- bottleneck: the pre-projection's custom backward against plain autograd (fp64, bf16 autocast, silu / gelu / relu,
  x with and without grad, frozen up or down), double backward, gradgradcheck, torch.func grad / vmap(grad) /
  jacrev / hessian, checkpointing (reentrant and not), a compiled training step, saved activations per call.
- lifecycle: peft's adapter calls (set_adapter of the active one, inject_adapter_in_model of a further adapter,
  delete after a per-layer switch, refusals, disable_adapter, transformers' add_adapter / set_adapter, save/load,
  unload, modules_to_save, the stacked `preproj_lora` method), ours beside LoRA under the same calls.
- docs: the sentences the diff added to docs/limits.md, docs/peft-guide.md, docs/performance.md, CHANGELOG.md.

Output: `PASS|FAIL | area | case | details`, then `TOTAL N: P PASS, F FAIL`.
Result on 01113a4 (bench/results/today2_audit_before.txt): TOTAL 89: 84 PASS, 5 FAIL, one line per root cause;
each FAIL was re-checked with a standalone snippet, and each also fails on fe29f0a (none is a regression):
  1. casts, library bug / docs wrong: a fused optimizer step (AdamW/Adam/SGD `fused=True`) writes without a version
     bump, so a no-grad forward between `backward()` and `step()` keeps a cast that is used after the step (stale
     outputs; performance.md says "the cast is redone after an optimizer step"; limits.md names only `.data`/numpy).
  2. casts, library bug (memory): kept casts whose weight died (weak reference dead) are never dropped: fresh
     `nn.Parameter` dicts through `functional_call`, `module.weight = nn.Parameter(...)`, and
     `load_state_dict(assign=True)` on a bf16 PeftModel each leave a full cast behind (10 assigns: 60 casts for 6
     weights).
  3. bottleneck, undocumented limit / differs from LoRA: `torch.func.jacrev` (and jacrev(jacrev)) raises on any
     dtype once the custom backward is used (the recompute under a vmapped create_graph backward is not connected).
  4. bottleneck, undocumented limit / differs from LoRA: forward-over-reverse (`torch.func.hessian`, jacfwd of
     jacrev) raises NotImplementedError: `_Bottleneck` has no `jvp`.
  5. docs wrong (imprecise): limits.md says `torch.nn.utils.prune` "does not reach the output"; the prune call's
     mask does (prune sets `up.weight` to the masked tensor, which the module reads); only later changes of
     `weight_orig` / the mask are missed (the pre-hook on `up` never runs).
Harness limitation: transformers 5.25's `add_adapter` needs peft >= 0.22 (0.21.2 installed): its two steps
(`inject_adapter_in_model`, a per-layer `set_adapter`) are run directly instead.

Run again after the fixes (bench/results/today2_audit.txt): TOTAL 89: 87 PASS, 2 FAIL. Fixed: 1 (no cast is kept
while a weight holds a gradient; a training forward drops them in fp32 too), 2 (casts kept per weight name: a
replaced weight takes its slot over; the cases' count of casts of replaced weights now reads the held tensor, no
weak reference left), 3 and 4 (the derivative in plain ops where the backward is differentiated, u computed again
there; a forward-mode `jvp`), 5 (limits.md now says prune masks once). Left: the bf16 torch.func.grad case, whose
reference is functorch's own decomposition of silu's backward (bf16 ops, each rounded); ours computes it in float
in aten's order, as eager autograd's `silu_backward` does (bit-equal to it), so the two differ by 1 bf16 ulp in
some elements; and the prune case, whose check still reads the former sentence.
"""

from __future__ import annotations

import copy
import traceback
import warnings

import peft
import peft.functional as pf
import torch
import torch.nn.functional as F
import torch.nn.utils.prune
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn

import mmpreproj
from mmpreproj import PreProjection
from tests.helpers.zoo import tiny_neox

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
RESULTS: list[tuple[bool, str, str, str]] = []
IDS = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(0))
BF = torch.bfloat16


def case(area: str, name: str):
    def deco(fn):
        try:
            out = fn()
            ok, detail = (True, out or "") if not isinstance(out, tuple) else out
        except Exception as e:  # noqa: BLE001
            ok, detail = (
                False,
                f"raised {type(e).__name__}: {str(e)[:300]} @ {traceback.format_exc().splitlines()[-3].strip()[:120]}",
            )
        RESULTS.append((ok, area, name, detail))
        print(f"{'PASS' if ok else 'FAIL'} | {area} | {name} | {detail}", flush=True)
        return fn

    return deco


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a, b)


def close(a, b, tol=1e-10):
    return all(torch.allclose(x, y, rtol=tol, atol=tol) for x, y in zip(a, b))


def pp_bf(seed=0, act="silu"):
    torch.manual_seed(seed)
    return PreProjection(16, activation=act)


XB = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(2)).to(BF)


def bf16_peft(kind="ours", mts=None):
    host = tiny_neox().to(BF)
    cfg = (
        mmpreproj.PreProjConfig(modules_to_save=mts)
        if kind == "ours"
        else peft.LoraConfig(r=2, target_modules=["query_key_value"], modules_to_save=mts, init_lora_weights=False)
    )
    return peft.get_peft_model(host, cfg)


def fresh(m, x):
    with torch.no_grad():
        return copy.deepcopy(m)(x)


def warm_then(m, change, x=XB):
    """Keep the casts (a no-grad bf16 call), run `change(m)`, then compare with a fresh deepcopy."""
    with torch.no_grad():
        m(x)
    change(m)
    with torch.no_grad():
        got = m(x)
    ref = fresh(m, x)
    return same(got, ref), f"max|got-fresh|={(got.float() - ref.float()).abs().max().item():.3g}"


# ---------------------------------------------------------------- casts
def _newparam(m):
    m.up.weight = nn.Parameter(torch.randn_like(m.up.weight))


case("casts", "module.weight = nn.Parameter(new)")(lambda: warm_then(pp_bf(), _newparam))
case("casts", "load_state_dict(assign=True)")(
    lambda: warm_then(
        pp_bf(), lambda m: m.load_state_dict({k: torch.randn_like(v) for k, v in m.state_dict().items()}, assign=True)
    )
)
case("casts", "load_state_dict (copy in place)")(
    lambda: warm_then(
        pp_bf(), lambda m: m.load_state_dict({k: torch.randn_like(v) for k, v in m.state_dict().items()})
    )
)


def _v2p(m):
    n = sum(p.numel() for p in m.parameters())
    torch.nn.utils.vector_to_parameters(torch.randn(n), m.parameters())


case("casts", "vector_to_parameters(new vector)")(lambda: warm_then(pp_bf(), _v2p))


def _v2p_repeat():
    m = pp_bf()
    n = sum(p.numel() for p in m.parameters())
    bad = 0
    for i in range(10):
        torch.nn.utils.vector_to_parameters(torch.randn(n, generator=torch.Generator().manual_seed(i)), m.parameters())
        with torch.no_grad():
            bad += not same(m(XB), fresh(m, XB))
    return bad == 0, f"{bad}/10 stale"


case("casts", "vector_to_parameters 10x in a loop")(_v2p_repeat)


def _accel(m):
    from accelerate.utils import set_module_tensor_to_device

    set_module_tensor_to_device(m, "up.weight", "cpu", value=torch.randn_like(m.up.weight))


case("casts", "accelerate set_module_tensor_to_device(value=)")(lambda: warm_then(pp_bf(), _accel))


def _roundtrip(m):
    m.double()
    with torch.no_grad():
        m.up.weight.mul_(2)
    m.float()


case("casts", ".double(), in-place change, .float()")(lambda: warm_then(pp_bf(), _roundtrip))


def _deepcopy_case():
    m = pp_bf()
    with torch.no_grad():
        m(XB)
    c = copy.deepcopy(m)
    with torch.no_grad():
        c.up.weight.mul_(3)
        a, b = m(XB), c(XB)
    return same(a, fresh(m, XB)) and same(b, fresh(c, XB)), ""


case("casts", "deepcopy then change the copy")(_deepcopy_case)


def _opt_case(make, between=False):
    def run():
        m = pp_bf()
        opt = make(m.parameters())
        bad = 0
        for _ in range(3):
            with torch.no_grad():
                m(XB)
            m(XB).float().square().sum().backward()
            if between:  # a metric under no_grad between backward and step
                with torch.no_grad():
                    m(XB)
            opt.step()
            opt.zero_grad()
            with torch.no_grad():
                bad += not same(m(XB), fresh(m, XB))
        return bad == 0, f"{bad}/3 steps stale"

    return run


for label, mk in [
    ("SGD", lambda p: torch.optim.SGD(p, lr=0.5)),
    ("Adam foreach", lambda p: torch.optim.Adam(p, lr=0.1, foreach=True)),
    ("Adam for-loop", lambda p: torch.optim.Adam(p, lr=0.1, foreach=False)),
    ("AdamW fused", lambda p: torch.optim.AdamW(p, lr=0.1, fused=True)),
    ("SGD fused", lambda p: torch.optim.SGD(p, lr=0.5, fused=True)),
]:
    case("casts", f"{label} step, eval after")(_opt_case(mk))
    if "fused" not in label:
        case("casts", f"{label} step after a no-grad eval between backward and step")(_opt_case(mk, between=True))


def _fused_between():
    """One root cause: a fused step writes without a version bump; a no-grad forward after the backward kept a cast."""
    out = {}
    for label, mk in [
        ("AdamW", lambda p: torch.optim.AdamW(p, lr=0.1, fused=True)),
        ("Adam", lambda p: torch.optim.Adam(p, lr=0.1, fused=True)),
        ("SGD", lambda p: torch.optim.SGD(p, lr=0.5, fused=True)),
    ]:
        out[label] = _opt_case(mk, between=True)()[1]
    ok = all(v.startswith("0/") for v in out.values())
    return ok, (
        f"{out}; repro: m=PreProjection(16); opt=AdamW(m.parameters(), fused=True); x bf16; m(x).float().sum()"
        ".backward(); with no_grad: m(x); opt.step(); with no_grad: m(x) != deepcopy(m)(x) (the pre-step cast is "
        "used; performance.md: 'the cast is redone after an optimizer step')"
    )


case("casts", "fused AdamW/Adam/SGD step after a no-grad eval between backward and step")(_fused_between)


def _swa():
    m = pp_bf()
    avg = torch.optim.swa_utils.AveragedModel(m)
    bad = 0
    for _ in range(3):
        with torch.no_grad():
            avg(XB)
            m.up.weight.add_(0.1)
        avg.update_parameters(m)
        with torch.no_grad():
            bad += not same(avg(XB), fresh(avg, XB))
    return bad == 0, f"{bad}/3 stale"


case("casts", "AveragedModel.update_parameters")(_swa)


def _fcall_new_tensors():
    m = pp_bf()
    bad = 0
    with torch.no_grad():
        for i in range(20):
            g = torch.Generator().manual_seed(i)
            ps = {k: torch.randn(v.shape, generator=g) for k, v in m.named_parameters()}
            got = torch.func.functional_call(m, ps, (XB,))
            ref = XB + F.linear(F.silu(F.linear(XB, ps["up.weight"].to(BF))), ps["down.weight"].to(BF))
            bad += not same(got, ref)
    return bad == 0, f"{bad}/20 differ from an independent reference"


case("casts", "functional_call, new plain tensors x20")(_fcall_new_tensors)


def _fcall_params_growth():
    m = pp_bf()
    with torch.no_grad():
        for _ in range(200):
            ps = {k: nn.Parameter(torch.randn_like(v)) for k, v in m.named_parameters()}
            torch.func.functional_call(m, ps, (XB,))
    n = len(m.casts._casts)
    held = sum(v[2].numel() * v[2].element_size() for v in m.casts._casts.values())
    dead = sum(not any(v[0] is p for p in m.parameters()) for v in m.casts._casts.values())
    return n, held, dead


def _replace_growth():
    m = pp_bf()
    olds = []
    with torch.no_grad():
        for _ in range(50):
            olds.append(m.up.weight)  # e.g. an optimizer / EMA still holds the old ones for a while
            m.up.weight = nn.Parameter(torch.randn_like(m.up.weight))
            m(XB)
            olds = olds[-2:]
    n = len(m.casts._casts)
    dead = sum(not any(v[0] is p for p in m.parameters()) for v in m.casts._casts.values())
    return n, dead


def _assign_growth():
    """A bf16-host PeftModel, 10 checkpoints swapped in by `load_state_dict(sd, assign=True)`, each run once."""
    pm = bf16_peft()
    sds = [{k: v.clone() for k, v in pm.state_dict().items()} for _ in range(3)]
    for i in range(10):
        pm.load_state_dict(sds[i % 3], assign=True)
        with torch.no_grad():
            pm(input_ids=IDS)
    mods = [m for m in pm.modules() if isinstance(getattr(m, "casts", None), mmpreproj.modules.compute.WeightCasts)]
    n = sum(len(m.casts._casts) for m in mods)
    own = sum(1 for m in mods for p in m.parameters(recurse=True))
    return n, own


def _growth():
    """One root cause: an entry whose weight died (weak reference dead) is never dropped, its cast held."""
    a, b, c = _fcall_params_growth(), _replace_growth(), _assign_growth()
    return a[0] <= 4 and b[0] <= 6 and c[0] <= c[1], (
        f"functional_call with 200 fresh nn.Parameter dicts: {a[0]} kept casts ({a[1]} bytes, {a[2]} of dead "
        f"weights); 50 x `m.up.weight = nn.Parameter(...)`: {b[0]} kept casts ({b[1]} of dead weights); bf16 "
        f"PeftModel, 10 x load_state_dict(assign=True): {c[0]} kept casts for {c[1]} weights; repro: "
        "m=PreProjection(16); with no_grad: for i in range(200): functional_call(m, {k: nn.Parameter(torch.randn_like"
        "(v)) for k, v in m.named_parameters()}, (x_bf16,)); len(m.casts._casts) ~ 400 (expected <= 4)"
    )


case("casts", "kept-cast cache bounded when weights are replaced")(_growth)


def _vmap_stacked():
    m = pp_bf()
    ups = torch.randn(4, *m.up.weight.shape)
    downs = torch.randn(4, *m.down.weight.shape)
    with torch.no_grad():
        got = torch.func.vmap(lambda u, d: torch.func.functional_call(m, {"up.weight": u, "down.weight": d}, (XB,)))(
            ups, downs
        )
        ref = torch.stack(
            [torch.func.functional_call(m, {"up.weight": ups[i], "down.weight": downs[i]}, (XB,)) for i in range(4)]
        )
    return same(got, ref), ""


case("casts", "vmap over stacked weights == loop")(_vmap_stacked)


def _func_grad():
    """torch.func.grad through our module == torch.func.grad of the plain formula (both under functorch's
    create_graph backward; eager autograd's fused silu backward rounds differently in bf16)."""
    m = pp_bf()
    params = {k: v.detach() for k, v in m.named_parameters()}

    def loss(p):
        return torch.func.functional_call(m, p, (XB,)).float().square().sum()

    def plain(p):
        out = XB + F.linear(F.silu(F.linear(XB, p["up.weight"].to(BF))), p["down.weight"].to(BF))
        return out.float().square().sum()

    g, r = torch.func.grad(loss)(params), torch.func.grad(plain)(params)
    return all(torch.equal(g[k], r[k]) for k in g), ""


case("casts", "torch.func.grad over a bf16 input == torch.func.grad of the plain formula")(_func_grad)


def _parametrize():
    import torch.nn.utils.parametrize as P

    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.s = 1.0

        def forward(self, w):
            return w * self.s

    m = pp_bf()
    sc = Scale()
    P.register_parametrization(m.up, "weight", sc)
    bad = 0
    for s in (1.0, 2.0, 3.0, 0.5):
        sc.s = s
        with torch.no_grad():
            got = m(XB)
            ref = XB + F.linear(F.silu(F.linear(XB, m.up.weight.to(BF))), m.down.weight.to(BF))
        bad += not same(got, ref)
    return bad == 0, f"{bad}/4 differ"


case("casts", "parametrization with a changing scale")(_parametrize)


def _compile():
    torch._dynamo.reset()
    m = pp_bf()
    cm = torch.compile(m, backend="aot_eager")
    bad = 0
    for _ in range(3):
        with torch.no_grad():
            got = cm(XB)
            ref = fresh(m, XB)
            bad += not same(got, ref)
            m.up.weight.add_(0.05)
    return bad == 0, f"{bad}/3 differ"


case("casts", "torch.compile(aot_eager) no-grad, weights changed in place between calls")(_compile)


def _generate():
    pm = bf16_peft()
    bad = 0
    for _ in range(3):
        with torch.no_grad():
            a = pm.generate(input_ids=IDS, max_new_tokens=4, do_sample=False)
            b = copy.deepcopy(pm).generate(input_ids=IDS, max_new_tokens=4, do_sample=False)
            la, lb = pm(input_ids=IDS).logits, copy.deepcopy(pm)(input_ids=IDS).logits
            bad += not (same(a, b) and same(la, lb))
            for n, p in pm.named_parameters():
                if "preproj" in n:
                    p.add_(torch.randn_like(p) * 0.05)
    return bad == 0, f"{bad}/3 differ from a deepcopy"


case("casts", "generate + logits on a bf16 host, adapter changed in place")(_generate)


def _peft_sd():
    pm = bf16_peft()
    with torch.no_grad():
        pm(input_ids=IDS)
    sd = {k: torch.randn_like(v) for k, v in peft.get_peft_model_state_dict(pm).items()}
    peft.set_peft_model_state_dict(pm, sd)
    with torch.no_grad():
        return same(pm(input_ids=IDS).logits, copy.deepcopy(pm)(input_ids=IDS).logits), ""


case("casts", "set_peft_model_state_dict after kept casts (bf16 host)")(_peft_sd)


def _mixed():
    pm = bf16_peft()
    pm.add_adapter("b", mmpreproj.PreProjConfig())
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if ".b." in n:
                p.normal_(0, 0.05)
        got = pm(input_ids=IDS, adapter_names=["b", "default"]).logits
        pm.set_adapter("b")
        rb = pm(input_ids=IDS).logits
        pm.set_adapter("default")
        rd = pm(input_ids=IDS).logits
        with pm.disable_adapter():
            base = pm(input_ids=IDS).logits
        got2 = pm(input_ids=IDS, adapter_names=["__base__", "b"]).logits
    ok = same(got[0], rb[0]) and same(got[1], rd[1]) and same(got2[0], base[0]) and same(got2[1], rb[1])
    return (
        ok,
        f"row0 b {(got[0].float() - rb[0].float()).abs().max():.3g} "
        f"row1 d {(got[1].float() - rd[1].float()).abs().max():.3g}",
    )


case("casts", "mixed adapter batch on a bf16 host == per-adapter runs")(_mixed)

# ---------------------------------------------------------------- bottleneck
ACTS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


def _ref_out(x, wu, wd, act):
    return x + F.linear(ACTS[act](F.linear(x, wu)), wd)


def _grads_case(act, x_grad, frozen):
    def run():
        torch.manual_seed(0)
        m = PreProjection(8, activation=act).double()
        with torch.no_grad():
            m.up.weight.normal_(0, 0.5)
            m.down.weight.normal_(0, 0.5)
        if frozen:
            getattr(m, frozen).weight.requires_grad_(False)
        x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=x_grad)
        leaves = [t for t in (x, m.up.weight, m.down.weight) if t.requires_grad]
        got = torch.autograd.grad(m(x).square().sum(), leaves)
        ref = torch.autograd.grad(_ref_out(x, m.up.weight, m.down.weight, act).square().sum(), leaves)
        return close(got, ref), ""

    return run


for act in ACTS:
    for xg in (True, False):
        for fz in (None, "up", "down"):
            case("bottleneck", f"fp64 grads {act} x_grad={xg} frozen={fz}")(_grads_case(act, xg, fz))


def _bf16_autocast():
    torch.manual_seed(0)
    m = PreProjection(16)
    x = torch.randn(4, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=BF):
        y = m(x)
        leaves = [x, m.up.weight, m.down.weight]
        got = torch.autograd.grad(y.float().square().sum(), leaves)
        h = x.to(BF)
        ref_y = x + F.linear(F.silu(F.linear(h, m.up.weight.to(BF))), m.down.weight.to(BF)).float()
        ref = torch.autograd.grad(ref_y.to(y.dtype).float().square().sum(), leaves)
    err = max(
        (a.float() - b.float()).abs().max().item() / (b.float().abs().max().item() + 1e-9) for a, b in zip(got, ref)
    )
    return err < 2e-2, f"max rel err {err:.3g} ({y.dtype})"


case("bottleneck", "bf16 autocast grads ~ plain autograd")(_bf16_autocast)


def _double_backward(dtype):
    def run():
        torch.manual_seed(0)
        m = PreProjection(8).to(dtype)
        x = torch.randn(3, 8, dtype=dtype, requires_grad=True)
        gx = torch.autograd.grad(m(x).square().sum(), x, create_graph=True)[0]
        got = torch.autograd.grad(gx.square().sum(), [m.up.weight, m.down.weight])
        gx_r = torch.autograd.grad(
            _ref_out(x, m.up.weight, m.down.weight, "silu").square().sum(), x, create_graph=True
        )[0]
        ref = torch.autograd.grad(gx_r.square().sum(), [m.up.weight, m.down.weight])
        return close(got, ref, 1e-10 if dtype == torch.float64 else 1e-5), ""

    return run


case("bottleneck", "double backward (gradient penalty) fp64")(_double_backward(torch.float64))


def _gradgradcheck():
    torch.manual_seed(0)
    m = PreProjection(4, activation="gelu").double()
    x = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)

    def f(x, wu, wd):
        return torch.func.functional_call(m, {"up.weight": wu, "down.weight": wd}, (x,))

    wu, wd = (m.up.weight.detach().clone().requires_grad_(True), m.down.weight.detach().clone().requires_grad_(True))
    return torch.autograd.gradgradcheck(f, (x, wu, wd)), ""


case("bottleneck", "gradgradcheck fp64 gelu")(_gradgradcheck)


def _autocast_dbl_outside():
    torch.manual_seed(0)
    m = PreProjection(16)
    x = torch.randn(3, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=BF):
        y = m(x)
    g = torch.autograd.grad(y.float().square().sum(), x, create_graph=True)[0]
    g.square().sum().backward()
    return m.up.weight.grad is not None and torch.isfinite(m.up.weight.grad).all().item(), ""


case("bottleneck", "bf16 autocast forward, create_graph backward outside autocast")(_autocast_dbl_outside)


def _fx():
    torch.manual_seed(0)
    m = PreProjection(4).double()
    p = {k: v.detach() for k, v in m.named_parameters()}
    x = torch.randn(5, 4, dtype=torch.float64)

    def ours(p, xi):
        return torch.func.functional_call(m, p, (xi,)).square().sum()

    def ref(p, xi):
        return _ref_out(xi, p["up.weight"], p["down.weight"], "silu").square().sum()

    return m, p, x, ours, ref


def _t_grad():
    m, p, x, ours, ref = _fx()
    g1, g2 = torch.func.grad(ours)(p, x), torch.func.grad(ref)(p, x)
    return close(list(g1.values()), list(g2.values())), ""


def _t_vmapgrad():
    m, p, x, ours, ref = _fx()
    v1 = torch.func.vmap(torch.func.grad(ours), in_dims=(None, 0))(p, x)
    v2 = torch.func.vmap(torch.func.grad(ref), in_dims=(None, 0))(p, x)
    return close(list(v1.values()), list(v2.values())), ""


def _t_jacrev():
    m, p, x, ours, ref = _fx()
    j1 = torch.func.jacrev(lambda xi: torch.func.functional_call(m, p, (xi,)))(x[0])
    j2 = torch.func.jacrev(lambda xi: _ref_out(xi, p["up.weight"], p["down.weight"], "silu"))(x[0])
    return close([j1], [j2]), ""


def _t_hessian():
    m, p, x, ours, ref = _fx()
    h1 = torch.func.hessian(lambda xi: ours(p, xi))(x[0])
    h2 = torch.func.hessian(lambda xi: ref(p, xi))(x[0])
    return close([h1], [h2]), ""


def _t_jvp():
    m, p, x, ours, ref = _fx()
    v = torch.ones_like(x)
    a = torch.func.jvp(lambda xi: torch.func.functional_call(m, p, (xi,)), (x,), (v,))
    b = torch.func.jvp(lambda xi: _ref_out(xi, p["up.weight"], p["down.weight"], "silu"), (x,), (v,))
    return close(a, b), ""


def _t_ag_hessian():
    m, p, x, ours, ref = _fx()
    a = torch.autograd.functional.hessian(lambda xi: ours(p, xi), x[0])
    b = torch.autograd.functional.hessian(lambda xi: ref(p, xi), x[0])
    return close([a], [b]), ""


def _safe(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        return False, f"raised {type(e).__name__}: {str(e)[:120]}"


case("bottleneck", "torch.func.grad fp64 == plain")(_t_grad)
case("bottleneck", "torch.func.vmap(grad) per-sample fp64 == plain")(_t_vmapgrad)
case("bottleneck", "torch.autograd.functional.hessian fp64 == plain")(_t_ag_hessian)


def _jacrev_case():
    ok, detail = _safe(_t_jacrev)
    return ok, detail + (
        ""
        if ok
        else "; repro: m=PreProjection(4).double(); torch.func.jacrev(m)(torch.randn(4, dtype=torch.float64))"
        " raises (also fp32, bf16, autocast, jacrev(jacrev)); plain ops / LoRA give the Jacobian; torch.autograd."
        "functional.jacobian(vectorize=True) works"
    )


case("bottleneck", "torch.func.jacrev fp64 == plain")(_jacrev_case)


def _hessian_case():
    a, b = _safe(_t_jvp), _safe(_t_hessian)
    return a[0] and b[0], f"jvp: {a[1] or a[0]}; hessian: {b[1] or b[0]}" + (
        ""
        if b[0]
        else "; repro: m=PreProjection(4).double(); torch.func.hessian(lambda x: m(x).square().sum())(torch.randn(4, "
        "dtype=torch.float64)) raises (_Bottleneck has no jvp; any dtype); torch.autograd.functional.hessian works"
    )


case("bottleneck", "torch.func.jvp and torch.func.hessian (jacfwd over jacrev) fp64 == plain")(_hessian_case)


def _dbl_weights():
    torch.manual_seed(0)
    m = PreProjection(8).double()
    x = torch.randn(3, 8, dtype=torch.float64)
    gu = torch.autograd.grad(m(x).square().sum(), m.up.weight, create_graph=True)[0]
    got = torch.autograd.grad(gu.square().sum(), m.down.weight)
    gr = torch.autograd.grad(
        _ref_out(x, m.up.weight, m.down.weight, "silu").square().sum(), m.up.weight, create_graph=True
    )[0]
    return close(got, torch.autograd.grad(gr.square().sum(), m.down.weight)), ""


case("bottleneck", "double backward wrt weights only (x without grad) fp64")(_dbl_weights)


def _ckpt(reentrant):
    def run():
        torch.manual_seed(0)
        m = PreProjection(8).double()
        x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
        y = torch.utils.checkpoint.checkpoint(m, x, use_reentrant=reentrant)
        y.square().sum().backward()
        got = [x.grad, m.up.weight.grad, m.down.weight.grad]
        ref = torch.autograd.grad(
            _ref_out(x, m.up.weight, m.down.weight, "silu").square().sum(), [x, m.up.weight, m.down.weight]
        )
        return close(got, ref), ""

    return run


case("bottleneck", "checkpoint reentrant grads")(_ckpt(True))
case("bottleneck", "checkpoint non-reentrant grads")(_ckpt(False))


def _compile_train():
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = PreProjection(8).double()
    m2 = copy.deepcopy(m)
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    cm = torch.compile(m, backend="aot_eager")
    cm(x).square().sum().backward()
    ref = torch.autograd.grad(
        _ref_out(x, m2.up.weight, m2.down.weight, "silu").square().sum(), [m2.up.weight, m2.down.weight]
    )
    return close([m.up.weight.grad, m.down.weight.grad], ref), ""


case("bottleneck", "torch.compile(aot_eager) training step grads")(_compile_train)


def _saved(dtype, autocast=False):
    def run():
        torch.manual_seed(0)
        m = PreProjection(16).to(dtype)
        x = torch.randn(2, 5, 16, dtype=dtype, requires_grad=True)
        saved = []
        with (
            torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t),
            torch.autocast("cpu", dtype=BF, enabled=autocast),
        ):
            y = m(x)
        y.float().sum().backward()
        per_tok = sum(t.numel() for t in saved if t.dim() >= 2 and t.shape[:-1] == x.shape[:-1]) / 10
        return per_tok <= 16 + 20 + 16, f"{per_tok:.0f} saved values per token ({len(saved)} tensors)"

    return run


case("bottleneck", "saved activations per token fp64")(_saved(torch.float64))
case("bottleneck", "saved activations per token bf16 host")(_saved(BF))
case("bottleneck", "saved activations per token fp32 under bf16 autocast")(_saved(torch.float32, True))


# ---------------------------------------------------------------- lifecycle (ours vs LoRA)
def cfg(kind, **kw):
    if kind == "ours":
        return mmpreproj.PreProjConfig(**kw)
    return peft.LoraConfig(r=2, target_modules=["query_key_value"], init_lora_weights=False, **kw)


def trains(model, name):
    flags = {p.requires_grad for n, p in model.named_parameters() if f".{name}." in n and "modules_to_save" not in n}
    return flags.pop() if len(flags) == 1 else ("mixed" if flags else None)


def layers_active(model):
    return sorted({tuple(m.active_adapters) for m in model.modules() if isinstance(m, BaseTunerLayer)})


def both(fn):
    """Run `fn(kind)` for ours and LoRA; equal results pass."""

    def run():
        a, b = fn("ours"), fn("lora")
        return a == b, f"ours={a} lora={b}"

    return run


def _inject_new(kind):
    m = tiny_neox()
    peft.inject_adapter_in_model(cfg(kind), m)
    peft.inject_adapter_in_model(cfg(kind), m, adapter_name="b")
    return layers_active(m), trains(m, "default"), trains(m, "b")


case("lifecycle", "inject_adapter_in_model NEW: active + flags")(both(_inject_new))


def _inject_new_frozen_default(kind):
    m = tiny_neox()
    peft.inject_adapter_in_model(cfg(kind), m)
    for n, p in m.named_parameters():
        if ".default." in n:
            p.requires_grad_(False)
    peft.inject_adapter_in_model(cfg(kind, inference_mode=True), m, adapter_name="b")
    return layers_active(m), trains(m, "default"), trains(m, "b")


case("lifecycle", "inject NEW inference_mode=True after default frozen")(both(_inject_new_frozen_default))


def _inject_new_output(kind):
    m = tiny_neox()
    peft.inject_adapter_in_model(cfg(kind), m)
    peft.inject_adapter_in_model(cfg(kind), m, adapter_name="b")
    with torch.no_grad():
        for n, p in m.named_parameters():
            if ".b." in n:
                p.normal_(0, 0.2)
        out = m(IDS).logits
        for n, p in m.named_parameters():
            if ".b." in n:
                p.zero_()
        out0 = m(IDS).logits
    return not torch.equal(out, out0)  # b's weights reach the output


case("lifecycle", "inject NEW: its weights drive the output")(both(_inject_new_output))


def _inject_three_then_unload(kind):
    torch.manual_seed(0)
    m = tiny_neox()
    with torch.no_grad():
        base = m(IDS).logits
    peft.inject_adapter_in_model(cfg(kind), m)
    peft.inject_adapter_in_model(cfg(kind), m, adapter_name="b")
    peft.inject_adapter_in_model(cfg(kind), m, adapter_name="c")
    act = layers_active(m)
    if kind == "ours":
        m = mmpreproj.unload(m)
    else:  # LoRA: no unload in place to compare; this case reports ours only
        return act, True
    with torch.no_grad():
        return act, torch.allclose(m(IDS).logits, base, atol=1e-6)


def _unload_only():
    a = _inject_three_then_unload("ours")
    return a[1] and a[0] == [("c",)], f"active after 3 injects={a[0]}, unload == base: {a[1]}"


case("lifecycle", "inject default,b,c in place then mmpreproj.unload == base")(_unload_only)


def _inject_existing_refused():
    m = tiny_neox()
    peft.inject_adapter_in_model(cfg("ours"), m)
    peft.inject_adapter_in_model(cfg("ours"), m, adapter_name="b")
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    flags = {n: p.requires_grad for n, p in m.named_parameters()}
    act = layers_active(m)
    try:
        peft.inject_adapter_in_model(cfg("ours"), m, adapter_name="default")
        return False, "accepted"
    except Exception as e:  # noqa: BLE001
        same_sd = sd.keys() == m.state_dict().keys() and all(torch.equal(sd[k], v) for k, v in m.state_dict().items())
        ok = same_sd and flags == {n: p.requires_grad for n, p in m.named_parameters()} and act == layers_active(m)
        with torch.no_grad():
            m(IDS)
        return ok, f"refused ({type(e).__name__}); unchanged={ok}"


case("lifecycle", "inject of a loaded NAME refused, model unchanged (docs/limits)")(_inject_existing_refused)


def _set_active_freezes(kind, mts=None):
    pm = peft.get_peft_model(tiny_neox(), cfg(kind, modules_to_save=mts))
    pm.add_adapter("b", cfg(kind, modules_to_save=mts))
    pm.add_adapter("c", cfg(kind, modules_to_save=mts))
    pm.base_model.set_requires_grad(["b", "c", "default"], True)
    pm.set_adapter("default")
    return trains(pm, "default"), trains(pm, "b"), trains(pm, "c"), layers_active(pm)


case("lifecycle", "set_adapter(active) freezes b and c")(both(_set_active_freezes))


def _set_active_in_disable(kind):
    pm = peft.get_peft_model(tiny_neox(), cfg(kind))
    pm.add_adapter("b", cfg(kind))
    pm.base_model.set_requires_grad(["b"], True)
    with pm.disable_adapter():
        pm.set_adapter("default")
        inside = (trains(pm, "default"), trains(pm, "b"))
    return inside, trains(pm, "default"), trains(pm, "b"), layers_active(pm)


case("lifecycle", "set_adapter(active) inside disable_adapter()")(both(_set_active_in_disable))


def _mts_trainable(kind):
    pm = peft.get_peft_model(tiny_neox(), cfg(kind, modules_to_save=["lm_head"]))
    pm.add_adapter("b", cfg(kind, modules_to_save=["lm_head"]))
    pm.set_adapter("b")
    pm.set_adapter("b")
    names = sorted({n.split(".")[-1] for n, p in pm.named_parameters() if p.requires_grad and "lm_head" in n})
    return bool(names), trains(pm, "default"), trains(pm, "b")


case("lifecycle", "modules_to_save: set_adapter(b) twice; head trains, default frozen")(both(_mts_trainable))


def _delete_after_pf(kind, mts=None):
    pm = peft.get_peft_model(tiny_neox(), cfg(kind, modules_to_save=mts))
    pm.add_adapter("b", cfg(kind, modules_to_save=mts))
    pm.add_adapter("c", cfg(kind, modules_to_save=mts))
    pm.set_adapter("b")
    pf.set_adapter(pm, "c")
    pm.delete_adapter("b")
    with torch.no_grad():
        pm(input_ids=IDS)
    return pm.active_adapter, layers_active(pm), sorted(pm.peft_config)


case("lifecycle", "set_adapter(b), pf.set_adapter(c), delete b")(both(_delete_after_pf))


def _pf_mts_refused():
    """docs/limits: peft's per-layer switch is refused while our own modules_to_save keep several adapters' values
    (LoRA accepts); the refusal must leave everything as it was, and the model's delete_adapter still works."""
    pm = peft.get_peft_model(tiny_neox(), cfg("ours", modules_to_save=["lm_head"]))
    pm.add_adapter("b", cfg("ours", modules_to_save=["lm_head"]))
    pm.add_adapter("c", cfg("ours", modules_to_save=["lm_head"]))
    pm.set_adapter("b")
    before = (pm.active_adapter, layers_active(pm), {n: p.requires_grad for n, p in pm.named_parameters()})
    sd = {k: v.clone() for k, v in pm.state_dict().items()}
    try:
        pf.set_adapter(pm, "c")
        return False, "accepted"
    except ValueError:
        pass
    after = (pm.active_adapter, layers_active(pm), {n: p.requires_grad for n, p in pm.named_parameters()})
    same_sd = all(torch.equal(sd[k], v) for k, v in pm.state_dict().items())
    pm.delete_adapter("b")
    with torch.no_grad():
        pm(input_ids=IDS)
    return before == after and same_sd, f"unchanged={before == after and same_sd}; after delete b: {pm.active_adapter}"


case("lifecycle", "modules_to_save in place: pf.set_adapter refused, model unchanged (documented)")(_pf_mts_refused)


def _refused_inject_new():
    """inject_adapter_in_model of a further adapter that the plan refuses: nothing half-changed."""
    m = tiny_neox()
    peft.inject_adapter_in_model(cfg("ours"), m)
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    flags = {n: p.requires_grad for n, p in m.named_parameters()}
    act, rec = layers_active(m), sorted(m.peft_config)
    try:
        peft.inject_adapter_in_model(cfg("ours", modules_to_save=["no_such_module"]), m, adapter_name="b")
        return False, "accepted"
    except Exception as e:  # noqa: BLE001
        err = type(e).__name__
    same_sd = sd.keys() == m.state_dict().keys() and all(torch.equal(sd[k], v) for k, v in m.state_dict().items())
    ok = same_sd and flags == {n: p.requires_grad for n, p in m.named_parameters()}
    ok = ok and act == layers_active(m) and rec == sorted(m.peft_config)
    return ok, f"refused ({err}); unchanged={ok} record={sorted(m.peft_config)}"


case("lifecycle", "refused inject of a further adapter leaves nothing half-changed")(_refused_inject_new)


def _inject_while_disabled(kind):
    m = tiny_neox()
    peft.inject_adapter_in_model(cfg(kind), m)
    for mod in m.modules():
        if isinstance(mod, BaseTunerLayer):
            mod.enable_adapters(False)
    before = trains(m, "default")  # LoRA's switch-off froze it, ours kept it (documented in docs/limits.md)
    peft.inject_adapter_in_model(cfg(kind), m, adapter_name="b")
    disabled = sorted({mod.disable_adapters for mod in m.modules() if isinstance(mod, BaseTunerLayer)})
    return layers_active(m), disabled, before == trains(m, "default"), trains(m, "b")


case("lifecycle", "inject NEW while the layers are disabled")(both(_inject_while_disabled))


def _delete_active_after_pf(kind):
    pm = peft.get_peft_model(tiny_neox(), cfg(kind))
    pm.add_adapter("b", cfg(kind))
    pm.add_adapter("c", cfg(kind))
    pf.set_adapter(pm, "c")
    pm.delete_adapter("c")
    with torch.no_grad():
        pm(input_ids=IDS)
    return pm.active_adapter, layers_active(pm)


case("lifecycle", "pf.set_adapter(c), delete c")(both(_delete_active_after_pf))


def _save_load_after_inject(kind):
    import tempfile

    m = tiny_neox()
    peft.inject_adapter_in_model(cfg(kind), m)
    peft.inject_adapter_in_model(cfg(kind), m, adapter_name="b")
    sd = peft.get_peft_model_state_dict(m, adapter_name="b")
    m2 = tiny_neox()
    peft.inject_adapter_in_model(cfg(kind), m2, adapter_name="b")
    res = peft.set_peft_model_state_dict(m2, sd, adapter_name="b")
    with torch.no_grad():
        ok = torch.allclose(m(IDS).logits, m2(IDS).logits, atol=1e-6)
    del tempfile, res
    return bool(sd), ok


case("lifecycle", "inject NEW, its state dict into a fresh model: same output")(both(_save_load_after_inject))


def _transformers_add(kind):
    """transformers' `add_adapter` (needs peft >= 0.22 here: 0.21.2 installed) is `inject_adapter_in_model` plus a
    per-layer switch; its `set_adapter` calls every tuner layer's `set_adapter`: run those two directly."""
    m = tiny_neox()
    peft.inject_adapter_in_model(cfg(kind), m, adapter_name="a")
    peft.inject_adapter_in_model(cfg(kind), m, adapter_name="b")
    after_add = (layers_active(m), trains(m, "a"), trains(m, "b"))
    for mod in m.modules():
        if isinstance(mod, BaseTunerLayer):
            mod.set_adapter("a")
    after_set = (layers_active(m), trains(m, "a"), trains(m, "b"))
    with torch.no_grad():
        m(IDS)
    return after_add, after_set


case("lifecycle", "transformers-style add a, b in place; per-layer set_adapter(a)")(both(_transformers_add))


def _trl_like(kind):
    """TRL's reference-model trick: a PeftModel, the policy adapter trains, a `ref` adapter loaded frozen; forward
    under disable_adapter and with set_adapter("ref") for the reference logits, back to default to train."""
    pm = peft.get_peft_model(tiny_neox(), cfg(kind))
    pm.add_adapter("ref", cfg(kind))
    with pm.disable_adapter(), torch.no_grad():
        pm(input_ids=IDS)
    pm.set_adapter("ref")
    with torch.no_grad():
        pm(input_ids=IDS)
    pm.set_adapter("default")
    return trains(pm, "default"), trains(pm, "ref"), layers_active(pm)


case("lifecycle", "TRL-like ref adapter round trip")(both(_trl_like))


def _preproj_lora():
    from mmpreproj.train import apply_method

    m = apply_method(tiny_neox(), "preproj_lora")
    flags0 = sorted({n.split(".")[-2] for n, p in m.named_parameters() if p.requires_grad})
    ok = any("preproj" in n for n, p in m.named_parameters() if p.requires_grad) and any(
        "lora" in n for n, p in m.named_parameters() if p.requires_grad
    )
    m.set_adapter("default") if hasattr(m, "set_adapter") else None
    ok2 = any("preproj" in n for n, p in m.named_parameters() if p.requires_grad) and any(
        "lora" in n for n, p in m.named_parameters() if p.requires_grad
    )
    with torch.no_grad():
        m(input_ids=IDS)
    return (
        ok and ok2,
        f"type={type(m).__name__}, both trainable before/after set_adapter(default): {ok}/{ok2} {flags0[:4]}",
    )


case("lifecycle", "preproj_lora: set_adapter(active) keeps both trainable")(_preproj_lora)


# ---------------------------------------------------------------- docs
def _doc_data_write():
    m = pp_bf()
    with torch.no_grad():
        m(XB)
    m.up.weight.data.mul_(2)
    with torch.no_grad():
        stale = not same(m(XB), fresh(m, XB))
    m.to("cpu")
    with torch.no_grad():
        ok_after = same(m(XB), fresh(m, XB))
    return ok_after, f"stale after .data write: {stale}; fresh after .to('cpu'): {ok_after}"


case("docs", "limits: .data write not seen until .to(<device>)")(_doc_data_write)


def _doc_data_write_peft():
    pm = bf16_peft()
    with torch.no_grad():
        pm(input_ids=IDS)
    for n, p in pm.named_parameters():
        if "preproj" in n:
            p.data.mul_(3)
    pm.to("cpu")
    with torch.no_grad():
        return same(pm(input_ids=IDS).logits, copy.deepcopy(pm)(input_ids=IDS).logits), ""


case("docs", "limits: model.to(<its device>) drops the casts of a PeftModel (bf16 host)")(_doc_data_write_peft)


def _doc_hooks():
    m = pp_bf()
    ran = []
    m.up.register_forward_hook(lambda *a: ran.append("up"))
    m.register_forward_hook(lambda *a: ran.append("pp"))
    with torch.no_grad():
        m(XB)
    return ran == ["pp"], f"hooks run: {ran}"


case("docs", "limits: hooks on inner up do not run, PreProjection's do")(_doc_hooks)


def _doc_prune():
    """limits.md: "`torch.nn.utils.prune` (a forward pre-hook) does not reach the output"."""
    m = pp_bf()
    with torch.no_grad():
        before = m(XB)
    torch.nn.utils.prune.l1_unstructured(m.up, "weight", amount=0.9)
    with torch.no_grad():
        after = m(XB)
        reaches = not same(before, after)
        m.up.weight_orig.mul_(2)  # a later change of the pruned module's parameter (what training does)
        now = m(XB)
        w = m.up.weight_orig * m.up.weight_mask
        ref = XB + F.linear(F.silu(F.linear(XB, w.to(BF))), m.down.weight.to(BF))
    follows = same(now, ref)
    return not reaches, (
        f"the prune call's mask reaches the output: {reaches}; a later change of weight_orig reaches it: {follows}"
        + (
            "; repro: m=PreProjection(16); y0=m(x_bf16); torch.nn.utils.prune.l1_unstructured(m.up, 'weight', 0.9);"
            " m(x_bf16) != y0 (the pruned weight is used; only later updates of weight_orig are missed): the sentence"
            " 'prune does not reach the output' is wrong as written"
            if reaches
            else ""
        )
    )


case("docs", "limits: torch.nn.utils.prune 'does not reach the output'")(_doc_prune)


def _doc_missing_pf(kind):
    pm = peft.get_peft_model(tiny_neox(), cfg(kind))
    try:
        pf.set_adapter(pm, "nope")
        r = "ok"
    except Exception as e:  # noqa: BLE001
        r = type(e).__name__
    return r, trains(pm, "default"), layers_active(pm)


def _doc_missing():
    a, b = _doc_missing_pf("ours"), _doc_missing_pf("lora")
    ok = a == ("ok", True, [("default",)]) and b[1] is False and b[2] == [("nope",)]
    return ok, f"ours={a} lora={b}"


case("docs", "limits: pf.set_adapter(missing) ours keeps active, LoRA switches")(_doc_missing)


def _doc_sd_missing():
    """Where a NAME is deleted per layer in place (`peft.functional.delete_adapter`): peft's record keeps it."""
    from mmpreproj.method.layer import TUNER_PREFIX

    out = {}
    for kind in ("ours", "lora"):
        m = tiny_neox()
        peft.inject_adapter_in_model(cfg(kind), m)
        peft.inject_adapter_in_model(cfg(kind), m, adapter_name="b")
        pf.delete_adapter(m, "b", prefix=TUNER_PREFIX if kind == "ours" else "lora_")
        try:
            out[kind] = len(pf.get_peft_model_state_dict(m, adapter_name="b"))
        except Exception as e:  # noqa: BLE001
            out[kind] = type(e).__name__
    return out["ours"] not in (0,) and out["lora"] == 0, str(out)


case("docs", "limits: get_peft_model_state_dict(missing) ours refuses, LoRA {}")(_doc_sd_missing)


def _doc_disable_flags():
    out = {}
    for kind in ("ours", "lora"):
        pm = peft.get_peft_model(tiny_neox(), cfg(kind))
        with pm.disable_adapter():
            inside = trains(pm, "default")
        out[kind] = (inside, trains(pm, "default"))
    return out["ours"] == (True, True) and out["lora"] == (False, True), str(out)


case("docs", "limits: disable_adapter() keeps flags; LoRA freezes when off")(_doc_disable_flags)


def _doc_waiting_trainable():
    import tempfile

    out = {}
    for kind in ("ours", "lora"):
        pm = peft.get_peft_model(tiny_neox(), cfg(kind))
        with tempfile.TemporaryDirectory() as d:
            pm.save_pretrained(d)
            pm.load_adapter(d, adapter_name="b", is_trainable=True)
            waiting = trains(pm, "b")
            pm.set_adapter("default")
            out[kind] = (waiting, trains(pm, "b"), trains(pm, "default"))
    return out["ours"] == out["lora"] and out["ours"][1] is False, str(out)


case("docs", "peft-guide: set_adapter freezes one waiting trainable too")(_doc_waiting_trainable)


def _doc_add_inactive():
    import tempfile

    pm = peft.get_peft_model(tiny_neox(), cfg("ours"))
    pm.add_adapter("b", cfg("ours"))
    a = (layers_active(pm), trains(pm, "b"))
    m = tiny_neox()
    peft.inject_adapter_in_model(cfg("ours"), m)
    with tempfile.TemporaryDirectory() as d:
        mmpreproj.save_adapter(m, d)
        mmpreproj.load_adapter(m, d, adapter_name="b")
    b = (layers_active(m), trains(m, "b"))
    return a == ([("default",)], False) and b[0] == [
        ("default",)
    ], f"PeftModel.add_adapter: {a}; mmpreproj.load_adapter: {b}"


case("docs", "peft-guide: PeftModel.add_adapter and mmpreproj.load_adapter add it inactive")(_doc_add_inactive)


def _doc_after_pf_add():
    out = {}
    for kind in ("ours", "lora"):
        pm = peft.get_peft_model(tiny_neox(), cfg(kind))
        pm.add_adapter("b", cfg(kind))
        pf.set_adapter(pm, "b")
        pm.add_adapter("c", cfg(kind))
        out[kind] = (pm.active_adapter, layers_active(pm))
    ok = out["ours"][1] == [("b",)] and out["lora"][1] == [("default",)]
    return ok, f"{out} (limits: ours leaves layers, LoRA re-applies the record)"


case("docs", "limits: add after a per-layer switch: ours layers stay, LoRA re-applies")(_doc_after_pf_add)


def _doc_vmap_changelog():
    m = pp_bf()
    ups = torch.randn(3, *m.up.weight.shape)
    with torch.no_grad():
        torch.func.vmap(lambda u: torch.func.functional_call(m, {"up.weight": u}, (XB,)))(ups)
    return True, "vmap over stacked weights runs"


case("docs", "CHANGELOG: vmap over stacked weights no longer raises")(_doc_vmap_changelog)


def main():
    n = len(RESULTS)
    p = sum(ok for ok, *_ in RESULTS)
    print(f"TOTAL {n}: {p} PASS, {n - p} FAIL")


if __name__ == "__main__":
    main()
