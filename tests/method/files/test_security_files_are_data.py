"""Files are data: a tampered adapter file can make the library call nothing, change nothing, delete nothing.

Every path an adapter file carries (its `host_description`: blocks and their alternatives, attention, norm,
width, embeddings and its `|` alternatives; its `config.modules_to_save`) is poisoned with one attack of each
class: a call, a dunder / private name, a method or property reached through attributes, an alternative whose
first branch would have side effects. Each goes through every loader: the one loader `load_adapter` (an
adapter folder, a run folder, a Trainer checkpoint of `preproj_lora`, and as a named adapter), `from_pretrained`
and `mmpreproj eval --adapter`. After each: no `SystemExit`, the trap model's side effects never ran, the model is
exactly as it was (or, where a harmless path is accepted, exactly the base again after `unload`), and the
working folder and the adapter folder hold the same files with the same bytes.
"""

from __future__ import annotations

import copy
import hashlib
import re
from pathlib import Path

import peft
import pytest
import torch
from transformers import GPTNeoXForCausalLM

import mmpreproj
from mmpreproj.hosts import HOSTS
from mmpreproj.hosts.paths import INPUT_EMBEDDINGS, HostError, PathError, check_path, get_path
from tests.helpers.adapter_json import dump_desc, load_desc
from tests.helpers.zoo import tiny_neox


class TrapNeox(GPTNeoXForCausalLM):
    """A GPT-NeoX whose property and method have side effects: a path that ran either would show."""

    sprung: list[str] = []

    @property
    def trap(self):  # a property: reading it runs code
        TrapNeox.sprung.append("property")
        return self.gpt_neox

    def spring(self):  # a method a string could try to call
        TrapNeox.sprung.append("method")
        with torch.no_grad():
            for p in self.parameters():
                p.zero_()
        return self.gpt_neox


def trap_model() -> TrapNeox:
    base = tiny_neox()
    model = TrapNeox(base.config).eval()
    model.load_state_dict(base.state_dict())
    return model


# One attack of each class; each is put into every path field below.
ATTACKS = {
    "call": "gpt_neox.layers.0.attention.query_key_value.weight.zero_()",
    "call_no_dot": "half()",
    "call_method_of_model": "spring()",
    "call_then_path": "spring().layers",
    "dunder_globals": "forward.__func__.__globals__.sys.exit",
    "dunder_class": "__class__.__init__",
    "private_table": "_modules.gpt_neox.layers",
    "private_in_middle": "gpt_neox._modules.layers",
    "method_through_attribute": "gpt_neox.layers.0.attention.train",
    "mutating_method": "gpt_neox.layers.clear",
    "property": "trap.layers",
    "alternative_first_side_effect": "spring()|gpt_neox.layers",
    "alternative_property_first": "trap.layers|gpt_neox.layers",
    "unknown_keyword": "@sys_exit",
    "legacy_call_spelling_other_method": "get_output_embeddings()",
}
FIELDS = ("blocks", "attention", "norm", "width", "embeddings", "modules_to_save")


def _described(model) -> dict:
    desc = HOSTS["gpt_neox"].describe(model)
    desc["name"] = "custom_neox"  # not a row: load_adapter must follow the file's own description
    desc["embeddings"] = "gpt_neox.embed_in"
    return desc


@pytest.fixture
def clean_adapter(tmp_path):
    model = tiny_neox()
    mmpreproj.inject(model, mmpreproj.PreProjConfig(), host=_described(model))
    folder = tmp_path / "adapter"
    mmpreproj.save_adapter(model, folder)
    return folder


def _poison(folder: Path, field: str, attack: str) -> None:
    cfg_file = folder / "adapter_config.json"
    desc = load_desc(cfg_file)
    part = desc["host_description"]["parts"][0]
    if field == "modules_to_save":
        desc["config"]["modules_to_save"] = [attack]
        desc["modules_to_save"] = {attack: attack}
    elif field == "embeddings":
        desc["host_description"]["embeddings"] = attack
    elif field == "blocks":
        part["blocks"] = [attack, "gpt_neox.layers"] if "|" not in attack else attack.split("|")
    elif field == "attention":
        part["attention"] = attack.split("|")[0]
    else:
        part[field] = attack.split("|")[0]
    dump_desc(cfg_file, desc)


def _tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


def _snapshot(model) -> tuple:
    return (
        [(n, type(m).__name__) for n, m in model.named_modules()],
        {k: v.detach().clone() for k, v in model.state_dict().items()},
        {n: (p.requires_grad, p.dtype) for n, p in model.named_parameters()},
        hasattr(model, "mmpreproj_state"),
    )


def _same(a: tuple, b: tuple) -> bool:
    return (
        a[0] == b[0]
        and a[2] == b[2]
        and a[3] == b[3]
        and a[1].keys() == b[1].keys()
        and all(torch.equal(a[1][k], b[1][k]) for k in a[1])
    )


def _load_and_check(load, model, tmp_path, monkeypatch, folder) -> None:
    """Run `load(model)`; it is refused, nothing ran, nothing was lost, the folders are unchanged."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("precious")
    TrapNeox.sprung = []
    before, files = _snapshot(model), _tree(tmp_path)
    try:
        loaded = load(model)
    except SystemExit as e:  # pragma: no cover - the hole this test guards
        pytest.fail(f"the adapter file made the library exit the process ({e!r})")
    except (ValueError, TypeError, FileNotFoundError) as e:
        assert _same(before, _snapshot(model)), "a refused load changed the model"
        assert str(e), "the refusal names nothing"
    else:  # a harmless path (e.g. embeddings that resolve to nothing) may load: the base is untouched
        if isinstance(loaded, peft.PeftModel):  # preproj_lora: ours, then peft's LoRA, off; peft leaves the base
            loaded.unload()  # frozen, as its LoRA alone does, so the flags are not compared
            before, after = before[:2] + before[3:], (s := _snapshot(model))[:2] + s[3:]
            assert before[0] == after[0] and all(torch.equal(before[1][k], after[1][k]) for k in before[1])
        else:
            mmpreproj.unload(loaded)
            assert _same(before, _snapshot(model)), "a load through a poisoned path changed the base"
    assert TrapNeox.sprung == [], f"a path ran model code: {TrapNeox.sprung}"
    assert _tree(tmp_path) == files, "the load created, changed or deleted files"


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_poisoned_path_through_load_adapter_runs_and_changes_nothing(
    clean_adapter, tmp_path, monkeypatch, field, attack
):
    _poison(clean_adapter, field, ATTACKS[attack])
    _load_and_check(
        lambda m: mmpreproj.load_adapter(m, clean_adapter), trap_model(), tmp_path, monkeypatch, clean_adapter
    )


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("attack", ["call", "dunder_globals", "private_in_middle", "alternative_first_side_effect"])
def test_poisoned_path_refused_by_name_before_the_model_is_touched(clean_adapter, field, attack):
    """The calls, dunders and alternatives are refused for their form, naming the field, not by luck."""
    _poison(clean_adapter, field, ATTACKS[attack])
    with pytest.raises(ValueError) as err:
        mmpreproj.load_adapter(trap_model(), clean_adapter)
    msg = str(err.value)
    assert "not allowed" in msg or "has no" in msg, msg
    assert field.rstrip("s") in msg or "embeddings" in msg or "modules_to_save" in msg, msg


@pytest.mark.parametrize("field", ["blocks", "embeddings", "modules_to_save"])
@pytest.mark.parametrize(
    "attack", ["call_method_of_model", "dunder_globals", "property", "alternative_first_side_effect"]
)
def test_poisoned_named_adapter_and_run_folder_loaders(clean_adapter, tmp_path, monkeypatch, field, attack):
    _poison(clean_adapter, field, ATTACKS[attack])
    run = tmp_path / "run"  # a train() run folder holding the poisoned adapter in adapter/
    (run / "adapter").mkdir(parents=True)
    for f in clean_adapter.iterdir():
        (run / "adapter" / f.name).write_bytes(f.read_bytes())
    _load_and_check(lambda m: mmpreproj.load_adapter(m, run), trap_model(), tmp_path, monkeypatch, run / "adapter")
    peft = pytest.importorskip("peft")
    ckpt = tmp_path / "checkpoint-2"  # a Trainer checkpoint of preproj_lora: peft's LoRA at the top, ours below
    lora = peft.LoraConfig(r=2, target_modules=["query_key_value"])
    peft.get_peft_model(tiny_neox(), lora).save_pretrained(str(ckpt))
    (ckpt / "preproj").mkdir()
    for f in clean_adapter.iterdir():
        (ckpt / "preproj" / f.name).write_bytes(f.read_bytes())
    _load_and_check(lambda m: mmpreproj.load_adapter(m, ckpt), trap_model(), tmp_path, monkeypatch, ckpt)
    injected = trap_model()
    mmpreproj.inject(injected, mmpreproj.PreProjConfig(), host=_described(injected))
    _load_and_check(
        lambda m: mmpreproj.load_adapter(m, clean_adapter, adapter_name="b"),
        injected,
        tmp_path,
        monkeypatch,
        clean_adapter,
    )


@pytest.mark.parametrize("field", ["blocks", "embeddings", "modules_to_save"])
@pytest.mark.parametrize("attack", ["call", "dunder_globals", "alternative_first_side_effect"])
def test_poisoned_adapter_through_from_pretrained_and_cli(tmp_path, monkeypatch, field, attack, capsys):
    from mmpreproj_cli.command import main

    model_dir = tmp_path / "model"
    base = tiny_neox()
    base.save_pretrained(model_dir)
    model = copy.deepcopy(base)
    mmpreproj.inject(model, mmpreproj.PreProjConfig(), host=_described(model))
    folder = tmp_path / "adapter"
    mmpreproj.save_adapter(model, folder)
    _poison(folder, field, ATTACKS[attack])
    monkeypatch.chdir(tmp_path)
    files = _tree(tmp_path)
    with pytest.raises(ValueError):
        mmpreproj.from_pretrained(model_dir, adapter=folder)
    assert (
        main(
            [
                "eval",
                "--model",
                str(model_dir),
                "--adapter",
                str(folder),
                "--tasks",
                "ppl",
                "--limit",
                "1",
                "--no-progress",
            ]
        )
        == 1
    )
    assert "error" in capsys.readouterr().err
    assert _tree(tmp_path) == files


def test_the_resolver_follows_plain_steps_only():
    model = trap_model()
    TrapNeox.sprung = []
    assert get_path(model, "gpt_neox.layers.1.attention") is model.gpt_neox.layers[1].attention
    assert get_path(model, "gpt_neox.layers.0.attention.query_key_value.weight") is (
        model.gpt_neox.layers[0].attention.query_key_value.weight
    )
    assert get_path(model, "config") is model.config  # a plain instance attribute
    assert get_path(model, INPUT_EMBEDDINGS) is model.gpt_neox.embed_in  # the keyword, not a string call
    assert get_path(model, "get_input_embeddings()") is model.gpt_neox.embed_in  # old files: read as the keyword
    for not_plain in ("trap", "spring", "training_step", "device", "dtype"):
        with pytest.raises(HostError):
            get_path(model, not_plain)
    for bad in ("spring()", "__class__", "_modules", "a..b", "a.", "@nope", "x y", "a(1)"):
        with pytest.raises(PathError):
            get_path(model, bad)
    assert TrapNeox.sprung == []


def test_the_resolver_reads_no_descriptor_of_a_config():
    """transformers configs map attributes in `__getattribute__`; a path reads what `vars` holds, nothing more."""
    model = trap_model()
    assert get_path(model, "config.hidden_size") == 32
    with pytest.raises(HostError, match="to_dict"):
        get_path(model, "config.to_dict")


def test_described_host_is_checked_for_form_before_it_meets_a_model():
    desc = _described(tiny_neox())
    desc["parts"][0]["norm"] = "input_layernorm.__class__"
    model = trap_model()
    before = _snapshot(model)
    with pytest.raises(PathError, match=r"parts\[0\]\.norm"):
        mmpreproj.inject(model, host=desc)
    assert _same(before, _snapshot(model))
    assert check_path("", "x") == ""
    with pytest.raises(PathError, match="not allowed"):
        mmpreproj.hosts.HostSpec.from_dict({**desc, "embeddings": "gpt_neox.embed_in|half()"})


def test_old_files_spelling_get_input_embeddings_still_load(clean_adapter):
    cfg_file = clean_adapter / "adapter_config.json"
    desc = load_desc(cfg_file)
    desc["host_description"]["embeddings"] = "get_input_embeddings()"  # what mmpreproj <= 0.x wrote
    dump_desc(cfg_file, desc)
    model = mmpreproj.load_adapter(tiny_neox(), clean_adapter)
    assert model.mmpreproj_state.host_description["embeddings"] == INPUT_EMBEDDINGS


def test_no_component_of_the_library_turns_file_strings_into_code():
    """The audit, as a test: the package (with its plain tables and the command) never evaluates, imports by name or
    unpickles what it reads."""
    banned = re.compile(r"(?<![\w.])(eval|exec|compile|__import__)\(|import_module\(|pickle\.loads?\(")
    repo = Path(mmpreproj.__file__).parents[1]
    lines = [
        (f"{f.relative_to(repo).as_posix()}:{n}", line.split("#", 1)[0])
        for package in ("mmpreproj", "mmpreproj_tables", "mmpreproj_cli")
        for f in sorted((repo / package).rglob("*.py"))
        for n, line in enumerate(f.read_text().splitlines(), 1)
    ]
    found = [where for where, code in lines if banned.search(code)]
    # reviewed: the quantizer's module name is one of the library's constants ("torchao" / "bitsandbytes")
    assert [f for f in found if not f.startswith("mmpreproj/integrations/quantized.py:")] == []
    loads = [(where, code) for where, code in lines if "torch.load(" in code and "`torch.load(" not in code]
    assert loads and all("weights_only=True" in code for _, code in loads), loads  # tensors only, never pickle


@pytest.mark.parametrize(
    "entry,value",
    [
        ("rope.head_dim", 10**12),
        ("rope.head_dim", "16"),
        ("rope.theta", float("inf")),
        ("rope.pairing", "exec"),
        ("positions.ref_shape", [10**9, 10**9]),
        ("positions.xy", "yes"),
        ("positions.offset", None),
    ],
)
def test_saved_rope_entry_is_checked_before_anything_is_built(tmp_path, entry, value):
    """The `add_rope` entry rebuilds an encoder from the file: its values are checked first (no huge cache)."""
    from timm.models.vision_transformer import VisionTransformer

    from mmpreproj.rope import RoPE2D
    from mmpreproj.timm_rope import add_rope, has_rope

    def tiny_vit():
        torch.manual_seed(0)
        return VisionTransformer(
            img_size=(32, 48), patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5, dynamic_img_size=True
        ).eval()

    model = add_rope(tiny_vit(), RoPE2D(16, theta=50.0))
    mmpreproj.inject(model)
    mmpreproj.save_adapter(model, tmp_path / "a")
    cfg_file = tmp_path / "a" / "adapter_config.json"
    desc = load_desc(cfg_file)
    section, key = entry.split(".")
    desc["rope"][section][key] = value
    dump_desc(cfg_file, desc)
    plain = tiny_vit()
    before = _snapshot(plain)
    with pytest.raises(ValueError, match=rf"corrupt 'rope' entry: {entry}"):
        mmpreproj.load_adapter(plain, tmp_path / "a")
    assert _same(before, _snapshot(plain)) and not has_rope(plain)
