"""A tiny LLaVA-style model of the mixed recipe: text, image and video tokens through one decoder, M-RoPE positions.

Recipe code, not library code. It was `mmpreproj.mixed`; it moved here because it is a model family of its
own (a forward returning `(logits, cache)`, its own greedy `generate` and `KVCache` protocol) that
`mmpreproj.train` does not drive, and only `cifar_vqa.py` uses it. Making it a host the trainer drives
(transformers-style outputs, one cache protocol, the common `generate`) would duplicate what the real VLM
host rows (`mmpreproj.hosts.transformers_vision`: Qwen2-VL, Qwen3-VL, ...) already give. What users need
stays in the library: per-modality positions `mmpreproj.rope.multimodal_positions` and the M-RoPE layouts
`mmpreproj.rope.make_mrope` / `MultimodalRoPE` / `InterleavedMultimodalRoPE`. The parts only tests used
(a GPT-NeoX with its rotary swapped for M-RoPE, timm and open_clip towers) were removed.

The pre-projection carries no position, so one pre-projection + content skip per decoder block serves every
token; the positional encoding that follows it (M-RoPE: text 1D, images 2D, video 3D) is what differs.

    model = MixedModel(PatchTower(), VisionProjector(64, 64), NativeDecoder(vocab), markers)
    inject_decoder(model, PreProjConfig(freeze_base=False))
    batch = model.prepare([MixedSample(ids_with_image_marker, images=[img], target_ids=answer)])
    logits, _ = model(**batch.decoder_inputs())
    out = generate(model, batch, max_new_tokens=4)
"""

from .decoder import NativeDecoder
from .generate import GenerateOutput, generate
from .inject import inject_decoder
from .markers import MarkerIds
from .model import MixedModel, MixedSample
from .projector import VisionProjector
from .sequence import IMAGE, PAD, TEXT, VIDEO, MixedBatch, MixedSequence, Visual, build_sequence, collate
from .tower import PatchTower

__all__ = [
    "IMAGE",
    "PAD",
    "TEXT",
    "VIDEO",
    "GenerateOutput",
    "MarkerIds",
    "MixedBatch",
    "MixedModel",
    "MixedSample",
    "MixedSequence",
    "NativeDecoder",
    "PatchTower",
    "VisionProjector",
    "Visual",
    "build_sequence",
    "collate",
    "generate",
    "inject_decoder",
]
