"""Sizes at a budget (`train.sizes`), the TrainConfig size fields, and the `budget` study end to end on a tiny host."""

from __future__ import annotations

import functools
import json
import math

import pytest
import torch

from mmpreproj.experiments.arms import arm_key
from mmpreproj.experiments.budget import budget_study
from mmpreproj.experiments.runner import doubling_step, next_lr
from mmpreproj.train import get_preset
from mmpreproj.train.sizes import budget_params, sizes_for_budget, sizes_for_method
from mmpreproj_tables.values import parse_budgets


def test_sizes_at_one_percent_of_mini_pythia_by_hand():
    # mini-pythia: d=256, 4 blocks, 7,353,856 weights; 1% = 73,539. LoRA on query_key_value (r(d + 3d)) + dense
    # (r(d + d)) is 6 d r per block = 6,144 r -> r = 12; the others spend units of 2 d L = 2,048 weights -> 36
    b, d, L = round(0.01 * 7_353_856), 256, 4
    assert sizes_for_budget("lora", b, dim=d, layers=L) == {"lora_r": 12}
    assert sizes_for_budget("skip", b, dim=d, layers=L) == {"skip_rank": 36}
    assert sizes_for_budget("preproj", b, dim=d, layers=L) == {"expansion": 36 / 256}
    assert sizes_for_budget("preproj_skip", b, dim=d, layers=L) == {"expansion": 18 / 256, "skip_rank": 18}
    for method in ("lora", "skip", "preproj", "preproj_skip"):
        assert budget_params(sizes_for_budget(method, b, dim=d, layers=L), method, dim=d, layers=L) == 73_728


def test_a_skip_rank_reaching_d_is_out_of_reach_and_widths_survive_rounding():
    assert sizes_for_budget("skip", 2 * 256 * 4 * 256, dim=256, layers=4) is None  # rank 256 = d
    assert sizes_for_budget("skip", 2 * 256 * 4 * 255, dim=256, layers=4) == {"skip_rank": 255}
    for width in range(1, 400):  # d = 3 * 5 * 7: widths / d are not dyadic, int(e * d) must still give the width
        e = sizes_for_budget("preproj", 2 * 105 * width, dim=105, layers=1)["expansion"]
        assert int(e * 105) == width
    with pytest.raises(ValueError, match="allowed values"):
        sizes_for_budget("dora", 100, dim=8, layers=1)
    with pytest.raises(ValueError, match="budget="):
        sizes_for_budget("lora", 0, dim=8, layers=1)


def test_size_overrides_reach_only_the_methods_with_that_module():
    sizes = {"expansion": 0.5, "skip_rank": 4, "layers": [0], "steps": 3}
    assert sizes_for_method("lora", sizes) == {"steps": 3}
    assert sizes_for_method("skip", sizes) == {"skip_rank": 4, "layers": [0], "steps": 3}
    assert sizes_for_method("preproj_lora", sizes) == {"expansion": 0.5, "layers": [0], "steps": 3}
    assert sizes_for_method("preproj_skip", sizes) == sizes


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(method="lora", skip_rank=4), "skip_rank"),
        (dict(method="skip", expansion=0.5), "expansion"),
        (dict(method="lora", layers=[0]), "layers"),
        (dict(method="preproj_skip", skip_rank=0), "skip_rank"),
        (dict(method="preproj_skip", skip_rank=2.0), "skip_rank"),
        (dict(method="preproj_skip", expansion=0), "expansion"),
        (dict(method="preproj_skip", layers=[]), "layers"),
        (dict(method="preproj_skip", parts=["a", "a"]), "parts"),
    ],
)
def test_train_config_refuses_bad_sizes_naming_the_field(kw, field):
    with pytest.raises(ValueError, match=f"TrainConfig.{field}"):
        get_preset("mini", **kw)


def test_arm_key_leaves_default_sizes_out_so_older_arms_still_match():
    cfg = get_preset("mini", method="preproj_skip")
    key = arm_key(cfg, {})
    assert not {"expansion", "skip_rank", "layers", "parts"} & set(key["train"])
    sized = arm_key(get_preset("mini", method="preproj_skip", skip_rank=8), {})
    assert sized["train"]["skip_rank"] == 8 and sized != key


def test_parse_budgets_and_the_lr_search_step():
    assert parse_budgets("0.01, 0.1") == [0.01, 0.1]
    for bad in ("0", "1.5", "x", "0.1,0.1", ","):
        with pytest.raises(ValueError, match="budgets"):
            parse_budgets(bad)
    two_x = functools.partial(next_lr, step=doubling_step)  # the budget search's step: 2x past an edge
    assert two_x({1e-3: 10.0, 2e-3: 9.0, 4e-3: 8.0}) == 8e-3  # best at the top edge: 2x up
    assert two_x({1e-3: 8.0, 2e-3: 9.0}) == 5e-4  # at the bottom edge: 2x down
    assert two_x({1e-3: 9.0, 2e-3: 8.0, 4e-3: None}) is None  # inside (a diverged neighbour counts as tried)
    assert two_x({1e-3: None, 2e-3: None}) == 5e-4  # all diverged: lower
    assert two_x({0.4: 9.0, 0.2: 10.0}) is None  # 0.8 is past the search's bound


def test_budget_study_end_to_end(tiny_model_dir, tmp_path):
    """A tiny host (d=32, 2 blocks, 541,440 weights) at 0.5%: every arm's trainable count is the formula's,
    the search stops with its best LR inside what it tried or at its extension limit, the other seed trains at
    the best LR, the report compares with LoRA, and a second call reads every point back."""
    out = tmp_path / "budget"
    kw = dict(
        budgets=[0.005],
        methods=["lora", "preproj_skip"],
        seeds=2,
        max_extend=1,
        paper_point=False,
        start_lrs=[1e-3, 2e-3],
        eval_settings={"limit": 8},
        progress=False,
        train_overrides={"model": str(tiny_model_dir), "steps": 2, "warmup_steps": 1, "save_every": 0},
    )
    doc = budget_study("mini", out, **kw)
    assert doc["dim"] == 32 and doc["layers"] == 2
    rows = {r["method"]: r for r in doc["summary"]}
    b = round(0.005 * doc["base_params"])  # 2,707 -> LoRA r = round(2707 / 384) = 7; units 21 -> width 10, rank 11
    assert rows["lora"]["sizes"] == {"lora_r": 7} and rows["lora"]["params"] == 7 * 6 * 32 * 2
    assert rows["preproj_skip"]["sizes"] == {"expansion": 10 / 32, "skip_rank": 11}
    assert rows["preproj_skip"]["params"] == 2 * 32 * 10 * 2 + 2 * 11 * 32 * 2
    assert abs(rows["lora"]["params"] - b) < 6 * 32 * 2 and abs(rows["preproj_skip"]["params"] - b) < 2 * 32 * 2
    for r in rows.values():
        assert 2 <= len(r["curve"]) <= 3 and r["n"] == 2 and set(r["ppl"]) == {"42", "43"}  # JSON keys
        lrs = sorted(float(x) for x in r["curve"])
        assert all(math.isclose(hi / lo, 2) for lo, hi in zip(lrs, lrs[1:]))  # 2x apart
    assert "vs_lora" in rows["preproj_skip"] and "vs_lora" not in rows["lora"]
    v = rows["preproj_skip"]["vs_lora"]
    assert v["seeds"] is not None and v["items"] is not None
    assert v["diff"] == pytest.approx(rows["preproj_skip"]["mean"] - rows["lora"]["mean"])
    report = (out / "report.md").read_text()
    assert "| b0.005 | preproj_skip | expansion 0.3125, skip rank 11 |" in report
    for png in ("pareto.png", "lr-b0.005.png"):
        assert (out / png).stat().st_size > 1000
    again = budget_study("mini", out, **kw)
    assert again["reused"] == len(doc["points"]) and again["summary"] == json.loads(json.dumps(doc["summary"]))
    # read_only: the finished points come back as they are, a method with none is "not run", nothing trains
    arms = sorted(p for p in out.rglob("*") if p.is_dir())
    ro = budget_study("mini", out, **{**kw, "methods": ["lora", "preproj_skip", "skip"]}, read_only=True)
    assert ro["summary"] == again["summary"] and ro["not_run"] == ["b0.005 skip"]
    assert sorted(p for p in out.rglob("*") if p.is_dir()) == arms
    assert "Not run (no finished point): b0.005 skip." in (out / "report.md").read_text()
    empty = budget_study("mini", tmp_path / "empty", **kw, read_only=True)
    assert empty["points"] == [] and empty["not_run"] == ["b0.005 lora", "b0.005 preproj_skip"]


def test_a_trained_rank_r_arm_has_the_formulas_count(tiny_model_dir, tmp_path):
    from mmpreproj.method.estimate import trainable_report
    from mmpreproj.train import train

    cfg = get_preset(
        "mini",
        method="preproj_skip",
        model=str(tiny_model_dir),
        steps=1,
        warmup_steps=0,
        save_every=0,
        expansion=0.25,
        skip_rank=3,
        layers=[-1],
        out=str(tmp_path / "run"),
        progress=False,
    )
    model = train(cfg).model
    r = trainable_report(model)
    assert (r.preproj, r.skip) == (2 * 32 * 8, 2 * 3 * 32)  # one block (-1): width int(0.25 * 32) = 8
    saved = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert (saved["skip_rank"], saved["layers"]) == (3, [-1])
    assert torch.is_tensor(model.gpt_neox.layers[1].attention.slots()[1].up.weight)
