"""The mixed recipe's arms on a real VLM: a tiny transformers `Qwen2VLForConditionalGeneration`, trained from scratch.

Same task, data stream, step budget, optimiser and seed as the recipe's own arms (`cifar_vqa.py`); what changes is
the model: transformers' own Qwen2-VL (its vision tower with 2D RoPE inside every block, its 2x2 patch merger, its
Qwen2 decoder with M-RoPE) built from a config in code with random weights. Pixels go through Qwen2-VL's own
`Qwen2VLImageProcessor` (constructed in code: patch 4, merge 2, min/max pixels that keep the recipe's 16..48 px
pictures at their size), so a 32x32 CIFAR image becomes the same 4x4 = 16 decoder tokens as in the other arms.
Token ids are the recipe's `WordTokenizer` ids; its `<image>`, `<vision_start>`, `<vision_end>` markers are the
config's image / vision-start / vision-end token ids, and each `<image>` is expanded as the Qwen2-VL processor does:
`<vision_start> <image>*n <vision_end>`.

    qwen2vl-mrope          Qwen2-VL's own M-RoPE (chunked sections, t/h/w), nothing injected
    qwen2vl-mrope+adapter  the same with `mmpreproj.inject`: one pre-projection + content skip per block of both
                           towers (vision blocks ahead of the 2D RoPE, decoder layers ahead of M-RoPE)

Trained from scratch, so the whole model trains in both arms (`PreProjConfig(freeze_base=False)`), as the recipe's
own `+adapter` arms do. The answer is scored from the logits at the last prompt position (the greedy first token;
the same as `generate(max_new_tokens=1)`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import torch
from cifar_tasks import MEAN, QUESTION_TYPES, STD, WordTokenizer, next_token_loss, train_loop

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.analysis import routing_ratios, skip_norms

__all__ = ["QWEN2VL_ARMS", "Qwen2VLBatcher", "build_qwen2vl", "image_processor", "run_qwen2vl_arm"]

QWEN2VL_ARMS = {"qwen2vl-mrope+adapter": True, "qwen2vl-mrope": False}  # name: pre-projection + skip injected
VISION_DEPTH = 2  # blocks of the Qwen2-VL vision tower (the recipe's own tower is a position-free MLP)


def mrope_sections(head_dim: int) -> list[int]:
    """Qwen2-VL's (t, h, w) frequency-pair sections scaled to `head_dim` ((16, 24, 24) at 128; (4, 6, 6) at 32)."""
    pairs = head_dim // 2
    t = pairs // 4
    h = (pairs - t) // 2
    return [t, h, pairs - t - h]


def build_qwen2vl(cfg: Any, tok: WordTokenizer, adapter: bool) -> torch.nn.Module:
    """A random-init Qwen2-VL at the recipe's decoder shape (width, depth, heads, theta; a SwiGLU MLP of 8/3 width,
    the parameter count of the recipe's 4x GELU MLP), seeded like every arm."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    torch.manual_seed(cfg.seed)  # both Qwen2-VL arms start from the same base weights
    head_dim = cfg.width // cfg.heads
    m = tok.markers
    config = Qwen2VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=cfg.width, intermediate_size=8 * cfg.width // 3,
                         num_hidden_layers=cfg.depth, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
                         max_position_embeddings=512, rope_parameters={"rope_type": "default", "rope_theta": cfg.theta,
                                                                       "mrope_section": mrope_sections(head_dim)},
                         pad_token_id=m.pad, eos_token_id=tok.eos, bos_token_id=None),
        vision_config=dict(depth=VISION_DEPTH, embed_dim=cfg.tower_width, hidden_size=cfg.width, num_heads=2,
                           mlp_ratio=2, patch_size=cfg.patch, temporal_patch_size=2, spatial_merge_size=cfg.merge,
                           in_channels=3),
        image_token_id=m.image, video_token_id=m.video, vision_start_token_id=m.vision_start,
        vision_end_token_id=m.vision_end, pad_token_id=m.pad, eos_token_id=tok.eos, bos_token_id=None,
    )  # fmt: skip
    model = Qwen2VLForConditionalGeneration(config)
    if adapter:  # both towers (the row's default parts); trained from scratch, so nothing is frozen
        mmpreproj.inject(model, PreProjConfig(freeze_base=False))
    return model


def image_processor(cfg: Any) -> Any:
    """Qwen2-VL's own image processor, built in code: the recipe's patch and merge; pictures of 16..48 px kept as
    is."""
    from transformers import Qwen2VLImageProcessor

    factor = cfg.patch * cfg.merge
    return Qwen2VLImageProcessor(patch_size=cfg.patch, merge_size=cfg.merge, temporal_patch_size=2,
                                 min_pixels=factor * factor, max_pixels=64 * 64)  # fmt: skip


class Qwen2VLBatcher:
    """Recipe samples (`MixedSample`: ids with `<image>` markers, normalised pixels, answer ids) -> Qwen2-VL inputs.

    Pixels are un-normalised back to [0, 1] (the recipe's `(x - 0.5) / 0.25`) and handed to the image processor,
    which normalises them its own way (CLIP mean / std) and patchifies them (two identical frames per image).
    Batches are right-padded; `labels` (B, S) hold the answer ids at their own positions (-100 elsewhere).
    """

    def __init__(self, tok: WordTokenizer, processor: Any) -> None:
        self.tok, self.processor = tok, processor
        self.merge = processor.merge_size

    def __call__(self, samples: Sequence[Any]) -> dict[str, torch.Tensor]:
        pics = [(img * STD + MEAN).clamp(0, 1) for s in samples for img in s.images]  # (3, H, W) in [0, 1]
        vision = self.processor(images=pics, do_rescale=False, return_tensors="pt")
        grids = iter(vision["image_grid_thw"].tolist())
        m, rows, labels = self.tok.markers, [], []
        for s in samples:
            ids: list[int] = []
            for t in s.input_ids:
                if t == m.image:
                    n = math.prod(next(grids)) // self.merge**2  # decoder tokens of this image
                    ids += [m.vision_start, *([m.image] * n), m.vision_end]
                else:
                    ids.append(t)
            rows.append(ids + list(s.target_ids))
            labels.append([-100] * len(ids) + list(s.target_ids))
        width = max(map(len, rows))
        pad = lambda xs, v: [x + [v] * (width - len(x)) for x in xs]  # noqa: E731
        input_ids = torch.tensor(pad(rows, m.pad))  # (B, S)
        return {
            "input_ids": input_ids,
            "attention_mask": torch.tensor(pad([[1] * len(r) for r in rows], 0)),
            "mm_token_type_ids": (input_ids == m.image).long(),  # 1 = image token, as from the processor
            "pixel_values": vision["pixel_values"],  # (patches, 3 * 2 * patch * patch)
            "image_grid_thw": vision["image_grid_thw"],  # (images, 3)
            "labels": torch.tensor(pad(labels, -100)),
        }


def _forward(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    return model(**inputs, use_cache=False).logits  # (B, S, vocab)


def train_qwen2vl(model: torch.nn.Module, cfg: Any, images, labels, batcher: Qwen2VLBatcher) -> list[dict]:
    """The recipe's `train_loop`, step for step (AdamW, warmup + cosine, grad clip, the same question stream)."""

    def loss_of(samples: list) -> torch.Tensor:
        batch = batcher(samples)
        return next_token_loss(_forward(model, batch), batch["labels"])

    return train_loop(model, cfg, images, labels, batcher.tok, loss_of)


def _chunks(items: list, size: int = 64) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


@torch.no_grad()
def evaluate_qwen2vl(model: torch.nn.Module, questions: list, batcher: Qwen2VLBatcher) -> dict[str, float]:
    """Exact match of the greedy first answer token (argmax at the last prompt position), per type and overall."""
    model.eval()
    hits: dict[str, list[bool]] = {k: [] for k in QUESTION_TYPES}
    for chunk in _chunks(questions):
        batch = batcher([q.sample for q in chunk])
        first = (batch["labels"] != -100).int().argmax(1)  # (B,) position of the first answer token
        logits = _forward(model, batch)
        guess = logits[torch.arange(len(chunk)), first - 1].argmax(-1)
        for q, t in zip(chunk, guess.tolist()):
            hits[q.kind].append(t == q.answer)
    acc = {k: sum(v) / len(v) for k, v in hits.items() if v}
    acc["all"] = sum(sum(v) for v in hits.values()) / sum(len(v) for v in hits.values())
    return acc


@torch.no_grad()
def routing_by_modality(model: torch.nn.Module, questions: list, batcher: Qwen2VLBatcher) -> dict:
    """Per decoder layer ||W_skip x~|| / ||attn_out|| over text and over image tokens (the language part only:
    the decoder's inputs are captured from one full forward, then fed to the decoder alone)."""
    model.eval()
    decoder = model.model.language_model
    feeds = []
    for chunk in _chunks(questions):
        batch = batcher([q.sample for q in chunk])
        captured: dict[str, Any] = {}
        hook = decoder.register_forward_pre_hook(lambda mod, args, kw, c=captured: c.update(kw), with_kwargs=True)
        try:
            _forward(model, batch)
        finally:
            hook.remove()
        keep = {k: captured[k] for k in ("inputs_embeds", "attention_mask", "position_ids")}
        feeds.append((keep, batch["mm_token_type_ids"].bool(), batch["attention_mask"].bool()))
    out = {}
    for name in ("text", "image"):
        feed = [{**kw, "use_cache": False, "mask": (img if name == "image" else ~img) & att} for kw, img, att in feeds]
        ratios = routing_ratios(decoder, feed, token_mask_key="mask")  # keyed by the global block index
        out[name] = {i: v for i, (_, v) in enumerate(sorted(ratios.items()))}  # decoder layer 0, 1, ...
    return out


def skip_norms_by_part(model: torch.nn.Module) -> dict[str, dict[int, float]]:
    """{part: {layer within the part: ||W_skip||_F}} (block indices run over both towers)."""
    norms, out = skip_norms(model), {}
    for w in mmpreproj.injected_modules(model):
        layers = out.setdefault(w.part, {})
        layers[len(layers)] = norms[w.block_index]
    return out


def run_qwen2vl_arm(arm: str, cfg: Any, tok: WordTokenizer, train_x, train_y, test: list) -> dict:
    """Build, train and score one Qwen2-VL arm; the dict has the keys of the recipe's own arms' results."""
    adapter = QWEN2VL_ARMS[arm]
    batcher = Qwen2VLBatcher(tok, image_processor(cfg))
    model = build_qwen2vl(cfg, tok, adapter)
    t0, cpu0 = time.time(), time.process_time()
    log = train_qwen2vl(model, cfg, train_x, train_y, batcher)
    r = {"positions": "qwen2-vl mrope", "layout": "chunked", "adapter": adapter, "loss": log,
         "train_s": time.time() - t0, "train_cpu_s": time.process_time() - cpu0,
         "params": sum(p.numel() for p in model.parameters()),
         "accuracy": evaluate_qwen2vl(model, test, batcher)}  # fmt: skip
    if adapter:
        r["routing"] = routing_by_modality(model, test[: min(len(test), 192)], batcher)
        r["skip_norms"] = skip_norms_by_part(model)
    return r
