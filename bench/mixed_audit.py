"""Mixed text-image (and video) audit: mmpreproj's multimodal positions, M-RoPE, and the pre-projection + content
skip on mixed models, against the docs and against reference implementations this project did not write.

Run:  PYTHONPATH=. OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python bench/mixed_audit.py [--only SUBSTR]

Written by an independent audit from the docs alone (docs/howto-mixed-model.md, docs/api.md, docs/hosts.md,
docs/limits.md, README.md, recipes/mixed/README.md and the public docstrings of `mmpreproj.rope` and of the
package root); the expectations are the auditor's. It goes past `bench/rope_audit.py` (not repeated here).
Every model is tiny, random, built from a config in code; nothing is downloaded. Areas:
  * pos:    `multimodal_positions` == transformers' `Qwen2VLModel.get_rope_index` (and Qwen2.5-VL's, images) for
            an image alone / first / last, 1 x N and N x 1 grids, three grids, video with t > max(h, w), image +
            video, spatial merge 2, text only, delta for generated tokens, a batch whose rows hold 2 / 0 / 1
            images with left and right padding + attention mask (max |diff| of the ids, and the deltas).
  * enc:    `MultimodalRoPE` / interleaved M-RoPE == Qwen2-VL / Qwen3-VL rotary + apply_rotary_pos_emb on video
            positions, in bf16 / fp16 / fp64; per-row (B, N, 3) positions; text-only == RoPE1D (partial rotary,
            interleaved layout); int32 / float positions.
  * vlm:    tiny Qwen2-VL and Qwen2.5-VL ForConditionalGeneration with `mmpreproj.inject`: identity init ==
            base bit-exact (image, left-padded multi-image batch, video, bf16); with perturbed adapter weights,
            greedy `generate` (KV cache) == step-by-step no-cache recomputation (image, batch, video, image +
            video, a text-only row); left- and right-padded rows == the row alone; save_adapter / load_adapter,
            save_pretrained / from_pretrained, the hosts.md example with modules_to_save=["projector"]; unload
            bit-exact; adapter_disabled; parts; peft.get_peft_model route; gradient checkpointing; mixed-adapter
            batches (refused through the packed vision tower, as docs/limits.md says; per row in the language).
  * lm:     a Qwen2 decoder with `use_multimodal_rope` + inject: identity exact, order of the two calls, equal
            bit for bit to Qwen2-VL's language model with the same adapter, KV-cache decode at N + k + delta,
            save/load, unload + remove_multimodal_rope.
  * howto:  the page's own TinyMixedModel (Block stack + MultimodalRoPE): identity exact, 7,168 trainable
            weights, the rope untouched by training, the pre-projection's output independent of pos, shift
            invariance, permutation of patches with their positions (one causal block; non-causal stack),
            KV-cache decode with the same cache bytes, left-padded batch of two grids with (B, N, 3) pos + mask,
            RoPE1D / 2D / 3D / learned-position stacks, save/load + unload.
  * refuse: bad segments and grids, wrong sections / pos shape / pos length / head_dim, parts, layers, init,
            compute_dtype, use_multimodal_rope on a model already M-RoPE, adapter of another width or host,
            a NaN adapter: one-line ValueError/TypeError naming the argument, model unchanged.
One line per case: PASS/FAIL | area | case | details; then TOTAL. `bench/results/mixed_audit.txt` is its output.

Result on commit 994fe83 (CPU, one thread, about 10 s wall with imports): TOTAL 115: 114 PASS, 1 FAIL.
Every reference comparison is exact or within float32 rounding (positions bit-equal to get_rope_index in every
layout tried, padded batches included; generate == no-cache recomputation to <= 6e-5 on the logits, same
tokens; adapter round trips and unload bit-exact). The one FAIL is minor and outside a promise: `MultimodalRoPE`
given integer q/k (its `apply_rotary` docstring says "any float dtype") returns an int64 tensor with the
rotation truncated instead of refusing. Harness notes: inject draws W_up from the global RNG (the cases seed it
before each inject they compare); inject's seam-check hooks go away after the first forward.
That run's lines: bench/results/mixed_audit_before.txt.

Run again after the fix (RotaryEncoder.forward refuses non-float q/k naming both dtypes; MultimodalRoPE's docstring
says its equality with transformers is exact in float32, not bf16/fp16): TOTAL 115: 115 PASS, 0 FAIL.
"""

from __future__ import annotations

import argparse
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

import torch  # noqa: E402
import transformers as tf  # noqa: E402
from torch import nn  # noqa: E402
from transformers.models.qwen2_vl import modeling_qwen2_vl as mq  # noqa: E402

import mmpreproj  # noqa: E402
from mmpreproj.modules import Block  # noqa: E402
from mmpreproj.rope import (  # noqa: E402
    MultimodalRoPE,
    RoPE1D,
    RoPE2D,
    RoPE3D,
    multimodal_positions,
    remove_multimodal_rope,
    use_multimodal_rope,
)

CASES: list[tuple[str, str, object]] = []
RESULTS: list[bool] = []
V = 100  # text vocabulary; V = vision start, V + 1 = video token, V + 2 = image token
VSTART, VID, IMG = V, V + 1, V + 2


def case(area, name):
    def deco(fn):
        CASES.append((area, name, fn))
        return fn

    return deco


def check(cond, detail):
    if not cond:
        raise AssertionError(detail)
    return detail


def snap(model):
    """What a refused call must leave alone: state values, requires_grad, module tree, hooks."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    tree = [(n, type(m).__name__) for n, m in model.named_modules()]
    hooks = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())
    grads = [p.requires_grad for p in model.parameters()]
    return sd, tree, hooks, grads


def same_snap(a, b):
    sda, *ra = a
    sdb, *rb = b
    if sda.keys() != sdb.keys():
        return "state_dict keys differ"
    bad = [
        k
        for k in sda
        if not (
            torch.equal(sda[k], sdb[k])
            or torch.equal(sda[k].isnan(), sdb[k].isnan())
            and torch.equal(sda[k].nan_to_num(), sdb[k].nan_to_num())
        )
    ]
    if bad:
        return f"values differ: {bad[:3]}"
    for what, x, y in zip(("module tree", "hooks", "requires_grad"), ra, rb):
        if x != y:
            return f"{what} differ"
    return ""


def refusal(fn, model, *names):
    """fn() must raise a one-line ValueError/TypeError naming one of `names`, leaving `model` as it was."""
    before = snap(model) if model is not None else None
    try:
        fn()
    except (ValueError, TypeError) as err:
        msg = f"{type(err).__name__}: {err}"
        if model is not None:
            diff = same_snap(before, snap(model))
            check(not diff, f"refused ({msg[:80]}) but model changed: {diff}")
        check("\n" not in msg.strip(), f"message has several lines: {msg[:120]!r}")
        check(any(n.lower() in msg.lower() for n in names), f"message names none of {names}: {msg[:150]!r}")
        return f"refused: {msg[:110]}"
    except Exception as err:  # noqa: BLE001
        raise AssertionError(f"raised {type(err).__name__} (not ValueError/TypeError): {str(err)[:120]}") from None
    changed = same_snap(before, snap(model)) if model is not None else "n/a"
    raise AssertionError(f"not refused (model changed: {changed or 'no'})")


def maxdiff(a, b):
    return (a.double() - b.double()).abs().max().item()


# ----------------------------------------------------------------------------------------------------- positions
def _vl_config(cls="Qwen2VL", merge=1, width=32, depth=1, heads=2, kv=1, sections=(2, 3, 3)):
    return getattr(tf, f"{cls}Config")(
        text_config=dict(
            vocab_size=V + 3,
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=depth,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": list(sections)},
        ),
        vision_config=dict(
            depth=depth,
            embed_dim=width,
            hidden_size=width,
            num_heads=2,
            mlp_ratio=2,
            patch_size=4,
            temporal_patch_size=2,
            spatial_merge_size=merge,
            in_channels=3,
            out_hidden_size=width,
            intermediate_size=2 * width,
            window_size=8,
            fullatt_block_indexes=[depth - 1],
        ),
        image_token_id=IMG,
        video_token_id=VID,
        vision_start_token_id=VSTART,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


_REF_MODELS: dict = {}


def _ref_model(cls="Qwen2VL", merge=1):
    key = (cls, merge)
    if key not in _REF_MODELS:
        torch.manual_seed(0)
        _REF_MODELS[key] = getattr(tf, f"{cls}Model")(_vl_config(cls, merge)).eval()
    return _REF_MODELS[key]


def _tokens(segments, merge=1):
    """ids, token types, image grids, video grids (in patches: tokens x merge) for get_rope_index."""
    ids, types, ig, vg = [], [], [], []
    for kind, n in segments:
        if kind == "text":
            ids += [5] * n
            types += [0] * n
        elif kind == "image":
            ids += [IMG] * (n[0] * n[1])
            types += [1] * (n[0] * n[1])
            ig.append([1, n[0] * merge, n[1] * merge])
        else:
            ids += [VID] * (n[0] * n[1] * n[2])
            types += [2] * (n[0] * n[1] * n[2])
            vg.append([n[0], n[1] * merge, n[2] * merge])
    return ids, types, ig, vg


def ref_positions(segments, cls="Qwen2VL", merge=1):
    """transformers' get_rope_index for one sequence: (N, 3), delta."""
    ids, types, ig, vg = _tokens(segments, merge)
    out, delta = _ref_model(cls, merge).get_rope_index(
        torch.tensor([ids]),
        torch.tensor([types]),
        image_grid_thw=torch.tensor(ig) if ig else None,
        video_grid_thw=torch.tensor(vg) if vg else None,
    )
    return out[:, 0].T, int(delta.reshape(-1)[0])


def _cmp(segments, cls="Qwen2VL", merge=1):
    ref, rdelta = ref_positions(segments, cls, merge)
    pos, delta = multimodal_positions(segments)
    if pos.shape != ref.shape:
        raise AssertionError(f"shape {tuple(pos.shape)} vs ref {tuple(ref.shape)}")
    bad = (pos != ref).any(-1).nonzero().flatten().tolist()
    return check(
        not bad and int(delta) == rdelta,
        f"N {pos.shape[0]}, mismatching tokens {len(bad)} {bad[:4]} (ours {pos[bad[:1]].tolist()} ref "
        f"{ref[bad[:1]].tolist()}), delta {delta} vs ref {rdelta}, max|diff| {maxdiff(pos, ref):.0f}",
    )


POS_CASES = [
    ("image alone 3x5", [("image", (3, 5))]),
    ("image first, then text", [("image", (2, 2)), ("text", 4)]),
    ("image last", [("text", 3), ("image", (2, 4))]),
    ("1 x N image (1x7) between text", [("text", 2), ("image", (1, 7)), ("text", 2)]),
    ("N x 1 image (6x1) between text", [("text", 2), ("image", (6, 1)), ("text", 3)]),
    ("1 x 1 image", [("text", 1), ("image", (1, 1)), ("text", 2)]),
    (
        "three images of different grids",
        [("text", 1), ("image", (2, 3)), ("text", 2), ("image", (4, 1)), ("text", 1), ("image", (1, 5)), ("text", 2)],
    ),
    ("image first and last, text between", [("image", (3, 2)), ("text", 2), ("image", (2, 5))]),
    ("video t > max(h, w) (5x2x2), text after", [("text", 2), ("video", (5, 2, 2)), ("text", 3)]),
    ("video alone 2x3x2", [("video", (2, 3, 2))]),
    ("video t = 1 (1x3x4)", [("text", 1), ("video", (1, 3, 4)), ("text", 1)]),
    (
        "image then video then image",
        [
            ("text", 1),
            ("image", (2, 2)),
            ("text", 1),
            ("video", (3, 2, 3)),
            ("text", 1),
            ("image", (1, 3)),
            ("text", 2),
        ],
    ),
    ("long text after a large image (8x8)", [("text", 4), ("image", (8, 8)), ("text", 30)]),
]
for label, segs in POS_CASES:

    @case("pos", f"multimodal_positions == Qwen2-VL get_rope_index: {label}")
    def _(segs=segs):
        return _cmp(segs)


@case("pos", "merge 2: grid (2,3) in tokens == get_rope_index with image_grid_thw (1,4,6) (docstring: after merging)")
def _():
    return _cmp([("text", 2), ("image", (2, 3)), ("text", 2), ("video", (2, 1, 2)), ("text", 1)], merge=2)


for label, segs in [
    (
        "image first / middle / last",
        [("image", (2, 3)), ("text", 2), ("image", (1, 4)), ("text", 1), ("image", (3, 3))],
    ),
    ("1 x N and N x 1", [("text", 2), ("image", (1, 6)), ("text", 1), ("image", (5, 1)), ("text", 2)]),
]:

    @case("pos", f"multimodal_positions == Qwen2.5-VL get_rope_index (images): {label}")
    def _(segs=segs):
        return _cmp(segs, cls="Qwen2_5_VL")


@case("pos", "text only: (n, 3) arange on all axes, delta 0 (== the decoder's own text positions)")
def _():
    pos, delta = multimodal_positions([("text", 7)])
    want = torch.arange(7)[:, None].expand(7, 3)
    return check(torch.equal(pos, want) and int(delta) == 0, f"pos {pos[:, 0].tolist()}, delta {delta}")


@case("pos", "text runs split in pieces == one run (positions are additive)")
def _():
    a, da = multimodal_positions([("text", 2), ("text", 3), ("image", (2, 2)), ("text", 1), ("text", 2)])
    b, db = multimodal_positions([("text", 5), ("image", (2, 2)), ("text", 3)])
    return check(torch.equal(a, b) and da == db, f"equal {torch.equal(a, b)}, delta {da} vs {db}")


@case("pos", "delta: generated tokens at N+k+delta == get_rope_index of prompt + generated text")
def _():
    prompt = [("text", 3), ("image", (3, 4)), ("text", 2)]
    pos, delta = multimodal_positions(prompt)
    n = pos.shape[0]
    ref, _ = ref_positions([*prompt, ("text", 4)])
    want = ref[n:, 0].tolist()
    got = [n + k + int(delta) for k in range(4)]
    return check(got == want and (ref[n:] == ref[n:, :1]).all(), f"ours {got}, ref {want}")


def _batch(rows, side):
    """Per-row segments -> padded ids/types/mask/grids, and our (3, B, L) ids placed at the non-pad positions."""
    toks = [_tokens(r) for r in rows]
    L = max(len(t[0]) for t in toks)
    ids = torch.zeros(len(rows), L, dtype=torch.long)
    types = torch.zeros(len(rows), L, dtype=torch.long)
    mask = torch.zeros(len(rows), L, dtype=torch.long)
    ours = torch.zeros(3, len(rows), L, dtype=torch.long)
    deltas = []
    for b, ((i, t, _, _), segs) in enumerate(zip(toks, rows)):
        n = len(i)
        sl = slice(L - n, L) if side == "left" else slice(0, n)
        ids[b, sl], types[b, sl], mask[b, sl] = torch.tensor(i), torch.tensor(t), 1
        p, d = multimodal_positions(segs)
        ours[:, b, sl] = p.T
        deltas.append(int(d))
    ig = [g for t in toks for g in t[2]]
    vg = [g for t in toks for g in t[3]]
    return ids, types, mask, ig, vg, ours, deltas


BATCH_ROWS = [
    [("text", 2), ("image", (2, 3)), ("text", 1), ("image", (1, 4)), ("text", 2)],  # two images
    [("text", 3)],  # none
    [("image", (3, 3)), ("text", 4)],  # one, first
]
for side in ("left", "right"):

    @case("pos", f"batch, rows with 2 / 0 / 1 images, {side} padding + mask == get_rope_index (non-pad positions)")
    def _(side=side):
        ids, types, mask, ig, vg, ours, deltas = _batch(BATCH_ROWS, side)
        ref, rdelta = _ref_model().get_rope_index(
            ids, types, image_grid_thw=torch.tensor(ig), video_grid_thw=None, attention_mask=mask
        )
        m = mask.bool()[None].expand(3, -1, -1)
        err = (ours[m] - ref[m]).abs().max().item()
        rd = rdelta.reshape(-1).tolist()
        return check(
            err == 0 and rd == deltas, f"max|diff| {err} on {int(mask.sum())} tokens, deltas {deltas} vs {rd}"
        )


# ------------------------------------------------------------------------------------------------- encoder
@case("enc", "MultimodalRoPE (B,N,3) per-row positions == each row with its own (N,3)")
def _():
    rope = MultimodalRoPE(16, sections=(2, 3, 3))
    a, _ = multimodal_positions([("text", 2), ("image", (2, 3)), ("text", 1)])
    b, _ = multimodal_positions([("image", (1, 5)), ("text", 4)])
    q, k = torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16)
    qb, kb = rope(q, k, torch.stack([a, b]))
    q0, k0 = rope(q[:1], k[:1], a)
    q1, k1 = rope(q[1:], k[1:], b)
    err = max(maxdiff(qb, torch.cat([q0, q1])), maxdiff(kb, torch.cat([k0, k1])))
    return check(err == 0, f"max|diff| {err:.2e}")


@case("enc", "MultimodalRoPE video positions (t>1) == Qwen2VLRotaryEmbedding + apply_rotary_pos_emb")
def _():
    pos, _ = multimodal_positions([("text", 2), ("video", (4, 2, 3)), ("text", 3)])
    n = pos.shape[0]
    cfg = tf.Qwen2VLTextConfig(
        hidden_size=32,
        num_attention_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]},
    )
    q, k = torch.randn(1, 2, n, 16), torch.randn(1, 2, n, 16)
    cos, sin = mq.Qwen2VLRotaryEmbedding(cfg)(q, pos.T[:, None])
    rq, rk = mq.apply_rotary_pos_emb(q, k, cos, sin)
    oq, ok = MultimodalRoPE(16, sections=(2, 3, 3))(q, k, pos)
    err = max(maxdiff(oq, rq), maxdiff(ok, rk))
    return check(err < 1e-6, f"max|diff| {err:.2e}")


for dt in (torch.bfloat16, torch.float16, torch.float64):

    @case("enc", f"MultimodalRoPE in {str(dt)[6:]} == Qwen2VLRotaryEmbedding + apply_rotary_pos_emb in that dtype")
    def _(dt=dt):
        pos, _ = multimodal_positions([("text", 2), ("image", (3, 4)), ("text", 3)])
        n = pos.shape[0]
        cfg = tf.Qwen2VLTextConfig(
            hidden_size=32,
            num_attention_heads=2,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]},
        )
        q, k = torch.randn(1, 2, n, 16).to(dt), torch.randn(1, 2, n, 16).to(dt)
        cos, sin = mq.Qwen2VLRotaryEmbedding(cfg)(q, pos.T[:, None])
        rq, rk = mq.apply_rotary_pos_emb(q, k, cos, sin)
        oq, ok = MultimodalRoPE(16, sections=(2, 3, 3))(q, k, pos)
        err = max(maxdiff(oq, rq), maxdiff(ok, rk))
        tol = 1e-6 if dt == torch.float64 else 1.6e-2 * q.abs().max().item()
        return check(
            oq.dtype == dt and err <= tol,
            f"dtype {oq.dtype}, max|diff| {err:.2e} (tol {tol:.1e}; ref rounds cos/sin to {str(cos.dtype)[6:]}, "
            f"bit-equal {torch.equal(oq, rq)})",
        )


@case("enc", "interleaved M-RoPE (make_mrope) == Qwen3-VL rotary + apply_rotary_pos_emb on video + image positions")
def _():
    from transformers.models.qwen3_vl import modeling_qwen3_vl as m3

    from mmpreproj.rope import make_mrope

    pos, _ = multimodal_positions([("text", 2), ("video", (3, 2, 3)), ("text", 1), ("image", (2, 4)), ("text", 2)])
    n = pos.shape[0]
    cfg = tf.Qwen3VLTextConfig(
        hidden_size=64,
        num_attention_heads=4,
        head_dim=16,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1e4,
            "mrope_section": [4, 2, 2],
            "mrope_interleaved": True,
        },
    )
    q, k = torch.randn(1, 4, n, 16), torch.randn(1, 4, n, 16)
    cos, sin = m3.Qwen3VLTextRotaryEmbedding(cfg)(q, pos.T[:, None])
    rq, rk = m3.apply_rotary_pos_emb(q, k, cos, sin)
    oq, ok = make_mrope(16, layout="interleaved", sections=(4, 2, 2))(q, k, pos)
    err = max(maxdiff(oq, rq), maxdiff(ok, rk))
    return check(err < 1e-6, f"max|diff| {err:.2e}")


@case("enc", "MultimodalRoPE: int32 and float positions give the same rotation as int64 (from multimodal_positions)")
def _():
    pos, _ = multimodal_positions([("text", 2), ("image", (3, 4)), ("text", 3)])
    rope = MultimodalRoPE(16, sections=(2, 3, 3))
    q, k = torch.randn(1, 2, pos.shape[0], 16), torch.randn(1, 2, pos.shape[0], 16)
    a = rope(q, k, pos)[0]
    b = rope(q, k, pos.int())[0]
    c = rope(q, k, pos.float())[0]
    return check(torch.equal(a, b) and torch.equal(a, c), f"int32 {maxdiff(a, b):.1e}, float {maxdiff(a, c):.1e}")


@case("enc", "MultimodalRoPE(rotary_fraction=0.5) on text (t=h=w) == RoPE1D(16, rotary_fraction=0.5) bit-exact")
def _():
    p = torch.arange(13)
    q, k = torch.randn(1, 2, 13, 16), torch.randn(1, 2, 13, 16)
    a = MultimodalRoPE(16, sections=(1, 1, 2), rotary_fraction=0.5)(q, k, p[:, None].expand(-1, 3))
    b = RoPE1D(16, rotary_fraction=0.5)(q, k, p)
    tail = torch.equal(a[0][..., 8:], q[..., 8:])
    return check(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and tail,
        f"max|diff| {maxdiff(a[0], b[0]):.1e}, channels 8.. pass through {tail}",
    )


@case("enc", "InterleavedMultimodalRoPE on text (t=h=w) == RoPE1D bit-exact (docstring)")
def _():
    from mmpreproj.rope import InterleavedMultimodalRoPE

    p = torch.arange(13)
    q, k = torch.randn(1, 2, 13, 16), torch.randn(1, 2, 13, 16)
    a = InterleavedMultimodalRoPE(16, sections=(4, 2, 2))(q, k, p[:, None].expand(-1, 3))
    b = RoPE1D(16)(q, k, p)
    return check(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), f"max|diff| {maxdiff(a[0], b[0]):.1e}")


@case("pos", "video with more frames than max(h, w): text after overlaps the video's t (documented: docstring)")
def _():
    pos, _ = multimodal_positions([("text", 2), ("video", (6, 2, 3)), ("text", 2)])
    vid_t = pos[2:-2, 0]
    after = pos[-2:, 0].tolist()
    overlap = int(vid_t.max()) >= after[0]
    return check(after[0] == 2 + 3 and overlap, f"video t {vid_t.min()}..{vid_t.max()}, text after at {after}")


# ------------------------------------------------------------------------------------------------- vlm models
def vlm(cls="Qwen2VL", seed=0, width=32, depth=2):
    torch.manual_seed(seed)
    cfg = _vl_config(cls, merge=2, width=width, depth=depth, heads=2, kv=1)
    return getattr(tf, f"{cls}ForConditionalGeneration")(cfg).eval()


def vl_prompt(rows, video=False, seed=2, row_ids=None, side="left"):
    """rows: per row a list of ("text", n) / ("image", (h, w)) in tokens (merge 2); left-padded batch inputs.
    Row b draws its text and pixels from seed + row_ids[b], so a row alone gets what it had in a batch."""
    seqs, types, grids, pix, vgrids, vpix = [], [], [], [], [], []
    for b, segs in enumerate(rows):
        g = torch.Generator().manual_seed(seed + (row_ids or range(len(rows)))[b])
        ids, ty = [], []
        for kind, n in segs:
            if kind == "text":
                ids += torch.randint(3, V, (n,), generator=g).tolist()
                ty += [0] * n
            else:
                is_video = video or kind == "video"
                ids += [VSTART]
                ty += [0]
                tok = VID if is_video else IMG
                t = 2 if is_video else 1  # temporal patches (4 frames of video at temporal_patch_size 2)
                ids += [tok] * (t * n[0] * n[1])
                ty += [2 if is_video else 1] * (t * n[0] * n[1])
                (vgrids if is_video else grids).append([t, 2 * n[0], 2 * n[1]])
                (vpix if is_video else pix).append(torch.randn(t * 4 * n[0] * n[1], 3 * 2 * 4 * 4, generator=g))
        seqs.append(ids)
        types.append(ty)
    L = max(len(s) for s in seqs)
    ids = torch.zeros(len(rows), L, dtype=torch.long)
    tt = torch.zeros(len(rows), L, dtype=torch.long)
    mask = torch.zeros(len(rows), L, dtype=torch.long)
    for b, (s, t) in enumerate(zip(seqs, types)):
        sl = slice(L - len(s), L) if side == "left" else slice(0, len(s))
        ids[b, sl], tt[b, sl], mask[b, sl] = torch.tensor(s), torch.tensor(t), 1
    kw = dict(input_ids=ids, attention_mask=mask, mm_token_type_ids=tt)
    if grids:
        kw["pixel_values"], kw["image_grid_thw"] = torch.cat(pix), torch.tensor(grids)
    if vgrids:
        kw["pixel_values_videos"], kw["video_grid_thw"] = torch.cat(vpix), torch.tensor(vgrids)
    return kw


ONE = [[("text", 2), ("image", (2, 2)), ("text", 3)]]
AV = [[("text", 1), ("image", (1, 2)), ("text", 2), ("video", (2, 1)), ("text", 2)]]  # an image and a video
MIXED = [[("text", 2), ("image", (2, 2)), ("text", 3)], [("text", 9)]]  # one row with an image, one without
TWO = [[("text", 1), ("image", (1, 2)), ("text", 2), ("image", (2, 3)), ("text", 2)], [("text", 3), ("image", (2, 1))]]


def logits_of(model, kw):
    with torch.no_grad():
        return model(**kw).logits


def perturb(model, scale=0.05, seed=7):
    g = torch.Generator().manual_seed(seed)
    n = 0
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * scale)
                n += p.numel()
    return n


def trained_vlm(cls="Qwen2VL", parts=None):
    m = vlm(cls)
    torch.manual_seed(123)  # the pre-projection's W_up is drawn from the global RNG
    mmpreproj.inject(m, mmpreproj.PreProjConfig(init="identity", parts=parts))
    perturb(m)
    return m


for cls in ("Qwen2VL", "Qwen2_5_VL"):
    for what, rows, video in (
        ("one image", ONE, False),
        ("two rows, 2 and 1 images, left-padded", TWO, False),
        ("a video (t=2)", ONE, True),
    ):

        @case("vlm", f"{cls}: identity inject (vision + language) == base logits bit-exact, {what}")
        def _(cls=cls, rows=rows, video=video):
            m = vlm(cls)
            kw = vl_prompt(rows, video)
            base = logits_of(m, kw)
            mmpreproj.inject(m, mmpreproj.PreProjConfig(init="identity"))
            out = logits_of(m, kw)
            n = len(mmpreproj.injected_modules(m)) if hasattr(mmpreproj, "injected_modules") else -1
            return check(torch.equal(out, base), f"{n} blocks injected, max|diff| {maxdiff(out, base):.2e}")


def greedy_nocache(model, kw, steps):
    """Greedy decoding by full recomputation without cache (the reference for generate)."""
    kw = dict(kw)
    out = []
    for _ in range(steps):
        with torch.no_grad():
            lg = model(**kw, use_cache=False).logits[:, -1]
        nxt = lg.argmax(-1, keepdim=True)
        out.append((nxt, lg))
        kw["input_ids"] = torch.cat([kw["input_ids"], nxt], 1)
        kw["attention_mask"] = torch.cat([kw["attention_mask"], torch.ones_like(nxt)], 1)
        kw["mm_token_type_ids"] = torch.cat([kw["mm_token_type_ids"], torch.zeros_like(nxt)], 1)
    return torch.cat([o[0] for o in out], 1), torch.stack([o[1] for o in out], 1)


def greedy_generate(model, kw, steps):
    with torch.no_grad():
        g = model.generate(
            **kw,
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            eos_token_id=None,
            pad_token_id=0,
        )
    return g.sequences[:, kw["input_ids"].shape[1] :], torch.stack(g.scores, 1)


for cls in ("Qwen2VL", "Qwen2_5_VL"):
    for what, rows, video in (
        ("one image", ONE, False),
        ("left-padded batch 2/1 images", TWO, False),
        ("a video", ONE, True),
        ("left-padded batch, a row with no image", MIXED, False),
        ("an image and a video in one prompt", AV, False),
    ):

        @case("vlm", f"{cls} trained adapter: generate (KV cache, greedy, 5) == no-cache recompute, {what}")
        def _(cls=cls, rows=rows, video=video):
            m = trained_vlm(cls)
            kw = vl_prompt(rows, video)
            seq, sc = greedy_generate(m, kw, 5)
            ref, rl = greedy_nocache(m, kw, 5)
            err = maxdiff(sc, rl)
            return check(
                torch.equal(seq, ref) and err < 1e-4,
                f"tokens equal {torch.equal(seq, ref)} ({seq[0].tolist()}), logits max|diff| {err:.2e}",
            )


for cls in ("Qwen2VL", "Qwen2_5_VL"):

    @case("vlm", f"{cls} trained adapter: left-padded batch row == the row alone (non-pad logits; generate)")
    def _(cls=cls):
        m = trained_vlm(cls)
        rows = [*TWO, MIXED[1]]
        kw = vl_prompt(rows)
        lb = logits_of(m, kw)
        seqb, _ = greedy_generate(m, kw, 4)
        errs, same = [], True
        for b, row in enumerate(rows):
            k1 = vl_prompt([row], row_ids=[b])
            # row b's image(s) only
            n = k1["input_ids"].shape[1]
            l1 = logits_of(m, k1)
            errs.append(maxdiff(lb[b, -n:], l1[0]))
            s1, _ = greedy_generate(m, k1, 4)
            same = same and torch.equal(s1[0], seqb[b])
        return check(max(errs) < 1e-4 and same, f"row max|diff| {[f'{e:.1e}' for e in errs]}, generate equal {same}")


@case("vlm", "Qwen2VL trained: save_adapter -> load_adapter on a fresh base: bit-equal logits (image batch)")
def _():
    m = trained_vlm()
    kw = vl_prompt(TWO)
    want = logits_of(m, kw)
    with tempfile.TemporaryDirectory() as d:
        mmpreproj.save_adapter(m, d)
        fresh = mmpreproj.load_adapter(vlm(), d)
        got = logits_of(fresh, kw)
    return check(torch.equal(got, want), f"max|diff| {maxdiff(got, want):.2e}")


@case("vlm", "Qwen2_5_VL trained: save_adapter -> load_adapter on a fresh base: bit-equal logits (video)")
def _():
    m = trained_vlm("Qwen2_5_VL")
    kw = vl_prompt(ONE, video=True)
    want = logits_of(m, kw)
    with tempfile.TemporaryDirectory() as d:
        mmpreproj.save_adapter(m, d)
        fresh = mmpreproj.load_adapter(vlm("Qwen2_5_VL"), d)
        got = logits_of(fresh, kw)
    return check(torch.equal(got, want), f"max|diff| {maxdiff(got, want):.2e}")


for cls in ("Qwen2VL", "Qwen2_5_VL"):

    @case("vlm", f"{cls} trained: unload restores the base bit-exact (state, tree, flags, hooks, logits)")
    def _(cls=cls):
        m = vlm(cls)
        kw = vl_prompt(TWO)
        before, base = snap(m), logits_of(m, kw)
        mmpreproj.inject(m, mmpreproj.PreProjConfig(init="identity"))
        perturb(m)
        changed = not torch.equal(logits_of(m, kw), base)
        mmpreproj.unload(m)
        d = same_snap(before, snap(m))
        after = logits_of(m, kw)
        return check(
            changed and not d and torch.equal(after, base),
            f"adapter changed logits {changed}; {d or 'state/tree/flags/hooks equal'}; "
            f"logits max|diff| {maxdiff(after, base):.2e}",
        )


@case("vlm", "Qwen2VL parts=['language']: vision tower untouched (image features == base), logits move")
def _():
    base = vlm()
    kw = vl_prompt(ONE)
    with torch.no_grad():
        f0 = base.model.get_image_features(kw["pixel_values"], kw["image_grid_thw"])
    m = trained_vlm(parts=["language"])
    with torch.no_grad():
        f1 = m.model.get_image_features(kw["pixel_values"], kw["image_grid_thw"])
    f0 = f0.pooler_output if hasattr(f0, "pooler_output") else f0
    f1 = f1.pooler_output if hasattr(f1, "pooler_output") else f1
    f0, f1 = torch.cat(list(f0)), torch.cat(list(f1))
    moved = not torch.equal(logits_of(m, kw), logits_of(base, kw))
    return check(torch.equal(f0, f1) and moved, f"features equal {torch.equal(f0, f1)}, logits moved {moved}")


@case("vlm", "Qwen2VL parts=['vision']: the language model's attentions are not wrapped, logits move")
def _():
    m = trained_vlm(parts=["vision"])
    names = [n for n, mod in m.named_modules() if type(mod).__name__ == "PreProjAttention"]
    lang = [n for n in names if "language_model" in n]
    moved = not torch.equal(logits_of(m, vl_prompt(ONE)), logits_of(vlm(), vl_prompt(ONE)))
    return check(
        names and not lang and moved, f"{len(names)} wrapped, {len(lang)} in the language model, moved {moved}"
    )


@case("vlm", "Qwen2VL built with dtype=bfloat16: identity inject == base bit-exact (image batch); trained moves it")
def _():
    torch.manual_seed(0)
    m = tf.Qwen2VLForConditionalGeneration._from_config(
        _vl_config("Qwen2VL", merge=2, width=32, depth=2, heads=2, kv=1), dtype=torch.bfloat16
    ).eval()
    kw = vl_prompt(TWO)
    kw["pixel_values"] = kw["pixel_values"].to(torch.bfloat16)
    base = logits_of(m, kw)
    mmpreproj.inject(m, mmpreproj.PreProjConfig(init="identity"))
    out = logits_of(m, kw)
    perturb(m)
    moved = not torch.equal(logits_of(m, kw), base)
    return check(torch.equal(out, base) and moved, f"{out.dtype}, max|diff| {maxdiff(out, base):.2e}, moved {moved}")


@case("vlm", "Qwen2VL via peft.get_peft_model(PreProjConfig): same logits and greedy generate as the inject route")
def _():
    import peft

    a = trained_vlm()
    b = vlm()
    torch.manual_seed(123)
    pm = peft.get_peft_model(b, mmpreproj.PreProjConfig(init="identity"))
    perturb(pm)
    kw = vl_prompt(TWO)
    la, lb = logits_of(a, kw), logits_of(pm, kw)
    sa, _ = greedy_generate(a, kw, 4)
    sb, _ = greedy_generate(pm, kw, 4)
    return check(
        torch.equal(la, lb) and torch.equal(sa, sb),
        f"logits max|diff| {maxdiff(la, lb):.2e}, generate equal {torch.equal(sa, sb)}",
    )


@case("vlm", "Qwen2VL (vision injected), two adapters, mixed-adapter batch: refused (documented: limits.md)")
def _():
    import peft

    b = vlm()
    torch.manual_seed(123)
    pm = peft.get_peft_model(b, mmpreproj.PreProjConfig(init="identity"))
    perturb(pm)
    with tempfile.TemporaryDirectory() as d:
        mmpreproj.save_adapter(pm, d)
        pm.load_adapter(d, adapter_name="other")
    kw = vl_prompt(TWO)
    with torch.no_grad():
        pm(**kw)  # the first forward removes inject's one-time seam-check hooks; snapshot after it
    before = snap(pm)
    try:
        with torch.no_grad():
            pm(**kw, adapter_names=["default", "other"])
    except (ValueError, TypeError, RuntimeError) as err:
        d = same_snap(before, snap(pm))
        return check(not d, f"refused: {type(err).__name__}: {str(err)[:120]}; {d or 'unchanged'}")
    raise AssertionError("a mixed-adapter batch through a packed vision tower was accepted")


@case("vlm", "Qwen2VL parts=['language'], two adapters: mixed-adapter batch row == that row under its adapter alone")
def _():
    import peft

    b = vlm()
    torch.manual_seed(123)
    pm = peft.get_peft_model(b, mmpreproj.PreProjConfig(init="identity", parts=["language"]))
    perturb(pm, seed=1)
    with tempfile.TemporaryDirectory() as d:
        mmpreproj.save_adapter(pm, d)
        perturb(pm, seed=2)  # "default" moves on; "other" keeps the first values
        pm.load_adapter(d, adapter_name="other")
    kw = vl_prompt(TWO)
    with torch.no_grad():
        mixed = pm(**kw, adapter_names=["default", "other"]).logits
        pm.set_adapter("default")
        la = pm(**kw).logits
        pm.set_adapter("other")
        lb = pm(**kw).logits
    err = max(maxdiff(mixed[0], la[0]), maxdiff(mixed[1], lb[1]))
    differ = not torch.equal(la, lb)
    return check(err < 1e-5 and differ, f"max|diff| {err:.2e}, adapters differ {differ}")


for cls in ("Qwen2VL", "Qwen2_5_VL"):

    @case("vlm", f"{cls} trained adapter: right-padded batch row == the row alone (non-pad logits)")
    def _(cls=cls):
        m = trained_vlm(cls)
        rows = [*TWO, MIXED[1]]
        lb = logits_of(m, vl_prompt(rows, side="right"))
        errs = []
        for b, row in enumerate(rows):
            l1 = logits_of(m, vl_prompt([row], row_ids=[b]))
            errs.append(maxdiff(lb[b, : l1.shape[1]], l1[0]))
        return check(max(errs) < 1e-4, f"row max|diff| {[f'{e:.1e}' for e in errs]}")


@case("vlm", "Qwen2VL trained: inside adapter_disabled the logits == base bit-exact; after it, the adapter's again")
def _():
    m = trained_vlm()
    kw = vl_prompt(TWO)
    base, on = logits_of(vlm(), kw), logits_of(m, kw)
    with mmpreproj.adapter_disabled(m):
        off = logits_of(m, kw)
    again = logits_of(m, kw)
    return check(
        torch.equal(off, base) and torch.equal(again, on) and not torch.equal(on, base),
        f"disabled vs base {maxdiff(off, base):.2e}, after vs before {maxdiff(again, on):.2e}",
    )


@case("vlm", "Qwen2VL trained: mmpreproj.save_pretrained -> from_pretrained(model_cls=Qwen2VL...): bit-equal logits")
def _():
    m = trained_vlm()
    kw = vl_prompt(TWO)
    want = logits_of(m, kw)
    with tempfile.TemporaryDirectory() as d:
        mmpreproj.save_pretrained(m, d)
        got_m = mmpreproj.from_pretrained(d, model_cls=tf.Qwen2VLForConditionalGeneration).eval()
        got = logits_of(got_m, kw)
    return check(torch.equal(got, want), f"max|diff| {maxdiff(got, want):.2e}")


@case("vlm", "Qwen2VL trained, gradient checkpointing on: adapter grads == without checkpointing (image batch)")
def _():
    kw = vl_prompt(TWO)
    grads = []
    for ckpt in (False, True):
        m = trained_vlm()
        if ckpt:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        m.train()
        out = m(**kw).logits
        out.float().pow(2).mean().backward()
        grads.append([p.grad.clone() for p in m.parameters() if p.requires_grad])
    err = max(maxdiff(a, b) for a, b in zip(*grads))
    return check(len(grads[0]) == 12 and err < 1e-6, f"{len(grads[0])} adapter tensors, max|grad diff| {err:.2e}")


@case("vlm", "Qwen2VL hosts.md example (layers={'language': [-1]}, modules_to_save=['projector']): save/load, unload")
def _():
    m = vlm()
    kw = vl_prompt(TWO)
    before, base = snap(m), logits_of(m, kw)
    torch.manual_seed(123)
    cfg = mmpreproj.PreProjConfig(init="identity", layers={"language": [-1]}, modules_to_save=["projector"])
    mmpreproj.inject(m, cfg)
    n = perturb(m)
    merger = any(p.requires_grad for p in m.model.visual.merger.parameters())
    want = logits_of(m, kw)
    with tempfile.TemporaryDirectory() as d:
        mmpreproj.save_adapter(m, d)
        got = logits_of(mmpreproj.load_adapter(vlm(), d), kw)
    mmpreproj.unload(m)
    diff = same_snap(before, snap(m))
    back = logits_of(m, kw)
    return check(
        merger and torch.equal(got, want) and not diff and torch.equal(back, base),
        f"{n} trained weights (merger trains {merger}); reloaded max|diff| {maxdiff(got, want):.2e}; "
        f"unload: {diff or 'state/tree/flags equal'}, logits vs base {maxdiff(back, base):.2e}",
    )


# ------------------------------------------------------------------ llama-family decoder + use_multimodal_rope
def qwen2_lm(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = tf.Qwen2Config(
        **kw,
        vocab_size=V + 3,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4},
    )
    return tf.Qwen2ForCausalLM(cfg).eval()


SEGS = [("text", 2), ("image", (2, 3)), ("text", 3)]


def thw(segs=SEGS, B=1):
    pos, delta = multimodal_positions(segs)
    return pos.T[:, None].expand(3, B, -1).contiguous(), int(delta)


IDS = torch.randint(3, V, (1, 11), generator=torch.Generator().manual_seed(4))


@case("lm", "Qwen2 + use_multimodal_rope + inject(identity): image-id logits == use_multimodal_rope alone, bit-exact")
def _():
    m = qwen2_lm()
    use_multimodal_rope(m, sections=(2, 3, 3))
    ids, _ = thw()
    with torch.no_grad():
        base = m(input_ids=IDS, position_ids=ids).logits
        mmpreproj.inject(m, mmpreproj.PreProjConfig(init="identity"))
        out = m(input_ids=IDS, position_ids=ids).logits
    return check(torch.equal(out, base), f"max|diff| {maxdiff(out, base):.2e}")


@case("lm", "Qwen2: use_multimodal_rope then inject == inject then use_multimodal_rope (trained adapter)")
def _():
    ids, _ = thw()
    a, b = qwen2_lm(), qwen2_lm()
    use_multimodal_rope(a, sections=(2, 3, 3))
    torch.manual_seed(123)
    mmpreproj.inject(a, mmpreproj.PreProjConfig(init="identity"))
    perturb(a)
    torch.manual_seed(123)
    mmpreproj.inject(b, mmpreproj.PreProjConfig(init="identity"))
    perturb(b)
    use_multimodal_rope(b, sections=(2, 3, 3))
    with torch.no_grad():
        la, lb = a(input_ids=IDS, position_ids=ids).logits, b(input_ids=IDS, position_ids=ids).logits
    return check(torch.equal(la, lb), f"max|diff| {maxdiff(la, lb):.2e}")


@case("lm", "Qwen2 + M-RoPE + trained adapter == Qwen2-VL language model + same adapter (same weights, 3D ids)")
def _():
    torch.manual_seed(1)
    cfg = _vl_config("Qwen2VL", merge=1, width=32, depth=2, heads=2, kv=1)
    cfg.text_config.intermediate_size = 64
    ref = tf.Qwen2VLForConditionalGeneration(cfg).eval()
    lm = qwen2_lm(rms_norm_eps=cfg.text_config.rms_norm_eps)  # Qwen2-VL's eps default differs from Qwen2's
    lm.config._attn_implementation = ref.model.language_model.config._attn_implementation
    use_multimodal_rope(lm, sections=(2, 3, 3))
    ref.model.language_model.load_state_dict(lm.model.state_dict())
    ref.lm_head.load_state_dict(lm.lm_head.state_dict())
    with torch.no_grad():
        base_err = maxdiff(
            lm(input_ids=IDS, position_ids=thw()[0]).logits, ref(input_ids=IDS, position_ids=thw()[0]).logits
        )
    torch.manual_seed(123)
    mmpreproj.inject(lm, mmpreproj.PreProjConfig(init="identity"))
    torch.manual_seed(123)
    mmpreproj.inject(ref, mmpreproj.PreProjConfig(init="identity", parts=["language"]))
    perturb(lm)
    perturb(ref)  # same seed, same parameter order in the language model
    ids, _ = thw()
    with torch.no_grad():
        a = lm(input_ids=IDS, position_ids=ids).logits
        b = ref(input_ids=IDS, position_ids=ids).logits
    return check(
        maxdiff(a, b) < 1e-5,
        f"max|diff| {maxdiff(a, b):.2e} (bit-equal {torch.equal(a, b)}; bases alone {base_err:.2e})",
    )


@case("lm", "Qwen2 + M-RoPE + trained adapter: KV-cache decode at N+k+delta == full forward (image prompt)")
def _():
    m = qwen2_lm()
    use_multimodal_rope(m, sections=(2, 3, 3))
    mmpreproj.inject(m, mmpreproj.PreProjConfig(init="identity"))
    perturb(m)
    ids, delta = thw()
    n = IDS.shape[1]
    new = torch.randint(3, V, (1, 4), generator=torch.Generator().manual_seed(9))
    full_ids = torch.cat([ids, (n + torch.arange(4) + delta)[None, None].expand(3, 1, 4)], -1)
    with torch.no_grad():
        full = m(input_ids=torch.cat([IDS, new], 1), position_ids=full_ids).logits[:, n:]
        out = m(input_ids=IDS, position_ids=ids, use_cache=True)
        past, steps = out.past_key_values, []
        for k in range(4):
            p = torch.full((3, 1, 1), n + k + delta)
            o = m(input_ids=new[:, k : k + 1], position_ids=p, past_key_values=past, use_cache=True)
            past = o.past_key_values
            steps.append(o.logits)
    inc = torch.cat(steps, 1)
    return check(maxdiff(inc, full) < 1e-5, f"max|diff| {maxdiff(inc, full):.2e}")


@case("lm", "Qwen2 + M-RoPE + trained adapter: unload then remove_multimodal_rope restores the base bit-exact")
def _():
    m = qwen2_lm()
    before = snap(m)
    with torch.no_grad():
        base = m(input_ids=IDS).logits
    use_multimodal_rope(m, sections=(2, 3, 3))
    mmpreproj.inject(m, mmpreproj.PreProjConfig(init="identity"))
    perturb(m)
    mmpreproj.unload(m)
    remove_multimodal_rope(m)
    d = same_snap(before, snap(m))
    with torch.no_grad():
        after = m(input_ids=IDS).logits
    return check(not d and torch.equal(after, base), d or f"restored, max|diff| {maxdiff(after, base):.2e}")


@case("lm", "Qwen2 + M-RoPE + trained adapter: save_adapter -> fresh base + use_multimodal_rope + load: bit-equal")
def _():
    m = qwen2_lm()
    use_multimodal_rope(m, sections=(2, 3, 3))
    mmpreproj.inject(m, mmpreproj.PreProjConfig(init="identity"))
    perturb(m)
    ids, _ = thw()
    with torch.no_grad(), tempfile.TemporaryDirectory() as d:
        want = m(input_ids=IDS, position_ids=ids).logits
        mmpreproj.save_adapter(m, d)
        fresh = qwen2_lm()
        use_multimodal_rope(fresh, sections=(2, 3, 3))
        fresh = mmpreproj.load_adapter(fresh, d)
        got = fresh(input_ids=IDS, position_ids=ids).logits
    return check(torch.equal(got, want), f"max|diff| {maxdiff(got, want):.2e}")


# ------------------------------------------------------------------------------------------------- the howto's model
WIDTH, HEADS, DEPTH, VOCAB, PATCH = 32, 2, 2, 100, 4


class TinyMixedModel(nn.Module):
    """docs/howto-mixed-model.md's model, verbatim, plus `run` (tokens + positions in, logits out) for the checks."""

    def __init__(self, rope=None, causal=True):
        super().__init__()
        self.rope = rope if rope is not None else MultimodalRoPE(WIDTH // HEADS, sections=(2, 3, 3))
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.projector = nn.Sequential(nn.Linear(3 * PATCH * PATCH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH))
        self.blocks = nn.ModuleList(Block(WIDTH, HEADS, rope=self.rope, causal=causal) for _ in range(DEPTH))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def image_tokens(self, image):
        b, c, height, width = image.shape
        h, w = height // PATCH, width // PATCH
        patches = image.reshape(b, c, h, PATCH, w, PATCH).permute(0, 2, 4, 1, 3, 5).reshape(b, h * w, -1)
        return self.projector(patches), (h, w)

    def forward(self, before, image, after):
        image_tokens, grid = self.image_tokens(image)
        x = torch.cat([self.embed(before), image_tokens, self.embed(after)], dim=1)
        segments = [("text", before.shape[1]), ("image", grid), ("text", after.shape[1])]
        pos, _ = multimodal_positions(segments)
        for block in self.blocks:
            x = block(x, pos=pos)
        return self.head(self.norm(x))

    def run(self, x, pos, caches=None):
        for i, block in enumerate(self.blocks):
            x = block(x, pos=pos, cache=None if caches is None else caches[i])
        return self.head(self.norm(x))


def howto(seed=0, **kw):
    torch.manual_seed(seed)
    return TinyMixedModel(**kw).eval()


G = torch.Generator().manual_seed(11)
BEFORE = torch.randint(0, VOCAB, (2, 3), generator=G)
IMAGE = torch.randn(2, 3, 16, 16, generator=G)
AFTER = torch.randint(0, VOCAB, (2, 5), generator=G)


def trained_howto(seed=0, steps=3, **kw):
    """The howto's three AdamW steps after identity inject."""
    m = howto(seed, **kw)
    mmpreproj.inject(m, mmpreproj.PreProjConfig(init="identity"))
    m.train()
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        logits = m(BEFORE, IMAGE, AFTER)
        loss = nn.functional.cross_entropy(logits[:, -6:-1].flatten(0, 1), AFTER.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m.eval()


@case("howto", "identity inject == base bit-exact (the page says 'exactly'; it asserts assert_close)")
def _():
    m = howto()
    with torch.no_grad():
        base = m(BEFORE, IMAGE, AFTER)
        mmpreproj.inject(m, mmpreproj.PreProjConfig(init="identity"))
        out = m(BEFORE, IMAGE, AFTER)
    return check(torch.equal(out, base), f"max|diff| {maxdiff(out, base):.2e}")


@case("howto", "trainable weights == DEPTH*(2*32*40 + 32*32) = 7,168; only adapter weights train")
def _():
    m = howto()
    mmpreproj.inject(m, mmpreproj.PreProjConfig(init="identity"))
    tr = {n: p.numel() for n, p in m.named_parameters() if p.requires_grad}
    n = sum(tr.values())
    base_tr = [k for k in tr if "projector" in k or "embed" in k or k.startswith("head") or "qkv.weight" in k]
    return check(n == 7168 and not base_tr, f"{n} in {len(tr)} tensors; base tensors training: {base_tr[:3]}")


@case("howto", "3 AdamW steps: logits move, the rotary encoder's state and tables untouched")
def _():
    ref = howto()
    m = trained_howto()
    r0 = {k: v for k, v in vars(ref.rope).items() if torch.is_tensor(v)}
    r1 = {k: v for k, v in vars(m.rope).items() if torch.is_tensor(v)}
    same = r0.keys() == r1.keys() and all(torch.equal(r0[k], r1[k]) for k in r0)
    with torch.no_grad():
        moved = not torch.allclose(m(BEFORE, IMAGE, AFTER), ref(BEFORE, IMAGE, AFTER))
    all_blocks_rope = all(b.attn.rope is m.rope if hasattr(b.attn, "rope") else True for b in m.blocks)
    return check(same and moved, f"rope tensors {sorted(r1)} equal {same}, moved {moved}, shared {all_blocks_rope}")


def _capture_xtilde(m):
    """The pre-projection's output (what qkv reads) in block 0, via a hook on the PreProjection module."""
    mods = [mod for mod in m.blocks[0].modules() if isinstance(mod, mmpreproj.PreProjection)]
    store = []
    h = mods[0].register_forward_hook(lambda mod, i, o: store.append(o.detach().clone()))
    return store, h


@case("howto", "trained: the pre-projection's output in block 0 does not depend on pos (shifted / scrambled pos)")
def _():
    m = trained_howto()
    store, h = _capture_xtilde(m)
    with torch.no_grad():
        x = torch.cat([m.embed(BEFORE), m.image_tokens(IMAGE)[0], m.embed(AFTER)], 1)
        pos, _ = multimodal_positions([("text", 3), ("image", (4, 4)), ("text", 5)])
        m.run(x, pos)
        m.run(x, pos + 17)
        m.run(x, pos[torch.randperm(pos.shape[0], generator=torch.Generator().manual_seed(1))])
    h.remove()
    return check(
        torch.equal(store[0], store[1]) and torch.equal(store[0], store[2]),
        f"{len(store)} captures, equal {torch.equal(store[0], store[1])}, {torch.equal(store[0], store[2])}",
    )


@case("howto", "trained: shifting every position by a constant (all axes) leaves the logits unchanged (<1e-5)")
def _():
    m = trained_howto()
    with torch.no_grad():
        x = torch.cat([m.embed(BEFORE), m.image_tokens(IMAGE)[0], m.embed(AFTER)], 1)
        pos, _ = multimodal_positions([("text", 3), ("image", (4, 4)), ("text", 5)])
        a, b = m.run(x, pos), m.run(x, pos + 40)
    return check(maxdiff(a, b) < 1e-5, f"max|diff| {maxdiff(a, b):.2e}")


@case("howto", "trained, one causal block: permuting the image patches WITH their positions leaves the text after it")
def _():
    m = trained_howto()
    m.blocks = m.blocks[:1]  # with 2+ causal blocks the patches' own states depend on their order (the prefix)
    with torch.no_grad():
        img, _ = m.image_tokens(IMAGE)
        x = torch.cat([m.embed(BEFORE), img, m.embed(AFTER)], 1)
        pos, _ = multimodal_positions([("text", 3), ("image", (4, 4)), ("text", 5)])
        perm = torch.randperm(16, generator=torch.Generator().manual_seed(3))
        order = torch.cat([torch.arange(3), 3 + perm, torch.arange(19, 24)])
        a = m.run(x, pos)
        b = m.run(x[:, order], pos[order])
    # causal: text after the image sees every patch as a set; the patches themselves see a prefix that changed
    err = maxdiff(a[:, 19:], b[:, 19:])
    return check(err < 1e-5, f"text after the image: max|diff| {err:.2e}")


@case("howto", "trained, non-causal stack: permuting tokens with positions permutes every output (equivariance)")
def _():
    m = trained_howto(causal=False)
    with torch.no_grad():
        x = torch.cat([m.embed(BEFORE), m.image_tokens(IMAGE)[0], m.embed(AFTER)], 1)
        pos, _ = multimodal_positions([("text", 3), ("image", (4, 4)), ("text", 5)])
        order = torch.randperm(24, generator=torch.Generator().manual_seed(5))
        a = m.run(x, pos)[:, order]
        b = m.run(x[:, order], pos[order])
    return check(maxdiff(a, b) < 1e-5, f"max|diff| {maxdiff(a, b):.2e}")


@case("howto", "trained: permuting patch CONTENT but keeping positions changes the text after the image")
def _():
    m = trained_howto()
    with torch.no_grad():
        img, _ = m.image_tokens(IMAGE)
        pos, _ = multimodal_positions([("text", 3), ("image", (4, 4)), ("text", 5)])
        perm = torch.randperm(16, generator=torch.Generator().manual_seed(3))
        a = m.run(torch.cat([m.embed(BEFORE), img, m.embed(AFTER)], 1), pos)
        b = m.run(torch.cat([m.embed(BEFORE), img[:, perm], m.embed(AFTER)], 1), pos)
    err = maxdiff(a[:, 19:], b[:, 19:])
    return check(err > 1e-4, f"max|diff| {err:.2e} (positions reach attention: the image is a grid, not a bag)")


@case("howto", "trained: KV-cache decode of 4 text tokens after the prompt == full forward ('nothing added to cache')")
def _():
    from mmpreproj.modules.block import KVCache

    m = trained_howto()
    with torch.no_grad():
        x = torch.cat([m.embed(BEFORE), m.image_tokens(IMAGE)[0], m.embed(AFTER)], 1)
        pos, delta = multimodal_positions([("text", 3), ("image", (4, 4)), ("text", 5)])
        n = pos.shape[0]
        new = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(8))
        npos = (n + torch.arange(4) + delta)[:, None].expand(4, 3)
        full = m.run(torch.cat([x, m.embed(new)], 1), torch.cat([pos, npos]))[:, n:]
        caches = [KVCache() for _ in m.blocks]
        m.run(x, pos, caches)
        nbytes = sum(c.nbytes() for c in caches)
        steps = [m.run(m.embed(new[:, k : k + 1]), npos[k : k + 1], caches) for k in range(4)]
    base = howto()
    with torch.no_grad():
        bc = [KVCache() for _ in base.blocks]
        base.run(x, pos, bc)
    inc = torch.cat(steps, 1)
    same_bytes = nbytes == sum(c.nbytes() for c in bc)
    return check(
        maxdiff(inc, full) < 1e-5 and same_bytes,
        f"max|diff| {maxdiff(inc, full):.2e}, cache bytes {nbytes} (base {sum(c.nbytes() for c in bc)})",
    )


@case("howto", "trained stack, batch with 2 different grids, left padding: (B,N,3) pos + (B,N) mask == each row alone")
def _():
    m = trained_howto()
    rows = [[("text", 3), ("image", (2, 3)), ("text", 2)], [("text", 1), ("image", (4, 1)), ("text", 1)]]
    g = torch.Generator().manual_seed(6)
    xs = [torch.randn(1, multimodal_positions(r)[0].shape[0], WIDTH, generator=g) for r in rows]
    L = max(x.shape[1] for x in xs)
    x = torch.zeros(2, L, WIDTH)
    pos = torch.zeros(2, L, 3, dtype=torch.long)
    mask = torch.zeros(2, L, dtype=torch.bool)
    for b, (r, xb) in enumerate(zip(rows, xs)):
        n = xb.shape[1]
        x[b, L - n :], pos[b, L - n :], mask[b, L - n :] = xb[0], multimodal_positions(r)[0], True
    with torch.no_grad():
        y = x
        for blk in m.blocks:
            y = blk(y, pos=pos, attn_mask=mask)
        errs, finite = [], True
        for b, (r, xb) in enumerate(zip(rows, xs)):
            alone = m.run(xb, multimodal_positions(r)[0])
            n = xb.shape[1]
            finite = finite and bool(torch.isfinite(y[b, L - n :]).all())
            errs.append(maxdiff(m.head(m.norm(y[b, L - n :])), alone[0]))
    return check(finite and max(errs) < 1e-5, f"non-pad finite {finite}, row max|diff| {[f'{e:.1e}' for e in errs]}")


for label, rope, pos in [
    ("RoPE1D", RoPE1D(16), torch.arange(24)),
    ("RoPE2D", RoPE2D(16), torch.stack([torch.arange(24) // 6, torch.arange(24) % 6], -1)),
    (
        "RoPE3D",
        RoPE3D(16),
        torch.stack([torch.arange(24) // 12, (torch.arange(24) // 4) % 3, torch.arange(24) % 4], -1),
    ),
    ("learned positions (rope=None)", None, None),
]:

    @case("howto", f"Block stack with {label}: identity inject == base bit-exact; trained adapter moves it")
    def _(rope=rope, pos=pos):
        torch.manual_seed(0)
        m = nn.Sequential(*[Block(WIDTH, HEADS, rope=rope) for _ in range(2)]).eval()
        x = torch.randn(2, 24, WIDTH, generator=torch.Generator().manual_seed(1))

        def run():
            y = x
            for b in m:
                y = b(y, pos=pos)
            return y

        with torch.no_grad():
            base = run()
            mmpreproj.inject(m, mmpreproj.PreProjConfig(init="identity"))
            out = run()
            perturb(m)
            moved = not torch.equal(run(), base)
        return check(torch.equal(out, base) and moved, f"max|diff| {maxdiff(out, base):.2e}, moved {moved}")


@case("howto", "trained: save_adapter -> load_adapter onto a fresh TinyMixedModel: bit-equal; unload == base")
def _():
    m = trained_howto()
    with torch.no_grad(), tempfile.TemporaryDirectory() as d:
        want = m(BEFORE, IMAGE, AFTER)
        mmpreproj.save_adapter(m, d)
        fresh = mmpreproj.load_adapter(howto(), d)
        got = fresh(BEFORE, IMAGE, AFTER)
        mmpreproj.unload(fresh)
        back = fresh(BEFORE, IMAGE, AFTER)
        base = howto()(BEFORE, IMAGE, AFTER)
    return check(
        torch.equal(got, want) and torch.equal(back, base),
        f"loaded max|diff| {maxdiff(got, want):.2e}, unloaded vs base {maxdiff(back, base):.2e}",
    )


@case("howto", "the page's own check: PreProjection(WIDTH) is permutation-equivariant over tokens (trained weights)")
def _():
    p = mmpreproj.PreProjection(WIDTH)
    with torch.no_grad():
        for t in p.parameters():
            t.normal_(0, 0.3)
        tokens = torch.randn(1, 24, WIDTH)
        order = torch.randperm(24)
        err = maxdiff(p(tokens[:, order]), p(tokens)[:, order])
    return check(err == 0, f"max|diff| {err:.2e}")


@case(
    "howto", "a second image grid (2x8, non-square) through the same trained model: runs, == get_rope_index positions"
)
def _():
    m = trained_howto()
    img = torch.randn(2, 3, 8, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = m(BEFORE, img, AFTER)
    _cmp([("text", 3), ("image", (2, 8)), ("text", 5)])
    return check(out.shape == (2, 3 + 16 + 5, VOCAB) and torch.isfinite(out).all(), f"shape {tuple(out.shape)}")


# ------------------------------------------------------------------------------------------------- refusals
BAD_SEGMENTS = [
    ("image grid with a zero side", [("text", 2), ("image", (0, 3))], ("grid", "image", "(0, 3)", "positive")),
    ("image grid with a negative side", [("image", (2, -1))], ("grid", "image", "-1", "positive")),
    ("image grid of one number", [("image", (4,))], ("grid", "image", "(h, w)")),
    ("image grid of floats", [("image", (2.5, 2))], ("grid", "image", "int", "2.5")),
    ("video grid of two numbers", [("video", (2, 3))], ("video", "(t, h, w)", "grid")),
    ("unknown kind 'audio'", [("audio", 3)], ("audio", "kind")),
    ("negative text length", [("text", -2)], ("text", "-2")),
    ("text length a float", [("text", 2.0)], ("text", "int")),
    ("a segment that is not a pair", [("text",)], ("segment",)),
    ("empty list", [], ("segment", "empty")),
]
for label, segs, names in BAD_SEGMENTS:

    @case("refuse", f"multimodal_positions: {label} refused, naming it")
    def _(segs=segs, names=names):
        return refusal(lambda: multimodal_positions(segs), None, *names)


@case("refuse", "MultimodalRoPE: sections of two numbers refused, naming sections")
def _():
    return refusal(lambda: MultimodalRoPE(16, sections=(4, 4)), None, "sections")


@case("refuse", "MultimodalRoPE: positions (N, 2) refused, naming pos / the 3 axes")
def _():
    q = torch.randn(1, 2, 6, 16)
    return refusal(
        lambda: MultimodalRoPE(16, sections=(2, 3, 3))(q, q, torch.zeros(6, 2, dtype=torch.long)),
        None,
        "pos",
        "axes",
        "3",
    )


@case("refuse", "MultimodalRoPE: positions for 5 tokens on 6 tokens refused, naming pos / N")
def _():
    q = torch.randn(1, 2, 6, 16)
    return refusal(
        lambda: MultimodalRoPE(16, sections=(2, 3, 3))(q, q, torch.zeros(5, 3, dtype=torch.long)),
        None,
        "pos",
        "token",
        "5",
    )


@case("refuse", "MultimodalRoPE: q of the wrong head_dim (8 for 16) refused, naming head_dim")
def _():
    q = torch.randn(1, 2, 6, 8)
    return refusal(
        lambda: MultimodalRoPE(16, sections=(2, 3, 3))(q, q, torch.zeros(6, 3, dtype=torch.long)),
        None,
        "head_dim",
        "16",
    )


@case("refuse", "MultimodalRoPE: integer q/k (docstring: 'any float dtype') refused, naming the dtype")
def _():
    q = torch.arange(1, 97, dtype=torch.long).reshape(1, 2, 3, 16)
    pos = torch.tensor([[0, 0, 0], [3, 1, 2], [3, 1, 3]])
    try:
        out, _ = MultimodalRoPE(16, sections=(2, 3, 3))(q, q, pos)
    except (ValueError, TypeError) as err:
        return check("dtype" in str(err).lower() or "float" in str(err).lower(), f"refused: {str(err)[:110]}")
    want, _ = MultimodalRoPE(16, sections=(2, 3, 3))(q.float(), q.float(), pos)
    raise AssertionError(
        f"not refused: returns {out.dtype}, max|diff| {maxdiff(out, want):.2f} vs the float rotation (truncated)"
    )


@case("refuse", "howto Block: (N, 3) positions of the wrong length refused, naming pos; model unchanged")
def _():
    m = trained_howto()
    x = torch.randn(1, 24, WIDTH)
    return refusal(lambda: m.run(x, torch.zeros(20, 3, dtype=torch.long)), m, "pos", "20", "24")


@case("refuse", "howto Block with MultimodalRoPE: pos missing (None) refused, naming pos")
def _():
    m = howto()
    return refusal(lambda: m.run(torch.randn(1, 24, WIDTH), None), m, "pos")


@case("refuse", "Block with a MultimodalRoPE of another head_dim: refused at construction or first forward")
def _():
    def build_and_run():
        b = Block(WIDTH, HEADS, rope=MultimodalRoPE(8, sections=(1, 1, 2)))
        b(torch.randn(1, 4, WIDTH), pos=torch.zeros(4, 3, dtype=torch.long))

    return refusal(build_and_run, None, "head_dim", "head dim")


@case("refuse", "inject Qwen2-VL parts=['audio'] refused, naming parts / audio; model unchanged")
def _():
    m = vlm()
    return refusal(lambda: mmpreproj.inject(m, mmpreproj.PreProjConfig(parts=["audio"])), m, "audio", "parts")


@case("refuse", "inject Qwen2-VL layers={'language': [7]} (2 blocks) refused, naming layers; model unchanged")
def _():
    m = vlm()
    return refusal(lambda: mmpreproj.inject(m, mmpreproj.PreProjConfig(layers={"language": [7]})), m, "layer", "7")


@case("refuse", "PreProjConfig(init='zeros') refused, naming init")
def _():
    return refusal(lambda: mmpreproj.PreProjConfig(init="zeros"), None, "init")


@case("refuse", "PreProjConfig(compute_dtype='fp8') refused, naming compute_dtype")
def _():
    return refusal(lambda: mmpreproj.PreProjConfig(compute_dtype="fp8"), None, "compute_dtype")


@case("refuse", "use_multimodal_rope(sections=(4, 4)) (two axes) refused, naming sections; model unchanged")
def _():
    m = qwen2_lm()
    return refusal(lambda: use_multimodal_rope(m, sections=(4, 4)), m, "sections")


@case("refuse", "use_multimodal_rope on Qwen2-VL (already M-RoPE) refused or a no-op, model unchanged")
def _():
    m = vlm()
    before = snap(m)
    try:
        use_multimodal_rope(m)
    except (ValueError, TypeError) as err:
        d = same_snap(before, snap(m))
        return check(not d and "\n" not in str(err).strip(), f"refused: {str(err)[:110]}; {d or 'unchanged'}")
    raise AssertionError("accepted on a model that already reads M-RoPE")


@case("refuse", "load_adapter of a width-32 Qwen2-VL adapter onto a width-48 Qwen2-VL refused; model unchanged")
def _():
    m = trained_vlm()
    other = vlm(width=48)
    with tempfile.TemporaryDirectory() as d:
        mmpreproj.save_adapter(m, d)
        return refusal(lambda: mmpreproj.load_adapter(other, d), other, "shape", "32", "48", "size")


@case("refuse", "load_adapter of a Qwen2-VL adapter onto Qwen2.5-VL: refused (host), or loads every tensor as saved")
def _():
    m = trained_vlm()
    other = vlm("Qwen2_5_VL")
    with tempfile.TemporaryDirectory() as d:
        mmpreproj.save_adapter(m, d)
        try:
            got = mmpreproj.load_adapter(other, d)
        except (ValueError, TypeError) as err:
            return f"refused: {str(err)[:110]}"
    sa, sb = mmpreproj.adapter_state_dict(m), mmpreproj.adapter_state_dict(got)
    same = sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    return check(same, f"accepted (Qwen2.5-VL shares the module names); {len(sa)} tensors as saved: {same}")


@case("refuse", "Qwen2-VL trained adapter: save_adapter with a NaN in W_skip refused, nothing written")
def _():
    m = trained_vlm()
    with torch.no_grad():
        next(p for p in m.parameters() if p.requires_grad).view(-1)[0] = float("nan")
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "a"
        msg = refusal(lambda: mmpreproj.save_adapter(m, out), m, "finite", "nan")
        return check(not out.exists() or not any(out.iterdir()), msg + "; nothing written")


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
        try:
            detail = fn()
            ok = True
        except AssertionError as err:
            ok, detail = False, str(err)
        except Exception as err:  # noqa: BLE001
            ok = False
            tb = traceback.extract_tb(err.__traceback__)[-1]
            detail = f"CRASH {type(err).__name__}: {str(err)[:150]} @ {Path(tb.filename).name}:{tb.lineno}"
        RESULTS.append(ok)
        print(f"{'PASS' if ok else 'FAIL'} | {label} | {detail}", flush=True)
    n, p = len(RESULTS), sum(RESULTS)
    print(f"TOTAL {n}: {p} PASS, {n - p} FAIL ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
