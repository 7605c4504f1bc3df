"""`trace_seams` is never silently wrong (issue 20 s2): every slot fed x^ reads x~, every seam of a block is
found, post-norm seams are refused, and a description that fails at the first forward says where."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mmpreproj
from mmpreproj.config import PreProjConfig
from mmpreproj.hosts import trace_seams

D, N, B = 16, 5, 2


def _x() -> torch.Tensor:
    return torch.randn(B, N, D, generator=torch.Generator().manual_seed(0))


def _inputs_seen(model: nn.Module, attention_type: type, *args) -> list[tuple[list, dict, list]]:
    """Run `model(*args)` recording, per call of an `attention_type` module (the host's own attention,
    inside the wrapper), its positional and keyword tensors, and the outputs of every norm of the model."""
    calls, norm_outs, handles = [], [], []
    for m in model.modules():
        if isinstance(m, attention_type):
            handles.append(m.register_forward_pre_hook(
                lambda mod, a, kw: calls.append((list(a), dict(kw))), with_kwargs=True))
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
