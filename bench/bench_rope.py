"""Apply time of mmpreproj's rotary encoders vs the peer implementations they reproduce (CPU, fp32).

    OMP_NUM_THREADS=2 python bench/bench_rope.py [--runs 21]

Each row rotates the same q and k (B=8, H=12, D=64) both ways, side by side in one process, and reports the
median wall time of one q+k rotation; runs alternate between the two so load drift hits both alike. Peer
cos/sin tables are built once outside the timed region; mmpreproj's timed call includes its cache lookup
(a hit after the first call). Outputs are checked to agree before timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from diffusers.models.embeddings import apply_rotary_emb, get_3d_rotary_pos_embed  # noqa: E402
from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, apply_rot_embed_cat  # noqa: E402
from transformers import GPTNeoXConfig, LlamaConfig  # noqa: E402
from transformers.models.gpt_neox import modeling_gpt_neox as neox  # noqa: E402
from transformers.models.llama import modeling_llama as llama  # noqa: E402

from mmpreproj.rope import RoPE1D, RoPE2D, RoPE3D, grid_positions  # noqa: E402

B, H, D = 8, 12, 64
Pair = tuple[torch.Tensor, torch.Tensor]


def median_ms(fns: list[Callable[[], Pair]], runs: int, warmup: int = 2) -> list[float]:
    """Median wall time (ms) of each fn, runs alternating between them so load drift hits both alike."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for fn, t in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
    return [1e3 * statistics.median(t) for t in times]


def case_2d(q: torch.Tensor, k: torch.Tensor) -> tuple[Callable[[], Pair], Callable[[], Pair]]:
    """ViT-B/16 at 224: 1 class token + a 14x14 grid; timm's AttentionRope keeps the class token unrotated."""
    emb = RotaryEmbeddingCat(D, temperature=10000, in_pixels=False).get_embed((14, 14))
    rope, pos = RoPE2D(D), grid_positions(14, 14)

    def peer() -> Pair:
        return tuple(torch.cat((x[:, :, :1], apply_rot_embed_cat(x[:, :, 1:], emb)), dim=2) for x in (q, k))

    return (lambda: rope(q, k, pos, num_prefix_tokens=1)), peer


def case_3d(q: torch.Tensor, k: torch.Tensor) -> tuple[Callable[[], Pair], Callable[[], Pair]]:
    """A CogVideoX-like 8x14x14 video grid."""
    freqs = get_3d_rotary_pos_embed(D, ((0, 0), (14, 14)), (14, 14), 8, use_real=True)
    rope, pos = RoPE3D(D), grid_positions(8, 14, 14)
    return (lambda: rope(q, k, pos)), (lambda: (apply_rotary_emb(q, freqs), apply_rotary_emb(k, freqs)))


def case_1d(q: torch.Tensor, k: torch.Tensor, rotary_pct: float) -> tuple[Callable[[], Pair], Callable[[], Pair]]:
    """Llama (full rotary) or GPT-NeoX (rotary_pct=0.25) over 512 tokens."""
    n = q.shape[2]
    position_ids = torch.arange(n)[None].expand(B, -1)
    common = dict(hidden_size=D * H, num_attention_heads=H, num_hidden_layers=1, intermediate_size=8, vocab_size=8)
    if rotary_pct == 1.0:
        cos, sin = llama.LlamaRotaryEmbedding(LlamaConfig(**common))(q, position_ids)
        apply = llama.apply_rotary_pos_emb
    else:
        cos, sin = neox.GPTNeoXRotaryEmbedding(GPTNeoXConfig(**common, rotary_pct=rotary_pct))(q, position_ids)
        apply = neox.apply_rotary_pos_emb
    rope = RoPE1D(D, rotary_fraction=rotary_pct)
    return (lambda: rope(q, k, position_ids)), (lambda: apply(q, k, cos, sin))


def flash_attn_apply_rotary_emb_torch(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False
) -> torch.Tensor:
    """flash-attn's reference torch implementation (`flash_attn.layers.rotary.apply_rotary_emb_torch`),
    written out from its documented semantics: x (B, S, H, D), cos/sin (S, rotary_dim / 2); the first
    rotary_dim channels rotate (split-half or interleaved pairs), the rest pass through."""
    ro_dim = cos.shape[-1] * 2
    if interleaved:
        cos, sin = (t.repeat_interleave(2, dim=-1)[:, None] for t in (cos, sin))  # (S, 1, r)
        x1, x2 = x[..., :ro_dim:2], x[..., 1:ro_dim:2]
        rot = torch.stack((-x2, x1), dim=-1).flatten(-2)
    else:
        cos, sin = (torch.cat((t, t), dim=-1)[:, None] for t in (cos, sin))
        x1, x2 = x[..., : ro_dim // 2], x[..., ro_dim // 2 : ro_dim]
        rot = torch.cat((-x2, x1), dim=-1)
    return torch.cat((x[..., :ro_dim] * cos + rot * sin, x[..., ro_dim:]), dim=-1)


def case_flash(q: torch.Tensor, k: torch.Tensor, interleaved: bool) -> tuple[Callable[[], Pair], Callable[[], Pair]]:
    """flash-attn reference semantics (layout (B, S, H, D)) vs RoPE1D, full rotary over 512 tokens."""
    n = q.shape[2]
    inv = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)
    f = torch.arange(n, dtype=torch.float32)[:, None] * inv  # (S, D/2)
    cos, sin = f.cos(), f.sin()
    qs, ks = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()  # (B, S, H, D), flash-attn's layout
    rope = RoPE1D(D, pairing="interleaved" if interleaved else "half")
    pos = torch.arange(n)

    def peer() -> Pair:
        return tuple(flash_attn_apply_rotary_emb_torch(x, cos, sin, interleaved).transpose(1, 2) for x in (qs, ks))

    return (lambda: rope(q, k, pos)), peer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    results = []
    torch.manual_seed(0)
    rows = [
        ("RoPE2D vs timm apply_rot_embed_cat", 197, lambda q, k: case_2d(q, k)),
        ("RoPE3D vs diffusers apply_rotary_emb", 1568, lambda q, k: case_3d(q, k)),
        ("RoPE1D vs transformers Llama apply_rotary_pos_emb", 512, lambda q, k: case_1d(q, k, 1.0)),
        ("RoPE1D(0.25) vs transformers GPT-NeoX apply_rotary_pos_emb", 512, lambda q, k: case_1d(q, k, 0.25)),
        ("RoPE1D vs flash-attn apply_rotary_emb_torch (split-half)", 512, lambda q, k: case_flash(q, k, False)),
        ("RoPE1D interleaved vs flash-attn apply_rotary_emb_torch", 512, lambda q, k: case_flash(q, k, True)),
    ]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, B={B} H={H} D={D} fp32 CPU, "
          f"median of {args.runs} runs, one q+k rotation")  # fmt: skip
    print(f"| {'case':<58} | {'N':>5} | {'mmpreproj ms':>12} | {'peer ms':>8} | {'ratio':>5} |")
    print(f"|{'-' * 60}|{'-' * 7}|{'-' * 14}|{'-' * 10}|{'-' * 7}|")
    for name, n, build in rows:
        q, k = torch.randn(B, H, n, D), torch.randn(B, H, n, D)
        ours, peer = build(q, k)
        # same numbers, or no timing (1e-4: fp32 angles pos * inv_freq at pos ~500 differ in the last bits)
        torch.testing.assert_close(ours()[0], peer()[0], atol=1e-4, rtol=0)
        t_ours, t_peer = median_ms([ours, peer], args.runs)
        print(f"| {name:<58} | {n:>5} | {t_ours:>12.2f} | {t_peer:>8.2f} | {t_ours / t_peer:>5.2f} |")
        results.append({"case": name, "N": n, "ours_ms": t_ours, "peer_ms": t_peer, "ratio": t_ours / t_peer})
    print("ratio = mmpreproj / peer (below 1: mmpreproj is faster)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": results}, f, indent=2)


if __name__ == "__main__":
    main()
