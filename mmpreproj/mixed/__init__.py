"""Mixed text / image / video sequences through one decoder, LLaVA-style, with per-modality rotary positions.

The pre-projection carries no position, so one pre-projection + content skip per decoder block serves every
token; the positional encoding that follows it (M-RoPE: text 1D, images 2D, video 3D) is what differs.

    model = MixedModel(PatchTower(), VisionProjector(64, 64), NativeDecoder(vocab), markers)
    inject_decoder(model, PreProjConfig(freeze_base=False))
    batch = model.prepare([MixedSample(ids_with_image_marker, images=[img], target_ids=answer)])
    logits, _ = model(**batch.decoder_inputs())
    out = generate(model, batch, max_new_tokens=4)
"""

from ..rope.layouts import MROPE_LAYOUTS, InterleavedMultimodalRoPE, default_sections, make_mrope
from .decoders import NativeDecoder, NeoXDecoder
from .generate import GenerateOutput, generate
from .inject import inject_decoder
from .markers import MarkerIds
from .model import MixedModel, MixedSample
from .projector import VisionProjector
from .rotary import MultimodalRotaryEmbedding, restore_rotary, swap_rotary
from .sequence import IMAGE, PAD, TEXT, VIDEO, MixedBatch, MixedSequence, Visual, build_sequence, collate
from .towers import OpenClipTower, PatchTower, TimmTower

__all__ = [
    "IMAGE",
    "MROPE_LAYOUTS",
    "PAD",
    "TEXT",
    "VIDEO",
    "GenerateOutput",
    "InterleavedMultimodalRoPE",
    "MarkerIds",
    "MixedBatch",
    "MixedModel",
    "MixedSample",
    "MixedSequence",
    "MultimodalRotaryEmbedding",
    "NativeDecoder",
    "NeoXDecoder",
    "OpenClipTower",
    "PatchTower",
    "TimmTower",
    "VisionProjector",
    "Visual",
    "build_sequence",
    "collate",
    "default_sections",
    "generate",
    "inject_decoder",
    "make_mrope",
    "restore_rotary",
    "swap_rotary",
]
