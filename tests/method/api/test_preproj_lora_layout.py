"""`preproj_lora` is one folder in the layout peft users know, written by `save_pretrained` alone: peft's LoRA at
DIR, our adapter at DIR/preproj (`mmpreproj/method/stacked.py`). It reloads bit-exact through the one loader, peft
reads its own part, a Trainer's checkpoints have that layout and resume bit-exact, a given state dict is what is
written, and a corrupt or mismatched DIR/preproj is refused with nothing changed. (Older layouts:
tests/method/model/test_peft_tuner.py's fixtures.)"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import mmpreproj
from mmpreproj.method.stacked import PREPROJ_SUBDIR, PreProjLoraModel
from mmpreproj.train import apply_method
from mmpreproj.train.adapters import gather_run_adapter, save_run_adapter
from tests.helpers.training import trainer_args
from tests.helpers.zoo import tiny_neox

peft = pytest.importorskip("peft")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
IDS = torch.randint(1, 128, (2, 10), generator=torch.Generator().manual_seed(1))
WEIGHTS = "adapter_model.safetensors"


def _trained(seed: int = 3, **sizes) -> peft.PeftModel:
    model = apply_method(tiny_neox(), "preproj_lora", lora_r=4, sizes=sizes or None)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model.eval()


def _params(model: torch.nn.Module) -> dict[str, tuple[torch.Tensor, bool]]:
    return {n: (p.detach().clone(), p.requires_grad) for n, p in model.named_parameters()}


def _assert_unchanged(model: torch.nn.Module, before: dict[str, tuple[torch.Tensor, bool]]) -> None:
    after = _params(model)
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k][0], v) and after[k][1] == flag for k, (v, flag) in before.items())


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def test_save_pretrained_alone_writes_lora_at_the_top_and_ours_below_and_reloads_bit_exact(tmp_path):
    model = _trained()
    assert isinstance(model, PreProjLoraModel)
    model.save_pretrained(str(tmp_path))
    assert json.loads((tmp_path / "adapter_config.json").read_text())["peft_type"] == "LORA"
    assert json.loads((tmp_path / PREPROJ_SUBDIR / "adapter_config.json").read_text())["peft_type"] == "PREPROJ"
    assert {p.name for p in (tmp_path / PREPROJ_SUBDIR).iterdir()} == {"adapter_config.json", WEIGHTS}

    reloaded = mmpreproj.load_adapter(tiny_neox(), tmp_path)
    assert isinstance(reloaded, PreProjLoraModel) and not any(p.requires_grad for p in reloaded.parameters())
    assert torch.equal(_logits(reloaded.eval()), _logits(model))
    trainable = mmpreproj.load_adapter(tiny_neox(), tmp_path, is_trainable=True)
    want = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {n for n, p in trainable.named_parameters() if p.requires_grad} == want

    reloaded.save_pretrained(str(tmp_path / "again"))  # the reloaded model writes the same folder
    for sub in ("", PREPROJ_SUBDIR):
        first, again = load_file(str(tmp_path / sub / WEIGHTS)), load_file(str(tmp_path / "again" / sub / WEIGHTS))
        assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)


def test_the_top_file_is_a_plain_lora_file_that_peft_alone_reads_onto_the_base(tmp_path):
    """LoRA goes in first and ours around the attention that holds it (ARCHITECTURE.md), and the top file is written
    with ours aside: LoRA's keys as on the plain base, none of ours. peft alone reads it onto a plain base and gives
    the trained model's outputs without ours, weight for weight."""
    model = _trained()
    model.save_pretrained(str(tmp_path))
    top = load_file(str(tmp_path / WEIGHTS))
    assert top and all("lora_" in k and ".base_layer." not in k for k in top)
    plain = peft.PeftModel.from_pretrained(tiny_neox(), str(tmp_path)).eval()
    assert type(plain) is peft.PeftModel and plain.peft_config["default"].peft_type == "LORA"
    want = {n.replace(".attention.base_layer.", ".attention."): p for n, p in model.named_parameters() if "lora_" in n}
    got = {n: p for n, p in plain.named_parameters() if "lora_" in n}
    assert want and got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    mmpreproj.unload(model.base_model.model)  # ours off: the trained LoRA alone
    assert torch.equal(_logits(plain), _logits(model))


def test_a_given_state_dict_is_what_both_parts_hold(tmp_path):
    model = _trained()
    given = {k: v.clone() + 1.0 for k, v in model.state_dict().items()}  # e.g. gathered from shards elsewhere
    model.save_pretrained(str(tmp_path), state_dict=given)
    ours = load_file(str(tmp_path / PREPROJ_SUBDIR / WEIGHTS))
    key = "base_model.model.gpt_neox.layers.0.attention.preproj.up.weight"
    assert torch.equal(ours[key], given[key.replace(".preproj.", ".preproj.default.")])
    live = model.base_model.model.gpt_neox.layers[0].attention.preproj["default"].up.weight
    assert not torch.equal(ours[key], live)
    lora = load_file(str(tmp_path / WEIGHTS))
    lora_key = next(k for k in lora if "lora_A" in k)
    live_key = lora_key.replace("lora_A.", "lora_A.default.").replace(".attention.", ".attention.base_layer.")
    assert torch.equal(lora[lora_key], given[live_key])


def test_fsdp2_main_process_save_reads_ours_from_the_gathered_state_dict_and_gathers_nothing(tmp_path, monkeypatch):
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = _trained()
        fully_shard(model)
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        changed = {k: v + 1.0 for k, v in full.items() if ".preproj." in k or ".preproj_skip." in k}

        def refuse(self, *args, **kwargs):
            raise AssertionError("full_tensor() called: a collective on the main process alone deadlocks")

        monkeypatch.setattr(DTensor, "full_tensor", refuse)
        model.save_pretrained(str(tmp_path / "s"), state_dict={**full, **changed})
    finally:
        dist.destroy_process_group()
    ours = load_file(str(tmp_path / "s" / PREPROJ_SUBDIR / WEIGHTS))
    want = {k.replace(".default.", "."): v for k, v in changed.items()}
    assert ours.keys() == want.keys() and all(torch.equal(ours[k], v) for k, v in want.items())


def test_a_state_dict_without_our_weights_is_refused_before_anything_is_written(tmp_path):
    model = _trained()
    given = {k: v for k, v in model.state_dict().items() if "preproj" not in k}
    with pytest.raises(ValueError, match="the given state_dict lacks .* weight"):
        model.save_pretrained(str(tmp_path / "out"), state_dict=given)
    assert not (tmp_path / "out").exists()


def test_a_lora_adapter_named_like_our_folder_is_refused_before_anything_is_written(tmp_path):
    model = _trained()
    model.add_adapter(PREPROJ_SUBDIR, peft.LoraConfig(r=2, target_modules=["query_key_value"]))
    with pytest.raises(ValueError, match="a LoRA adapter is named 'preproj'.*nothing was written"):
        model.save_pretrained(str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def _corrupt_nan(folder):
    tensors = load_file(str(folder / WEIGHTS))
    key = next(iter(tensors))
    tensors[key] = torch.full_like(tensors[key], float("nan"))
    save_file(tensors, str(folder / WEIGHTS))


def _mismatched(folder):  # our adapter of another size (expansion) in place of the right one
    _trained(expansion=2.0).save_pretrained(str(folder.parent / "other"))
    for name in ("adapter_config.json", WEIGHTS):
        (folder / name).write_bytes((folder.parent / "other" / PREPROJ_SUBDIR / name).read_bytes())


@pytest.mark.parametrize("spoil, error", [(_corrupt_nan, "weights_digest|non-finite"), (_mismatched, "shape")])
def test_a_spoilt_preproj_folder_is_refused_with_nothing_changed(tmp_path, spoil, error):
    """Into a trained model (a resume) both are refused; onto a fresh base only the corrupt one (ours of another size
    is a whole adapter of its own, and LoRA's file no longer holds a copy of ours to disagree with it)."""
    saved = tmp_path / "saved"
    _trained(seed=3).save_pretrained(str(saved))
    spoil(saved / PREPROJ_SUBDIR)

    model = _trained(seed=4)  # a resume: peft's load_adapter into the loaded name
    before = _params(model)
    with pytest.raises(ValueError, match=error):
        model.load_adapter(str(saved), "default", is_trainable=True)
    _assert_unchanged(model, before)

    if spoil is _mismatched:
        return
    base = tiny_neox()
    plain = _params(base)
    with pytest.raises(ValueError, match=error):  # LoRA goes in first, then ours is refused: both taken off
        mmpreproj.load_adapter(base, saved)
    _assert_unchanged(base, plain)
    assert not mmpreproj.is_injected(base) and not any("lora_" in n for n, _ in base.named_parameters())


def test_load_adapter_reads_our_folder_only_into_the_loaded_model(tmp_path):
    source, model = _trained(seed=3), _trained(seed=4)
    source.save_pretrained(str(tmp_path))
    before = _params(model)
    with pytest.raises(ValueError, match="holds an mmpreproj adapter too .* nothing was loaded"):
        model.load_adapter(str(tmp_path), "second")  # would replace the one injection's weights
    with pytest.raises(ValueError, match=r"under the name 'preproj' \(allowed: \['preproj'\]\)"):
        model.load_adapter(str(tmp_path / PREPROJ_SUBDIR), "other")
    _assert_unchanged(model, before)

    result = model.load_adapter(str(tmp_path / PREPROJ_SUBDIR), PREPROJ_SUBDIR)  # a Trainer's resume: the subfolder
    assert (result.missing_keys, result.unexpected_keys) == ([], [])  # the fields peft's load_adapter returns
    want, got = mmpreproj.adapter_state_dict(source), mmpreproj.adapter_state_dict(model)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert "preproj" not in model.peft_config  # ours is no LoRA adapter
    assert all(p.requires_grad == before[n][1] for n, p in model.named_parameters())  # flags as they were


def test_train_writes_the_same_layout_from_the_model_or_from_gathered_weights(tmp_path):
    model = _trained()
    save_run_adapter(model, "preproj_lora", tmp_path / "live")
    save_run_adapter(model, "preproj_lora", tmp_path / "gathered", state=gather_run_adapter(model, "preproj_lora"))
    for sub in ("", PREPROJ_SUBDIR):
        live, gathered = (
            load_file(str(tmp_path / "live" / sub / WEIGHTS)),
            load_file(str(tmp_path / "gathered" / sub / WEIGHTS)),
        )
        assert live.keys() == gathered.keys() and all(torch.equal(live[k], gathered[k]) for k in live)
    assert torch.equal(_logits(mmpreproj.load_adapter(tiny_neox(), tmp_path / "gathered").eval()), _logits(model))


def test_a_train_run_folder_is_the_layout_and_reloads_bit_exact(tmp_path):
    from mmpreproj.train import train
    from tests.helpers.training import DATA, run_config

    result = train(run_config(tmp_path / "run", method="preproj_lora", lora_r=4, steps=2), tiny_neox(), examples=DATA)
    adapter = tmp_path / "run" / "adapter"
    assert json.loads((adapter / "adapter_config.json").read_text())["peft_type"] == "LORA"
    assert json.loads((adapter / PREPROJ_SUBDIR / "adapter_config.json").read_text())["peft_type"] == "PREPROJ"
    assert not (adapter / "lora").exists()
    reloaded = mmpreproj.load_adapter(tiny_neox(), tmp_path / "run").eval()  # the run folder: its method checked
    assert isinstance(reloaded, PreProjLoraModel) and torch.equal(_logits(reloaded), _logits(result.model.eval()))


# ---- a transformers Trainer: checkpoints in the layout, a resume bit-exact -------------------------------------

STEPS = 4


def _fit(out, model, *, stop=None, resume=None):
    datasets = pytest.importorskip("datasets")
    from transformers import Trainer

    from tests.helpers.callbacks import StopAfterSave

    ids = torch.randint(0, 128, (16, 12), generator=torch.Generator().manual_seed(0)).tolist()
    data = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})
    args = trainer_args(out, STEPS)
    callbacks = [StopAfterSave(stop)] if stop else []
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _trainable(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_trainer_checkpoints_are_the_layout_and_resume_bit_exact(tmp_path):
    pytest.importorskip("accelerate")
    whole = apply_method(tiny_neox(), "preproj_lora", lora_r=4)
    _fit(tmp_path / "whole", whole)
    ref = _trainable(whole)

    _fit(tmp_path / "cut", apply_method(tiny_neox(), "preproj_lora", lora_r=4), stop=2)
    ckpt = tmp_path / "cut" / "checkpoint-2"
    assert json.loads((ckpt / "adapter_config.json").read_text())["peft_type"] == "LORA"
    assert json.loads((ckpt / PREPROJ_SUBDIR / "adapter_config.json").read_text())["peft_type"] == "PREPROJ"

    fresh = apply_method(tiny_neox(), "preproj_lora", lora_r=4)
    with torch.no_grad():  # scrambled: the resume must load ours
        for w in mmpreproj.injected_modules(fresh):
            w.slots()[0].up.weight.normal_()
    _fit(tmp_path / "cut", fresh, resume=True)
    got = _trainable(fresh)
    assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)
    reloaded = mmpreproj.load_adapter(tiny_neox(), tmp_path / "cut" / "checkpoint-4").eval()
    assert torch.equal(_logits(reloaded), _logits(fresh.eval()))


def test_a_hand_built_stack_is_refused_by_peft_one_way_and_by_our_loader_the_other(tmp_path):
    """LoRA cannot go into an injected model (peft skips what a tuner layer holds, and our wrapper is one). Built the
    other way by hand (ours injected into the model a plain PeftModel wraps), peft's save holds LoRA's keys inside our
    wrapper and no config of ours: our loader refuses it, naming the way that saves both."""
    lora = peft.LoraConfig(r=4, target_modules=["query_key_value"])
    with pytest.raises(peft.utils.error.NoMatchingPeftModuleError if hasattr(peft.utils, "error") else ValueError):
        peft.get_peft_model(mmpreproj.inject(tiny_neox()), lora)
    model = peft.get_peft_model(tiny_neox(), lora)
    mmpreproj.inject(model.base_model.model, mmpreproj.PreProjConfig(skip=False))
    model.eval().save_pretrained(str(tmp_path))
    assert not (tmp_path / PREPROJ_SUBDIR).exists()
    base = tiny_neox()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    with pytest.raises(ValueError, match=r"mmpreproj modules injected .*save_adapter.*apply_method"):
        mmpreproj.load_adapter(base, tmp_path)
    assert base.state_dict().keys() == before.keys() and all(
        torch.equal(base.state_dict()[k], before[k]) for k in before
    )


def _no_config(folder):  # our config deleted, our weights left
    (folder / "adapter_config.json").unlink()


def _lora_config(folder):  # LoRA's config in place of ours
    (folder / "adapter_config.json").write_bytes((folder.parent / "adapter_config.json").read_bytes())


@pytest.mark.parametrize("spoil, said", [(_no_config, "is missing"), (_lora_config, "is not an mmpreproj adapter")])
def test_a_preproj_folder_without_our_config_is_refused_before_lora_loads(tmp_path, spoil, said):
    """A torn DIR/preproj (its config deleted, or another method's) is refused naming the file, through the one
    loader onto a fresh base and the resume route into a trained model, before LoRA loads: LoRA alone, or LoRA with
    the model's own earlier weights of ours, would run silently (an independent audit's finding)."""
    saved = tmp_path / "saved"
    _trained(seed=3).save_pretrained(str(saved))
    spoil(saved / PREPROJ_SUBDIR)
    error = rf"adapter file missing: .*{PREPROJ_SUBDIR}/adapter_config.json {said}"
    base = tiny_neox()
    plain = _params(base)
    with pytest.raises(FileNotFoundError, match=error):
        mmpreproj.load_adapter(base, saved)
    _assert_unchanged(base, plain)
    model = _trained(seed=4)
    before = _params(model)
    with pytest.raises(FileNotFoundError, match=error):
        model.load_adapter(str(saved), "default", is_trainable=True)
    _assert_unchanged(model, before)


@pytest.mark.parametrize(
    "spoil, error",
    [(_corrupt_nan, (ValueError, "weights_digest|non-finite")), (_no_config, (FileNotFoundError, "json is missing"))],
)
def test_a_trainer_resume_from_a_spoilt_preproj_folder_is_refused(tmp_path, spoil, error):
    """Refused before either part loads (without our config, LoRA's weights were copied in first, before)."""
    pytest.importorskip("accelerate")
    _fit(tmp_path / "cut", apply_method(tiny_neox(), "preproj_lora", lora_r=4), stop=2)
    spoil(tmp_path / "cut" / "checkpoint-2" / PREPROJ_SUBDIR)
    fresh = apply_method(tiny_neox(), "preproj_lora", lora_r=4)
    before = _params(fresh)
    with pytest.raises(error[0], match=error[1]):
        _fit(tmp_path / "cut", fresh, resume=True)
    _assert_unchanged(fresh, before)


def test_a_mixed_batch_runs_a_base_row_through_neither_part():
    """peft's `adapter_names` reach our wrappers too: a "__base__" row is the base (LoRA and ours off), a LoRA
    adapter's row runs ours as well (before, every row ran ours)."""
    model = _trained()
    base = tiny_neox().eval()
    with torch.no_grad():
        got = model(IDS, adapter_names=["default", "__base__"]).logits
        torch.testing.assert_close(got[1], base(IDS).logits[1], atol=1e-6, rtol=0)
        torch.testing.assert_close(got[0], _logits(model)[0], atol=1e-6, rtol=0)
        assert not torch.allclose(got[1], _logits(model)[1], atol=1e-4)  # the rows differ: the test can fail


def test_a_second_lora_adapter_trains_alone_and_ours_with_its_own_name():
    """Ours is the model's one PREPROJ adapter, named as the LoRA it was built with: it runs under every LoRA adapter
    and trains only while that name is active, as peft trains the active adapter alone."""
    model = _trained()
    ours = [p for n, p in model.named_parameters() if ".preproj" in n]
    assert ours and all(p.requires_grad for p in ours)
    model.add_adapter("b", peft.LoraConfig(r=4, target_modules=["query_key_value"]))
    model.set_adapter("b")
    assert not any(p.requires_grad for p in ours)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, _ in model.named_parameters() if ".b." in n and "lora_" in n
    }
    model.set_adapter("default")
    assert all(p.requires_grad for p in ours)
    model.set_adapter("default", inference_mode=True)
    assert not any(p.requires_grad for p in ours)


def test_after_mmpreproj_unload_the_lora_model_saves_as_peft_does(tmp_path):
    model = _trained()
    mmpreproj.unload(model)
    model.save_pretrained(str(tmp_path))  # raised "no mmpreproj modules" before
    assert not (tmp_path / PREPROJ_SUBDIR).exists()
    lora = peft.PeftModel.from_pretrained(tiny_neox(), str(tmp_path)).eval()
    assert torch.equal(_logits(lora), _logits(model))
