"""recipes/integrations/{hf_trainer,sft_trainer}.py on a tiny config: they train the shipped mini Pythia
offline, their checkpoints are adapters, and the saved result rebuilds the trained model exactly."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("datasets")
pytest.importorskip("trl")
pytest.importorskip("peft")

RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "integrations"
TINY = ["--steps", "4", "--save-steps", "2", "--batch-size", "2"]


def _recipe(name: str):
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", RECIPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _assert_adapter_checkpoints(out: Path, ours: Path) -> None:
    for step in (2, 4):
        names = {p.name for p in (out / f"checkpoint-{step}").iterdir()}
        assert "model.safetensors" not in names and "optimizer.pt" in names
    assert (ours / "adapter_config.json").is_file() and (ours / "adapter_model.safetensors").is_file()


def test_hf_trainer_recipe(tmp_path):
    summary = _recipe("hf_trainer").main(["--out", str(tmp_path), "--num-lines", "32", "--max-len", "32", *TINY])
    assert summary["steps"] == 4 and summary["reload_max_diff"] == 0.0
    _assert_adapter_checkpoints(tmp_path, tmp_path / "final")
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 4


def test_sft_trainer_recipe_with_preproj_lora(tmp_path):
    summary = _recipe("sft_trainer").main(
        [
            "--out",
            str(tmp_path),
            "--num-examples",
            "16",
            "--max-len",
            "96",
            "--method",
            "preproj_lora",
            "--lora-r",
            "2",
            *TINY,
        ]
    )
    assert summary["steps"] == 4 and summary["reload_max_diff"] == 0.0
    _assert_adapter_checkpoints(tmp_path, tmp_path / "final" / "preproj")
    assert json.loads((tmp_path / "final" / "adapter_config.json").read_text())["peft_type"] == "LORA"
