"""How much each layer uses the content skip: ||W_skip||_F per layer, and ||W_skip x~|| / ||attn_out||."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from torch import nn

from ..adapter import read_adapter
from ..modules import PreProjAttention

__all__ = ["skip_norms", "skip_norms_from_adapter", "routing_ratios", "PAPER_SKIP_NORMS"]

# Figure 2 of the paper: Frobenius norm of W_skip per layer after the frozen-probe run.
PAPER_SKIP_NORMS = {
    "pythia-160m": [.1295, .1301, .1283, .1274, .1273, .1279, .1315, .1358, .1507, .1905, .2575, .2959],
    "pythia-410m": [.2017, .1982, .1973, .1958, .1945, .1927, .1887, .1883, .1893, .1888, .1887, .1911,
                    .1928, .1949, .1948, .1983, .2048, .2070, .2117, .2153, .2399, .2573, .2785, .2825],
}


def skip_norms(model: nn.Module) -> dict[int, float]:
    """{block index: ||W_skip||_F} for every injected block that has a skip."""
    return {
        m.block_index: m.skip.proj.weight.detach().float().norm().item()
        for m in model.modules()
        if isinstance(m, PreProjAttention) and m.skip is not None
    }


def skip_norms_from_adapter(path: str | Path) -> dict[int, float]:
    """The same, read from a saved adapter folder without building a model."""
    _, tensors = read_adapter(path)
    out = {int(k.split(".")[1]): v.float().norm().item() for k, v in tensors.items() if k.endswith("skip.proj.weight")}
    return dict(sorted(out.items()))


@contextlib.contextmanager
def _capture(model: nn.Module, sums: dict[int, list[float]], token_mask: torch.Tensor | None) -> Iterator[None]:
    """Hooks that add up per-token ||skip|| and ||attn_out|| for every wrapper (no state left behind)."""
    handles = []
    for w in (m for m in model.modules() if isinstance(m, PreProjAttention) and m.skip is not None):
        out: dict[str, torch.Tensor] = {}

        def on_attn(mod, args, output, out=out, w=w):
            t = output[w.call.output_index] if w.call.output_index is not None else output
            out["attn"] = t.detach().float().norm(dim=-1)  # (B, N)

        def on_skip(mod, args, output, out=out, w=w):
            skip = output.detach().float().norm(dim=-1)  # (B, N)
            attn = out.pop("attn")
            mask = token_mask if token_mask is not None else torch.ones_like(skip, dtype=torch.bool)
            acc = sums.setdefault(w.block_index, [0.0, 0.0])
            acc[0] += skip[mask].sum().item()
            acc[1] += attn[mask].sum().item()

        handles.append(w.base_layer.register_forward_hook(on_attn))
        handles.append(w.skip.register_forward_hook(on_skip))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def routing_ratios(
    model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], token_mask_key: str | None = None
) -> dict[int, float]:
    """{block index: sum ||W_skip x~|| / sum ||attn_out||} over the tokens of `batches`.

    Each batch is the kwargs of one forward call (e.g. input_ids, attention_mask). Tokens where
    `batch[token_mask_key]` (a bool (B, N) mask, popped before the call) is False are ignored, which
    lets a caller measure text and image tokens apart; by default the attention_mask is used.
    """
    was_training = model.training
    model.eval()
    sums: dict[int, list[float]] = {}
    try:
        for batch in batches:
            batch = dict(batch)
            mask = batch.pop(token_mask_key) if token_mask_key else batch.get("attention_mask")
            with _capture(model, sums, None if mask is None else mask.bool()):
                model(**batch)
    finally:
        model.train(was_training)
    return {i: s / a if a else float("nan") for i, (s, a) in sorted(sums.items())}
