"""The VLM: cached DINOv2 tokens -> a trained projector -> SmolLM2's input embeddings, between text tokens.

The projector is LLaVA's (Linear-GELU-Linear, vision width -> the LM's width); its output replaces the
embeddings at the image slots of each sequence. The LM's `rotary_emb` is swapped once by
`mmpreproj.rope.use_multimodal_rope`, so position ids (3, B, N) reach its attention as M-RoPE; text-only input
on equal positions gives the LM's own logits bit for bit. Generation is greedy with the KV cache: generated
token k of a sample sits at `next_position + k` on all three axes (its prompt length + k + delta).

    vlm = VLM(lm, vision_dim=384)          # lm: a LlamaForCausalLM, frozen; use_multimodal_rope(lm) inside
    loss = vlm.loss(batch)                 # mean cross-entropy over the answer tokens
    tokens = vlm.generate(prompts, max_new_tokens=4, eos=end_id)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache

from mmpreproj.rope import MultimodalRotaryEmbedding, use_multimodal_rope

from .tasks import Batch


class Projector(nn.Sequential):
    """LLaVA-1.5's projector: Linear(vision_dim, d) - GELU - Linear(d, d), token by token."""

    def __init__(self, vision_dim: int, dim: int) -> None:
        super().__init__(nn.Linear(vision_dim, dim), nn.GELU(), nn.Linear(dim, dim))


class VLM(nn.Module):
    """`projector` + `lm` (a transformers Llama-family causal LM, its rotary swapped for M-RoPE).

    `lm` stays the plain model object: an adapter injected into it (mmpreproj, or peft's LoRA in place) is
    reached through it, so `decoder` and `lm_head` are always `lm.model` and `lm.lm_head`.
    """

    def __init__(self, lm: nn.Module, vision_dim: int, layout: str = "chunked") -> None:
        super().__init__()
        self.projector = Projector(vision_dim, lm.config.hidden_size).to(next(lm.parameters()).device)
        if not isinstance(lm.model.rotary_emb, MultimodalRotaryEmbedding):
            use_multimodal_rope(lm, layout=layout)
        self.lm = lm

    def embed(self, batch: Batch) -> torch.Tensor:
        """(B, N, d) input embeddings: the LM's token embeddings, projected image tokens at the image slots."""
        emb = self.lm.get_input_embeddings()(batch.ids)  # (B, N, d)
        img = self.projector(batch.image.to(emb.dtype))  # (B, H*W, d), raster order = slot order
        return emb.masked_scatter(batch.image_mask[..., None], img)

    def loss(self, batch: Batch, per_item: bool = False) -> torch.Tensor:
        """Mean cross-entropy over the answer tokens (per item: (B,) means over each item's answer tokens).
        The LM head runs on the answer positions only."""
        hidden = self.lm.model(
            inputs_embeds=self.embed(batch),
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        ).last_hidden_state  # (B, N, d)
        sel = batch.targets != -100  # (B, N)
        logits = self.lm.lm_head(hidden[sel]).float()  # (T, vocab)
        ce = F.cross_entropy(logits, batch.targets[sel], reduction="none")  # (T,)
        if not per_item:
            return ce.mean()
        rows = sel.nonzero()[:, 0]  # (T,) item of each answer token
        return torch.zeros(sel.shape[0], device=ce.device).index_add_(0, rows, ce) / sel.sum(1)

    @torch.no_grad()
    def generate(self, batch: Batch, max_new_tokens: int, eos: int) -> torch.Tensor:
        """Greedy tokens (B, T) with the KV cache, for a prompt batch of one length (no padding); after a sample
        emits `eos` it keeps emitting it."""
        _check_unpadded(batch)
        emb = self.embed(batch)
        cache = DynamicCache(config=self.lm.config)
        out = self.lm(inputs_embeds=emb, position_ids=batch.position_ids, cache=cache, use_cache=True)
        return self._greedy(out.logits[:, -1], batch, max_new_tokens, eos, cache=cache)

    @torch.no_grad()
    def generate_recompute(self, batch: Batch, max_new_tokens: int, eos: int) -> torch.Tensor:
        """The same greedy tokens, each step a full forward over prompt + generated tokens (no cache)."""
        _check_unpadded(batch)
        emb, pos = self.embed(batch), batch.position_ids
        out = self.lm(inputs_embeds=emb, position_ids=pos, use_cache=False)
        return self._greedy(out.logits[:, -1], batch, max_new_tokens, eos, emb=emb)

    def _greedy(self, step, batch, max_new_tokens, eos, *, cache=None, emb=None) -> torch.Tensor:
        tokens = []
        done = torch.zeros(step.shape[0], dtype=torch.bool, device=step.device)
        pos = batch.position_ids
        for k in range(max_new_tokens):
            nxt = torch.where(done, torch.full_like(step[:, 0], eos, dtype=torch.long), step.argmax(-1))  # (B,)
            done |= nxt == eos
            tokens.append(nxt)
            if k == max_new_tokens - 1 or bool(done.all()):
                break
            new_pos = (batch.next_position + k)[None, :, None].expand(3, -1, 1)  # (3, B, 1)
            new_emb = self.lm.get_input_embeddings()(nxt[:, None])  # (B, 1, d)
            if cache is not None:
                out = self.lm(inputs_embeds=new_emb, position_ids=new_pos, cache=cache, use_cache=True)
            else:
                emb, pos = torch.cat([emb, new_emb], 1), torch.cat([pos, new_pos], 2)
                out = self.lm(inputs_embeds=emb, position_ids=pos, use_cache=False)
            step = out.logits[:, -1]
        return torch.stack(tokens, 1)


def _check_unpadded(batch: Batch) -> None:
    if not bool(batch.attention_mask.all()):
        raise ValueError("generate takes prompts of one length (no padding): batch items by prompt length")


def answer_text(tokenizer, tokens: torch.Tensor, eos: int) -> list[str]:
    """The decoded answers of (B, T) greedy tokens, cut at the first `eos`, stripped."""
    out = []
    for row in tokens.tolist():
        row = row[: row.index(eos)] if eos in row else row
        out.append(tokenizer.decode(row).strip())
    return out
