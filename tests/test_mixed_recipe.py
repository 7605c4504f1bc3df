"""The mixed-modality CIFAR recipe: its data and a --quick run end to end (shipped assets only)."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "mixed"


def _load(name: str):
    sys.path.insert(0, str(RECIPE))
    try:
        spec = importlib.util.spec_from_file_location(name, RECIPE / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the file runs
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(RECIPE))


@pytest.fixture(scope="module")
def tasks():
    return _load("cifar_tasks")


def test_default_data_is_shipped(tasks):
    recipe = _load("cifar_vqa")
    data = Path(recipe.MixedConfig().data)
    assert data == REPO / "assets" / "cifar10" and "shared" not in data.parts
    x, y = tasks.load_cifar(data, "test", per_class=2)
    assert x.shape == (20, 3, 32, 32) and x.dtype == torch.uint8 and y.tolist() == [i // 2 for i in range(20)]


def test_where_question_layout(tasks):
    tok = tasks.WordTokenizer()
    images = torch.zeros(4, 3, 32, 32, dtype=torch.uint8)  # black CIFAR stand-ins: the object cell is all zeros
    rng = random.Random(0)
    for i in range(20):
        q = tasks.make_question(("row", "column")[i % 2], images, torch.arange(4), tok, rng)
        pic = q.sample.images[0]  # (3, 16 R, 16 C), normalised pixels
        words = tok.decode(q.sample.input_ids).split()
        axis, k = words[2], tasks.ORDINALS.index(tok.vocab[q.answer])
        rows, cols = pic.shape[1] // tasks.CELL, pic.shape[2] // tasks.CELL
        assert (rows if axis == "row" else cols) >= 2
        black = [(r, c) for r in range(rows) for c in range(cols)
                 if (pic[:, r * 16 : (r + 1) * 16, c * 16 : (c + 1) * 16] == pic.min()).all()]  # fmt: skip
        assert len(black) == 1 and black[0][0 if axis == "row" else 1] == k
        assert q.sample.target_ids == [q.answer, tok.eos]


def test_quick_run_writes_table_json_and_plot(tmp_path):
    recipe = _load("cifar_vqa")
    report = recipe.main(["--quick", "--threads", "1", "--out", str(tmp_path)])
    assert set(report["arms"]) == set(recipe.ARMS) and len(recipe.ARMS) == 6
    saved = json.loads((tmp_path / "results.json").read_text())
    for arm, r in saved["arms"].items():
        assert set(r["accuracy"]) == {"class", "row", "column", "which", "all"}
        assert ("routing" in r) == arm.endswith("+adapter")
    routing = saved["arms"]["mrope+adapter"]["routing"]
    assert set(routing) == {"text", "image"} and len(routing["text"]) == 2  # --quick: a 2-block decoder
    assert "| mrope+adapter |" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "routing.png").stat().st_size > 1000


# --- the Qwen2-VL arms (recipes/mixed/qwen2vl_arms.py): a tiny transformers Qwen2-VL on the same task -------------


def test_qwen2vl_batcher_expands_each_image_like_the_qwen2vl_processor(tasks):
    arms = _load("qwen2vl_arms")
    recipe = _load("cifar_vqa")
    cfg, tok = recipe.MixedConfig(quick=True), tasks.WordTokenizer()
    images, labels = tasks.load_cifar(REPO / "assets" / "cifar10", "test", per_class=1)
    rng = random.Random(0)
    qs = [tasks.make_question(k, images, labels, tok, rng) for k in ("class", "row", "which")]
    batch = arms.Qwen2VLBatcher(tok, arms.image_processor(cfg))([q.sample for q in qs])
    grids = batch["image_grid_thw"]
    assert grids[0].tolist() == [1, 8, 8]  # a 32x32 CIFAR image, 4 px patches: 8x8 patches, 4x4 decoder tokens
    assert len(grids) == 4 and batch["pixel_values"].shape == (int(grids.prod(-1).sum()), 3 * 2 * 4 * 4)
    m = tok.markers
    for b, q in enumerate(qs):
        ids = batch["input_ids"][b][batch["attention_mask"][b].bool()].tolist()
        assert ids.count(m.vision_start) == ids.count(m.vision_end) == q.sample.input_ids.count(m.image)
        answer_at = batch["labels"][b].tolist().index(q.answer)
        assert ids[answer_at] == q.answer and ids[answer_at - 1] == tok.ids["?"]
    assert batch["mm_token_type_ids"].sum() == grids.prod(-1).sum() // 4  # 2x2 merge
    model = arms.build_qwen2vl(cfg, tok, adapter=True)
    import mmpreproj

    assert {w.part for w in mmpreproj.injected_modules(model)} == {"vision", "language"}
    assert all(p.requires_grad for p in model.parameters())  # trained from scratch: nothing frozen
    assert arms._forward(model, batch).shape == (*batch["input_ids"].shape, len(tok))


def test_quick_run_with_the_qwen2vl_arms_in_the_one_table(tmp_path):
    recipe = _load("cifar_vqa")
    arms = "mrope+adapter,qwen2vl-mrope,qwen2vl-mrope+adapter"
    report = recipe.main(["--quick", "--threads", "1", "--arms", arms, "--out", str(tmp_path)])
    assert list(report["arms"]) == arms.split(",")
    base, injected = report["arms"]["qwen2vl-mrope"], report["arms"]["qwen2vl-mrope+adapter"]
    assert set(injected["accuracy"]) == {"class", "row", "column", "which", "all"} and "routing" not in base
    assert set(injected["routing"]) == {"text", "image"} and list(injected["routing"]["text"]) == [0, 1]
    assert {part: len(n) for part, n in injected["skip_norms"].items()} == {"vision": 2, "language": 2}
    assert injected["params"] > base["params"] and injected["loss"] != base["loss"]
    table = (tmp_path / "results.md").read_text()
    assert "| qwen2vl-mrope |" in table and "| qwen2vl-mrope+adapter |" in table.split("Routing")[1]
    with pytest.raises(ValueError, match="qwen2vl-mrope"):
        recipe.MixedConfig(arms="qwen2vl-nope")
