"""API fuzz audit: every public name of `mmpreproj` (and some of `analysis` / `train`) called with bad arguments.

Run:  PYTHONPATH=. OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python bench/api_fuzz_audit.py

Written by an independent, adversarial audit against the project's rule ("bad input gets a clear error naming the
field and the allowed values, and nothing is lost or half-changed"); expectations are the auditor's, from the
docstrings and docs. One bad argument per case. Each case checks: (1) the exception is ValueError / TypeError (or a
subclass; an OSError subclass is accepted for a path that does not exist / is of the wrong kind), not an
AttributeError / KeyError / IndexError / AssertionError / ZeroDivisionError / RuntimeError from deep inside;
(2) the message names the argument (one of the listed words) and, for a choice, at least one allowed value;
(3) the model / tensors / folder passed in are unchanged (parameters, buffers, requires_grad, module tree, bytes);
(4) nothing hangs (signal.alarm 20 s per case). A bad value that is accepted silently is a FAIL.
Areas: rope (RoPE1D/2D/3D/MultimodalRoPE/RotaryEncoder constructors, forward, cos_sin), pos (grid_positions,
multimodal_positions), mod (PreProjection, ContentSkip constructors, forward, num_params, reset_parameters),
query (active_adapter, adapter_names, injected_modules, is_injected, trainable_report, adapter_state_dict,
adapter_disabled, unload), sd (set_adapter_state_dict), est (estimate), io (save_adapter, load_adapter,
save_pretrained, from_pretrained, last_whole_checkpoint), wrap (PreProjAttention constructor, observe, forward
adapter_names, slots, set_adapter), hosts (get_host, find_host, register_host), analysis, train.
Models: tests/helpers/zoo.py `tiny_neox` (random, built in code; nothing downloaded).
One line per case: PASS/FAIL | area | case | details; then TOTAL. Output: bench/results/api_fuzz_audit_before.txt.

Result on commit ad6b88c (CPU, one thread, about 8 s wall): TOTAL 447: 231 PASS, 216 FAIL. No hang; no refusal
changed a model, tensor or folder (every "changed" line is a bad value that was ACCEPTED). No page of README.md /
docs/*.md names an exception type, so nothing below counts as documented. FAIL groups:
  * A. 66 accepted silently + 1 "observers=3" line (library bug unless noted): RoPE theta nan/inf,
    RoPE1D(head_dim=8.0), MultimodalRoPE odd sections, pos with NaN, grid_positions of 1 or 4 sizes,
    PreProjection(expansion=0.01) -> inner_dim 0,
    ContentSkip(init_std=inf), ContentSkip(rank=17 > dim 16), num_params(...) with 0 / negative / bool / float /
    str ("4"*32), PreProjAttention(...) with base_layer=None / call=None / block_index=-1 or '0' / part=1,
    wrapper.observe(None|'x'|1) (registered: the next forward dies with "'NoneType' object is not callable"),
    wrapper.slots / set_adapter / delete_adapter of an unknown name, HostSpec(parts=()) / HostSpec(name=1),
    last_whole_checkpoint(config='x' or a dict), save_adapter(readme='yes' / base_save_token=1 / path='' -> writes
    adapter files into the cwd), save_pretrained(adapter_only='x'), load_adapter(adapter_name='a/b' /
    is_trainable='yes' / freeze_base='no'), skip_norms(not injected) -> {}, train helpers with 0 / negative sizes,
    select_lines(lines=str / num_lines=-1). Harness expectation, arguably: save_pretrained(foo_bar=1) (**kwargs go
    on to transformers), skip_norms on a plain model returning {}.
  * B. 65 right type (TypeError / ValueError) but a Python-internal message that names no field, e.g. "'<='
    not supported between instances of 'NoneType' and 'int'" for RoPE*/PreProjection/ContentSkip(dim|head_dim|
    theta|expansion|init_std=None or str), "cannot convert float NaN to integer", set_adapter_state_dict(None),
    save_pretrained/last_whole_checkpoint(path=123). Library bug (the rule asks for the field's name).
  * C. 45 AttributeError for a model/tensor/fn that is not one: every model-taking function given None / a str
    ('NoneType' object has no attribute 'named_modules'), RoPE forward k=None, cos_sin('x'), set_adapter_state_dict
    with a list / a non-tensor value / a non-str key, save_adapter(state_dict=list|{'x': 1}), from_pretrained(
    model_cls='x'), register_host(None), PreProjAttention(preproj='x'). Library bug.
  * D. 11 RuntimeError "this model has no mmpreproj modules (call mmpreproj.inject first)" for a model that is not
    injected (active_adapter, adapter_names, adapter_state_dict, unload, save_adapter, set_adapter_state_dict): a
    clear message, but RuntimeError, which the rule does not allow and no doc names. Docs / type choice.
  * E. 28 other internals leaking: torch RuntimeError (huge head_dim / grid: 8 TB allocation attempted; device
    'nope'; dtype=int64; mat1/mat2 shapes for x of the wrong width; normal_ std for reset_parameters(init_std<0
    or nan), which the constructor refuses properly), NotImplementedError (RoPE2D(head_dim=8.0), forward of int
    x), OverflowError (expansion=inf), ZeroDivisionError (train.paper_lora_rank(0, ...)), KeyError
    (update_layer/PreProjAttention adapter_name='', routing_ratios(token_mask_key='nope')), RuntimeError for
    routing_ratios(batches=[]), FileNotFoundError for from_pretrained(123 / None / adapter=123) (harness
    expectation, arguably: the message is clear, only the type and field name differ). Library bug.
The run's lines: bench/results/api_fuzz_audit_before.txt.

Run again after the first fixes (bench/results/api_fuzz_audit.txt): TOTAL 447: 281 PASS, 166 FAIL. Fixed: RoPE
`theta` NaN/inf and a float `head_dim`; `PreProjection` / `ContentSkip` widths, an inner width of 0, a skip rank
above the width, a non-finite `init_std` (also in `reset_parameters`); a model that is not a module (TypeError
naming `model`, in the one lookup every call goes through); a non-callable observer; an empty `save_adapter`
path (it wrote into the working directory); switches that are not bools (`load_adapter(freeze_base="no")` froze
the base). Left, knowingly: Python's own TypeError for None/str widths in the RoPE classes and the `train` helpers
(B), RuntimeError for a model with no injection (D: the message names the call and what to do), torch's own errors
for impossible sizes or dtypes (E), and the lower-level calls (a layer's `slots`/`set_adapter` of a name it does
not hold, peft's rule; `PreProjAttention`'s constructor; `num_params`; `HostSpec`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import math
import os
import signal
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import torch  # noqa: E402
from torch import nn  # noqa: E402

import mmpreproj as mp  # noqa: E402
from mmpreproj import analysis, hosts, train  # noqa: E402
from tests.helpers.zoo import tiny_neox  # noqa: E402

RESULTS: list[tuple[bool, str, str, str]] = []
OK_TYPES = (ValueError, TypeError)


def report(ok: bool, area: str, case: str, details: str) -> None:
    RESULTS.append((ok, area, case, details))
    line = f"{'PASS' if ok else 'FAIL'} | {area} | {case} | {details}".replace("\n", " ")
    print(line[:400], flush=True)


class Hang(Exception):
    pass


def _alarm(*_):
    raise Hang("hang > 20 s")


signal.signal(signal.SIGALRM, _alarm)


def snap_model(m):
    if m is None or not isinstance(m, nn.Module):
        return None
    params = {k: (v.detach().clone(), v.requires_grad) for k, v in m.named_parameters(remove_duplicate=False)}
    bufs = {k: v.detach().clone() for k, v in m.named_buffers(remove_duplicate=False)}
    tree = [(k, type(v).__name__) for k, v in m.named_modules(remove_duplicate=False)]
    extra = (mp.adapter_names(m), mp.active_adapter(m)) if _safe(mp.is_injected, m) else None
    return params, bufs, tree, extra


def _safe(fn, *a):
    try:
        return fn(*a)
    except Exception:
        return False


def diff_model(a, b) -> str:
    if a is None:
        return ""
    pa, ba, ta, ea = a
    pb, bb, tb, eb = b
    if ta != tb:
        return "module tree changed"
    if pa.keys() != pb.keys():
        return "parameter names changed"
    for k in pa:
        if pa[k][1] != pb[k][1]:
            return f"requires_grad changed: {k}"
        if pa[k][0].shape != pb[k][0].shape or not torch.equal(pa[k][0], pb[k][0]):
            return f"parameter changed: {k}"
    if ba.keys() != bb.keys():
        return "buffer names changed"
    for k in ba:
        if not torch.equal(ba[k], bb[k]):
            return f"buffer changed: {k}"
    if ea != eb:
        return f"adapters changed {ea} -> {eb}"
    return ""


def snap_path(p):
    if p is None:
        return None
    p = Path(p)
    if not p.exists():
        return "absent"
    if p.is_file():
        return hashlib.sha1(p.read_bytes()).hexdigest()
    return sorted(
        (str(f.relative_to(p)), hashlib.sha1(f.read_bytes()).hexdigest()) for f in p.rglob("*") if f.is_file()
    )


def snap_tensors(ts):
    return [t.detach().clone() for t in ts]


def bad(area, case, fn, names, allowed=(), model=None, path=None, tensors=(), oserror_ok=False, ok_if=None):
    """`fn` must refuse: ValueError/TypeError naming one of `names` (and one of `allowed`), nothing changed."""
    sm, sp, st = snap_model(model), snap_path(path), snap_tensors(tensors)
    signal.alarm(20)
    exc = None
    out = None
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            out = fn()
    except Hang as e:
        exc = e
    except BaseException as e:  # noqa: BLE001
        exc = e
    finally:
        signal.alarm(0)
    problems = []
    if isinstance(exc, Hang):
        report(False, area, case, "HANG (> 20 s)")
        return None
    if exc is None:
        if ok_if is not None and ok_if(out):
            problems = []
            msg = f"accepted, documented/harmless: {str(out)[:80]}"
        else:
            problems.append(f"accepted silently, returned {type(out).__name__}: {str(out)[:80]}")
            msg = ""
    else:
        msg = f"{type(exc).__name__}: {str(exc)[:200]}"
        allowed_types = OK_TYPES + ((OSError,) if oserror_ok else ())
        if not isinstance(exc, allowed_types):
            problems.append(f"wrong type {type(exc).__name__}")
        text = str(exc).lower()
        if names and not any(n.lower() in text for n in names):
            problems.append(f"message names none of {list(names)}")
        if allowed and not any(str(a).lower() in text for a in allowed):
            problems.append(f"message lists none of the allowed {list(allowed)}")
    d = diff_model(sm, snap_model(model)) if model is not None else ""
    if d:
        problems.append(f"model changed after refusal: {d}")
    if path is not None and snap_path(path) != sp:
        problems.append("folder/file changed after refusal")
    for t0, t1 in zip(st, tensors):
        if not torch.equal(t0, t1):
            problems.append("input tensor changed")
            break
    report(not problems, area, case, ("; ".join(problems) + " || " if problems else "") + msg)
    return out


# ----------------------------------------------------------------------------------------------------------- rope
def audit_rope():
    A = "rope"
    hd_bad = {"None": None, "str": "8", "bool": True, "zero": 0, "neg": -8, "odd": 7, "float": 8.0, "nan": math.nan}
    for cls, allowed_pair in [
        (mp.RoPE1D, ("half", "interleaved")),
        (mp.RoPE2D, ("half", "interleaved")),
        (mp.RoPE3D, ("half", "interleaved")),
    ]:
        for k, v in hd_bad.items():
            bad(A, f"{cls.__name__}(head_dim={k})", lambda c=cls, v=v: c(v), ["head_dim"])
        bad(A, f"{cls.__name__}(head_dim=2**40)", lambda c=cls: c(2**40), ["head_dim"])
        for k, v in {"zero": 0.0, "neg": -1.0, "nan": math.nan, "inf": math.inf, "str": "1e4", "None": None}.items():
            bad(A, f"{cls.__name__}(theta={k})", lambda c=cls, v=v: c(16, theta=v), ["theta"])
        for k, v in {"foo": "foo", "None": None, "int": 1, "empty": ""}.items():
            bad(A, f"{cls.__name__}(pairing={k})", lambda c=cls, v=v: c(16, pairing=v), ["pairing"], allowed_pair)
    bad(A, "RoPE1D(unknown kwarg)", lambda: mp.RoPE1D(16, foo=1), ["foo"])
    for k, v in {
        "zero": 0.0,
        "neg": -0.5,
        "over1": 1.5,
        "nan": math.nan,
        "str": "1",
        "None": None,
        "tiny": 0.01,
    }.items():
        bad(A, f"RoPE1D(rotary_fraction={k})", lambda v=v: mp.RoPE1D(16, rotary_fraction=v), ["rotary_fraction"])
    bad(A, "RoPE2D(head_dim=6, not /4)", lambda: mp.RoPE2D(6), ["head_dim"])
    bad(A, "RoPE3D(head_dim=10, not /6 no sections)", lambda: mp.RoPE3D(10), ["head_dim"])
    sec = {
        "wrong_sum": [2, 2, 2],
        "neg": [-2, 10, 8],
        "len2": [8, 8],
        "str": "888",
        "dict": {"t": 8},
        "odd": [3, 7, 6],
        "float": [8.0, 4.0, 4.0],
        "zero": [0, 8, 8],
        "None_item": [None, 8, 8],
    }
    for k, v in sec.items():
        bad(A, f"RoPE3D(sections={k})", lambda v=v: mp.RoPE3D(32, sections=v), ["sections"])
        bad(A, f"MultimodalRoPE(sections={k})", lambda v=v: mp.MultimodalRoPE(32, v), ["sections"])
    bad(A, "MultimodalRoPE(sections=None)", lambda: mp.MultimodalRoPE(32, None), ["sections"])
    for k, v in hd_bad.items():
        bad(A, f"MultimodalRoPE(head_dim={k})", lambda v=v: mp.MultimodalRoPE(v, [4, 6, 6]), ["head_dim"])
    for k, v in {"zero": 0.0, "nan": math.nan, "neg": -1.0, "str": "x"}.items():
        bad(A, f"MultimodalRoPE(theta={k})", lambda v=v: mp.MultimodalRoPE(32, [4, 6, 6], theta=v), ["theta"])
        bad(
            A,
            f"MultimodalRoPE(rotary_fraction={k})",
            lambda v=v: mp.MultimodalRoPE(32, [4, 6, 6], rotary_fraction=v),
            ["rotary_fraction"],
        )
    # RotaryEncoder direct
    bad(
        A,
        "RotaryEncoder(pairing=foo)",
        lambda: mp.RotaryEncoder(8, 8, 1, "foo", torch.ones(4), torch.zeros(4)),
        ["pairing"],
        ("half", "interleaved"),
    )
    bad(
        A,
        "RotaryEncoder(rotary_dim>head_dim)",
        lambda: mp.RotaryEncoder(8, 16, 1, "half", torch.ones(8), torch.zeros(8, dtype=torch.long)),
        ["rotary_dim"],
    )
    bad(
        A,
        "RotaryEncoder(inv_freq wrong length)",
        lambda: mp.RotaryEncoder(8, 8, 1, "half", torch.ones(3), torch.zeros(3, dtype=torch.long)),
        ["inv_freq"],
    )
    # forward
    r1 = mp.RoPE1D(8)
    q = torch.randn(1, 2, 5, 8)
    k = torch.randn(1, 2, 5, 8)
    p = torch.arange(5)
    T = (q, k, p)
    fw = {
        "pos rank 3 (1,1,5)": lambda: r1(q, k, torch.arange(5).view(1, 1, 5)),
        "pos (N,2) for 1D": lambda: r1(q, k, torch.zeros(5, 2, dtype=torch.long)),
        "pos too short (4)": lambda: r1(q, k, torch.arange(4)),
        "pos too long (6)": lambda: r1(q, k, torch.arange(6)),
        "pos batch 3 vs q batch 1": lambda: r1(q, k, torch.zeros(3, 5, dtype=torch.long)),
        "pos None": lambda: r1(q, k, None),
        "pos list": lambda: r1(q, k, [0, 1, 2, 3, 4]),
        "pos bool dtype": lambda: r1(q, k, torch.ones(5, dtype=torch.bool)),
        "pos complex": lambda: r1(q, k, torch.zeros(5, dtype=torch.complex64)),
        "pos negative": lambda: r1(q, k, torch.tensor([-1, 0, 1, 2, 3])),
        "q rank 3": lambda: r1(q[0], k[0], p),
        "q last dim 6": lambda: r1(torch.randn(1, 2, 5, 6), torch.randn(1, 2, 5, 6), p),
        "k shape != q": lambda: r1(q, torch.randn(1, 2, 4, 8), p),
        "k None": lambda: r1(q, None, p),
        "q int dtype": lambda: r1(q.long(), k.long(), p),
        "q str": lambda: r1("q", k, p),
        "num_prefix_tokens=-1": lambda: r1(q, k, torch.arange(6), num_prefix_tokens=-1),
        "num_prefix_tokens=6 > N": lambda: r1(q, k, torch.arange(0), num_prefix_tokens=6),
        "num_prefix_tokens=1.5": lambda: r1(q, k, torch.arange(4), num_prefix_tokens=1.5),
        "num_prefix_tokens='1'": lambda: r1(q, k, torch.arange(4), num_prefix_tokens="1"),
        "num_prefix_tokens=None": lambda: r1(q, k, p, num_prefix_tokens=None),
        "num_prefix_tokens mismatched pos": lambda: r1(q, k, p, num_prefix_tokens=2),
        "unknown kwarg": lambda: r1(q, k, p, foo=1),
    }
    names = {"pos": ["pos"], "q": ["q"], "k": ["k"], "num": ["num_prefix_tokens", "pos"], "unk": ["foo"]}
    for case, fn in fw.items():
        key = "num" if case.startswith("num") else "unk" if case.startswith("unknown") else case.split()[0]
        if key in ("pos", "q", "k") and key != "q":
            nm = names[key]
        else:
            nm = names.get(key, ["q"])
        if case == "pos negative":
            bad(A, f"RoPE1D.forward({case})", fn, ["pos"], tensors=T, ok_if=lambda o: True)  # negative pos: harmless
            continue
        if case == "pos float":
            continue
        bad(A, f"RoPE1D.forward({case})", fn, nm + (["shape", "dim"] if key in ("q", "k") else []), tensors=T)
    bad(
        A,
        "RoPE1D.forward(pos float 0.5)",
        lambda: r1(q, k, torch.arange(5) + 0.5),
        ["pos"],
        tensors=T,
        ok_if=lambda o: True,
    )
    bad(A, "RoPE1D.forward(pos NaN)", lambda: r1(q, k, torch.tensor([0.0, math.nan, 2, 3, 4])), ["pos"], tensors=T)
    bad(A, "RoPE1D.cos_sin(pos str)", lambda: r1.cos_sin("x"), ["pos"])
    bad(A, "RoPE1D.cos_sin(device nope)", lambda: r1.cos_sin(p, device="nope"), ["device", "nope"])
    r2 = mp.RoPE2D(8)
    bad(A, "RoPE2D.forward(pos (N,))", lambda: r2(q, k, p), ["pos"], tensors=T)
    bad(A, "RoPE2D.forward(pos (N,3))", lambda: r2(q, k, torch.zeros(5, 3, dtype=torch.long)), ["pos"], tensors=T)
    r3 = mp.RoPE3D(16)
    q3 = torch.randn(1, 2, 5, 16)
    bad(A, "RoPE3D.forward(pos (N,2))", lambda: r3(q3, q3, torch.zeros(5, 2, dtype=torch.long)), ["pos"])
    mr = mp.MultimodalRoPE(16, [2, 3, 3])
    bad(A, "MultimodalRoPE.forward(pos (N,))", lambda: mr(q3, q3, p), ["pos"])
    bad(A, "MultimodalRoPE.forward(pos (N,2))", lambda: mr(q3, q3, torch.zeros(5, 2, dtype=torch.long)), ["pos"])
    bad(
        A,
        "MultimodalRoPE.forward(q last dim 8)",
        lambda: mr(q, k, torch.zeros(5, 3, dtype=torch.long)),
        ["q", "head_dim", "shape"],
    )


def audit_positions():
    A = "pos"
    cases = {
        "()": (),
        "(0,4)": (0, 4),
        "(-1,4)": (-1, 4),
        "(2.5,4)": (2.5, 4),
        "('2',4)": ("2", 4),
        "(True,4)": (True, 4),
        "(2,2,2,2)": (2, 2, 2, 2),
        "(None,)": (None,),
        "(4,)": (4,),
        "(nan,2)": (math.nan, 2),
        "(2**40,2**40)": (2**40, 2**40),
    }
    for case, args in cases.items():
        bad(A, f"grid_positions{case}", lambda a=args: mp.grid_positions(*a), ["size", "grid", "sizes"])
    bad(A, "grid_positions(device=nope)", lambda: mp.grid_positions(2, 2, device="nope"), ["device", "nope"])
    bad(A, "grid_positions(unknown kwarg)", lambda: mp.grid_positions(2, 2, foo=1), ["foo"])
    seg_allowed = ("text", "image", "video")
    mcases = {
        "None": (None, ()),
        "str": ("text", ()),
        "dict": ({"text": 3}, ()),
        "empty list": ([], ()),
        "kind audio": ([("audio", 3)], seg_allowed),
        "kind None": ([(None, 3)], seg_allowed),
        "text -1": ([("text", -1)], ()),
        "text 2.5": ([("text", 2.5)], ()),
        "text '3'": ([("text", "3")], ()),
        "text True": ([("text", True)], ()),
        "1-tuple": ([("text",)], ()),
        "3-tuple": ([("text", 2, 3)], ()),
        "image (0,2)": ([("image", (0, 2))], ()),
        "image (-1,2)": ([("image", (-1, 2))], ()),
        "image (2,)": ([("image", (2,))], ()),
        "image (2,2,2)": ([("image", (2, 2, 2))], ()),
        "image int": ([("image", 4)], ()),
        "image (2.5,2)": ([("image", (2.5, 2))], ()),
        "video (2,2)": ([("video", (2, 2))], ()),
        "video (0,2,2)": ([("video", (0, 2, 2))], ()),
        "video (2,-2,2)": ([("video", (2, -2, 2))], ()),
        "segment not tuple": (["text"], ()),
    }
    for case, (segs, allowed) in mcases.items():
        ok_if = (lambda o: True) if case in ("empty list",) else None
        bad(
            A,
            f"multimodal_positions({case})",
            lambda s=segs: mp.multimodal_positions(s),
            ["segment", "segments", "text", "image", "video"],
            allowed,
            ok_if=ok_if,
        )


def audit_modules():
    A = "mod"
    dims = {"None": None, "str": "8", "bool": True, "zero": 0, "neg": -4, "float": 8.5, "nan": math.nan}
    for k, v in dims.items():
        bad(A, f"PreProjection(dim={k})", lambda v=v: mp.PreProjection(v), ["dim"])
        bad(A, f"ContentSkip(dim={k})", lambda v=v: mp.ContentSkip(v), ["dim"])
        bad(A, f"PreProjection.num_params(dim={k})", lambda v=v: mp.PreProjection.num_params(v), ["dim"])
        bad(A, f"ContentSkip.num_params(dim={k})", lambda v=v: mp.ContentSkip.num_params(v), ["dim"])
    for k, v in {
        "zero": 0.0,
        "neg": -1.0,
        "nan": math.nan,
        "inf": math.inf,
        "str": "1.25",
        "None": None,
        "tiny (inner 0)": 0.01,
    }.items():
        bad(A, f"PreProjection(expansion={k})", lambda v=v: mp.PreProjection(16, v), ["expansion"])
        bad(
            A,
            f"PreProjection.num_params(expansion={k})",
            lambda v=v: mp.PreProjection.num_params(16, v),
            ["expansion"],
        )
    for field, val in [
        ("activation", "nope"),
        ("activation", None),
        ("init", "nope"),
        ("init", 1),
        ("compute_dtype", "nope"),
        ("compute_dtype", None),
    ]:
        bad(
            A,
            f"PreProjection({field}={val!r})",
            lambda f=field, v=val: mp.PreProjection(16, **{f: v}),
            [field],
            ("silu", "gelu", "relu", "paper", "zero", "input", "float32", "fp32"),
        )
    bad(A, "PreProjection(device=nope)", lambda: mp.PreProjection(16, device="nope"), ["device", "nope"])
    bad(A, "PreProjection(dtype='float32' str)", lambda: mp.PreProjection(16, dtype="float32"), ["dtype"])
    bad(A, "PreProjection(dtype=int64)", lambda: mp.PreProjection(16, dtype=torch.int64), ["dtype"])
    bad(A, "PreProjection(unknown kwarg)", lambda: mp.PreProjection(16, foo=1), ["foo"])
    for k, v in {"nan": math.nan, "neg": -1.0, "inf": math.inf, "str": "x", "None": None}.items():
        bad(A, f"ContentSkip(init_std={k})", lambda v=v: mp.ContentSkip(16, v), ["init_std"])
    for k, v in {"zero": 0, "neg": -1, "float": 2.5, "bool": True, "over dim": 17, "str": "4"}.items():
        bad(A, f"ContentSkip(rank={k})", lambda v=v: mp.ContentSkip(16, rank=v), ["rank"])
        bad(A, f"ContentSkip.num_params(rank={k})", lambda v=v: mp.ContentSkip.num_params(16, v), ["rank"])
    bad(
        A,
        "ContentSkip(compute_dtype=nope)",
        lambda: mp.ContentSkip(16, compute_dtype="nope"),
        ["compute_dtype"],
        ("input", "float32", "fp32"),
    )
    pp, cs = mp.PreProjection(16), mp.ContentSkip(16, 0.1)
    for name, m in [("PreProjection", pp), ("ContentSkip", cs)]:
        x = torch.randn(2, 3, 16)
        bad(A, f"{name}.forward(x last dim 8)", lambda m=m: m(torch.randn(2, 3, 8)), ["x", "dim", "shape"], model=m)
        bad(
            A,
            f"{name}.forward(x int64)",
            lambda m=m: m(torch.ones(2, 3, 16, dtype=torch.long)),
            ["x", "dtype"],
            model=m,
        )
        bad(A, f"{name}.forward(x None)", lambda m=m: m(None), ["x", "tensor"], model=m)
        bad(A, f"{name}.forward(x list)", lambda m=m: m([[0.0] * 16]), ["x", "tensor"], model=m)
        bad(
            A,
            f"{name}.forward(x 0-dim)",
            lambda m=m: m(torch.tensor(1.0)),
            ["x", "dim", "shape"],
            model=m,
            tensors=(x,),
        )
    bad(
        A,
        "PreProjection.reset_parameters(init=nope)",
        lambda: pp.reset_parameters("nope"),
        ["init"],
        ("paper", "zero"),
        model=pp,
    )
    for k, v in {"nan": math.nan, "neg": -1.0, "str": "x"}.items():
        bad(
            A,
            f"ContentSkip.reset_parameters(init_std={k})",
            lambda v=v: cs.reset_parameters(v),
            ["init_std"],
            model=cs,
        )


def audit_queries(M, P, lin):
    A = "query"
    for fname in ["active_adapter", "adapter_names", "injected_modules", "adapter_state_dict", "unload"]:
        fn = getattr(mp, fname)
        for case, arg, names in [
            ("None", None, ["model"]),
            ("str", "model", ["model"]),
            ("nn.Linear", lin, ["inject", "model"]),
            ("not injected", P, ["inject"]),
        ]:
            okf = (lambda o: o == []) if fname in ("adapter_names", "injected_modules") else None
            if fname == "unload" and case in ("not injected",):
                okf = None
            bad(
                A,
                f"{fname}({case})",
                lambda f=fn, a=arg: f(a),
                names,
                model=arg if isinstance(arg, nn.Module) else None,
                ok_if=okf,
            )
    for case, arg in [("None", None), ("str", "model"), ("int", 1)]:
        bad(A, f"is_injected({case})", lambda a=arg: mp.is_injected(a), ["model"], ok_if=lambda o: o is False)
        bad(A, f"trainable_report({case})", lambda a=arg: mp.trainable_report(a), ["model"])
        bad(A, f"adapter_disabled({case})", lambda a=arg: mp.adapter_disabled(a).__enter__(), ["model"])
    bad(A, "adapter_disabled(not injected)", lambda: mp.adapter_disabled(P).__enter__(), ["inject"], model=P)
    bad(A, "adapter_disabled(nn.Linear)", lambda: mp.adapter_disabled(lin).__enter__(), ["inject", "model"], model=lin)


def audit_state_dict(M):
    A = "sd"
    sd = mp.adapter_state_dict(M)
    k0 = next(iter(sd))
    t0 = sd[k0]
    variants = {
        "tensors=None": (None, ["tensors", "state"]),
        "tensors=list": (list(sd.values()), ["tensors", "dict", "state"]),
        "tensors={}": ({}, ["missing", "key", "empty"]),
        "unknown key": ({**sd, "nope.weight": t0}, ["nope"]),
        "missing key": ({k: v for k, v in sd.items() if k != k0}, [k0.split(".")[-2], "missing"]),
        "wrong shape": ({**sd, k0: torch.zeros(3, 3)}, ["shape", k0.split(".")[-2]]),
        "NaN": ({**sd, k0: torch.full_like(t0, math.nan)}, ["finite", "nan"]),
        "int dtype": ({**sd, k0: torch.ones_like(t0, dtype=torch.long)}, ["dtype", k0.split(".")[-2]]),
        "value not tensor": ({**sd, k0: 1.0}, ["tensor", k0.split(".")[-2]]),
        "key not str": ({**sd, 1: t0}, ["key", "1"]),
        "first ok then bad (NaN last)": (
            {**{k: torch.randn_like(v) for k, v in sd.items()}, k0: torch.full_like(t0, math.inf)},
            ["finite", "inf"],
        ),
    }
    for case, (tensors, names) in variants.items():
        bad(A, f"set_adapter_state_dict({case})", lambda t=tensors: mp.set_adapter_state_dict(M, t), names, model=M)
    for case, name in [("''", ""), ("'nope'", "nope"), ("'a/b'", "a/b"), ("1", 1)]:
        bad(
            A,
            f"set_adapter_state_dict(adapter_name={case})",
            lambda n=name: mp.set_adapter_state_dict(M, sd, adapter_name=n),
            ["adapter_name", "adapter"],
            model=M,
        )
    bad(
        A,
        "set_adapter_state_dict(model=nn.Linear)",
        lambda: mp.set_adapter_state_dict(nn.Linear(2, 2), sd),
        ["inject", "model"],
    )
    bad(A, "set_adapter_state_dict(unknown kwarg)", lambda: mp.set_adapter_state_dict(M, sd, foo=1), ["foo"], model=M)


def audit_estimate():
    A = "est"
    cfg = mp.PreProjConfig()
    shapes = ("mini-pythia", "pythia-160m")
    bad(A, "estimate(shape=nope)", lambda: mp.estimate(cfg, "nope"), ["shape"], shapes)
    bad(A, "estimate(shape=None)", lambda: mp.estimate(cfg, None), ["shape"], shapes)
    bad(A, "estimate(shape=1)", lambda: mp.estimate(cfg, 1), ["shape"], shapes)
    bad(A, "estimate(shape='')", lambda: mp.estimate(cfg, ""), ["shape"], shapes)
    bad(A, "estimate(config=None)", lambda: mp.estimate(None, "mini-pythia"), ["config"])
    bad(A, "estimate(config=dict)", lambda: mp.estimate({"expansion": 1.0}, "mini-pythia"), ["config"])
    bad(A, "estimate(config=str)", lambda: mp.estimate("x", "mini-pythia"), ["config"])
    bad(
        A,
        "estimate(config layers out of range)",
        lambda: mp.estimate(mp.PreProjConfig(layers=[99]), "mini-pythia"),
        ["layers"],
    )
    bad(
        A,
        "estimate(config parts=['vision'])",
        lambda: mp.estimate(mp.PreProjConfig(parts=["vision"]), "mini-pythia"),
        ["parts", "vision"],
    )


def audit_io(M, P, lin, tmp: Path):
    A = "io"
    good = tmp / "good"
    mp.save_adapter(M, good)
    whole = tmp / "whole"
    mp.save_pretrained(M, whole)
    afile = tmp / "afile.txt"
    afile.write_text("hello")
    empty = tmp / "empty"
    empty.mkdir()
    missing = tmp / "missing"
    # save_adapter
    bad(A, "save_adapter(path=123)", lambda: mp.save_adapter(M, 123), ["path"], model=M)
    bad(A, "save_adapter(path=None)", lambda: mp.save_adapter(M, None), ["path"], model=M)
    cwd = tmp / "cwd"
    cwd.mkdir()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        bad(
            A,
            "save_adapter(path='') (writes into the cwd?)",
            lambda: mp.save_adapter(M, ""),
            ["path"],
            model=M,
            path=cwd,
        )
    finally:
        os.chdir(old)
    bad(
        A,
        "save_adapter(path is a file)",
        lambda: mp.save_adapter(M, afile),
        ["path", str(afile)],
        model=M,
        path=afile,
        oserror_ok=True,
    )
    bad(
        A,
        "save_adapter(model not injected)",
        lambda: mp.save_adapter(P, tmp / "x1"),
        ["inject"],
        model=P,
        path=tmp / "x1",
    )
    bad(
        A,
        "save_adapter(model nn.Linear)",
        lambda: mp.save_adapter(lin, tmp / "x2"),
        ["inject", "model"],
        path=tmp / "x2",
    )
    bad(A, "save_adapter(model None)", lambda: mp.save_adapter(None, tmp / "x3"), ["model"], path=tmp / "x3")
    for case, name in [("''", ""), ("'nope'", "nope"), ("'a/b'", "a/b"), ("1", 1)]:
        bad(
            A,
            f"save_adapter(adapter_name={case}) into existing folder",
            lambda n=name: mp.save_adapter(M, good, adapter_name=n),
            ["adapter_name", "adapter"],
            model=M,
            path=good,
        )
    bad(
        A,
        "save_adapter(state_dict=list)",
        lambda: mp.save_adapter(M, tmp / "x4", state_dict=[1]),
        ["state_dict"],
        model=M,
        path=tmp / "x4",
    )
    bad(
        A,
        "save_adapter(state_dict={'x': 1})",
        lambda: mp.save_adapter(M, tmp / "x5", state_dict={"x": 1}),
        ["state_dict", "x"],
        model=M,
        path=tmp / "x5",
    )
    bad(
        A,
        "save_adapter(state_dict NaN) over existing",
        lambda: mp.save_adapter(
            M, good, state_dict={k: torch.full_like(v, math.nan) for k, v in mp.adapter_state_dict(M).items()}
        ),
        ["finite", "nan"],
        model=M,
        path=good,
    )
    bad(
        A,
        "save_adapter(readme='yes')",
        lambda: mp.save_adapter(M, tmp / "x6", readme="yes"),
        ["readme"],
        model=M,
        path=tmp / "x6",
    )
    bad(
        A,
        "save_adapter(base_save_token=1)",
        lambda: mp.save_adapter(M, tmp / "x7", base_save_token=1),
        ["base_save_token"],
        model=M,
        path=tmp / "x7",
    )
    bad(
        A,
        "save_adapter(unknown kwarg)",
        lambda: mp.save_adapter(M, tmp / "x8", foo=1),
        ["foo"],
        model=M,
        path=tmp / "x8",
    )
    # load_adapter
    P2 = tiny_neox()
    P2 = tiny_neox()
    bad(
        A,
        "load_adapter(path missing)",
        lambda: mp.load_adapter(P2, missing),
        ["path", str(missing)],
        model=P2,
        oserror_ok=True,
    )
    P2 = tiny_neox()
    bad(
        A,
        "load_adapter(path is a file)",
        lambda: mp.load_adapter(P2, afile),
        ["path", str(afile)],
        model=P2,
        path=afile,
        oserror_ok=True,
    )
    P2 = tiny_neox()
    bad(
        A,
        "load_adapter(path empty folder)",
        lambda: mp.load_adapter(P2, empty),
        ["path", str(empty), "adapter_config"],
        model=P2,
        path=empty,
        oserror_ok=True,
    )
    P2 = tiny_neox()
    bad(A, "load_adapter(path=123)", lambda: mp.load_adapter(P2, 123), ["path"], model=P2)
    P2 = tiny_neox()
    bad(A, "load_adapter(path=None)", lambda: mp.load_adapter(P2, None), ["path"], model=P2)
    P2 = tiny_neox()
    bad(A, "load_adapter(model None)", lambda: mp.load_adapter(None, good), ["model"], path=good)
    P2 = tiny_neox()
    bad(A, "load_adapter(model str)", lambda: mp.load_adapter("m", good), ["model"], path=good)
    P2 = tiny_neox()
    bad(
        A,
        "load_adapter(model nn.Linear)",
        lambda: mp.load_adapter(nn.Linear(32, 32), good),
        ["model", "host", "linear"],
        path=good,
    )
    for case, name in [("''", ""), ("'a/b'", "a/b"), ("1", 1), ("'a.b'", "a.b")]:
        bad(
            A,
            f"load_adapter(adapter_name={case})",
            lambda n=name: mp.load_adapter(P2, good, adapter_name=n),
            ["adapter_name", "name"],
            model=P2,
            path=good,
        )
    P2 = tiny_neox()
    bad(
        A,
        "load_adapter(is_trainable='yes')",
        lambda: mp.load_adapter(P2, good, is_trainable="yes"),
        ["is_trainable"],
        model=P2,
        path=good,
    )
    P2 = tiny_neox()
    bad(
        A,
        "load_adapter(freeze_base='no')",
        lambda: mp.load_adapter(P2, good, freeze_base="no"),
        ["freeze_base"],
        model=P2,
        path=good,
    )
    P2 = tiny_neox()
    bad(A, "load_adapter(unknown kwarg)", lambda: mp.load_adapter(P2, good, foo=1), ["foo"], model=P2, path=good)
    P3 = tiny_neox(hidden_size=64)
    P2 = tiny_neox()
    bad(
        A,
        "load_adapter(model of other width)",
        lambda: mp.load_adapter(P3, good),
        ["shape", "dim", "size", "width", "hidden"],
        model=P3,
        path=good,
    )
    # save_pretrained
    bad(A, "save_pretrained(save_directory=123)", lambda: mp.save_pretrained(M, 123), ["save_directory"], model=M)
    bad(A, "save_pretrained(save_directory=None)", lambda: mp.save_pretrained(M, None), ["save_directory"], model=M)
    bad(
        A,
        "save_pretrained(save_directory is a file)",
        lambda: mp.save_pretrained(M, afile),
        ["save_directory", str(afile)],
        model=M,
        path=afile,
        oserror_ok=True,
    )
    bad(
        A,
        "save_pretrained(model nn.Linear)",
        lambda: mp.save_pretrained(lin, tmp / "y1"),
        ["model", "inject"],
        path=tmp / "y1",
    )
    bad(
        A,
        "save_pretrained(model not injected)",
        lambda: mp.save_pretrained(P, tmp / "y2"),
        ["inject"],
        model=P,
        path=tmp / "y2",
    )
    bad(
        A,
        "save_pretrained(adapter_only='x')",
        lambda: mp.save_pretrained(M, tmp / "y3", adapter_only="x"),
        ["adapter_only"],
        model=M,
        path=tmp / "y3",
    )
    bad(
        A,
        "save_pretrained(state_dict=list)",
        lambda: mp.save_pretrained(M, tmp / "y4", state_dict=[1]),
        ["state_dict"],
        model=M,
        path=tmp / "y4",
    )
    bad(
        A,
        "save_pretrained(unknown kwarg)",
        lambda: mp.save_pretrained(M, tmp / "y5", foo_bar=1),
        ["foo_bar"],
        model=M,
        path=tmp / "y5",
    )
    # from_pretrained
    bad(
        A,
        "from_pretrained(path missing)",
        lambda: mp.from_pretrained(missing),
        ["path", str(missing)],
        oserror_ok=True,
    )
    bad(A, "from_pretrained(path=123)", lambda: mp.from_pretrained(123), ["path"])
    bad(A, "from_pretrained(path=None)", lambda: mp.from_pretrained(None), ["path"])
    bad(
        A,
        "from_pretrained(path is a file)",
        lambda: mp.from_pretrained(afile),
        ["path", str(afile)],
        path=afile,
        oserror_ok=True,
    )
    bad(
        A,
        "from_pretrained(path empty folder)",
        lambda: mp.from_pretrained(empty),
        ["path", str(empty), "config"],
        path=empty,
        oserror_ok=True,
    )
    bad(
        A,
        "from_pretrained(adapter missing)",
        lambda: mp.from_pretrained(whole, adapter=missing),
        ["adapter", str(missing)],
        path=whole,
        oserror_ok=True,
    )
    bad(A, "from_pretrained(adapter=123)", lambda: mp.from_pretrained(whole, adapter=123), ["adapter"], path=whole)
    bad(
        A,
        "from_pretrained(adapter is a file)",
        lambda: mp.from_pretrained(whole, adapter=afile),
        ["adapter", str(afile)],
        path=whole,
        oserror_ok=True,
    )
    bad(
        A,
        "from_pretrained(model_cls='x')",
        lambda: mp.from_pretrained(whole, model_cls="x"),
        ["model_cls"],
        path=whole,
    )
    bad(
        A,
        "from_pretrained(model_cls=nn.Linear)",
        lambda: mp.from_pretrained(whole, model_cls=nn.Linear),
        ["model_cls"],
        path=whole,
    )
    # last_whole_checkpoint
    lw = mp.last_whole_checkpoint
    bad(A, "last_whole_checkpoint(None)", lambda: lw(None), ["output_dir"])
    bad(A, "last_whole_checkpoint(123)", lambda: lw(123), ["output_dir"])
    bad(
        A,
        "last_whole_checkpoint(missing)",
        lambda: lw(missing),
        ["output_dir", str(missing)],
        oserror_ok=True,
        ok_if=lambda o: o is None,
    )
    bad(
        A,
        "last_whole_checkpoint(a file)",
        lambda: lw(afile),
        ["output_dir", str(afile)],
        path=afile,
        oserror_ok=True,
        ok_if=lambda o: o is None,
    )
    bad(A, "last_whole_checkpoint(config='x')", lambda: lw(empty, "x"), ["config"], path=empty)
    bad(A, "last_whole_checkpoint(config=dict)", lambda: lw(empty, {"expansion": 1}), ["config"], path=empty)
    ck = tmp / "run"
    (ck / "checkpoint-notanumber").mkdir(parents=True)
    (ck / "checkpoint-5").mkdir()
    (ck / "checkpoint-5" / "adapter_config.json").write_text("{not json")
    bad(
        A,
        "last_whole_checkpoint(torn checkpoint-5 + checkpoint-notanumber)",
        lambda: lw(ck),
        ["checkpoint"],
        path=ck,
        ok_if=lambda o: o is None,
    )
    # analysis on paths
    bad(
        A,
        "analysis.skip_norms_from_adapter(missing)",
        lambda: analysis.skip_norms_from_adapter(missing),
        ["path", str(missing)],
        oserror_ok=True,
    )
    bad(
        A,
        "analysis.skip_norms_from_adapter(file)",
        lambda: analysis.skip_norms_from_adapter(afile),
        ["path", str(afile)],
        path=afile,
        oserror_ok=True,
    )
    bad(A, "analysis.skip_norms_from_adapter(123)", lambda: analysis.skip_norms_from_adapter(123), ["path"])
    bad(
        A,
        "train.load_checkpoint(missing)",
        lambda: train.load_checkpoint(missing),
        ["path", str(missing)],
        oserror_ok=True,
    )
    bad(
        A,
        "train.load_checkpoint(file)",
        lambda: train.load_checkpoint(afile),
        ["path", str(afile)],
        path=afile,
        oserror_ok=True,
    )


def audit_wrapper(M):
    A = "wrap"
    w = mp.injected_modules(M)[0]
    handles = [
        bad(A, "observe(fn=None)", lambda: w.observe(None), ["fn", "callable"], model=M),
        bad(A, "observe(fn='x')", lambda: w.observe("x"), ["fn", "callable"], model=M),
        bad(A, "observe(fn=1)", lambda: w.observe(1), ["fn", "callable"], model=M),
    ]
    n_obs = len(getattr(w, "_observers", {}) or {})
    report(n_obs == 0, A, "observe refusals left no observer registered", f"observers={n_obs}")
    fwd = bad(
        A,
        "forward after observe(fn=None) accepted",
        lambda: M(torch.randint(0, 100, (1, 4))),
        ["fn"],
        model=M,
        ok_if=lambda o: True,
    )
    del fwd
    for h in handles:
        if hasattr(h, "remove"):
            h.remove()
    ids = torch.randint(0, 100, (2, 5))
    bad(A, "model(adapter_names='default' str)", lambda: M(ids, adapter_names="default"), ["adapter_names"], model=M)
    bad(
        A,
        "model(adapter_names=['nope','nope'])",
        lambda: M(ids, adapter_names=["nope", "nope"]),
        ["adapter_names", "nope"],
        ("default",),
        model=M,
    )
    bad(
        A,
        "model(adapter_names=['default'] len 1 vs batch 2)",
        lambda: M(ids, adapter_names=["default"]),
        ["adapter_names", "batch", "len"],
        model=M,
    )
    bad(A, "model(adapter_names=[1,2])", lambda: M(ids, adapter_names=[1, 2]), ["adapter_names"], model=M)
    bad(A, "wrapper.slots('nope')", lambda: w.slots("nope"), ["nope", "adapter"], ("default",), model=M)
    bad(A, "wrapper.slots(1)", lambda: w.slots(1), ["adapter"], model=M)
    bad(A, "wrapper.set_adapter('nope')", lambda: w.set_adapter("nope"), ["nope", "adapter"], ("default",), model=M)
    report(
        w.active_adapters == ["default"] if hasattr(w, "active_adapters") else True,
        A,
        "wrapper.set_adapter('nope') left the wrapper's active adapter",
        f"{getattr(w, 'active_adapters', '?')}",
    )
    w.set_adapter("default")
    bad(A, "wrapper.set_adapter(None)", lambda: w.set_adapter(None), ["adapter"], model=M)
    bad(A, "wrapper.delete_adapter('nope')", lambda: w.delete_adapter("nope"), ["nope", "adapter"], model=M)
    bad(
        A,
        "wrapper.update_layer(preproj=nn.Linear)",
        lambda: w.update_layer("x", nn.Linear(32, 32), None),
        ["preproj"],
        model=M,
    )
    bad(
        A,
        "wrapper.update_layer(preproj wrong dim)",
        lambda: w.update_layer("x", mp.PreProjection(16), None),
        ["preproj", "dim", "width"],
        model=M,
    )
    bad(
        A,
        "wrapper.update_layer(name='')",
        lambda: w.update_layer("", mp.PreProjection(32), None),
        ["adapter_name", "name"],
        model=M,
    )
    call = w.call
    base = w.base_layer if hasattr(w, "base_layer") else None
    bad(
        A,
        "PreProjAttention(base_layer=None)",
        lambda: mp.PreProjAttention(None, call, mp.PreProjection(32), None, 0),
        ["base_layer"],
    )
    bad(
        A,
        "PreProjAttention(call=None)",
        lambda: mp.PreProjAttention(nn.Linear(32, 32), None, mp.PreProjection(32), None, 0),
        ["call"],
    )
    bad(
        A,
        "PreProjAttention(block_index=-1)",
        lambda: mp.PreProjAttention(nn.Linear(32, 32), call, mp.PreProjection(32), None, -1),
        ["block_index"],
    )
    bad(
        A,
        "PreProjAttention(block_index='0')",
        lambda: mp.PreProjAttention(nn.Linear(32, 32), call, mp.PreProjection(32), None, "0"),
        ["block_index"],
    )
    bad(
        A,
        "PreProjAttention(preproj='x')",
        lambda: mp.PreProjAttention(nn.Linear(32, 32), call, "x", None, 0),
        ["preproj"],
    )
    bad(
        A,
        "PreProjAttention(both slots None)",
        lambda: mp.PreProjAttention(nn.Linear(32, 32), call, None, None, 0),
        ["preproj", "skip"],
        ok_if=lambda o: True,
    )
    bad(
        A,
        "PreProjAttention(adapter_name='')",
        lambda: mp.PreProjAttention(nn.Linear(32, 32), call, mp.PreProjection(32), None, 0, adapter_name=""),
        ["adapter_name"],
    )
    bad(
        A,
        "PreProjAttention(part=1)",
        lambda: mp.PreProjAttention(nn.Linear(32, 32), call, mp.PreProjection(32), None, 0, part=1),
        ["part"],
    )
    del base


def audit_hosts_analysis_train(M, P, lin):
    A = "hosts"
    names = sorted(hosts.HOSTS)[:3]
    bad(A, "get_host('nope')", lambda: hosts.get_host("nope"), ["nope", "host"], names)
    bad(A, "get_host(None)", lambda: hosts.get_host(None), ["name", "host"])
    bad(A, "get_host(1)", lambda: hosts.get_host(1), ["name", "host"])
    bad(A, "get_host('')", lambda: hosts.get_host(""), ["name", "host"], names)
    bad(A, "find_host(None)", lambda: hosts.find_host(None), ["model"])
    bad(A, "find_host('x')", lambda: hosts.find_host("x"), ["model"])
    bad(A, "find_host(nn.Linear)", lambda: hosts.find_host(lin), ["host", "linear", "model"])
    bad(A, "register_host(None)", lambda: hosts.register_host(None), ["spec", "HostSpec"])
    bad(A, "register_host(dict)", lambda: hosts.register_host({"name": "x"}), ["spec", "HostSpec"])
    bad(A, "HostSpec(parts=())", lambda: hosts.HostSpec("x", "d", ()), ["parts"])
    bad(A, "HostSpec(name=1)", lambda: hosts.HostSpec(1, "d", ()), ["name"])
    bad(
        A,
        "HostSpec(checkpointing='nope')",
        lambda: hosts.HostSpec("x", "d", (), checkpointing="nope"),
        ["checkpointing"],
    )
    A = "analysis"
    batches = [{"input_ids": torch.randint(0, 100, (1, 5))}]
    for case, arg, nm in [
        ("None", None, ["model"]),
        ("nn.Linear", lin, ["inject", "model"]),
        ("not injected", P, ["inject"]),
    ]:
        bad(A, f"skip_norms({case})", lambda a=arg: analysis.skip_norms(a), nm, model=arg)
        bad(A, f"routing_ratios({case})", lambda a=arg: analysis.routing_ratios(a, batches), nm, model=arg)
    bad(A, "routing_ratios(batches=None)", lambda: analysis.routing_ratios(M, None), ["batches"], model=M)
    bad(A, "routing_ratios(batches=[])", lambda: analysis.routing_ratios(M, []), ["batches", "empty"], model=M)
    bad(
        A, "routing_ratios(batches=dict)", lambda: analysis.routing_ratios(M, batches[0]), ["batches", "dict"], model=M
    )
    bad(
        A,
        "routing_ratios(token_mask_key='nope')",
        lambda: analysis.routing_ratios(M, batches, "nope"),
        ["token_mask_key", "nope"],
        model=M,
    )
    A = "train"
    bad(A, "get_preset('nope')", lambda: train.get_preset("nope"), ["nope", "preset"], list(train.PRESETS)[:2])
    bad(A, "get_preset(None)", lambda: train.get_preset(None), ["preset", "name"])
    bad(
        A,
        "get_preset(overrides unknown)",
        lambda: train.get_preset(list(train.PRESETS)[0], nope_field=1),
        ["nope_field"],
    )
    for f in ("paper_lora_rank", "preproj_params"):
        fn = getattr(train, f)
        for case, a in [
            ("hidden_size=0", (0, 2)),
            ("hidden_size=-1", (-1, 2)),
            ("num_layers=0", (64, 0)),
            ("hidden_size='64'", ("64", 2)),
            ("hidden_size=None", (None, 2)),
        ]:
            bad(A, f"{f}({case})", lambda fn=fn, a=a: fn(*a), [case.split("=")[0]])
        bad(A, f"{f}(expansion=nan)", lambda fn=fn: fn(64, 2, math.nan), ["expansion"])
    bad(A, "select_lines(num_lines=-1)", lambda: train.select_lines(["a" * 60], -1), ["num_lines"])
    bad(A, "select_lines(lines=None)", lambda: train.select_lines(None), ["lines"])
    bad(A, "select_lines(lines=str)", lambda: train.select_lines("abc" * 30), ["lines"])
    P4 = tiny_neox()
    bad(
        A,
        "apply_method(method='nope')",
        lambda: train.apply_method(P4, "nope"),
        ["method"],
        list(train.METHODS)[:3],
        model=P4,
    )
    bad(
        A,
        "apply_method(method=None)",
        lambda: train.apply_method(P4, None),
        ["method"],
        list(train.METHODS)[:3],
        model=P4,
    )
    bad(A, "apply_method(lora_r=0)", lambda: train.apply_method(P4, "lora", lora_r=0), ["lora_r"], model=P4)
    bad(
        A,
        "apply_method(sizes=list)",
        lambda: train.apply_method(P4, list(train.METHODS)[0], sizes=[1]),
        ["sizes"],
        model=P4,
    )


def main():
    torch.set_num_threads(1)
    lin = nn.Linear(32, 32)
    P = tiny_neox()
    M = mp.inject(tiny_neox())
    sections = [
        ("rope", audit_rope),
        ("pos", audit_positions),
        ("mod", audit_modules),
        ("query", lambda: audit_queries(M, P, lin)),
        ("sd", lambda: audit_state_dict(M)),
        ("est", audit_estimate),
        ("wrap", lambda: audit_wrapper(M)),
        ("hosts", lambda: audit_hosts_analysis_train(M, P, lin)),
    ]
    with tempfile.TemporaryDirectory() as td:
        sections.append(("io", lambda: audit_io(M, P, lin, Path(td))))
        for name, fn in sections:
            try:
                fn()
            except Exception as e:  # noqa: BLE001
                report(False, name, "section setup", f"harness error {type(e).__name__}: {str(e)[:200]}")
    n = len(RESULTS)
    p = sum(ok for ok, *_ in RESULTS)
    print(f"TOTAL {n}: {p} PASS, {n - p} FAIL")


if __name__ == "__main__":
    main()
