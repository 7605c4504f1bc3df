"""A random-init tiny Qwen2-VL saved like a hub checkpoint (model + processor), to run `frozen_probe.py` offline.

Everything is built in code: the shipped Pythia tokenizer (`assets/mini-pythia`) with Qwen2-VL's vision special
tokens and a ChatML chat template added, Qwen2-VL's own `Qwen2VLImageProcessor` (4 px patches, 2x2 merge, small
min/max pixels), and a `Qwen2VLForConditionalGeneration` of width 64. Nothing is downloaded.

    .venv/bin/python recipes/vlm/tiny_qwen2vl.py /tmp/tiny-qwen2vl
    .venv/bin/python recipes/vlm/frozen_probe.py --model /tmp/tiny-qwen2vl --steps 20
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from mmpreproj.data.assets import asset_path

__all__ = ["CHAT_TEMPLATE", "save_tiny_qwen2vl"]

VISION_TOKENS = (
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|im_start|>",
    "<|im_end|>",
)
CHAT_TEMPLATE = (  # Qwen2-VL's ChatML layout, images as <|vision_start|><|image_pad|><|vision_end|>
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def save_tiny_qwen2vl(path: str | Path, width: int = 64, depth: int = 2, seed: int = 0) -> Path:
    """Write config, random weights, tokenizer, image processor and chat template to `path`; return it."""
    from transformers import (
        AutoTokenizer,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    path = Path(path)
    tok = AutoTokenizer.from_pretrained(str(asset_path("mini-pythia")))
    tok.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    images = Qwen2VLImageProcessor(patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=32 * 32,
                                   max_pixels=64 * 64)  # fmt: skip
    videos = Qwen2VLVideoProcessor(patch_size=4, merge_size=2, temporal_patch_size=2)  # required, unused here
    processor = Qwen2VLProcessor(image_processor=images, tokenizer=tok, video_processor=videos,
                                 chat_template=CHAT_TEMPLATE)  # fmt: skip
    torch.manual_seed(seed)
    head_pairs = width // 4 // 2  # 4 heads
    config = Qwen2VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=width, intermediate_size=2 * width, num_hidden_layers=depth,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                          "mrope_section": [head_pairs // 4, 3 * head_pairs // 8,
                                                            head_pairs - head_pairs // 4 - 3 * head_pairs // 8]},
                         bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=tok.pad_token_id),
        vision_config=dict(depth=depth, embed_dim=width, hidden_size=width, num_heads=4, mlp_ratio=2, patch_size=4,
                           temporal_patch_size=2, spatial_merge_size=2, in_channels=3),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    Qwen2VLForConditionalGeneration(config).save_pretrained(path)
    processor.save_pretrained(path)
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path", help="the folder to write the tiny model and its processor into")
    args = parser.parse_args()
    if not args.path.strip():  # '' would write into the working directory
        parser.error("path: empty; pass a folder to write the tiny model into")
    print(save_tiny_qwen2vl(args.path))
