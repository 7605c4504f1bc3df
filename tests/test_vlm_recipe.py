"""The pretrained-VLM frozen probe (`recipes/vlm/frozen_probe.py`) end to end on a random-tiny Qwen2-VL saved to disk
(model + processor built in code, `recipes/vlm/tiny_qwen2vl.py`), loaded by path like a hub checkpoint."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

import mmpreproj

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "vlm"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"vlm_{name}", RECIPE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def probe():
    return _load("frozen_probe")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _load("tiny_qwen2vl").save_tiny_qwen2vl(tmp_path_factory.mktemp("tiny-qwen2vl"))


@pytest.fixture(scope="module")
def run(probe, tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("probe")
    args = ["--model", str(tiny), "--out", str(out), "--steps", "12", "--batch-size", "8", "--lr", "1e-2",
            "--train-per-class", "4", "--test-per-class", "2", "--warmup", "2"]  # fmt: skip
    return probe.main(args), out


def test_probe_trains_only_the_injected_modules_and_lowers_the_held_out_answer_loss(run):
    result, out = run
    assert result["after"]["answer_loss"] < result["before"]["answer_loss"]
    assert result["trainable"] == sum(result["injected_by_part"].values())  # base frozen: nothing else trains
    assert set(result["injected_by_part"]) == {"vision", "language"}  # the Qwen2-VL row's default parts
    assert json.loads((out / "results.json").read_text())["after"] == result["after"]


def test_saved_adapter_reloads_bit_exact_into_the_model_loaded_by_path(probe, tiny, run):
    result, out = run
    model, processor = probe.load_vlm(str(tiny), "float32")
    x, y, classes = probe.load_image_zip(Path(result["config"]["data"]) / "test.zip", 1)
    batch = probe.collate(processor, probe.build_chats(processor, x[:3], y[:3], classes))
    base = probe._answer_logits(model, batch)[0]
    mmpreproj.load_adapter(model, out / "adapter")
    loaded = probe._answer_logits(model, batch)[0]
    assert not torch.equal(loaded, base)  # the trained modules change the answer logits
    again = probe._answer_logits(mmpreproj.load_adapter(probe.load_vlm(str(tiny), "float32")[0], out / "adapter"),
                                 batch)[0]  # fmt: skip
    torch.testing.assert_close(again, loaded, atol=0, rtol=0)


def test_answer_labels_cover_the_class_name_and_the_end_of_turn_only(probe, tiny):
    _, processor = probe.load_vlm(str(tiny), "float32")
    chats = probe.build_chats(processor, torch.zeros(2, 3, 32, 32, dtype=torch.uint8), torch.tensor([0, 9]),
                              ["airplane", *"bcdefghi", "truck"])  # fmt: skip
    assert chats[0]["answer"] == "airplane<|im_end|>" and chats[0]["prompt"].endswith("<|im_start|>assistant\n")
    batch = probe.collate(processor, chats)
    answer = [processor.tokenizer.decode(row[row != -100]) for row in batch["labels"]]
    assert answer == ["airplane<|im_end|>", "truck<|im_end|>"]
    assert int(batch["mm_token_type_ids"].sum()) == 2 * 16  # 32x32 px, 4 px patches, 2x2 merge: 16 tokens each


def test_an_unreachable_hub_id_fails_in_one_line_with_a_nonzero_exit(probe, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network probe: cache only
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(SystemExit) as exit_:
        probe.main(["--model", "Qwen/Qwen2-VL-2B-Instruct", "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'Qwen/Qwen2-VL-2B-Instruct'" in err and "local path" in err
    assert not (tmp_path / "out").exists()
