"""A training checkpoint written by mmpreproj 0.4 (injected weights named before adapters were keyed by name:
`...attention.preproj.up.weight`, `...attention.skip.proj.weight`) resumes on today's layout, bit-exact; found
when the SmolLM2 study's in-flight run, checkpointed by 0.4, would not resume under 0.5."""

from __future__ import annotations

import pytest
import torch

import mmpreproj
from mmpreproj.train.checkpoint import load_trainable_state, trainable_state
from tests.helpers.zoo import tiny_neox


def _old_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Today's trainable state keyed as 0.4 wrote it."""
    return {
        k.replace(".preproj.default.", ".preproj.").replace(".preproj_skip.default.", ".skip."): v
        for k, v in state.items()
    }


def _trained() -> dict[str, torch.Tensor]:
    model = mmpreproj.inject(tiny_neox(seed=1))
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.normal_()
    return trainable_state(model)


def test_old_layout_state_resumes_bit_exact():
    saved = _trained()
    old = _old_layout(saved)
    assert set(old) != set(saved) and any(".skip.proj." in k for k in old)  # the fixture is the old layout
    model = mmpreproj.inject(tiny_neox(seed=1))
    load_trainable_state(model, old)
    now = trainable_state(model)
    assert set(now) == set(saved)
    for k, v in saved.items():
        assert torch.equal(now[k], v), k


def test_old_layout_of_another_size_still_refused():
    old = _old_layout(_trained())
    model = mmpreproj.inject(tiny_neox(seed=1), mmpreproj.PreProjConfig(skip=False))
    with pytest.raises(ValueError, match=r"missing \[\], unexpected .*preproj_skip.default.proj.weight"):
        load_trainable_state(model, old)
