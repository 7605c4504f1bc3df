"""Encoders, encoder-decoders, video and audio the one call reaches, against the real transformers classes
built tiny from configs in code, through the shared contract: T5 and Whisper (self-attention; cross-attention
untouched), ModernBERT, VideoMAE and ViViT (recognised by structure: the ViT row under their base model),
TimeSformer (two seams per layer), Swin (window attention, checked by hand), PixtralVisionModel, Qwen2-Audio
(audio tower + Qwen2, with generation); Swin V2 refused (post-norm).
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import transformers as tf

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.hosts import find_host
from tests.helpers.checkpointing import check_checkpointing
from tests.helpers.host_contract import IDENTITY, HostCase, HostContract, build_once
from tests.helpers.zoo import VOCAB, logits, tokens


def _t5(width=64, depth=2, seed=0):
    torch.manual_seed(seed)
    return tf.T5ForConditionalGeneration(
        tf.T5Config(
            vocab_size=VOCAB,
            d_model=width,
            d_kv=16,
            d_ff=2 * width,
            num_layers=depth,
            num_heads=4,
            decoder_start_token_id=0,
        )
    ).eval()


def t5_inputs():
    g = torch.Generator().manual_seed(2)
    return torch.randint(1, VOCAB, (2, 6), generator=g), torch.randint(1, VOCAB, (2, 4), generator=g)


def t5_forward(model, inputs):
    return model(input_ids=inputs[0], decoder_input_ids=inputs[1]).logits


def _modernbert(width=64, depth=2, seed=0):
    torch.manual_seed(seed)
    cfg = tf.ModernBertConfig(
        vocab_size=VOCAB,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=depth,
        num_attention_heads=4,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
    )
    return tf.ModernBertForMaskedLM(cfg).eval()


def _video(family, width=64, depth=2, seed=0, **extra):
    torch.manual_seed(seed)
    cfg = getattr(tf, f"{family}Config")(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=depth,
        num_attention_heads=4,
        image_size=16,
        num_labels=3,
        **extra,
    )
    return getattr(tf, f"{family}ForVideoClassification")(cfg).eval()


def _swin(width=64, depth=2, seed=0, window=3):
    # one stage (one width), 8x8 tokens; window 3 pads them to 9x9, the second layer's shift rolls them
    torch.manual_seed(seed)
    cfg = tf.SwinConfig(
        image_size=16, patch_size=2, embed_dim=width, depths=[depth], num_heads=[4], window_size=window, num_labels=3
    )
    return tf.SwinForImageClassification(cfg).eval()


def _whisper(width=64, depth=2, seed=0):
    torch.manual_seed(seed)
    cfg = tf.WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=16,
        encoder_layers=depth,
        decoder_layers=depth,
        d_model=width,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=2 * width,
        decoder_ffn_dim=2 * width,
        max_source_positions=16,
        max_target_positions=32,
        pad_token_id=0,
        decoder_start_token_id=1,
        bos_token_id=1,
        eos_token_id=2,
    )
    return tf.WhisperForConditionalGeneration(cfg).eval()


def whisper_inputs():
    g = torch.Generator().manual_seed(6)
    return torch.randn(2, 16, 32, generator=g), torch.randint(3, VOCAB, (2, 5), generator=g)  # 16 mels x 32 frames


def whisper_forward(model, inputs):
    return model(input_features=inputs[0], decoder_input_ids=inputs[1]).logits


AUDIO = VOCAB + 2


def _qwen2_audio(width=64, depth=2, seed=0):
    torch.manual_seed(seed)
    cfg = tf.Qwen2AudioConfig(
        audio_config=dict(
            model_type="qwen2_audio_encoder",
            num_mel_bins=16,
            encoder_layers=depth,
            d_model=width,
            encoder_attention_heads=4,
            encoder_ffn_dim=2 * width,
            max_source_positions=16,
        ),
        text_config=dict(
            model_type="qwen2",
            vocab_size=VOCAB + 3,
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=depth,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            pad_token_id=0,
        ),
        audio_token_index=AUDIO,
    )
    return tf.Qwen2AudioForConditionalGeneration(cfg).eval()


def audio_inputs():
    g = torch.Generator().manual_seed(7)
    ids = torch.cat([torch.full((2, 8), AUDIO), torch.randint(3, VOCAB, (2, 5), generator=g)], 1)  # 32 frames -> 8
    return ids, torch.randn(2, 16, 32, generator=g)


def audio_forward(model, inputs):
    mask = torch.ones(inputs[1].shape[0], inputs[1].shape[-1], dtype=torch.long)
    return model(input_ids=inputs[0], input_features=inputs[1], feature_attention_mask=mask).logits


def _pixtral(width=64, depth=2, seed=0):
    torch.manual_seed(seed)
    return tf.PixtralVisionModel(
        tf.PixtralVisionConfig(
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=depth,
            num_attention_heads=4,
            image_size=16,
            patch_size=4,
            head_dim=16,
        )
    ).eval()


def pixtral_forward(model, inputs):
    return model(pixel_values=inputs[0], image_sizes=torch.tensor([[16, 16]] * inputs[0].shape[0])).last_hidden_state


def image():
    return (torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(5)),)


def video(frames):
    return lambda: (torch.randn(2, frames, 3, 16, 16, generator=torch.Generator().manual_seed(4)),)


def video_logits(model, inputs):
    return model(pixel_values=inputs[0]).logits


CASES = [
    HostCase("t5", "t5", build_once(_t5), t5_inputs, t5_forward),
    HostCase("modernbert", "modernbert", build_once(_modernbert), tokens, logits),
    HostCase(
        "videomae",
        "vit",
        build_once(partial(_video, "VideoMAE", patch_size=4, num_frames=4, tubelet_size=2)),
        video(4),
        video_logits,
    ),
    HostCase(
        "vivit",
        "vit",
        build_once(partial(_video, "Vivit", tubelet_size=[2, 4, 4], num_frames=4)),
        video(4),
        video_logits,
    ),
    HostCase("swin", "swin", build_once(_swin), image, video_logits),
    HostCase("pixtral", "pixtral", build_once(_pixtral), image, pixtral_forward),
    HostCase("whisper", "whisper", build_once(_whisper), whisper_inputs, whisper_forward),
    HostCase("qwen2_audio", "qwen2_audio", build_once(_qwen2_audio), audio_inputs, audio_forward),
    HostCase(
        "timesformer",
        "timesformer",
        build_once(partial(_video, "Timesformer", patch_size=4, num_frames=2)),
        video(2),
        video_logits,
    ),
]
VISION = {"videomae", "vivit", "timesformer", "swin", "pixtral"}  # rows naming no embeddings, as ViT's


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request):
    return request.param


class TestContract(HostContract):
    def test_gradient_checkpointing(self, case):
        # the vision rows name no embeddings (as ViT's): transformers' non-reentrant checkpointing, as there
        check_checkpointing(case, reentrant=case.id not in VISION)


def test_video_heads_resolve_the_vit_row_under_their_base_model():
    for name in ("videomae", "vivit"):
        model = CASES[[c.id for c in CASES].index(name)].build()
        (part,) = find_host(model).describe(model)["parts"]
        assert find_host(model).name == "vit" and part["blocks"].startswith(f"{name}.")


def test_timesformer_has_both_seams_as_parts():
    case = CASES[[c.id for c in CASES].index("timesformer")]
    model = mmpreproj.inject(case.build(), IDENTITY)
    got = {(w.part, w.block_index) for w in mmpreproj.injected_modules(model)}
    assert got == {("spatial", 0), ("spatial", 1), ("temporal", 2), ("temporal", 3)}
    layer = model.timesformer.encoder.layer[0]
    assert layer.attention.part == "spatial" and layer.temporal_attention.part == "temporal"


def test_swin_attention_receives_the_windows_of_the_pre_projected_tokens():
    from transformers.models.swin.modeling_swin import window_partition

    case = CASES[[c.id for c in CASES].index("swin")]
    model = mmpreproj.inject(case.build().double(), PreProjConfig(skip_init_std=0.05))
    seen: dict = {}
    for i, layer in enumerate(model.swin.encoder.layers[0].blocks):
        layer.layernorm_before.register_forward_hook(lambda m, a, out, i=i: seen.setdefault(("norm", i), out))
        layer.attention.base_layer.register_forward_pre_hook(lambda m, a, i=i: seen.setdefault(("attn", i), a[0]))
    model(pixel_values=image()[0].double())
    for i, layer in enumerate(model.swin.encoder.layers[0].blocks):
        x_hat = seen[("norm", i)].view(2, 8, 8, 64)
        x_tilde, _ = layer.maybe_pad(layer.attention.slots()[0](x_hat), 8, 8)  # (2, 9, 9, 64): zero pad tokens
        want = window_partition(layer.cyclic_shift(x_tilde), 3).view(-1, 9, 64)
        torch.testing.assert_close(seen[("attn", i)], want, atol=1e-12, rtol=0)
        assert not torch.allclose(
            want, window_partition(layer.cyclic_shift(layer.maybe_pad(x_hat, 8, 8)[0]), 3).view(-1, 9, 64)
        )  # x~ is not x^: the check above can fail
    assert layer.shift_size > 0  # the second layer's windows are shifted


def test_qwen2_audio_injects_both_towers_and_generates_as_the_base_at_identity():
    case = CASES[[c.id for c in CASES].index("qwen2_audio")]
    base, model = case.build(), mmpreproj.inject(case.build(), IDENTITY)
    assert {w.part for w in mmpreproj.injected_modules(model)} == {"audio", "language"}
    ids, feats = audio_inputs()
    ids = torch.cat([torch.zeros(2, 2, dtype=ids.dtype), ids], 1)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding
    ids[1, :2] = torch.tensor([5, 6])
    kw = dict(
        input_features=feats,
        feature_attention_mask=torch.ones(2, 32, dtype=torch.long),
        attention_mask=mask,
        max_new_tokens=5,
        do_sample=False,
        pad_token_id=0,
        use_cache=True,
    )
    out = model.generate(ids, **kw)
    assert out.shape[1] == ids.shape[1] + 5
    assert torch.equal(out, base.generate(ids, **kw))


def test_whisper_cross_attention_is_left_alone():
    case = CASES[[c.id for c in CASES].index("whisper")]
    model = mmpreproj.inject(case.build(), IDENTITY)
    layer = model.model.decoder.layers[0]
    assert isinstance(layer.self_attn, mmpreproj.PreProjAttention)
    assert not isinstance(layer.encoder_attn, mmpreproj.PreProjAttention)
    assert {w.part for w in mmpreproj.injected_modules(model)} == {"encoder", "decoder"}


def test_swinv2_is_refused_with_the_reason():
    model = tf.Swinv2Model(
        tf.Swinv2Config(image_size=16, patch_size=2, embed_dim=64, depths=[2], num_heads=[4], window_size=4)
    )
    with pytest.raises(ValueError, match="Swin V2 is post-norm"):
        mmpreproj.inject(model)
