"""Every bad input is named before any work starts: empty paths, list options checked in full before the first
arm, errors from torch/transformers re-raised with the field or the file, finite garbage in adapter files,
and a folder without the adapter `from_pretrained` was asked for."""

from __future__ import annotations

import errno
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import mmpreproj
from mmpreproj_cli.command import main
from tests.helpers.cli_lines import error_lines
from tests.helpers.zoo import tiny_neox


@pytest.fixture
def no_work(monkeypatch):
    """Loading a model or tokenizer fails loudly: an input error must be found before any of it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def started(*args, **kwargs):
        raise AssertionError("work started: a model or tokenizer was loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", started)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", started)


def _fails(capsys, argv: list[str], expect: str) -> None:
    code = main(argv)
    err = error_lines(capsys.readouterr().err)
    assert code == 1 and len(err) == 1, err
    assert expect in err[0], err[0]


def _empty(folder: Path) -> bool:
    return not any(folder.iterdir())


# --- 1. an empty path is refused by name, never read as the default -------------------------------------

EMPTY_PATHS = [
    (["train", "--out", ""], "--out: empty path; pass a folder"),
    (["train", "--model", ""], "--model: empty path; pass a hub id or a local folder"),
    (["train", "--data", " "], "--data: empty path; pass a hub dataset id or a local text file"),
    (["eval", "--model", ""], "--model: empty path; pass a hub id or a local folder"),
    (["eval", "--adapter", ""], "--adapter: empty path; pass a run folder or an adapter folder"),
    (["eval", "--adapter", ","], "--adapter ',': empty path; pass a run folder or an adapter folder"),
    (["eval", "--json", ""], "--json: empty path; pass a file name"),
    (["analyze", ""], "run folder: empty path; pass a run folder"),
    (["analyze", ".", "--out", ""], "--out: empty path; pass a folder"),
    (["reproduce", "--preset", "mini", "--out", ""], "--out: empty path; pass a folder"),
    (["reproduce", "--preset", "mini", "--model", ""], "--model: empty path"),
    (["reproduce", "--preset", "mini", "--data", ""], "--data: empty path"),
    (["demo", "--out", ""], "--out: empty path; pass a folder"),
    (["demo", "--model", ""], "--model: empty path"),
    (["demo", "--data", ""], "--data: empty path"),
    (["sweep", "--out", ""], "--out: empty path; pass a folder"),
    (["sweep", "--model", ""], "--model: empty path"),
    (["train", "--device", ""], "--device: empty value"),
    (["train", "--data-config", ""], "--data-config: empty value"),
]


@pytest.mark.parametrize(("argv", "expect"), EMPTY_PATHS, ids=[" ".join(a) for a, _ in EMPTY_PATHS])
def test_an_empty_path_option_is_refused_not_read_as_the_default(capsys, tmp_path, monkeypatch, no_work, argv, expect):
    monkeypatch.chdir(tmp_path)  # a command that started anyway would write runs/ here
    _fails(capsys, argv, expect)
    assert _empty(tmp_path)


@dataclass
class _RecipeConfig:
    out: str = "runs/recipe"
    model: str = "assets/mini-pythia"
    checkpoint: str | None = None
    note: str = ""  # "" is this field's own default: passing it is not an error


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["--out", ""], "argument --out: empty path; pass one, or leave the option out (default: runs/recipe)"),
        (["--model", "  "], "argument --model: empty path"),
        (["--checkpoint", ""], "argument --checkpoint: empty value"),
    ],
)
def test_recipe_options_refuse_an_empty_path(capsys, argv, expect):
    from recipes.kit.recipe import parse_config

    with pytest.raises(SystemExit) as exit_:
        parse_config(_RecipeConfig, argv)
    assert exit_.value.code == 2 and expect in capsys.readouterr().err
    assert parse_config(_RecipeConfig, ["--note", ""]).note == ""


# --- 2. list options are checked in full before the first arm trains ------------------------------------

LISTS = [
    (["sweep", "--lrs", "1e-3,nan"], "--lrs '1e-3,nan': nan is not a finite number > 0"),
    (["sweep", "--lrs", "1e-3,inf"], "--lrs '1e-3,inf': inf is not a finite number > 0"),
    (["sweep", "--lrs", "1e-3,0,-1"], "--lrs '1e-3,0,-1': 0.0 is not a finite number > 0"),
    (["sweep", "--lrs", "1e-3,abc"], "--lrs '1e-3,abc': 'abc' is not a number"),
    (["sweep", "--lrs", "1e-3,0.001"], "--lrs '1e-3,0.001': 0.001 is named twice"),
    (["sweep", "--lrs", ","], "--lrs ',': no learning rate given; pass distinct finite numbers > 0"),
    (["sweep", "--methods", "lora,lora"], "--methods 'lora,lora': names 'lora' twice"),
    (["sweep", "--methods", "lora,dora"], "--methods 'lora,dora': unknown ['dora']"),
    (["sweep", "--seed", "-3"], "--seed -3; must be an int in [0, 2**32)"),
    (["sweep", "--steps", "0"], "--steps 0; must be a positive int"),
    (["demo", "--seeds", "0,-3"], "--seeds '0,-3': seed -3 is out of range [0, 2**32)"),
    (["demo", "--seeds", "0,4294967296"], "seed 4294967296 is out of range [0, 2**32)"),
    (["demo", "--seeds", "0,0"], "--seeds '0,0': seed 0 is named twice"),
    (["demo", "--seeds", "0,abc"], "--seeds '0,abc': 'abc' is not an integer"),
    (["demo", "--seeds", "1.5"], "--seeds '1.5': '1.5' is not an integer"),
    (["demo", "--seeds", "0"], "--seeds '0': a count must be >= 1"),
    (["demo", "--seeds", "-2"], "--seeds '-2': a count must be >= 1"),
    (["demo", "--methods", "lora,lora"], "--methods 'lora,lora': names 'lora' twice"),
    (["reproduce", "--preset", "mini", "--seeds", ",,"], "--seeds ',,': no seed given"),
    (["eval", "--tasks", "ppl,ppl"], "--tasks 'ppl,ppl': names 'ppl' twice"),
]


@pytest.mark.parametrize(("argv", "expect"), LISTS, ids=[" ".join(a) for a, _ in LISTS])
def test_list_options_are_checked_in_full_before_any_work(capsys, tmp_path, monkeypatch, no_work, argv, expect):
    monkeypatch.chdir(tmp_path)
    _fails(capsys, argv, expect)
    assert _empty(tmp_path)


def test_sweep_and_reproduce_check_every_arm_before_writing_or_loading(tmp_path, no_work):
    from mmpreproj.experiments.reproduce import reproduce
    from mmpreproj.experiments.sweep import lr_sweep

    with pytest.raises(ValueError, match=r"lrs: nan is not a finite number > 0"):
        lr_sweep("mini", tmp_path / "sweep", lrs=[1e-3, math.nan])
    with pytest.raises(ValueError, match=r"seeds='0,-3': seed -3 is out of range"):
        reproduce("mini", tmp_path / "repro", seeds="0,-3")
    with pytest.raises(ValueError, match=r"method 'lora' is named twice"):
        reproduce("mini", tmp_path / "repro", methods=["lora", "lora"])
    with pytest.raises(ValueError, match=r"TrainConfig.lora_r=4 only applies to methods 'lora'"):
        reproduce("mini", tmp_path / "repro", methods=["lora", "preproj_skip"], train_overrides={"lora_r": 4})
    with pytest.raises(ValueError, match=r"methods='lora': pass a list of names"):
        lr_sweep("mini", tmp_path / "sweep", methods="lora")
    assert _empty(tmp_path)


# --- other odd inputs the CLI used to accept ------------------------------------------------------------

ODD = [
    (["eval", "--model", "./no-such-model"], "--model ./no-such-model: no such folder (a local path"),
    (["train", "--model", "/no/such/model"], "--model /no/such/model: no such folder"),
    (["demo", "--model", "~/no-such-model"], "--model ~/no-such-model: no such folder"),
    (["sweep", "--model", "org/name/sub"], "--model org/name/sub: no such folder"),
    (["train", "--data", "./no-such.txt"], "--data ./no-such.txt: no such file"),
    (["demo", "--data", "/no/such/lines.txt"], "--data /no/such/lines.txt: no such file"),
    (["train", "--data", "."], "--data .: is a folder; pass a text file"),
    (["train", "--batch-size", "0"], "--batch-size 0; must be a positive int"),
    (["train", "--steps", "-5"], "--steps -5; must be a positive int"),
    (["sweep", "--limit", "0"], "--limit 0; must be an integer >= 1"),
    (["analyze", ".", "--texts", "-1"], "--texts -1; must be an integer >= 0"),
    (["eval", "--adapter", "."], "--adapter .: holds no adapter (adapter_config.json missing)"),
    (["analyze", "."], "run folder .: holds no adapter (adapter_config.json missing)"),
]


@pytest.mark.parametrize(("argv", "expect"), ODD, ids=[" ".join(a) for a, _ in ODD])
def test_odd_counts_and_missing_local_paths_are_refused(capsys, tmp_path, monkeypatch, no_work, argv, expect):
    monkeypatch.chdir(tmp_path)
    _fails(capsys, argv, expect)
    assert _empty(tmp_path)


def test_a_missing_local_model_path_is_said_at_once_not_looked_up_on_the_hub(monkeypatch):
    from mmpreproj.train.models import load_model, load_tokenizer

    def no_hub(*args, **kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr("mmpreproj.data.hub.hub_reachable", no_hub)
    for load in (load_model, load_tokenizer, mmpreproj.from_pretrained):
        with pytest.raises(FileNotFoundError, match=r"model folder not found: \./nope/model \(no such file"):
            load("./nope/model")
        with pytest.raises(FileNotFoundError, match="model folder: empty name; pass a hub id or a local folder"):
            load("")  # not the working directory


# --- 3. errors from torch/transformers, re-raised with the field or the file ----------------------------


def _described(inputs: list) -> dict:
    """The gpt_neox row as a user description, with another `call.inputs`."""
    from mmpreproj.hosts import HOSTS

    d = HOSTS["gpt_neox"].describe(tiny_neox())
    d.pop("name", None)
    d["parts"] = [
        {**d["parts"][0], "norm": None, "unchecked_seam": True, "call": {"inputs": inputs, "output_index": 0}}
    ]
    return d


@pytest.mark.parametrize(
    ("inputs", "error", "expect"),
    [
        ([[3, "position_embeddings"]], TypeError, r"call.inputs entry \[3, 'position_embeddings'\] gives a tuple"),
        ([[5, "position_ids"]], TypeError, r"\[5, 'position_ids'\] gives a torch.int64 tensor of shape \(1, 5\)"),
        (
            [[1, "attention_mask"]],
            RuntimeError,
            r"found no attention input among call.inputs \[\[1, 'attention_mask'\]\]",
        ),
    ],
)
def test_a_wrong_call_slot_names_the_part_the_block_and_the_call_field(inputs, error, expect):
    model = mmpreproj.inject(tiny_neox(), host=_described(inputs))
    with pytest.raises(error, match=r"PreProjAttention \(part 'language', block 0\)") as err:
        model(torch.randint(0, 128, (1, 5)))
    assert err.match(expect) and "'call'" in str(err.value)


def test_a_call_slot_holding_a_tensor_of_another_width_is_named():
    from mmpreproj.hosts.spec import AttentionCall
    from mmpreproj.method.config import PreProjConfig
    from mmpreproj.method.layer import PreProjAttention
    from mmpreproj.method.plan import new_adapter_modules

    preproj, skip = new_adapter_modules(8, PreProjConfig(), torch.device("cpu"))
    wrapper = PreProjAttention(
        torch.nn.Identity(),
        AttentionCall(inputs=((1, "mask"),), output_index=None),
        preproj,
        skip,
        block_index=3,
        part="vision",
    )
    with pytest.raises(
        TypeError,
        match=r"\(part 'vision', block 3\): .*entry \[1, 'mask'\] gives a torch.float32 "
        r"tensor of shape \(2, 5, 7\), not the normed input x\^ \(a float tensor \(\.\.\., N, 8\)\)",
    ):
        wrapper(torch.zeros(2, 5, 8), torch.zeros(2, 5, 7))
    wrapper.call = AttentionCall(inputs=((0, "x"),), output_index=None)
    assert wrapper(torch.zeros(2, 5, 8)).shape == (2, 5, 8)  # the right slot runs


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_truncated_base_model_file_is_named(tmp_path):
    from mmpreproj.train.models import load_model

    base = tiny_neox()
    base.save_pretrained(tmp_path / "st")
    _truncate(tmp_path / "st" / "model.safetensors")
    for load in (
        lambda: load_model(str(tmp_path / "st")),
        lambda: mmpreproj.from_pretrained(tmp_path / "st", adapter=False),
    ):
        with pytest.raises(
            ValueError,
            match=r"corrupt model weights .*st/model.safetensors: .*truncated or not a "
            r"weights file\?",
        ):
            load()
    (tmp_path / "bin").mkdir()
    base.config.save_pretrained(tmp_path / "bin")
    torch.save(base.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    _truncate(tmp_path / "bin" / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"corrupt model weights .*bin/pytorch_model.bin"):
        load_model(str(tmp_path / "bin"))


@pytest.mark.parametrize("dtype", ["bf16", torch.int8, 3])
def test_a_bad_4bit_compute_dtype_names_the_field_and_the_allowed_values(dtype):
    from mmpreproj.integrations.quantized import quantize_frozen_base

    model = tiny_neox()
    before = {n: type(m) for n, m in model.named_modules()}
    with pytest.raises(
        ValueError,
        match=r"compute_dtype=.*; allowed values: None \(each layer's weight dtype\), "
        r"torch.float32, torch.float16, torch.bfloat16",
    ):
        quantize_frozen_base(model, "nf4", compute_dtype=dtype)
    with pytest.raises(ValueError, match=r"compute_dtype applies to the 4-bit schemes"):
        quantize_frozen_base(model, "int8", compute_dtype=torch.bfloat16)
    assert {n: type(m) for n, m in model.named_modules()} == before


def test_int8_save_pretrained_is_refused_before_anything_is_written(tmp_path):
    pytest.importorskip("torchao")
    from mmpreproj.integrations.quantized import quantize_frozen_base

    model = mmpreproj.inject(quantize_frozen_base(tiny_neox(), "int8"))
    with pytest.raises(
        ValueError,
        match=r"torchao int8 weights .*nothing was written. Save the adapter alone "
        r"\(mmpreproj\.save_pretrained\(model, DIR, adapter_only=True\)",
    ):
        mmpreproj.save_pretrained(model, tmp_path / "full")
    assert not (tmp_path / "full").exists()
    mmpreproj.save_pretrained(model, tmp_path / "only", adapter_only=True)  # what the message says to do works
    assert mmpreproj.is_injected(mmpreproj.load_adapter(quantize_frozen_base(tiny_neox(), "int8"), tmp_path / "only"))


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_at_the_final_adapter_write_names_the_folder_and_keeps_the_old_one(tmp_path, monkeypatch):
    from mmpreproj.train import train
    from mmpreproj.train.adapters import save_run_adapter
    from mmpreproj.train.errors import CheckpointWriteError
    from tests.helpers.training import DATA, run_config

    old = mmpreproj.inject(tiny_neox())
    save_run_adapter(old, "preproj_skip", tmp_path / "adapter")
    files = {p.name: p.read_bytes() for p in (tmp_path / "adapter").iterdir()}
    monkeypatch.setattr("mmpreproj.method.files.save_file", _disk_full)
    with pytest.raises(
        CheckpointWriteError,
        match=r"cannot write the adapter to .*adapter: OSError: No space left "
        r"on device; nothing there was replaced \(the previous adapter files, if any, are kept\)",
    ):
        save_run_adapter(mmpreproj.inject(tiny_neox(seed=1)), "preproj_skip", tmp_path / "adapter")
    assert {p.name: p.read_bytes() for p in (tmp_path / "adapter").iterdir()} == files
    with pytest.raises(CheckpointWriteError, match=r"cannot write the adapter to .*run/adapter: OSError: No space"):
        train(run_config(tmp_path / "run", steps=1), tiny_neox(), examples=DATA)


def test_a_deeply_nested_json_file_is_called_corrupt_by_name(tmp_path):
    from mmpreproj.experiments.arms import read_arm
    from mmpreproj.train import TrainConfig

    nested = "[" * 100_000 + "]" * 100_000
    mmpreproj.save_adapter(mmpreproj.inject(tiny_neox()), tmp_path / "run" / "adapter")
    cfg = tmp_path / "run" / "adapter" / "adapter_config.json"
    cfg.write_text(nested)
    with pytest.raises(ValueError, match=re.escape(f"corrupt adapter config {cfg}: nested too deeply")):
        mmpreproj.load_adapter(tiny_neox(), cfg.parent)
    with pytest.raises(ValueError, match=re.escape(f"corrupt adapter config {cfg}: nested too deeply")):
        mmpreproj.load_adapter(tiny_neox(), tmp_path / "run")  # what `mmpreproj eval --adapter` calls
    (tmp_path / "c.json").write_text(nested)
    with pytest.raises(ValueError, match=r"TrainConfig: .*c.json is not valid JSON \(nested too deeply\)"):
        TrainConfig.from_json(tmp_path / "c.json")
    (tmp_path / "arm").mkdir()
    (tmp_path / "arm" / "eval.json").write_text(nested)
    assert read_arm(tmp_path / "arm", {}) is None  # an arm whose record is garbage is computed again


# --- 4. finite garbage in an adapter file is refused by name --------------------------------------------


@pytest.fixture
def saved(tmp_path):
    """A folder whose weights the tests below edit by hand: its digest is dropped (as in a folder written before
    every writer recorded one), so the check under test, not the digest, is what refuses."""
    mmpreproj.save_adapter(mmpreproj.inject(tiny_neox()), tmp_path)
    cfg = json.loads((tmp_path / "adapter_config.json").read_text())
    del cfg["injection"]["weights_digest"]
    (tmp_path / "adapter_config.json").write_text(json.dumps(cfg))
    return tmp_path, load_file(str(tmp_path / "adapter_model.safetensors"))


KEY = "gpt_neox.layers.0.attention.preproj.up.weight"  # in memory (the module path); the file adds peft's prefix
FILE_KEY = "base_model.model.gpt_neox.layers.0.attention.preproj.up.weight"


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.bool, torch.complex64])
def test_non_float_adapter_weights_are_refused_by_key_and_dtype(saved, dtype):
    folder, tensors = saved
    bad = dict(tensors, **{FILE_KEY: tensors[FILE_KEY].to(dtype)})
    save_file(bad, str(folder / "adapter_model.safetensors"))
    model = tiny_neox()
    with pytest.raises(ValueError, match=f"tensor {FILE_KEY} has dtype {dtype}; injected weights are floating point"):
        mmpreproj.load_adapter(model, folder)
    assert not mmpreproj.is_injected(model)
    injected = mmpreproj.inject(tiny_neox())
    before = mmpreproj.adapter_state_dict(injected)[KEY].clone()
    in_memory = dict(mmpreproj.adapter_state_dict(injected), **{KEY: before.to(dtype)})
    with pytest.raises(
        ValueError,
        match=f"{KEY} has dtype {dtype}, expected a floating-point tensor "
        r"\(torch.float32\)",
    ):
        mmpreproj.set_adapter_state_dict(injected, in_memory)
    assert torch.equal(mmpreproj.adapter_state_dict(injected)[KEY], before)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_adapter_weights_in_another_float_dtype_are_cast(saved, dtype):
    folder, tensors = saved
    save_file(dict(tensors, **{FILE_KEY: tensors[FILE_KEY].to(dtype)}), str(folder / "adapter_model.safetensors"))
    got = mmpreproj.adapter_state_dict(mmpreproj.load_adapter(tiny_neox(), folder))[KEY]
    assert got.dtype == torch.float32 and torch.equal(got, tensors[FILE_KEY].to(dtype).float())


def test_a_zero_dim_or_wrong_rank_weight_is_refused_by_shape(saved):
    folder, tensors = saved
    for value in (torch.tensor(1.0), tensors[FILE_KEY].flatten()):
        save_file(dict(tensors, **{FILE_KEY: value}), str(folder / "adapter_model.safetensors"))
        with pytest.raises(ValueError, match=re.escape(f"{KEY} has shape {tuple(value.shape)}, expected")):
            mmpreproj.load_adapter(tiny_neox(), folder)


# --- 5. from_pretrained(DIR) without DIR/adapter says so ------------------------------------------------


def test_from_pretrained_of_a_folder_without_its_adapter_says_so(tmp_path, monkeypatch):
    tiny_neox().save_pretrained(tmp_path / "base")
    with pytest.raises(
        FileNotFoundError,
        match=r"holds no mmpreproj adapter \(no adapter/adapter_config.json\); "
        r"pass adapter=False to load only the base",
    ):
        mmpreproj.from_pretrained(tmp_path / "base")
    assert not mmpreproj.is_injected(mmpreproj.from_pretrained(tmp_path / "base", adapter=False))
    mmpreproj.save_adapter(mmpreproj.inject(tiny_neox()), tmp_path / "base" / "adapter")
    (tmp_path / "base" / "adapter" / "adapter_model.safetensors").unlink()
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", _disk_full)  # the base must not be loaded
    with pytest.raises(FileNotFoundError, match=r"adapter file missing: .*adapter/adapter_model.safetensors"):
        mmpreproj.from_pretrained(tmp_path / "base")


def test_the_nested_json_above_is_what_json_loads_cannot_take():
    with pytest.raises(RecursionError):
        json.loads("[" * 100_000 + "]" * 100_000)
