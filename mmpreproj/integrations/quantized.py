"""A quantized frozen base: its linear layers stored in int8 (torchao) or 4-bit (bitsandbytes), then `inject`.

    model = GPTNeoXForCausalLM.from_pretrained(path)
    quantize_frozen_base(model, "int8")   # every nn.Linear but the output head: int8 weights, frozen
    mmpreproj.inject(model)               # the injected modules are float32 and train as usual

The helpers wrap the two libraries' own calls. 4-bit layers are bitsandbytes' `Linear4bit`; int8 layers are
`FrozenInt8Linear`, an `nn.Linear` holding torchao's `Int8Tensor` weight with torchao's forward and a backward
that keeps no float copy of the weight. Quantize before `inject` (the injected layers are `nn.Linear`s too
and must stay float). A 4-bit base can also come from transformers:
`from_pretrained(path, quantization_config=BitsAndBytesConfig(load_in_4bit=True))`; `inject` takes it as is.

bitsandbytes' CPU backend (0.50) has an inference path that breaks training: in eval mode, on a CPU with
AVX512-BF16, a no-grad forward repacks a `Linear4bit`'s weight in place into a layout with bfloat16 scales
(outputs ~1e-3 away from the train-mode path), and from then on a forward has no autograd kernel, so no
gradient flows back through that layer (the injected pre-projection would silently not train; with a bias
the forward raises). `quantize_frozen_base` turns that path off for the layers it makes;
`disable_cpu_4bit_packing(model)` does it for a model transformers loaded in 4-bit, before its first forward.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from ..hosts import find_host
from ..method.state import is_injected

__all__ = [
    "COMPUTE_DTYPES",
    "FrozenInt8Linear",
    "QUANT_SCHEMES",
    "disable_cpu_4bit_packing",
    "is_quantized_tensor",
    "model_bytes",
    "quantize_frozen_base",
    "tensor_bytes",
]

QUANT_SCHEMES = {
    "int8": "torchao Int8WeightOnlyConfig: int8 weights, one float scale per output row",
    "nf4": "bitsandbytes Linear4bit, NF4 4-bit weights in blocks of 64 with a nested-quantized scale",
    "fp4": "bitsandbytes Linear4bit, FP4 4-bit weights in blocks of 64 with a nested-quantized scale",
}
"""The quantizers `quantize_frozen_base` applies, by name, with what each stores."""
_PACKAGES = {"int8": "torchao", "nf4": "bitsandbytes", "fp4": "bitsandbytes"}  # import name = pip name
COMPUTE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
"""The dtypes a 4-bit layer may compute in."""


def is_quantized_tensor(t: torch.Tensor) -> bool:
    """True for a weight stored quantized: a torchao tensor subclass or a bitsandbytes `Params4bit`/`Int8Params`."""
    if type(t) in (torch.Tensor, nn.Parameter) or hasattr(t, "full_tensor"):  # plain, or an FSDP2 DTensor
        return False
    return hasattr(t, "__tensor_flatten__") or hasattr(t, "quant_state") or hasattr(t, "SCB")


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor stores: a torchao subclass counts its inner tensors (int8 data + scales), a bitsandbytes
    4-bit weight its packed data plus its quantization state; a plain tensor numel x element size."""
    if type(t) not in (torch.Tensor, nn.Parameter) and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    n = t.numel() * t.element_size()
    state = getattr(t, "quant_state", None)
    if state is not None:
        n += sum(
            v.numel() * v.element_size() for v in state.as_dict(packed=True).values() if isinstance(v, torch.Tensor)
        )
    return n


def model_bytes(model: nn.Module) -> dict[str, int]:
    """`{"parameters", "buffers"}`: bytes the model's tensors store (`tensor_bytes`), each tensor once."""
    out = {}
    for kind, tensors in (("parameters", model.parameters()), ("buffers", model.buffers())):
        out[kind] = sum(tensor_bytes(t) for t in {id(t): t for t in tensors}.values())
    return out


def _targets(model: nn.Module, skip: tuple[str, ...]) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, linear) of every plain `nn.Linear` whose name is not in `skip`, each module once."""
    out, seen = [], set()
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is nn.Linear and name not in skip and id(child) not in seen:
                seen.add(id(child))
                out.append((parent, name, child))
    return out


def _output_heads(model: nn.Module) -> tuple[str, ...]:
    """The host row's output heads (`HostSpec.output_heads`); () for a model no row knows."""
    try:
        return find_host(model).output_heads
    except ValueError:
        return ()


def quantize_frozen_base(
    model: nn.Module,
    scheme: str = "int8",
    *,
    skip_modules: Sequence[str] | None = None,
    compute_dtype: torch.dtype | None = None,
) -> nn.Module:
    """Store every `nn.Linear` of `model` quantized and frozen (`requires_grad=False`), in place.

    Args:
        model: a float model, not yet injected.
        scheme: one of `QUANT_SCHEMES`: "int8" (torchao weight-only, runs on CPU and GPU), "nf4" or "fp4"
            (bitsandbytes `Linear4bit`).
        skip_modules: attribute names of linear layers kept float (None: the host row's output heads,
            `HostSpec.output_heads`, `lm_head` / GPT-NeoX's `embed_out`, kept float as transformers does; a
            tied head must stay float anyway). A model no row knows (by type or structure) has none: name
            its head here.
        compute_dtype: 4-bit only: the dtype bitsandbytes computes in, one of `COMPUTE_DTYPES`
            (torch.float32, torch.float16, torch.bfloat16; None = each layer's weight dtype).

    Biases and every other parameter stay as they are (`inject` freezes them). Checked before any change:
    the scheme, the compute dtype, the backend's import, an injected model and a model without any linear
    layer to quantize.
    Returns the same model.
    """
    if scheme not in QUANT_SCHEMES:
        raise ValueError(f"quantize_frozen_base: scheme={scheme!r}; allowed values: {sorted(QUANT_SCHEMES)}")
    if compute_dtype is not None and (
        not isinstance(compute_dtype, torch.dtype) or compute_dtype not in COMPUTE_DTYPES
    ):
        raise ValueError(
            f"quantize_frozen_base: compute_dtype={compute_dtype!r}; allowed values: None (each layer's weight "
            f"dtype), {', '.join(map(str, COMPUTE_DTYPES))}"
        )
    if compute_dtype is not None and scheme == "int8":
        raise ValueError(
            "quantize_frozen_base: compute_dtype applies to the 4-bit schemes ('nf4', 'fp4') only; torchao's int8 "
            "layers compute in the input's dtype: leave compute_dtype=None"
        )
    if skip_modules is None:
        skip_modules = _output_heads(model)
    if isinstance(skip_modules, str) or not all(isinstance(s, str) for s in skip_modules):
        raise TypeError(f"quantize_frozen_base: skip_modules must be a list of attribute names, got {skip_modules!r}")
    if is_injected(model):
        raise RuntimeError(
            "quantize_frozen_base: this model is injected; quantize the base first, then inject "
            "(the injected layers must stay float)"
        )
    targets = _targets(model, tuple(skip_modules))
    quantized = [n for n, p in model.named_parameters() if is_quantized_tensor(p)]
    if quantized:
        raise ValueError(f"quantize_frozen_base: the model already holds quantized weights (e.g. {quantized[0]})")
    uses: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        uses.setdefault(id(p), []).append(n)
    tied = [uses[id(lin.weight)] for _, _, lin in targets if len(uses[id(lin.weight)]) > 1]
    if tied:
        raise ValueError(
            f"quantize_frozen_base: {tied[0]} share one weight (tied); add the linear's name to skip_modules"
        )
    if not targets:
        raise ValueError(
            f"quantize_frozen_base: {type(model).__name__} has no nn.Linear to quantize "
            f"(skipped names: {list(skip_modules)})"
        )
    package = _PACKAGES[scheme]  # a constant of this table (scheme was checked against it), never a string from a file
    try:
        backend = importlib.import_module(package)
    except ImportError as e:
        raise ImportError(
            f"quantize_frozen_base(scheme={scheme!r}) needs {package}: pip install {package} ({e})"
        ) from None
    if scheme == "int8":
        _int8(model, targets)
    else:
        for parent, name, linear in targets:
            setattr(parent, name, _four_bit(backend, linear, scheme, compute_dtype))
        disable_cpu_4bit_packing(model)
    return model


def disable_cpu_4bit_packing(model: nn.Module) -> int:
    """Keep every bitsandbytes `Linear4bit` of `model` on its differentiable CPU path; returns how many.

    Needed to train through a 4-bit base on CPU (see the module docstring); costs CPU inference speed only.
    Refuses (nothing changed) a model whose weights a forward already repacked: reload or re-quantize it.
    """
    layers = [(n, m) for n, m in model.named_modules() if hasattr(m, "support_avx512bf16_for_cpu")]
    packed = [n for n, m in layers if getattr(getattr(m.weight, "quant_state", None), "packing_format_for_cpu", False)]
    if packed:
        raise RuntimeError(
            f"disable_cpu_4bit_packing: {len(packed)} layer(s) (e.g. {packed[0]}) were already repacked by an "
            "eval-mode "
            "forward on CPU; they cannot pass gradients. Load or quantize the model again and call this first"
        )
    for _, m in layers:
        m.support_avx512bf16_for_cpu = False
    return len(layers)


def _int8(model: nn.Module, targets: list[tuple[nn.Module, str, nn.Linear]]) -> None:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    chosen = {id(linear) for _, _, linear in targets}
    # set_inductor_config=False: a library never changes process-wide (torch._inductor) settings
    quantize_(model, Int8WeightOnlyConfig(set_inductor_config=False), filter_fn=lambda m, fqn: id(m) in chosen)
    for _, _, linear in targets:
        linear.__class__ = FrozenInt8Linear  # same state, a forward whose backward keeps no float weight copy


class FrozenInt8Linear(nn.Linear):
    """An `nn.Linear` holding a frozen torchao per-row int8 weight (`Int8Tensor`), forward as torchao computes it.

    torchao's weight-only forward is `(x @ W_int8.float().T) * scale`: in training autograd keeps that float
    copy of `W` for the input gradient, so a backward through a frozen int8 base holds a float32 copy of every
    layer it passed (as much as the float base). `_Int8Linear` keeps the int8 weight itself and computes the
    same input gradient, `(grad * scale) @ W_int8.float()`, one layer at a time in backward.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        plain = getattr(w, "act_quant_kwargs", 1) is None and getattr(w, "act_pre_scale", 1) is None
        if plain and not w.requires_grad and tuple(w.block_size)[-1] == w.qdata.shape[-1] and torch.is_grad_enabled():
            return _Int8Linear.apply(x, w, self.bias)
        return F.linear(x, w, self.bias)


class _Int8Linear(torch.autograd.Function):
    """`F.linear(x, W_int8, b)` with W frozen; saves W (a reference, no copy) for the input gradient only."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.weight = weight  # a parameter: alive anyway, not an activation
        with torch.no_grad():
            return F.linear(x, weight, bias)  # (..., out), torchao's own kernel

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        w = ctx.weight
        grad_x = grad_b = None
        # the ops autograd would run through torchao's forward, without its saved float copy of W
        if ctx.needs_input_grad[0]:
            g = grad * w.scale.to(grad.dtype).flatten()  # (..., out)
            grad_x = (g.reshape(-1, g.shape[-1]) @ w.qdata.to(grad.dtype)).reshape(*grad.shape[:-1], -1)
        if ctx.needs_input_grad[2]:
            grad_b = grad.reshape(-1, grad.shape[-1]).sum(0)
        return grad_x, None, grad_b


def _four_bit(bnb, linear: nn.Linear, quant_type: str, compute_dtype: torch.dtype | None) -> nn.Module:
    """A `bnb.nn.Linear4bit` holding `linear`'s weight quantized and its bias Parameter itself."""
    weight = linear.weight
    q = bnb.nn.Linear4bit(
        linear.in_features,
        linear.out_features,
        bias=False,
        quant_type=quant_type,
        compute_dtype=compute_dtype or weight.dtype,
        device="meta",
    )
    q.weight = bnb.nn.Params4bit(weight.detach(), requires_grad=False, quant_type=quant_type, module=q).to(
        weight.device
    )
    q.bias = linear.bias  # the same Parameter (or None): its requires_grad stays the caller's
    return q.train(linear.training)
