"""A model mmpreproj changed pickles whole (`torch.save(model)`, what Ray, multiprocessing and some launchers do): what
it installs (`add_rope`'s `forward_features` instance attribute, `inject`'s input-embedding forward hook) are
partials of module functions, which pickle; bound methods of module functions do not (pickle writes them as a
`getattr` of a name the model lacks). `inject` installs no `save_pretrained` on the instance (issue 45): on either
route the copy is saved whole by the function."""

from __future__ import annotations

import io

import pytest
import torch
from peft import get_peft_model
from timm.models.vision_transformer import VisionTransformer

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.timm_rope import add_rope
from tests.helpers.zoo import BUILDERS, tokens


def _round_trip(model: torch.nn.Module) -> torch.nn.Module:
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def _perturb(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for w in mmpreproj.injected_modules(model):
            for skip in w.preproj_skip.values():
                skip.proj.weight.normal_(std=0.2, generator=torch.Generator().manual_seed(w.block_index))


@pytest.mark.parametrize("through", ["inject", "peft"])
@torch.no_grad()
def test_an_injected_transformers_model_pickles_whole_and_its_copy_saves_whole(through, tmp_path):
    base = BUILDERS["llama"]()
    model = mmpreproj.inject(base) if through == "inject" else get_peft_model(base, PreProjConfig())
    _perturb(model)
    (ids,) = tokens(batch=2, length=5)
    want = model.eval()(ids).logits
    copy = _round_trip(model)
    assert torch.equal(copy(ids).logits, want)
    inner = copy if through == "inject" else copy.get_base_model()
    assert "save_pretrained" not in vars(inner)  # neither route installs one (a PeftModel saves itself)
    mmpreproj.save_pretrained(inner, tmp_path / "copy")  # the copy's own wrappers and weights, not the original's
    reloaded = mmpreproj.from_pretrained(tmp_path / "copy")
    assert torch.equal(reloaded.eval()(ids).logits, want)
    mmpreproj.unload(inner)
    assert "save_pretrained" not in vars(inner) and not mmpreproj.is_injected(inner)


@torch.no_grad()
def test_a_timm_vit_with_add_rope_pickles_whole():
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5).eval()
    model = add_rope(mmpreproj.inject(vit))
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    copy = _round_trip(model)
    assert torch.equal(copy.forward_features(x), model.forward_features(x))
    assert copy.forward_features.args[0] is copy  # the copy's own forward, not the original's
