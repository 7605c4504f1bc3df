"""The vision and video recipes' --quick modes end to end (shipped data, no downloads), and the offline message."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from recipes.kit.backbones import BackboneUnavailable, load_backbone

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def recipe(rel: str, monkeypatch: pytest.MonkeyPatch):
    """Import a recipe script as a module (registered, as dataclasses need, and removed after the test)."""
    name = f"recipe_{Path(rel).stem}"
    spec = importlib.util.spec_from_file_location(name, RECIPES / rel)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def check_outputs(out: Path, pngs: list[str]) -> dict:
    metrics = json.loads((out / "metrics.json").read_text())
    for name in pngs:
        assert (out / name).stat().st_size > 1000, name
    for r in metrics["results"].values():
        assert 0.0 <= r["test_accuracy"] <= 1.0 and 0.0 <= r["train_accuracy"] <= 1.0
        assert r["trainable_params"] > 0 and r["loss_curve"]
    return metrics


QUICK = ["--quick", "--threads", "1", "--no-progress"]


def test_cifar_scratch_quick(tmp_path, monkeypatch):
    recipe("vision/cifar_scratch.py", monkeypatch).main([*QUICK, "--out", str(tmp_path)])
    m = check_outputs(tmp_path, ["accuracy.png", "loss.png", "skip_norms.png"])
    assert set(m["results"]) == {"learned", "learned+rope2d", "learned+preproj", "learned+rope2d+preproj"}
    assert len(m["skip_norms"]["learned+preproj"]) == 2  # one per block


@pytest.mark.parametrize("backbone", ["random-tiny", "random-tiny-clip"])
def test_cifar_probe_quick(tmp_path, monkeypatch, backbone):
    recipe("vision/cifar_probe.py", monkeypatch).main([*QUICK, "--backbone", backbone, "--out", str(tmp_path)])
    m = check_outputs(tmp_path, ["accuracy.png", "loss.png", "skip_norms.png"])
    r = m["results"]
    assert r["linear"]["trainable_params"] == 64 * 10 + 10
    lora = r["lora"]["trainable_params"] - 650
    assert abs(lora - 4 * 2 * 64 * 80) / (4 * 2 * 64 * 80) < 0.05  # LoRA sized like the pre-projection


@pytest.mark.parametrize("task", ["shuffled", "reversed"])
def test_clip_order_quick(tmp_path, monkeypatch, task):
    recipe("video/clip_order.py", monkeypatch).main([*QUICK, "--task", task, "--out", str(tmp_path)])
    m = check_outputs(tmp_path, ["accuracy.png", "loss.png"])
    assert set(m["results"]) == {"rope3d", "rope1d", "learned"}
    assert m["test_clips"] > 0 and m["train_clips"] > m["test_clips"]


def test_pretrained_weights_unavailable_is_one_clear_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing cached: the cache-only path must fail at once
    with pytest.raises(BackboneUnavailable) as err:
        load_backbone("timm:test_vit")
    msg = str(err.value)
    assert "\n" not in msg and "test_vit" in msg and "--checkpoint" in msg and "random-tiny" in msg
    with pytest.raises(BackboneUnavailable, match="checkpoint"):
        load_backbone("timm:test_vit", checkpoint="/nonexistent/weights.safetensors")
    with pytest.raises(ValueError, match="unknown backbone"):
        load_backbone("resnet")
