"""How much each layer uses the content skip: ||W_skip||_F per layer, and ||W_skip x~|| / ||attn_out||."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from torch import nn

from ..method.convert import parse_block_key
from ..method.files import read_adapter
from ..method.layer import PreProjAttention

PAPER_SKIP_NORMS = {
    "pythia-160m": [0.1295, 0.1301, 0.1283, 0.1274, 0.1273, 0.1279, 0.1315, 0.1358, 0.1507, 0.1905, 0.2575, 0.2959],
    "pythia-410m": [
        0.2017,
        0.1982,
        0.1973,
        0.1958,
        0.1945,
        0.1927,
        0.1887,
        0.1883,
        0.1893,
        0.1888,
        0.1887,
        0.1911,
        0.1928,
        0.1949,
        0.1948,
        0.1983,
        0.2048,
        0.2070,
        0.2117,
        0.2153,
        0.2399,
        0.2573,
        0.2785,
        0.2825,
    ],
}
"""The paper's Figure 2: the Frobenius norm of W_skip per layer after its frozen-probe runs."""


def skip_norms(model: nn.Module) -> dict[int, float]:
    """{block index: ||W_skip||_F} for every injected block that has a skip (of B A for a low-rank skip)."""
    return {
        m.block_index: m.slots()[1].weight.detach().float().norm().item()
        for m in model.modules()
        if isinstance(m, PreProjAttention) and m.slots()[1] is not None
    }


def skip_norms_from_adapter(path: str | Path) -> dict[int, float]:
    """The same, read from a saved adapter folder without building a model."""
    desc, tensors = read_adapter(path)
    blocks = dict(zip(desc.get("modules") or [], desc.get("layers") or []))  # wrapper path -> block index
    full: dict[int, torch.Tensor] = {}
    low: dict[int, dict[str, torch.Tensor]] = {}  # block -> {"up": B (d, r), "down": A (r, d)}
    for key, v in tensors.items():
        old = parse_block_key(key)  # an older folder's `blocks.{i}.skip.{param}`
        if old is not None:
            block, module, param = old
        else:
            at = max((p for p in blocks if key.startswith(f"{p}.")), key=len, default=None)
            block = blocks.get(at)
            module, _, param = key[len(at) + 1 :].partition(".") if at is not None else ("", "", "")
        if block is None or module not in ("skip", "preproj_skip"):  # the old slot name or today's
            continue
        if param == "proj.weight":
            full[block] = v.float()
        elif param in ("up.weight", "down.weight"):
            low.setdefault(block, {})[param.split(".")[0]] = v.float()
    for block, ab in low.items():
        if set(ab) == {"up", "down"}:
            full[block] = ab["up"] @ ab["down"]  # (d, r) @ (r, d) -> (d, d)
    return {block: w.norm().item() for block, w in sorted(full.items())}


@contextlib.contextmanager
def _capture(model: nn.Module, sums: dict[int, list[float]], token_mask: torch.Tensor | None) -> Iterator[None]:
    """Add up per-token ||skip|| and ||attn_out|| for every wrapper, from the two terms each wrapper hands over
    (`PreProjAttention.observe`); the observers are removed on exit."""

    def on_output(w: PreProjAttention, attn: torch.Tensor, skip: torch.Tensor) -> None:
        skip_norm = skip.detach().float().norm(dim=-1)  # (B, N)
        attn_norm = attn.detach().float().norm(dim=-1)  # (B, N)
        mask = token_mask if token_mask is not None else torch.ones_like(skip_norm, dtype=torch.bool)
        if mask.shape != skip_norm.shape:
            raise ValueError(
                f"routing_ratios: the token mask has shape {tuple(mask.shape)}, but block {w.block_index} "
                f"({w.part}) sees tokens of shape {tuple(skip_norm.shape)}; pass a mask per token of that block"
            )
        acc = sums.setdefault(w.block_index, [0.0, 0.0, 0])
        acc[0] += skip_norm[mask].sum().item()
        acc[1] += attn_norm[mask].sum().item()
        acc[2] += int(mask.sum().item())

    handles = [
        w.observe(on_output) for w in model.modules() if isinstance(w, PreProjAttention) and w.slots()[1] is not None
    ]
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

    The wrappers hand over the two terms they add (`PreProjAttention.observe`), so the ratio is read from
    what the forward actually computed. Raises ValueError for a model without a skip or a mask that keeps no token of
    a block, and RuntimeError when no block with a skip ran (e.g. inside `adapter_disabled`), rather than return an
    empty or NaN answer.
    """
    if not any(isinstance(m, PreProjAttention) and m.slots()[1] is not None for m in model.modules()):
        raise ValueError("routing_ratios: this model has no injected content skip (inject with skip=True)")
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
    if not sums:
        raise RuntimeError(
            "routing_ratios: no injected block with a skip ran on these batches "
            "(no batches, the adapter disabled, or the skipped blocks not on the forward path)"
        )
    empty = [i for i, (_, _, tokens) in sorted(sums.items()) if not tokens]
    if empty:
        raise ValueError(
            f"routing_ratios: the token mask ({token_mask_key or 'attention_mask'}) keeps no token of block(s) "
            f"{empty}: there is no ratio to measure there; pass batches with tokens the mask keeps"
        )
    return {i: s / a if a else float("nan") for i, (s, a, _) in sorted(sums.items())}
