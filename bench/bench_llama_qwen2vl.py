"""Forward latency of injected over base at two real shapes: the Llama-3.2-1B decoder and the Qwen2-VL-2B vision tower.

    python bench/bench_llama_qwen2vl.py [--llama-layers 1] [--vision-layers 2] [--seq 512] [--image 448] [--repeats 5]

Random weights from configs in code, no downloads, CPU, fp32, batch 1, paper-init modules in every block.
- Llama-3.2-1B shape (hidden 2048, 32 heads, 8 KV heads, intermediate 8192, vocab 128256, tied embeddings), with
  `--llama-layers` of its 16 decoder layers: the decoder body (`model.model`, no LM head) is timed, so the ratio is
  per-layer representative; the FLOP ratio of the whole 16-layer model with its LM head is given beside it
  (computed from the counted per-layer FLOPs plus 2 * seq * hidden * vocab for the head).
- Qwen2-VL-2B vision tower (embed 1280, 16 heads, MLP ratio 4, patch 14, temporal patch 2, 2x2 merger to the
  1536-wide language model) with `--vision-layers` of its 32 blocks, on one `--image` x `--image` picture
  (448: 32 x 32 = 1024 patches, 256 merged tokens); `model.visual(pixel_values, grid_thw)` is timed, merger included.
The two models of a pair are timed round-robin (`interleaved_medians` style), and every repeat is kept, so the
median and the range are reported; the 1-min load average is printed before and after.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics

import torch
import transformers as tf
from common import count_flops, interleaved_times, machine, write_json

import mmpreproj

LLAMA_1B = dict(hidden_size=2048, num_attention_heads=32, num_key_value_heads=8, intermediate_size=8192,
                vocab_size=128256, head_dim=64, tie_word_embeddings=True, rope_theta=500000.0,
                max_position_embeddings=4096, num_hidden_layers=16)  # fmt: skip
QWEN2VL_2B_VISION = dict(embed_dim=1280, num_heads=16, mlp_ratio=4, patch_size=14, temporal_patch_size=2,
                         spatial_merge_size=2, in_channels=3, hidden_size=1536, depth=32)  # fmt: skip


def summarise(times: dict[str, list[float]], flops: dict[str, int]) -> dict:
    ratios = [i / b for b, i in zip(times["base"], times["injected"])]  # per round
    return {"base_ms": 1e3 * statistics.median(times["base"]),
            "injected_ms": 1e3 * statistics.median(times["injected"]),
            "latency_ratio": statistics.median(times["injected"]) / statistics.median(times["base"]),
            "round_ratio_min": min(ratios), "round_ratio_max": max(ratios),
            "flop_ratio": flops["injected"] / flops["base"], "base_gflop": flops["base"] / 1e9}  # fmt: skip


def llama(layers: int, seq: int, repeats: int) -> dict:
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(**{**LLAMA_1B, "num_hidden_layers": layers})
    base = tf.LlamaForCausalLM(cfg).eval()
    injected = mmpreproj.inject(copy.deepcopy(base))
    ids = torch.randint(0, cfg.vocab_size, (1, seq))

    def body(m):
        return lambda: m.model(ids, use_cache=False)

    with torch.no_grad():
        flops = {k: count_flops(body(m)) for k, m in (("base", base), ("injected", injected))}
        times = interleaved_times({"base": body(base), "injected": body(injected)}, repeats, warmup=1)
    r = summarise(times, flops)
    full_layers, head = LLAMA_1B["num_hidden_layers"], 2 * seq * cfg.hidden_size * cfg.vocab_size
    per_layer = {k: v / layers for k, v in flops.items()}
    r.update(layers=layers, of_layers=full_layers, seq=seq,
             full_model_flop_ratio=(full_layers * per_layer["injected"] + head)
             / (full_layers * per_layer["base"] + head))  # fmt: skip
    return r


def qwen2vl_vision(layers: int, image: int, repeats: int) -> dict:
    torch.manual_seed(0)
    cfg = tf.Qwen2VLConfig(
        vision_config={**QWEN2VL_2B_VISION, "depth": layers},
        text_config=dict(
            hidden_size=1536,
            num_hidden_layers=1,
            num_attention_heads=12,
            num_key_value_heads=2,
            intermediate_size=256,
            vocab_size=1024,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
        ),
        image_token_id=1000,
        video_token_id=1001,
        vision_start_token_id=1002,
        vision_end_token_id=1003,
    )  # fmt: skip  (a 1-layer, 1024-token language model: only the vision tower is timed)
    base = tf.Qwen2VLForConditionalGeneration(cfg).eval()
    injected = mmpreproj.inject(copy.deepcopy(base), mmpreproj.PreProjConfig(parts=["vision"]))
    grid_side = image // QWEN2VL_2B_VISION["patch_size"]
    patches = grid_side * grid_side
    pixels = torch.randn(patches, 3 * 2 * 14 * 14)  # the image processor's patchified layout
    grid = torch.tensor([[1, grid_side, grid_side]])

    def tower(m):
        return lambda: m.model.visual(pixels, grid_thw=grid)

    with torch.no_grad():
        flops = {k: count_flops(tower(m)) for k, m in (("base", base), ("injected", injected))}
        times = interleaved_times({"base": tower(base), "injected": tower(injected)}, repeats, warmup=1)
    r = summarise(times, flops)
    r.update(layers=layers, of_layers=QWEN2VL_2B_VISION["depth"], image=image, patches=patches)
    return r


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-layers", type=int, default=1, help="of Llama-3.2-1B's 16 (per-layer representative)")
    ap.add_argument("--vision-layers", type=int, default=2, help="of the Qwen2-VL-2B vision tower's 32")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--image", type=int, default=448, help="side in pixels (a multiple of 28)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    load = [os.getloadavg()[0]]
    result = {"machine": machine(), "llama": llama(args.llama_layers, args.seq, args.repeats)}
    load.append(os.getloadavg()[0])
    result["qwen2vl_vision"] = qwen2vl_vision(args.vision_layers, args.image, args.repeats)
    load.append(os.getloadavg()[0])
    result["load_avg_1min"] = load
    for name, r in (
        ("Llama-3.2-1B shape", result["llama"]),
        ("Qwen2-VL-2B vision tower", result["qwen2vl_vision"]),
    ):
        print(
            f"{name} ({r['layers']} of {r['of_layers']} layers): base {r['base_ms']:.0f} ms | injected "
            f"{r['injected_ms']:.0f} ms | ratio {r['latency_ratio']:.3f} (rounds {r['round_ratio_min']:.3f}-"
            f"{r['round_ratio_max']:.3f}) | matmul FLOP ratio {r['flop_ratio']:.3f}"
        )
    print(f"  whole 16-layer Llama-3.2-1B with its LM head: FLOP ratio {result['llama']['full_model_flop_ratio']:.3f}")
    print(f"  {machine()}; 1-min load average {', '.join(f'{x:.1f}' for x in load)} (start, after each shape)")
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
