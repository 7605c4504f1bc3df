"""Greedy generation with a KV cache over left-padded mixed prompts (images of different sizes and counts, video)."""

from __future__ import annotations

import pytest
import torch

from recipes.mixed.tinyvlm import MixedSample, generate
from tests.helpers.mixed_models import mixed_samples, tiny_mixed

LAYOUTS = ["chunked", "interleaved"]  # the decoder's M-RoPE frequency layout


def _with_answer(samples: list[MixedSample], tokens: torch.Tensor) -> list[MixedSample]:
    return [MixedSample(s.input_ids, s.images, s.videos, target_ids=t.tolist()) for s, t in zip(samples, tokens)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_incremental_decoding_equals_full_forward(layout):
    model = tiny_mixed(layout=layout)
    samples = mixed_samples()
    with torch.no_grad():
        out = generate(model, model.prepare(samples), max_new_tokens=4)
        # the prompt + generated tokens in one forward: the builder counts the new text on from the prompt's
        # last position, so token k sits at prompt length + k + delta, as generate placed it
        full_batch = model.prepare(_with_answer(samples, out.tokens))
        full, _ = model(**full_batch.decoder_inputs())
    assert out.tokens.shape == (3, 4)
    torch.testing.assert_close(out.logits, full[:, -5:-1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_left_padding_does_not_change_a_sample(layout):
    model = tiny_mixed(layout=layout)
    samples = mixed_samples()
    with torch.no_grad():
        batched = generate(model, model.prepare(samples), max_new_tokens=3)
        for i, s in enumerate(samples):
            alone = generate(model, model.prepare([s]), max_new_tokens=3)
            torch.testing.assert_close(alone.logits[0], batched.logits[i], atol=1e-5, rtol=0)


def test_back_to_back_generate_calls_are_identical():
    model = tiny_mixed(layout="interleaved")
    a, b = mixed_samples(0), mixed_samples(1)[:2]
    with torch.no_grad():
        batch_a = model.prepare(a)
        first = generate(model, batch_a, max_new_tokens=5)
        generate(model, model.prepare(b), max_new_tokens=2)  # a different prompt (other deltas) in between
        again = generate(model, batch_a, max_new_tokens=5)
    assert torch.equal(first.tokens, again.tokens) and torch.equal(first.logits, again.logits)
    assert torch.equal(batch_a.next_position, model.prepare(a).next_position)  # the batch was not mutated


def test_generated_tokens_continue_after_the_delta():
    model = tiny_mixed()
    with torch.no_grad():
        batch = model.prepare(mixed_samples()[:1])
    # 2 text, start, 2x3 image, end, 1 text, start, 1x1 image, end, 1 text: 15 tokens whose positions end at 11
    assert batch.position_ids[0, -1].tolist() == [11, 11, 11]
    assert batch.next_position.tolist() == [12]
    seen = []
    model.decoder.rope.register_forward_pre_hook(lambda m, args: seen.append(args[2].clone()))
    with torch.no_grad():
        generate(model, batch, max_new_tokens=3)
    steps = [p for p in seen if p.shape[1] == 1][:: len(model.decoder.blocks)]  # one per step, not per block
    assert [p[0, 0].tolist() for p in steps] == [[12, 12, 12], [13, 13, 13]]


def test_eos_stops_and_pads_with_eos():
    model = tiny_mixed()
    with torch.no_grad():
        batch = model.prepare(mixed_samples())
        first = generate(model, batch, max_new_tokens=1).tokens[:, 0]
        out = generate(model, batch, max_new_tokens=3, eos_token_id=int(first[0]))
    assert (out.tokens[0] == first[0]).all()
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, batch, max_new_tokens=0)
