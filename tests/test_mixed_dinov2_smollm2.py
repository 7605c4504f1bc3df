"""The DINOv2 -> projector -> SmolLM2 recipe on tiny random parts (a 2-layer Dinov2, a 2-layer Llama built here):
generation with the KV cache equals full recompute, save / reload and unload are exact, text-only input with the
2D rotary is the plain model's bit for bit, the batches put tiles and positions where they belong, and the
runner's --quick run finishes, then finds everything done on a restart."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mmpreproj
from recipes.mixed.dinov2_smollm2.arms import Times, build_arm, load_arm, save_arm, score, train_arm
from recipes.mixed.dinov2_smollm2.features import load_tower, patch_grid
from recipes.mixed.dinov2_smollm2.model import VLM
from recipes.mixed.dinov2_smollm2.tasks import (
    WHERE,
    Encoder,
    Item,
    class_items,
    image_tokens,
    item_stream,
    mosaic_items,
    where_items,
)
from tests.helpers.procs import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[1]
CLASSES = [f"c{i}" for i in range(10)]


def _recipe():
    sys.path.insert(0, str(REPO / "recipes" / "mixed"))
    try:
        import importlib.util

        spec = importlib.util.spec_from_file_location("dinov2_smollm2_main", REPO / "recipes/mixed/dinov2_smollm2.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO / "recipes" / "mixed"))


@pytest.fixture(scope="module")
def parts():
    """The tiny LM and tokenizer of the recipe's --quick run, and tower features of 20 random images."""
    lm, tok = _recipe().tiny_lm()
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (20, 3, 32, 32), dtype=torch.uint8, generator=g)
    feats = patch_grid(load_tower("random-tiny"), images)  # (20, 4, 4, 32)
    labels = torch.arange(20) % 10
    return lm, tok, feats, labels


def _trained(parts, method, task="class", positions="2d", steps=2):
    lm, tok, feats, labels = parts
    arm = build_arm(copy.deepcopy(lm), feats.shape[-1], method, budget=0.002, layout="chunked", seed=0)
    enc = Encoder(tok, task, positions)
    stream = item_stream(task, labels, range(20), CLASSES, seed=0)
    train_arm(arm, enc, feats, stream, steps=steps, batch=4, lr=1e-2, warmup=1, times=Times(None))
    return arm, enc


def _logits(vlm, batch):
    with torch.no_grad():
        emb = vlm.embed(batch)
        return vlm.lm(inputs_embeds=emb, position_ids=batch.position_ids, attention_mask=batch.attention_mask).logits


@pytest.mark.parametrize("task, positions", [("class", "2d"), ("mosaic", "2d"), ("mosaic", "1d"), ("where", "2d")])
def test_kv_cache_generation_equals_full_recompute(parts, task, positions):
    arm, enc = _trained(parts, "proj+preproj_skip", task, positions)
    feats, labels = parts[2], parts[3]
    items = {
        "class": lambda: class_items(labels, range(6), CLASSES),
        "mosaic": lambda: mosaic_items(labels, range(20), CLASSES, 6, 0),
        "where": lambda: where_items(range(20), 6, 0),
    }[task]()
    items = [it for it in items if enc.prompt_length(it) == enc.prompt_length(items[0])]
    prompts = enc.batch(items, feats, with_answer=False)
    never = -1  # no eos: every step runs
    cached = arm.vlm.generate(prompts, 6, never)
    assert cached.shape == (len(items), 6)
    assert torch.equal(cached, arm.vlm.generate_recompute(prompts, 6, never))


@pytest.mark.parametrize("method", ["proj", "proj+preproj_skip", "proj+lora"])
def test_save_and_reload_give_equal_logits(parts, method, tmp_path):
    arm, enc = _trained(parts, method)
    lm, _, feats, labels = parts
    batch = enc.batch(class_items(labels, range(5), CLASSES), feats, with_answer=True)
    before = _logits(arm.vlm, batch)
    save_arm(arm, tmp_path / "arm")
    again = load_arm(copy.deepcopy(lm), feats.shape[-1], method, tmp_path / "arm", layout="chunked")
    assert torch.equal(_logits(again.vlm, batch), before)
    if method != "proj":  # the adapter did something (a test that can fail)
        base = load_arm(copy.deepcopy(lm), feats.shape[-1], "proj", tmp_path / "arm", layout="chunked")
        assert not torch.allclose(_logits(base.vlm, batch), before)


def test_unload_gives_the_base_lm_back_exactly(parts):
    lm, tok, feats, labels = parts
    arm, enc = _trained(parts, "proj+preproj_skip")
    batch = enc.batch(class_items(labels, range(5), CLASSES), feats, with_answer=True)
    reference = VLM(copy.deepcopy(lm), feats.shape[-1])  # the same base, rotary swapped, nothing injected
    reference.projector.load_state_dict(arm.vlm.projector.state_dict())
    assert not torch.allclose(_logits(arm.vlm, batch), _logits(reference, batch))
    mmpreproj.unload(arm.vlm.lm)
    assert torch.equal(_logits(arm.vlm, batch), _logits(reference, batch))


def test_text_only_input_with_the_2d_rotary_is_the_plain_model(parts):
    lm, tok, _, _ = parts
    plain = copy.deepcopy(lm)
    vlm = VLM(copy.deepcopy(lm), 32)
    ids = torch.tensor(
        [tok("<|im_start|>user\nWhat is in the picture?<|im_end|>\n", add_special_tokens=False)["input_ids"]]
    )
    n = ids.shape[1]
    with torch.no_grad():
        want = plain(ids).logits
        got = vlm.lm(ids, position_ids=torch.arange(n)[None, None].expand(3, 1, n)).logits
    assert torch.equal(got, want)


def test_mosaic_tiles_and_positions(parts):
    lm, tok, feats, labels = parts
    item = Item((3, 7, 11, 15), "Where is the c1: top left, top right, bottom left or bottom right?", "top right")
    grid = image_tokens("mosaic", feats, item, tile=2)  # (4, 4, D)
    assert torch.allclose(grid[:2, 2:].mean((0, 1)), feats[7].mean((0, 1)), atol=1e-6)  # top right = image 7
    assert torch.allclose(grid[2:, :2].mean((0, 1)), feats[11].mean((0, 1)), atol=1e-6)  # bottom left = image 11
    b2 = Encoder(tok, "mosaic", "2d").batch([item], feats, with_answer=True)
    b1 = Encoder(tok, "mosaic", "1d").batch([item], feats, with_answer=True)
    start = int(b2.image_mask[0].nonzero()[0])
    img = b2.position_ids[:, 0, b2.image_mask[0]]  # (3, 16)
    assert torch.equal(img[0], torch.full((16,), start))  # t: one frame
    assert torch.equal(img[1], start + torch.arange(4).repeat_interleave(4))  # rows
    assert torch.equal(img[2], start + torch.arange(4).repeat(4))  # columns
    assert torch.equal(b1.position_ids, torch.arange(b1.ids.shape[1])[None, None].expand(3, 1, -1))
    answer = tok.decode(b2.targets[0][b2.targets[0] != -100].tolist())  # the answer tokens are the targets
    assert answer.replace("<|im_end|>", "").strip() == "top right"
    held = mosaic_items(labels, range(20), CLASSES, 8, seed=0)
    assert [it.answer for it in held] == list(WHERE) * 2
    for it in held:  # four different classes, the asked one at the answer's tile
        assert len({int(labels[i]) for i in it.images}) == 4
        asked = it.question.split()[3].rstrip(":")
        assert CLASSES[int(labels[it.images[WHERE.index(it.answer)]])] == asked


def test_where_puts_one_picture_at_its_place_among_empty_tiles(parts):
    lm, tok, feats, labels = parts
    held = where_items(range(20), 8, seed=0)
    assert [it.answer for it in held] == list(WHERE) * 2 and all(len(it.images) == 1 for it in held)
    item = next(it for it in held if it.answer == "bottom left")
    grid = image_tokens("where", feats, item, tile=2)  # (4, 4, D)
    assert torch.allclose(grid[2:, :2].mean((0, 1)), feats[item.images[0]].mean((0, 1)), atol=1e-6)
    assert not grid[:2].any() and not grid[2:, 2:].any()  # the three other tiles are empty
    batch = Encoder(tok, "where", "2d").batch([item], feats, with_answer=True)
    answer = tok.decode(batch.targets[0][batch.targets[0] != -100].tolist())
    assert answer.replace("<|im_end|>", "").strip() == "bottom left"
    stream = item_stream("where", labels, range(20), CLASSES, seed=1)
    assert {next(stream).answer for _ in range(40)} == set(WHERE)


def test_score_counts_exact_matches(parts, monkeypatch):
    arm, enc = _trained(parts, "proj")
    feats, labels = parts[2], parts[3]
    items = class_items(labels, range(4), CLASSES)
    monkeypatch.setattr(
        "recipes.mixed.dinov2_smollm2.arms.answer_text",
        lambda tok, tokens, eos: ["c0", "x", "c2", "c9"][: len(tokens)],
    )
    res = score(arm, enc, feats, items, batch=4, times=Times(None), kind="test")
    assert res["items"]["item_correct"] == [1.0, 0.0, 1.0, 0.0] and res["acc"] == 0.5


@pytest.mark.slow
def test_quick_run_finishes_and_a_restart_trains_nothing(tmp_path):
    cmd = [sys.executable, str(REPO / "recipes/mixed/dinov2_smollm2.py"), "--quick", "--out", str(tmp_path / "ev")]
    cmd += [
        "--runs",
        str(tmp_path / "runs"),
        "--groups",
        "class/proj,class/proj+preproj_skip,where/2d+preproj_skip,where/1d+preproj_skip",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    subprocess.run(cmd, check=True, env=env, cwd=REPO, capture_output=True, timeout=HANG_GUARD_S)
    report = (tmp_path / "ev" / "report.md").read_text()
    assert "| class/proj+preproj_skip | proj+preproj_skip |" in report and "CPU-hours" in report
    select = json.loads((tmp_path / "ev/arms/class/proj/lr-0.001-seed-1/select.json").read_text())
    assert set(select["items"]["select"]) == {"item_correct", "item_loss", "generated"}
    times = sorted((tmp_path / "ev").rglob("times.jsonl"))
    lines = {p: len(p.read_text().splitlines()) for p in times}
    assert len(times) == 2 * 4 and all(lines.values())
    out = subprocess.run(cmd, check=True, env=env, cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert "select " not in out.stderr and {p: len(p.read_text().splitlines()) for p in times} == lines
    one = [*cmd[:-1], "class/proj"]  # a run of one group trains nothing here and keeps every finished row
    subprocess.run(one, check=True, env=env, cwd=REPO, capture_output=True, timeout=HANG_GUARD_S)
    assert (tmp_path / "ev" / "report.md").read_text() == report
