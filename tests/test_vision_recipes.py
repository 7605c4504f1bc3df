"""The vision and video recipes' --quick modes end to end (shipped data, no downloads), and the offline message."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from mmpreproj.models import ViT
from recipes.kit import accuracy, fit_classifier
from recipes.kit.backbones import BackboneUnavailable, load_backbone
from tests.helpers.png_content import assert_draws

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def recipe(rel: str, monkeypatch: pytest.MonkeyPatch):
    """Import a recipe script as a module (registered, as dataclasses need, and removed after the test)."""
    name = f"recipe_{Path(rel).stem}"
    spec = importlib.util.spec_from_file_location(name, RECIPES / rel)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def counted(acc: float, n: int) -> bool:
    """acc is k / n for a whole number 0 <= k <= n: an accuracy over n examples, not any float in [0, 1]."""
    k = acc * n
    return 0 <= k <= n and abs(k - round(k)) < 1e-6


def check_outputs(out: Path, pngs: list[str], n_train: int | None = None, n_test: int | None = None) -> dict:
    metrics = json.loads((out / "metrics.json").read_text())
    cfg = metrics["config"]
    n_train = n_train or 10 * cfg["train_per_class"]  # CIFAR-10: per class x 10 classes
    n_test = n_test or 10 * cfg["test_per_class"]
    # each figure is decoded and must show its data: one bar per method (tab:blue) and one skip-norm line per
    # injected variant (C0, C1, ...; variants' norms may coincide, so only the top line must show) drawn
    # across the axes. loss.png is only checked to be a drawn-on PNG here; its curves are checked in
    # test_quick_loss_figure_shows_its_curves (a --quick run logs every step: `recipes.kit.log_interval`).
    series = {
        "accuracy.png": ["tab:blue"],
        "loss.png": [],
        "skip_norms.png": [f"C{i}" for i in range(len(metrics.get("skip_norms", {})))],
    }
    for name in pngs:
        assert_draws(out / name, series[name], all_visible=False)
    for r in metrics["results"].values():
        assert counted(r["test_accuracy"], n_test) and counted(r["train_accuracy"], n_train), r
        assert r["trainable_params"] > 0 and len(r["loss_curve"]) >= 1
        assert r["final_train_loss"] == r["loss_curve"][-1]
    return metrics


QUICK = ["--quick", "--threads", "1", "--no-progress"]


def test_quick_loss_figure_shows_its_curves(tmp_path, monkeypatch):
    recipe("vision/cifar_scratch.py", monkeypatch).main([*QUICK, "--out", str(tmp_path)])
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    curves = [f"C{i}" for i in range(len(metrics["results"]))]  # one loss curve per variant
    assert_draws(tmp_path / "loss.png", curves, all_visible=False)


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
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    m = check_outputs(tmp_path, ["accuracy.png", "loss.png"], metrics["train_clips"], metrics["test_clips"])
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


class Threshold(torch.nn.Module):
    """Logits that pick class 1 for values above 1.5."""

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return torch.cat([1.5 - v, v - 1.5], dim=-1)


def test_accuracy_is_the_share_of_correct_argmax():
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0]])
    y = torch.tensor([0, 0, 1, 0, 1])  # the predictions are [0, 0, 1, 1, 1]: 4 of 5 right
    model = Threshold().train()
    assert accuracy(model, x, y, lambda b, g: b, batch_size=2) == 4 / 5  # batches of 2, 2, 1
    assert model.training  # back in the mode it came in


def test_fit_classifier_learns_a_trivial_task():
    """Bright vs dark images: a tiny native ViT must get (nearly) all of them right, far above chance (50%)."""
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(96) % 2
    images = (torch.rand(96, 3, 16, 16, generator=g) * 60 + 40 + 120 * labels[:, None, None, None]).to(torch.uint8)
    torch.manual_seed(0)
    model = ViT(img_size=16, patch_size=4, num_classes=2, dim=32, depth=1, num_heads=2, positions="learned")
    prepare = lambda b, gen: b.float() / 127.5 - 1.0  # noqa: E731
    fit = fit_classifier(model, (images[:64], labels[:64]), (images[64:], labels[64:]), steps=30, batch_size=16,
                         lr=3e-3, warmup_steps=3, prepare_train=prepare, prepare_test=prepare, log_every=10,
                         progress=False)  # fmt: skip
    assert fit.test_accuracy >= 0.95 and fit.train_accuracy >= 0.95, fit
    assert fit.loss_curve[-1] < 0.5 * fit.loss_curve[0]
