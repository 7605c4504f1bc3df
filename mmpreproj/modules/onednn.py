"""bf16 linear layers on CPU with the weight prepacked once for oneDNN (inference only).

A bf16 `F.linear` on a CPU with oneDNN bf16 kernels (AVX512-BF16 / AMX) goes to oneDNN, which reorders the
weight into its blocked layout on every call: at batch-1 decode that reorder costs as much as the matmul
(measured here: 3-6 GB/s of weight read through `F.linear`, 7-11 GB/s prepacked; `bench/profile_decode.py`).
Prepacking once (`pack`) and calling oneDNN on the packed weight (`linear`) runs the same kernel on the same
blocked data, so the output is bit-identical to `F.linear` (`tests/test_modules_onednn.py`). `usable` says
when `F.linear` itself would take the oneDNN path (the rule in ATen's `use_mkldnn_bf16_matmul`: bf16
operands, oneDNN enabled and bf16-capable, more than 16**3 multiply-adds), so nothing else changes results.
A packed weight is an opaque layout: it is only ever passed to `linear`, never to other ops.
"""

from __future__ import annotations

import functools

import torch

_MIN_MACS = 16 * 16 * 16  # ATen's mkldnn_gemm_min_size
# Up to this many rows the packed kernel is bit-identical to `F.linear`'s; above it, on a CPU with AMX, oneDNN's
# kernel for a weight packed for batch 1 accumulates in another order than `F.linear`'s (from 33 rows on, at every
# width checked: tests/test_modules_onednn.py). Prepacking pays at decode (a few rows), not at a prefill.
MAX_ROWS = 32


@functools.cache
def _bf16_kernels() -> bool:
    """The CPU and this torch build have oneDNN bf16 matmul kernels (a fixed fact of the machine)."""
    ops = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise") and bool(ops._is_mkldnn_bf16_supported()))  # fmt: skip


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """`F.linear(x, weight)` (both bf16, CPU, no graph needed) would run oneDNN on at most `MAX_ROWS` rows: the
    packed path may stand in."""
    if x.dtype != torch.bfloat16 or x.device.type != "cpu" or type(x) is not torch.Tensor:
        return False
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or not torch.backends.mkldnn.enabled or x.dim() < 1:
        return False  # traced: the plain op (a packed weight is opaque to the tracers)
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return rows <= MAX_ROWS and rows * weight.shape[0] * weight.shape[1] > _MIN_MACS and _bf16_kernels()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (out, in), bf16, in oneDNN's blocked layout for `linear` (opaque: no other op may read it)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, 1)  # 1: the batch size oneDNN tunes the layout for


def linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, W)` for `packed = pack(W)`; x (..., in) -> (..., out), bit-identical."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
