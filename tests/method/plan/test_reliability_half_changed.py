"""Nothing half-changed, nothing silently wrong (issue 18, section 2): each case is refused with its reason and
the model left exactly as it was, or handled correctly. Every test here failed on the code before the fix."""

from __future__ import annotations

import pytest
import torch

import mmpreproj
from mmpreproj import PreProjConfig
from tests.helpers.adapter_json import dump_desc, load_desc
from tests.helpers.snapshots import assert_same_snapshot, snapshot
from tests.helpers.zoo import tiny_neox

TOKENS = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
NEOX_PART = {
    "name": "language",
    "blocks": "gpt_neox.layers",
    "attention": "attention",
    "norm": "input_layernorm",
    "call": {"inputs": [[0, "hidden_states"]], "output_index": 0},
}


def _no_hooks_left(model) -> bool:
    return not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


# --- 1. two parts of a description over the same blocks --------------------------------------------------


@pytest.mark.parametrize(
    "second",
    [
        {"blocks": "gpt_neox.layers"},  # the very same blocks
        {"blocks": "*:GPTNeoXLayer"},  # the same blocks found another way
    ],
    ids=["same_path", "same_blocks_by_class"],
)
def test_parts_over_the_same_blocks_are_refused_before_anything_changes(second):
    model = tiny_neox()
    host = {"name": "twice", "parts": [NEOX_PART, {**NEOX_PART, "name": "again", **second}]}
    snap = snapshot(model)
    with pytest.raises(
        ValueError,
        match=r"part 'language' block 0 and part 'again' block 0 resolve to the same "
        r"attention module 'gpt_neox.layers.0.attention'",
    ):
        mmpreproj.inject(model, PreProjConfig(), host=host)
    assert_same_snapshot(snapshot(model), snap)
    assert _no_hooks_left(model)


def test_parts_sharing_one_attention_module_are_refused():
    model = tiny_neox()
    model.gpt_neox.layers[1].attention = model.gpt_neox.layers[0].attention  # two blocks, one attention
    host = {"name": "shared", "parts": [{**NEOX_PART, "blocks": "gpt_neox.layers"}]}
    snap = snapshot(model)
    with pytest.raises(
        ValueError,
        match=r"block 0 and part 'language' block 1 resolve to the same attention module "
        r"'gpt_neox.layers.0.attention'",
    ):
        mmpreproj.inject(model, PreProjConfig(), host=host)
    assert_same_snapshot(snapshot(model), snap)


# --- 5. inject after peft; 6. inject after torch.compile ---------------------------------------------------


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_inject_into_a_peft_model_is_refused_and_into_its_model_keeps_lora_training():
    """A `PeftModel` itself is refused, naming the model it wraps; that model (LoRA's layers inside the attention,
    the order of `preproj_lora`) takes the injection, whose base freeze leaves LoRA's weights training."""
    peft = pytest.importorskip("peft")
    pm = peft.get_peft_model(tiny_neox(), peft.LoraConfig(r=4, target_modules=["query_key_value"]))
    snap = snapshot(pm)
    with pytest.raises(
        RuntimeError, match=r"the model is a peft PeftModel; inject the model it wraps, mmpreproj.inject"
    ):
        mmpreproj.inject(pm)
    assert_same_snapshot(snapshot(pm), snap)
    mmpreproj.inject(pm.base_model.model)
    lora = {n for n, _ in pm.named_parameters() if "lora_" in n}
    ours = {n for n, _ in pm.named_parameters() if ".preproj" in n}
    assert lora and ours and {n for n, p in pm.named_parameters() if p.requires_grad} == lora | ours


def test_inject_into_a_compiled_model_is_refused_with_the_order_that_works():
    model = tiny_neox()
    compiled = torch.compile(model, backend="eager")
    snap = snapshot(model)
    with pytest.raises(
        RuntimeError,
        match=r"torch.compile wrapper \(OptimizedModule\); inject the model before "
        r"compiling it: mmpreproj.inject\(model\), then model = torch.compile",
    ):
        mmpreproj.inject(compiled)
    assert_same_snapshot(snapshot(model), snap)
    model.gpt_neox.layers[0] = torch.compile(model.gpt_neox.layers[0], backend="eager")
    with pytest.raises(RuntimeError, match=r"its submodule 'gpt_neox.layers.0' is a torch.compile wrapper"):
        mmpreproj.inject(model)


# --- 3. the output side of the seam: the skip goes onto a tensor of the attention input's shape ----------


@pytest.mark.parametrize(
    ("output_index", "said"),
    [
        (1, r"item 1 has shape \(1, 4, 32, 32\)"),  # eager attention weights (B, H, N, N): broadcast silently before
        (None, r"not one tensor"),
        (5, r"item 5 is missing"),
    ],
)
def test_a_wrong_output_index_is_refused_naming_the_index_that_fits(output_index, said):
    from mmpreproj.method.layer import SeamError

    model = tiny_neox(attn_implementation="eager")
    call = {"inputs": [[0, "hidden_states"]], "output_index": output_index}
    mmpreproj.inject(
        model,
        PreProjConfig(preproj=False, skip_init_std=0.5),
        host={"name": "neox", "parts": [{**NEOX_PART, "call": call}]},
    )
    tokens = torch.randint(0, 128, (1, 32))  # N == d == 32: weights (1, 4, 32, 32) + skip (1, 32, 32) broadcast
    with pytest.raises(
        SeamError,
        match=rf"part 'language', block 0\): with call.output_index={output_index} the "
        rf"attention returns a tuple of 2 items.{{0,2}}{said}, but the skip must be added to a tensor of the "
        r"attention "
        r"input's shape \(1, 32, 32\); output_index 0 would fit",
    ):
        model(tokens)


# --- 4. unload puts back only the requires_grad flags inject changed ------------------------------------


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_unload_of_preproj_lora_keeps_the_base_frozen_for_peft():
    pytest.importorskip("peft")
    from mmpreproj.train.methods import apply_method

    pm = apply_method(tiny_neox(), "preproj_lora")
    mmpreproj.unload(pm)
    assert not mmpreproj.is_injected(pm)
    trainable = {n for n, p in pm.named_parameters() if p.requires_grad}
    assert trainable and trainable == {n for n, _ in pm.named_parameters() if "lora_" in n}  # not the whole base
    plain = mmpreproj.unload(mmpreproj.inject(pm.unload()))  # ours gone first: the stacked unload is peft's
    assert all(not p.requires_grad for p in plain.parameters())  # peft's freeze is what it had before inject


def test_unload_freezes_again_the_modules_to_save_inject_made_trainable():
    model = tiny_neox()
    head = model.get_output_embeddings()
    head.requires_grad_(False)
    model.gpt_neox.final_layer_norm.requires_grad_(False)  # frozen before, frozen after
    before = {n: p.requires_grad for n, p in model.named_parameters()}
    mmpreproj.inject(model, PreProjConfig(modules_to_save=["lm_head"]))
    assert head.weight.requires_grad
    mmpreproj.unload(model)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == before


# --- 7. trace_seams: neither the caller's RNG nor a train-mode model's dropout matters ------------------


def test_trace_seams_keeps_the_callers_rng_and_traces_a_train_mode_model_with_dropout():
    from mmpreproj.method import trace_seams

    model = tiny_neox(attention_dropout=0.5, hidden_dropout=0.5).train()
    model.gpt_neox.layers[1].eval()  # a mixed model: each flag comes back as it was
    flags = [m.training for m in model.modules()]
    rng = torch.random.get_rng_state()
    description = trace_seams(model, TOKENS)  # dropout on would fail the identity check
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert [m.training for m in model.modules()] == flags
    assert [p["blocks"] for p in description["parts"]] == ["gpt_neox.layers"]
    eval_model = tiny_neox().eval()
    rng = torch.random.get_rng_state()
    trace_seams(eval_model, TOKENS)  # the identity check builds modules: that drew from the caller's RNG
    assert torch.equal(torch.random.get_rng_state(), rng)


# --- 2. save_pretrained's two halves: a save killed between them is refused on load ---------------------


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs."""


def _saved_pair(folder, seed):
    model = mmpreproj.inject(tiny_neox(), PreProjConfig(skip_init_std=0.05))
    with torch.no_grad():
        for p in mmpreproj.adapter_state_dict(model).values():
            p.normal_(0, 0.05, generator=torch.Generator().manual_seed(seed))
    mmpreproj.save_pretrained(model, folder)
    return model


def test_a_save_pretrained_killed_between_base_and_adapter_is_refused_on_load(tmp_path, monkeypatch):
    import transformers as tf

    import mmpreproj.method.pretrained_save as save_pretrained_module
    from mmpreproj.util import file_sets as adapter_files

    _saved_pair(tmp_path, seed=1)
    newer = mmpreproj.inject(tiny_neox(seed=7), PreProjConfig(skip_init_std=0.05))  # another base, another adapter

    def killed_after_the_base(*args, **kwargs):
        raise Killed

    monkeypatch.setattr(save_pretrained_module, "save_adapter", killed_after_the_base)  # its one writer
    with pytest.raises(Killed):
        mmpreproj.save_pretrained(newer, tmp_path)  # the new base is written, the old adapter stays
    monkeypatch.undo()
    assert "mmpreproj_save_token" not in vars(newer.config)  # the model's config is as it was
    with pytest.raises(
        ValueError,
        match=r"the base and the adapter in its adapter/ were written by different "
        r"save_pretrained calls .* Nothing was loaded",
    ):
        mmpreproj.from_pretrained(tmp_path)
    base = tf.GPTNeoXForCausalLM.from_pretrained(tmp_path)  # the base alone still loads the plain way
    snap = snapshot(base)
    with pytest.raises(ValueError, match="written by different save_pretrained calls"):
        mmpreproj.load_adapter(base, tmp_path)
    assert_same_snapshot(snapshot(base), snap)

    # killed inside the adapter's own write: before its commit the old adapter stays (refused), after it the
    # reader finishes the new one (the pair matches again)
    for point, loads in (("written:adapter_model.safetensors", False), ("committed", True)):

        def fault(at, point=point):
            if at == point:
                raise Killed

        monkeypatch.setattr(adapter_files, "_fault_point", fault)
        with pytest.raises(Killed):
            mmpreproj.save_pretrained(newer, tmp_path)
        monkeypatch.undo()
        if loads:
            got = mmpreproj.from_pretrained(tmp_path).eval()
            with torch.no_grad():
                assert torch.equal(got(TOKENS).logits, newer(TOKENS).logits)
        else:
            with pytest.raises(ValueError, match="written by different save_pretrained calls"):
                mmpreproj.from_pretrained(tmp_path)


def test_a_complete_save_pretrained_pair_loads_and_an_untokened_pair_still_loads(tmp_path):
    import json

    model = _saved_pair(tmp_path, seed=2)
    with torch.no_grad():
        want = model(TOKENS).logits
        assert torch.equal(mmpreproj.from_pretrained(tmp_path).eval()(TOKENS).logits, want)
    d = json.loads((tmp_path / "config.json").read_text())
    assert isinstance(d.pop("mmpreproj_save_token"), str)
    (tmp_path / "config.json").write_text(json.dumps(d))  # as a save from before the tokens
    desc = load_desc(tmp_path / "adapter" / "adapter_config.json")
    assert isinstance(desc.pop("base_save_token"), str)
    dump_desc(tmp_path / "adapter" / "adapter_config.json", desc)
    with torch.no_grad():
        assert torch.equal(mmpreproj.from_pretrained(tmp_path).eval()(TOKENS).logits, want)
