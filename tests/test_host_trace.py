"""`trace_seams` is never silently wrong (issue 20 s2): every slot fed x^ reads x~, every seam of a block is
found, post-norm seams are refused, and a description that fails at the first forward says where."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mmpreproj
from mmpreproj.method import trace_seams
from mmpreproj.method.config import PreProjConfig
from tests.helpers.adapter_json import load_desc

D, N, B = 16, 5, 2


def _x() -> torch.Tensor:
    return torch.randn(B, N, D, generator=torch.Generator().manual_seed(0))


def _inputs_seen(model: nn.Module, attention_type: type, *args) -> list[tuple[list, dict, list]]:
    """Run `model(*args)` recording, per call of an `attention_type` module (the host's own attention,
    inside the wrapper), its positional and keyword tensors, and the outputs of every norm of the model."""
    calls, norm_outs, handles = [], [], []
    for m in model.modules():
        if isinstance(m, attention_type):
            handles.append(
                m.register_forward_pre_hook(lambda mod, a, kw: calls.append((list(a), dict(kw))), with_kwargs=True)
            )
        if isinstance(m, nn.LayerNorm):
            handles.append(m.register_forward_hook(lambda mod, a, o: norm_outs.append(o)))
    try:
        with torch.no_grad():
            model(*args)
    finally:
        for h in handles:
            h.remove()
    return [(a, kw, norm_outs) for a, kw in calls]


def _not_a_norm_output(t, norm_outs) -> bool:
    return isinstance(t, torch.Tensor) and all(t is not o for o in norm_outs)


# --- 1. nn.MultiheadAttention(y, y, y): query, key and value all read x~ ------------------------------------


class MHABlock(nn.Module):
    def __init__(self, by_keyword: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, 2, batch_first=True)
        self.mlp = nn.Linear(D, D)
        self.by_keyword = by_keyword

    def forward(self, x):
        y = self.norm(x)
        if self.by_keyword:
            a = self.attn(query=y, key=y, value=y, need_weights=False)[0]
        else:
            a = self.attn(y, y, y, need_weights=False)[0]
        x = x + a
        return x + self.mlp(x)


class Stack(nn.Module):
    def __init__(self, make, n: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(make() for _ in range(n))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


@pytest.mark.parametrize("by_keyword", [False, True], ids=["positional", "keyword"])
def test_multihead_attention_q_k_v_all_read_x_tilde(by_keyword):
    torch.manual_seed(0)
    model = Stack(lambda: MHABlock(by_keyword))
    description = trace_seams(model, _x())
    (part,) = description["parts"]
    assert part["attention"] == "attn" and part["norm"] == "norm"
    expected = [[0, "query"], [1, "key"], [2, "value"]]
    assert sorted(part["call"]["inputs"]) == expected
    mmpreproj.inject(model, PreProjConfig(), host=description)
    seen = _inputs_seen(model, nn.MultiheadAttention, _x())
    assert len(seen) == 2
    for args, kwargs, norm_outs in seen:  # hand check: q, k, v are one x~, none of them the norm's output
        q, k, v = (kwargs["query"], kwargs["key"], kwargs["value"]) if by_keyword else args[:3]
        assert q is k is v
        assert _not_a_norm_output(q, norm_outs)


# --- 2. two norm -> attention seams in one block (TimeSformer-like): one part each -------------------------


class SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.proj(torch.softmax(q @ k.transpose(-1, -2) / D**0.5, dim=-1) @ v)


class TwoSeamBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm_t, self.attn_t = nn.LayerNorm(D), SelfAttention()
        self.norm_s, self.attn_s = nn.LayerNorm(D), SelfAttention()
        self.mlp = nn.Linear(D, D)

    def forward(self, x):
        x = x + self.attn_t(self.norm_t(x))  # "temporal"
        x = x + self.attn_s(self.norm_s(x))  # "spatial"
        return x + self.mlp(x)


def test_a_block_with_two_seams_gives_two_parts_and_both_attentions_read_x_tilde(tmp_path):
    torch.manual_seed(0)
    model = Stack(TwoSeamBlock)
    description = trace_seams(model, _x())
    got = sorted((p["attention"], p["norm"]) for p in description["parts"])
    assert got == [("attn_s", "norm_s"), ("attn_t", "norm_t")]
    assert len({p["name"] for p in description["parts"]}) == 2
    assert {p["blocks"] for p in description["parts"]} == {"blocks"}
    ref = model(_x()).detach()
    mmpreproj.inject(model, PreProjConfig(), host=description)
    wrappers = mmpreproj.injected_modules(model)
    assert len(wrappers) == 4 and len({w.block_index for w in wrappers}) == 4
    seen = _inputs_seen(model, SelfAttention, _x())
    assert len(seen) == 4
    for args, _, norm_outs in seen:  # hand check: each attention reads x~, not its norm's output
        assert _not_a_norm_output(args[0], norm_outs)
    with torch.no_grad():
        for w in wrappers:
            w.slots()[1].weight.normal_()
    out = model(_x()).detach()
    mmpreproj.save_adapter(model, tmp_path / "a")
    mmpreproj.unload(model)
    assert torch.allclose(model(_x()), ref) and not mmpreproj.is_injected(model)
    mmpreproj.load_adapter(model, tmp_path / "a")
    assert torch.allclose(model(_x()), out)
    mmpreproj.unload(model)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


# --- 3. post-norm seams are refused; a parallel block (one norm feeding attention and MLP) is not -----------


class PostNormBlock(nn.Module):
    """BART decoder-like: self-attention on the block input, then a post-norm whose output is both the
    cross-attention's input and the residual."""

    def __init__(self) -> None:
        super().__init__()
        self.self_attn, self.cross_attn = SelfAttention(), SelfAttention()
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)

    def forward(self, x):
        y = self.norm1(x + self.self_attn(x))
        return self.norm2(y + self.cross_attn(y))


class ParallelBlock(nn.Module):
    """GPT-J-like: one norm feeds attention and MLP, the residual is the block input (pre-norm)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.attn, self.mlp = nn.LayerNorm(D), SelfAttention(), nn.Linear(D, D)

    def forward(self, x):
        y = self.norm(x)
        return x + self.attn(y) + self.mlp(y)


def test_a_post_norm_seam_is_refused_with_the_reason():
    torch.manual_seed(0)
    model = Stack(PostNormBlock)
    with pytest.raises(
        ValueError,
        match=r"seam 'blocks.0.norm1' -> 'blocks.0.cross_attn' .* is post-norm: .*"
        r"residual stream",
    ):
        trace_seams(model, _x())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_a_parallel_block_whose_norm_also_feeds_the_mlp_is_traced():
    torch.manual_seed(0)
    model = Stack(ParallelBlock)
    (part,) = trace_seams(model, _x())["parts"]
    assert (part["attention"], part["norm"]) == ("attn", "norm")
    mmpreproj.inject(model, PreProjConfig(), host={"name": "traced", "parts": [part]})
    mlp_inputs = []
    for b in model.blocks:
        b.mlp.register_forward_pre_hook(lambda m, a: mlp_inputs.append(a[0]))
    for args, _, norm_outs in _inputs_seen(model, SelfAttention, _x()):  # attention reads x~, the MLP x^
        assert _not_a_norm_output(args[0], norm_outs)
    assert len(mlp_inputs) == 2


# --- 5. a seam that fails at the first forward says where; inject(example_input=...) leaves nothing behind --


class BufferAttention(SelfAttention):
    """An attention that reads its input through the norm's buffer (here: insists on the very tensor the
    norm returned): any other tensor, x~ included, fails with a raw shape error."""

    def forward(self, x):
        if x is not self.expected:
            raise RuntimeError("shape '[2, 5, 2, 8]' is invalid for input of size 7")
        return super().forward(x)


class BufferBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.attn = nn.LayerNorm(D), BufferAttention()

    def forward(self, x):
        y = self.norm(x)
        object.__setattr__(self.attn if not hasattr(self.attn, "base_layer") else self.attn.base_layer, "expected", y)
        return x + self.attn(y)


HOST = {
    "name": "buffer",
    "parts": [
        {
            "name": "blocks",
            "blocks": "blocks",
            "attention": "attn",
            "norm": "norm",
            "call": {"inputs": [[0, "x"]], "output_index": None},
        }
    ],
}


def test_a_seam_failing_at_the_first_forward_names_the_block_and_the_seam():
    torch.manual_seed(0)
    model = Stack(BufferBlock)
    mmpreproj.inject(model, PreProjConfig(), host=HOST)
    with pytest.raises(
        mmpreproj.method.layer.SeamError,
        match=r"part 'blocks', block 0\) \(host 'buffer', block 0 of part 'blocks': norm 'norm' -> "
        r"attention 'attn'\): the host attention failed on its first call .*shape",
    ):
        model(_x())
    mmpreproj.unload(model)


def test_inject_with_example_input_unloads_when_the_first_forward_fails():
    torch.manual_seed(0)
    model = Stack(BufferBlock)
    model.train()
    with pytest.raises(mmpreproj.method.layer.SeamError, match="first call"):
        mmpreproj.inject(model, PreProjConfig(), host=HOST, example_input=_x())
    assert not mmpreproj.is_injected(model) and model.training
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert not any(isinstance(m, mmpreproj.PreProjAttention) for m in model.modules())


def test_inject_with_example_input_keeps_a_model_that_runs():
    torch.manual_seed(0)
    model = Stack(MHABlock)
    model.train()
    host = trace_seams(model, _x())
    mmpreproj.inject(model, PreProjConfig(), host=host, example_input=(_x(),))
    assert mmpreproj.is_injected(model) and model.training
    for w in mmpreproj.injected_modules(model):
        assert w.seam_check is None  # the example forward settled the seam checks
    for args, _, norm_outs in _inputs_seen(model, nn.MultiheadAttention, _x()):
        assert all(_not_a_norm_output(t, norm_outs) for t in args[:3])


# --- 4. norm: null needs the explicit opt-in "unchecked_seam": true ----------------------------------------


NO_NORM = {
    "name": "blocks",
    "blocks": "blocks",
    "attention": "attn_t",
    "call": {"inputs": [[0, "x"]], "output_index": None},
}


def test_norm_null_without_the_opt_in_is_refused_naming_it():
    from mmpreproj.hosts.spec import HostError

    model = Stack(TwoSeamBlock)
    for part in (NO_NORM, {**NO_NORM, "norm": None}):
        with pytest.raises(HostError, match=r"parts\[0\] has norm: null.*\"unchecked_seam\": true"):
            mmpreproj.inject(model, PreProjConfig(), host={"name": "x", "parts": [part]})
    assert not mmpreproj.is_injected(model)
    with pytest.raises(HostError, match="unchecked_seam must be true or false"):
        mmpreproj.inject(model, PreProjConfig(), host={"name": "x", "parts": [{**NO_NORM, "unchecked_seam": 1}]})


def test_norm_null_with_the_opt_in_warns_and_is_saved_with_the_adapter(tmp_path):

    torch.manual_seed(0)
    model = Stack(PostNormBlock)  # post-norm: unchecked, the pre-projection reads whatever the call names
    host = {"name": "x", "parts": [{**NO_NORM, "attention": "cross_attn", "unchecked_seam": True}]}
    with pytest.warns(UserWarning, match="norm: null with unchecked_seam: true"):
        mmpreproj.inject(model, PreProjConfig(), host=host)
    for args, _, norm_outs in _inputs_seen(model, SelfAttention, _x())[1::2]:  # the cross-attention calls
        assert _not_a_norm_output(args[0], norm_outs)  # it reads x~ (of the residual stream: the opt-in's risk)
    mmpreproj.save_adapter(model, tmp_path / "a")
    saved = load_desc(tmp_path / "a" / "adapter_config.json")
    assert saved["host_description"]["parts"][0]["unchecked_seam"] is True
    mmpreproj.unload(model)
    with pytest.warns(UserWarning, match="unchecked_seam"):
        mmpreproj.load_adapter(model, tmp_path / "a")


def test_a_built_in_row_with_norm_null_opts_in_in_code():
    from mmpreproj.hosts import HOSTS
    from mmpreproj.hosts.spec import HostError, PartSpec

    assert all(p.unchecked_seam for h in HOSTS.values() for p in h.parts if p.norm is None)
    with pytest.raises(HostError, match="unchecked_seam"):
        PartSpec("blocks", blocks=("blocks",), attention="attn")
