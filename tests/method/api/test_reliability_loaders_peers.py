"""Every loader the README lists is as safe as ours (issue 45, item 7): a bad folder is refused with one error naming
the file or field, and the base is exactly as it was (modules, tensors, `requires_grad`, peft's attributes).

Measured on main before: transformers' `model.load_adapter` injected, then failed or loaded silently, for a
missing, directory, truncated or garbage weights file, a wrong shape, an extra or missing key, integer or NaN
weights, a tampered digest (a); `PeftModel.from_pretrained` left the base half-injected (32 -> 50 modules) for a
missing weights file or a directory in its place (b); a SEQ_CLS folder whose head is reshaped, missing or has an
extra key was refused only after injecting, an int32 head was cast and loaded (c); the `low_cpu_mem_usage`
refusal with `modules_to_save` flipped `requires_grad` on the base (d); a host description naming the MLP as the
attention loaded with other logits (e).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers as tf
from peft import AutoPeftModelForSequenceClassification, PeftModel, get_peft_model
from safetensors.torch import load_file

import mmpreproj
from mmpreproj import PreProjConfig
from tests.helpers.adapter_cases import UP0, UP1, C, W, assert_refused, edit, good
from tests.helpers.adapter_cases import base as _base
from tests.helpers.snapshots import assert_unchanged, snapshot
from tests.helpers.zoo import tiny_neox

LOADERS = {
    "hf": lambda b, f: b.load_adapter(str(f)),
    "peft": lambda b, f: PeftModel.from_pretrained(b, str(f)),
    "ours": lambda b, f: mmpreproj.load_adapter(b, f),
}


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("base")
    tiny_neox().save_pretrained(path)
    return path


def _weights(change):
    return lambda f: edit(f, change)


def _replace_weights(make):
    def change(folder: Path) -> None:
        (folder / W).unlink()
        make(folder / W)

    return change


# name -> (damage, what the refusal names); the weights edits recompute the digest, so only the other checks see them
CASES = {
    "weights_missing": (lambda f: (f / W).unlink(), r"adapter_model\.safetensors is missing"),
    "weights_a_directory": (_replace_weights(lambda p: p.mkdir()), r"adapter_model\.safetensors is a directory"),
    "weights_truncated": (lambda f: (f / W).write_bytes((f / W).read_bytes()[:100]), r"corrupt adapter weights"),
    "weights_garbage": (_replace_weights(lambda p: p.write_bytes(b"\x00" * 300)), r"corrupt adapter weights"),
    "shape": (_weights(lambda t: {**t, UP0: torch.zeros(t[UP0].shape[0] + 1, 32)}), r"up\.weight has shape"),
    "extra_key": (
        _weights(lambda t: {**t, UP0.replace("up", "extra"): torch.zeros(2)}),
        r"belongs to no|unexpected \['gpt_neox",
    ),
    "missing_key": (
        _weights(lambda t: {k: v for k, v in t.items() if k != UP1}),
        r"missing 1 tensor|missing \['gpt_neox",
    ),
    "int32": (_weights(lambda t: {**t, UP0: torch.ones_like(t[UP0], dtype=torch.int32)}), r"dtype torch\.int32"),
    "nan": (_weights(lambda t: {**t, UP0: torch.full_like(t[UP0], float("nan"))}), r"non-finite"),
    "digest": (lambda f: edit(f, config=lambda c: c["injection"].update(weights_digest="0" * 64)), r"weights_digest"),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory, base_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cases")
    out = {}
    for name, (change, _) in CASES.items():
        out[name] = good(base_dir, root / name)
        change(out[name])
    return out


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_a_bad_weights_file_is_refused_before_the_base_changes(folders, base_dir, case, loader):
    said, error = CASES[case][1], ValueError
    if loader == "ours" and case in ("weights_missing", "weights_a_directory"):  # ours names the file its own way
        said, error = r"adapter file missing: .*adapter_model\.safetensors", FileNotFoundError
    assert_refused(LOADERS[loader], _base(base_dir), folders[case], said, error)


def test_transformers_load_adapter_of_a_state_dict_is_checked_before_it_injects(tmp_path, base_dir):
    folder = good(base_dir, tmp_path / "good")
    tensors = load_file(str(folder / W))
    config = json.loads((folder / C).read_text())
    base = _base(base_dir)
    before = snapshot(base)
    with pytest.raises(ValueError, match=r"adapter_state_dict: tensor .* non-finite"):
        base.load_adapter(
            peft_config=mmpreproj.PreProjConfig.from_dict(config),
            adapter_state_dict={**tensors, UP0: torch.full_like(tensors[UP0], float("nan"))},
        )
    assert_unchanged(base, before)


def test_a_good_folder_still_loads_through_transformers_and_peft(tmp_path, base_dir):
    folder = good(base_dir, tmp_path / "good")
    x = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    hf = _base(base_dir)
    hf.load_adapter(str(folder))
    want = PeftModel.from_pretrained(_base(base_dir), str(folder))(x).logits
    assert torch.equal(hf(x).logits, want) and not torch.equal(want, _base(base_dir)(x).logits)


# -- (c) a classification head peft saves beside the adapter -------------------------------------------------------
SEQ_CLS = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
HEAD = "base_model.model.score.weight"


def _classifier(num_labels: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    config = tf.LlamaConfig(**SEQ_CLS, num_key_value_heads=2, num_labels=num_labels, pad_token_id=0)
    return tf.LlamaForSequenceClassification(config).eval()


def _head_folder(root: Path, name: str, change) -> Path:
    """A trained SEQ_CLS adapter saved by peft, its head tensors changed by `change` (the digest, over ours alone,
    stays right: only the head checks can see it)."""
    model = get_peft_model(_classifier(), PreProjConfig(task_type="SEQ_CLS"))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.01)
    folder = root / name
    model.save_pretrained(folder)
    cfg = json.loads((folder / C).read_text())
    cfg["base_model_name_or_path"] = str(root / "base")
    (folder / C).write_text(json.dumps(cfg))
    if change is not None:
        edit(folder, change, redigest=False)
    return folder


HEAD_CASES = {
    "reshaped": (lambda t: {**t, HEAD: torch.zeros(5, 32)}, r"head tensor .*score\.weight has shape \(5, 32\)"),
    "missing": (lambda t: {k: v for k, v in t.items() if k != HEAD}, r"missing \['score\.weight'\]"),
    "extra_key": (lambda t: {**t, HEAD.replace("weight", "bias"): torch.zeros(3)}, r"unexpected \['score\.bias'\]"),
    "int32": (lambda t: {**t, HEAD: torch.ones(3, 32, dtype=torch.int32)}, r"score\.weight has dtype torch\.int32"),
}


@pytest.fixture(scope="module")
def heads(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("heads")
    _classifier().save_pretrained(root / "base")
    out = {name: _head_folder(root, name, change) for name, (change, _) in HEAD_CASES.items()}
    out["good"] = _head_folder(root, "good", None)
    return out


@pytest.mark.parametrize("case", sorted(HEAD_CASES))
@pytest.mark.parametrize("loader", ["hf", "peft"])
def test_a_bad_classification_head_is_refused_before_anything_is_injected(heads, case, loader):
    assert_refused(LOADERS[loader], _classifier(), heads[case], HEAD_CASES[case][1])


@pytest.mark.parametrize("case", sorted(HEAD_CASES))
def test_auto_peft_refuses_a_bad_classification_head(heads, case):
    with pytest.raises(ValueError, match=HEAD_CASES[case][1]):
        AutoPeftModelForSequenceClassification.from_pretrained(str(heads[case]))


@pytest.mark.parametrize("loader", ["hf", "peft"])
def test_a_head_for_another_number_of_labels_is_refused_before_anything_is_injected(heads, loader):
    assert_refused(LOADERS[loader], _classifier(num_labels=5), heads["good"], r"head_shapes records .*score\.weight")


def test_a_good_classification_folder_records_its_head_and_loads(heads):
    recorded = json.loads((heads["good"] / C).read_text())["injection"]["head_shapes"]
    assert recorded == {"score.weight": [3, 32]}
    ids = torch.randint(1, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    hf = _classifier()
    hf.load_adapter(str(heads["good"]))
    peft_model = PeftModel.from_pretrained(_classifier(), str(heads["good"]))
    assert torch.equal(hf(input_ids=ids).logits, peft_model(input_ids=ids).logits)


# -- (d) the low_cpu_mem_usage refusal ----------------------------------------------------------------------------
def test_the_low_cpu_mem_usage_refusal_leaves_every_flag_as_it_was(tmp_path, base_dir):
    get_peft_model(_base(base_dir), PreProjConfig(modules_to_save=["lm_head"])).save_pretrained(tmp_path / "head")
    base = _base(base_dir)
    base.gpt_neox.embed_in.weight.requires_grad_(False)  # a caller's own flags, both ways
    said = r"low_cpu_mem_usage=True with PreProjConfig\.modules_to_save: .*nothing was changed"
    assert_refused(
        lambda b, f: PeftModel.from_pretrained(b, str(f), low_cpu_mem_usage=True), base, tmp_path / "head", said
    )


# -- (e) a description naming another module as the attention ------------------------------------------------------
def _to_mlp(cfg: dict) -> None:
    injection = cfg["injection"]
    injection["host_description"]["parts"][0]["attention"] = "mlp"
    injection["modules"] = [m.replace(".attention", ".mlp") for m in injection["modules"]]
    injection["tensor_shapes"] = {k.replace(".attention.", ".mlp."): v for k, v in injection["tensor_shapes"].items()}


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_a_description_naming_the_mlp_as_the_attention_is_refused_at_load(tmp_path, base_dir, loader):
    folder = good(base_dir, tmp_path / "mlp")
    edit(folder, lambda t: {k.replace(".attention.", ".mlp."): v for k, v in t.items()}, _to_mlp)
    said = r"wraps GPTNeoXMLP 'mlp' of block 0 after norm 'input_layernorm', but the trace .* finds no attention"
    assert_refused(LOADERS[loader], _base(base_dir), folder, said)
