"""The content skip joins after the attention module's own projection where the norm sits inside that module
(`PartSpec.skip_to`, `layer.SkipJoin`): the pre-LN BERTs compute the paper's `x + W_o attn_out + W_skip x~`.

Before, the skip joined the inner attention's output and `attention.output.dense` projected it
(`x + W_o (attn_out + W_skip x~)`); `bench/one_call_reference_audit.py` measured these three families, and only
these, off the paper's formula. The reference here is written from the formula with hooks on a copy of the base.
"""

from __future__ import annotations

import copy
import json
import warnings

import peft
import pytest
import torch

import mmpreproj
from mmpreproj.hosts.example_input import example_input
from mmpreproj.hosts.spec import HostError, PartSpec
from mmpreproj.method import trace_seams
from tests.helpers.trace_zoo import build

PRE_LN_BERTS = [
    ("XLMRobertaXL", "XLMRobertaXLModel"),
    ("MegatronBert", "MegatronBertModel"),
    ("RobertaPreLayerNorm", "RobertaPreLayerNormModel"),
]
ids = [name for name, _ in PRE_LN_BERTS]


def _perturb(model: torch.nn.Module) -> None:
    """Move every adapter weight off its init (a zero-ish skip would hide where it joins)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for wrapper in mmpreproj.injected_modules(model):
            for module in wrapper.slots():
                for p in module.parameters():
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def _paper_reference(base: torch.nn.Module, injected: torch.nn.Module) -> torch.nn.Module:
    """A copy of `base` computing the paper's block with `injected`'s modules, by hooks: `attention.self` reads
    x~ = PreProj(x^), and `attention`'s output (W_o attn_out + x) gains W_skip x~."""
    ref = copy.deepcopy(base)
    for layer, wrapper in zip(ref.encoder.layer, mmpreproj.injected_modules(injected), strict=True):
        pre, skip = wrapper.slots()
        kept: dict[str, torch.Tensor] = {}

        def feed(module, args, kwargs, pre=pre, kept=kept):
            if args:
                kept["x"] = x = pre(args[0])
                return (x, *args[1:]), kwargs
            kept["x"] = kwargs["hidden_states"] = pre(kwargs["hidden_states"])
            return args, kwargs

        def join(module, args, out, skip=skip, kept=kept):
            return (out[0] + skip(kept.pop("x")), *out[1:])

        layer.attention.self.register_forward_pre_hook(feed, with_kwargs=True)
        layer.attention.register_forward_hook(join)
    return ref


def _hidden(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).last_hidden_state


@pytest.mark.parametrize("name", PRE_LN_BERTS, ids=ids)
@pytest.mark.parametrize("route", ["inject", "peft"])
def test_a_pre_ln_bert_block_computes_the_papers_formula(name, route):
    base = build(*name)
    inputs = example_input(base)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning left: the placement is the paper's now
        description = trace_seams(base, **inputs)
    assert [p.get("skip_to") for p in description["parts"]] == ["attention"]
    model = copy.deepcopy(base)
    if route == "inject":
        mmpreproj.inject(model, mmpreproj.PreProjConfig())
    else:
        model = peft.get_peft_model(model, mmpreproj.PreProjConfig())
    _perturb(model)
    want, got = _hidden(_paper_reference(base, model), inputs), _hidden(model, inputs)
    assert (got - _hidden(base, inputs)).abs().max() > 1e-2  # the adapter moves the outputs
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", [("T5", "T5EncoderModel"), ("JetMoe", "JetMoeForCausalLM")], ids=["T5", "JetMoe"])
def test_a_norm_inside_a_module_without_weights_of_its_own_keeps_the_skip_at_the_attention(name):
    model = build(*name, **({"kv_channels": 8} if name[0] == "JetMoe" else {}))
    description = trace_seams(model, **example_input(model))
    assert all("skip_to" not in p for p in description["parts"]), description["parts"]


def test_the_join_leaves_with_the_adapter_and_a_copy_joins_on_its_own(tmp_path):
    base = build(*PRE_LN_BERTS[0])
    inputs = example_input(base)
    model = copy.deepcopy(base)
    mmpreproj.inject(model, mmpreproj.PreProjConfig())
    _perturb(model)
    trained = _hidden(model, inputs)
    with mmpreproj.adapter_disabled(model):
        assert torch.equal(_hidden(model, inputs), _hidden(base, inputs))
    twin = copy.deepcopy(model)
    assert torch.equal(_hidden(twin, inputs), trained)
    mmpreproj.unload(twin)  # the copy's joins go; the original's stay
    assert torch.equal(_hidden(twin, inputs), _hidden(base, inputs))
    assert torch.equal(_hidden(model, inputs), trained)

    mmpreproj.save_adapter(model, tmp_path / "a")
    fresh = copy.deepcopy(base)
    mmpreproj.load_adapter(fresh, tmp_path / "a")
    assert torch.equal(_hidden(fresh, inputs), trained)
    mmpreproj.unload(model)
    assert torch.equal(_hidden(model, inputs), _hidden(base, inputs))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), base.state_dict().values()))


def test_an_adapter_saved_before_the_join_loads_as_it_was_trained(tmp_path):
    """A file whose description has no `skip_to` (written before it existed) keeps the skip where it trained."""
    base = build(*PRE_LN_BERTS[0])
    inputs = example_input(base)
    model = copy.deepcopy(base)
    mmpreproj.inject(model, mmpreproj.PreProjConfig())
    _perturb(model)
    mmpreproj.save_adapter(model, tmp_path / "a")
    cfg_file = tmp_path / "a" / "adapter_config.json"
    cfg = json.loads(cfg_file.read_text())
    (part,) = cfg["injection"]["host_description"]["parts"]
    assert part.pop("skip_to") == "attention"
    cfg_file.write_text(json.dumps(cfg))
    old = copy.deepcopy(base)
    mmpreproj.load_adapter(old, tmp_path / "a")
    assert all(w.skip_join is None for w in mmpreproj.injected_modules(old))
    before_dense = copy.deepcopy(base)  # the placement of that time: the skip joins attention.self's output
    for layer, wrapper in zip(before_dense.encoder.layer, mmpreproj.injected_modules(old), strict=True):
        pre, skip = wrapper.slots()
        kept: dict[str, torch.Tensor] = {}
        layer.attention.self.register_forward_pre_hook(
            lambda m, a, pre=pre, kept=kept: (kept.setdefault("x", pre(a[0])), *a[1:])
        )
        layer.attention.self.register_forward_hook(
            lambda m, a, out, skip=skip, kept=kept: (out[0] + skip(kept.pop("x")), *out[1:])
        )
    torch.testing.assert_close(_hidden(old, inputs), _hidden(before_dense, inputs), atol=1e-6, rtol=0)
    assert not torch.allclose(_hidden(old, inputs), _hidden(model, inputs), atol=1e-4)


@pytest.mark.parametrize(
    ("skip_to", "match"),
    [("mlp", r"skip_to='mlp' must be a module around the attention 'attention.self'"), (5, r"skip_to must be")],
)
def test_a_skip_to_that_is_not_around_the_attention_is_refused(skip_to, match):
    d = {"name": "language", "blocks": "layers", "attention": "attention.self", "norm": "attention.ln"}
    assert PartSpec.from_dict({**d, "skip_to": "attention"}).to_dict()["skip_to"] == "attention"
    assert "skip_to" not in PartSpec.from_dict(d).to_dict()  # the description of every other host as it was
    with pytest.raises(HostError, match=match):
        PartSpec.from_dict({**d, "skip_to": skip_to})
