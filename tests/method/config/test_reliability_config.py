"""Every field of PreProjConfig and TrainConfig is type-checked when built and when read from JSON; the
message names the field, the value and what is allowed."""

from __future__ import annotations

import json
import math

import pytest

from mmpreproj import PreProjConfig
from mmpreproj.train import TrainConfig
from mmpreproj.util.validate import ConfigTypeError


@pytest.mark.parametrize(
    ("field", "value", "expect"),
    [
        ("expansion", math.inf, "PreProjConfig.expansion=inf (float); must be a finite number"),
        ("expansion", math.nan, "PreProjConfig.expansion=nan (float); must be a finite number"),
        ("expansion", "1.25", "PreProjConfig.expansion='1.25' (str); must be a finite number"),
        ("expansion", True, "PreProjConfig.expansion=True (bool); must be a finite number"),
        ("expansion", 10**400, "must be a finite number"),
        ("expansion", 0.0, "PreProjConfig.expansion=0.0; must be a finite number in (0, 16]"),
        ("skip_init_std", math.nan, "PreProjConfig.skip_init_std=nan (float); must be None or a finite number"),
        ("skip_init_std", -0.1, "PreProjConfig.skip_init_std=-0.1; must be a finite number >= 0"),
        ("preproj", "yes", "PreProjConfig.preproj='yes' (str); must be a bool (true/false)"),
        ("skip", 1, "PreProjConfig.skip=1 (int); must be a bool"),
        ("freeze_base", None, "PreProjConfig.freeze_base=None (NoneType); must be a bool"),
        ("fuse_qkv_skip", True, "PreProjConfig.fuse_qkv_skip was removed"),
        ("activation", 3, "PreProjConfig.activation=3 (int); must be a string"),
        ("activation", "tanh", "PreProjConfig.activation='tanh'; allowed values: ['gelu', 'relu', 'silu']"),
        ("init", "zeros", "PreProjConfig.init='zeros'; allowed values: ['paper', 'identity']"),
        ("layers", "0", "PreProjConfig.layers='0' (str); must be None or a list of ints"),
        ("layers", [1.0], "PreProjConfig.layers=[1.0] (list); must be None or a list of ints"),
        ("layers", [True], "PreProjConfig.layers=[True] (list); must be None or a list of ints"),
        ("layers", [], "PreProjConfig.layers=[]; must be None (every block) or a non-empty list"),
    ],
)
def test_preproj_config_fields_are_typed(field, value, expect):
    with pytest.raises(ValueError) as err:
        PreProjConfig(**{field: value})
    assert expect in str(err.value)


@pytest.mark.parametrize(
    ("field", "value", "expect"),
    [
        ("steps", True, "TrainConfig.steps=True (bool); must be an int"),
        ("steps", 2.0, "TrainConfig.steps=2.0 (float); must be an int"),
        ("lr", "1e-3", "TrainConfig.lr='1e-3' (str); must be a finite number"),
        ("lr", math.inf, "TrainConfig.lr=inf (float); must be a finite number"),
        ("lr", -1.0, "TrainConfig.lr=-1.0; must be a finite number > 0"),
        ("packing", 1, "TrainConfig.packing=1 (int); must be a bool"),
        ("resume", "false", "TrainConfig.resume='false' (str); must be a bool"),
        ("method", None, "TrainConfig.method=None (NoneType); must be a string"),
        ("data_config", 3, "TrainConfig.data_config=3 (int); must be None or a string"),
        ("adam_betas", (0.9,), "TrainConfig.adam_betas=(0.9,) (tuple); must be 2 finite numbers"),
        ("adam_betas", (0.9, math.nan), "must be 2 finite numbers"),
        ("max_grad_norm", math.inf, "TrainConfig.max_grad_norm=inf (float); must be None or a finite number"),
        ("seed", -1, "TrainConfig.seed=-1; must be an int in [0, 2**32)"),
        ("model", "", "TrainConfig.model=''; must be a non-empty string"),
        ("data", " ", "TrainConfig.data=' '; must be a non-empty string"),
        ("lora_r", True, "TrainConfig.lora_r=True (bool); must be None or an int"),
        ("min_chars", -1, "TrainConfig.min_chars=-1; must be an int >= 0"),
        ("stop_at", 1.5, "TrainConfig.stop_at=1.5 (float); must be None or an int"),
    ],
)
def test_train_config_fields_are_typed(field, value, expect):
    with pytest.raises(ValueError) as err:
        TrainConfig(**{field: value})
    assert expect in str(err.value)


def test_type_errors_are_both_type_and_value_errors_and_numbers_normalise():
    with pytest.raises(TypeError):
        PreProjConfig(expansion="2")
    assert issubclass(ConfigTypeError, ValueError)
    cfg = PreProjConfig(expansion=2, skip_init_std=0, layers=(0, 1))
    assert (type(cfg.expansion), type(cfg.skip_init_std), cfg.layers) == (float, float, [0, 1])
    assert TrainConfig(adam_betas=[0.8, 0]).adam_betas == (0.8, 0.0)


def test_json_read_checks_types_and_names_the_file(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps(TrainConfig().to_dict() | {"lr": "fast"}))
    with pytest.raises(ValueError, match=r"TrainConfig.lr='fast' \(str\); must be a finite number"):
        TrainConfig.from_json(f)
    f.write_text("lr = 1e-3\n")
    with pytest.raises(ValueError, match=r"TrainConfig: .*c.json is not valid JSON"):
        TrainConfig.from_json(f)
    f.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"PreProjConfig: .*c.json holds a JSON list, expected an object"):
        PreProjConfig.from_json(f)
    f.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ValueError, match=r"c.json is not valid JSON"):
        PreProjConfig.from_json(f)
    with pytest.raises(ValueError, match=r"PreProjConfig: expected a JSON object \(a dict of fields\), got str"):
        PreProjConfig.from_dict("preproj")
