"""`PreProjConfig`: what to inject and how, validated up front; a `peft.PeftConfig` (peft_type "PREPROJ").

Saved as the adapter's `adapter_config.json` (peft's file): the fields below, peft's own fields
(`peft_type`, `task_type`, `base_model_name_or_path`, `inference_mode`, ...) and `injection`, what the
injection resolved (host row, description, blocks, widths, module paths), so a reload needs no code.

`PREPROJ`, this method's member of peft's `PeftType` enum, is added once at import. peft keys every method by a
member of its closed enum (`register_peft_method` refuses a name the enum lacks), so a method outside peft's tree
must add its member first. This is the one process-wide change mmpreproj makes at import, and it only adds: no
existing member, mapping or peft function is touched. Adding a member goes through the enum's internals
(`_member_map_`, `_value2member_map_`, `_member_names_`), so it is guarded: outside the peft versions it was tested
on (`TESTED_PEFT`, the bound in pyproject.toml), or on a Python whose enums lack those internals, `import mmpreproj`
fails with one line naming the versions, never with a half-registered method. The floor is the oldest peft whose
whole peft test surface passes (`make test-peft-floor` runs a subset on it). peft 0.20 lacks the tuner's
state-dict hooks (a shim routing peft's state-dict functions through them passed that subset, but not the rest:
preproj_lora's stacked files, mixed-batch errors, add_adapter's record, FSDP2 saves); 0.19's
`build_peft_weight_mapping` drops a GPT-NeoX adapter's weights in transformers' `load_adapter` (any method's),
0.18 has no such mapping, 0.16-0.17 do not import under transformers 5, 0.15 has no
`BaseTunerLayer.set_requires_grad`, and `register_peft_method` is new in 0.15.

The sizes at a trainable budget (`preproj_sizes`, the one formula `PreProjConfig.for_budget` and the budget study,
`train/sizes.py`, use). Per attention block (d = width, L blocks), with u = round(B / (2 d L)) units of 2*d*L
weights each:
- skip alone: the rank-u skip's 2 u d per block; unreachable at u >= d (the full d x d skip is cheaper);
- pre-projection alone: inner width w = u (expansion w / d, a bottleneck below 1);
- both: the units split evenly, w = round(u / 2), skip rank u - w.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import peft
import torch
from packaging.version import Version
from peft import PeftConfig
from peft.utils.peft_types import PeftType
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from mmpreproj_tables.tables import ADAPTER_WEIGHTS_NAME, MAX_EXPANSION  # the command checks --expansion alike

from ..hosts.paths import PathError, check_path
from ..hosts.registry import as_host
from ..hosts.spec import HostSpec, Site, resolve_sites
from ..modules import ContentSkip, PreProjection
from ..modules.compute import COMPUTE_DTYPES
from ..modules.preproj import ACTIVATIONS, PREPROJ_INITS
from ..util.jsonconfig import JsonConfig
from ..util.validate import check_choice, check_field_types, check_rule
from ..version import __version__
from .convert import renamed_slots
from .file_check import DIGEST_KEY, PEFT_PREFIX, check_file_tensors, check_weights_digest, peft_head_keys


def expansion_for_width(width: int, dim: int) -> float:
    """An expansion e with int(e * dim) == width (width / dim, nudged up where float rounding would cut it)."""
    e = width / dim
    while int(e * dim) < width:
        e = math.nextafter(e, math.inf)
    return e


def preproj_sizes(
    budget: int, *, dim: int, layers: int, preproj: bool = True, skip: bool = True
) -> dict[str, Any] | None:
    """{"expansion", "skip_rank"} (those of the modules asked for) at about `budget` trainable weights; None
    where the skip's rank would reach `dim`."""
    if not (preproj or skip):
        raise ValueError("preproj_sizes: ask for the pre-projection, the skip or both")
    units = max(1, round(budget / (2 * dim * layers)))
    if not preproj:
        return None if units >= dim else {"skip_rank": units}
    if not skip:
        return {"expansion": expansion_for_width(units, dim)}
    width = max(1, round(units / 2))
    rank = max(1, units - width)
    return None if rank >= dim else {"expansion": expansion_for_width(width, dim), "skip_rank": rank}


TESTED_PEFT = ("0.21", "0.22")  # [lowest, first untested): keep equal to pyproject.toml's `peft>=0.21,<0.22`
_ENUM_INTERNALS = ("_member_map_", "_value2member_map_", "_member_names_")


def check_peft_version(version: str | None = None) -> None:
    """ImportError (one line, the versions named) unless peft `version` (default: the installed one) is in
    `TESTED_PEFT` and the enum has the internals `add_peft_type` writes."""
    found = version or peft.__version__
    low, high = TESTED_PEFT
    if not Version(low) <= Version(found) < Version(high):
        raise ImportError(
            f"mmpreproj registers its peft method PREPROJ through peft internals tested on peft >={low},"
            f"<{high}; found peft {found}: pip install 'peft>={low},<{high}'"
        )
    missing = [a for a in _ENUM_INTERNALS if not hasattr(PeftType, a)]
    if missing:
        raise ImportError(
            f"mmpreproj cannot add PREPROJ to peft's PeftType on Python {sys.version.split()[0]}: "
            f"the enum has no {', '.join(missing)} (tested on Python 3.11)"
        )


def add_peft_type(name: str) -> PeftType:
    """`PeftType[name]`, added to the enum if absent (value == name, like peft's own members); idempotent."""
    if name in PeftType.__members__:
        return PeftType[name]
    member = str.__new__(PeftType, name)
    member._name_, member._value_ = name, name
    member._sort_order_ = len(PeftType._member_names_)
    PeftType._member_map_[name] = member
    PeftType._value2member_map_[name] = member
    PeftType._member_names_.append(name)
    type.__setattr__(PeftType, name, member)  # what `PeftType.PREPROJ` reads (EnumType.__setattr__ refuses members)
    return member


check_peft_version()
PREPROJ = add_peft_type("PREPROJ")


SKIP_INIT_STD = {"paper": 1e-4, "identity": 0.0}  # `W_skip`'s init std under each `init` (skip_init_std=None)

# The adapter file format this library writes and the newest it reads (CHANGELOG.md, "Versions"):
#   1: mmpreproj <= 0.3 (`adapter_type: "mmpreproj"`, `blocks.{i}.*` keys; read through `method/convert.py`)
#   2: mmpreproj 0.4 (peft's layout: `peft_type: "PREPROJ"`, peft's keys, `injection.weights_digest`)
#   3: the skip's slot is `preproj_skip` (every slot starts with the peft prefix "preproj"); 1 and 2 are read
#      through `method/convert.py`
# A config without `format_version` was written before the field existed (format 1 or 2, both read here).
ADAPTER_FORMAT = 3

FUSE_QKV_SKIP_REMOVED = (
    "PreProjConfig.fuse_qkv_skip was removed after mmpreproj 0.1.0: the one-matmul Q/K/V + skip path gave no reliable "
    "speed-up over the plain path (README, Performance) and needed a copy of the host's attention forward"
)


# what peft's `PeftModel.save_pretrained` writes in place before it calls `PreProjConfig.save_pretrained`
PEFT_WRITES_BEFORE_CONFIG = ("README.md", ADAPTER_WEIGHTS_NAME, "adapter_model.bin")

# peft's targeting words (`PreProjConfig.__init__` takes them to refuse or translate; not fields)
PEFT_TARGETING = ("target_modules", "exclude_modules", "layers_to_transform", "layers_pattern")

# peft's own PeftConfig fields: peft checks them; ours are checked by `check_field_types`
PEFT_FIELDS = (
    "task_type",
    "peft_type",
    "auto_mapping",
    "peft_version",
    "base_model_name_or_path",
    "revision",
    "inference_mode",
)


@dataclass
class PreProjConfig(JsonConfig, PeftConfig):
    """Configuration of the injected modules; a `peft.PeftConfig` (`peft.get_peft_model(model, PreProjConfig())`).

    Args:
        preproj: add the pre-projection `x~ = x^ + W_down·act(W_up·x^)` before Q/K/V.
        skip: add the content skip `W_skip·x~` beside the attention output.
        expansion: pre-projection inner width as a multiple of d (paper: 1.25); below 1 it is a bottleneck
            (1/16: inner width d/16), `2*d*int(expansion*d)` weights per block either way.
        activation: pre-projection activation, one of "silu", "gelu", "relu".
        init: "paper" (the pre-projection's weights N(0, 0.01), `W_skip` N(0, 1e-4)) or "identity" (`W_down` = 0
            and `W_skip` = 0: the whole adapter starts as the identity, outputs equal the frozen base's: bit for
            bit on most hosts, to ~1e-6 in float32 where the attention takes another kernel; docs/peft-guide.md).
        skip_init_std: std of the `W_skip` init; None = the init's (1e-4 for "paper", 0 for "identity");
            0 = exact zero.
        skip_rank: None (the paper's full d x d `W_skip`, `d*d` weights per block) or r >= 1 for a low-rank
            `W_skip = B A` (B: d x r, A: r x d; `2*r*d` weights per block). Init: B ~ N(0, skip_init_std),
            A ~ N(0, 1/sqrt(r)), so `skip_init_std=0` is an exact zero skip (`modules.ContentSkip`).
        parts: host parts to inject into, e.g. ["vision", "language"] for a VLM (None = the row's default
            parts; `mmpreproj.hosts.HOSTS[row].parts` lists them).
        layers: block indices to inject into (None = every block of the selected parts; negative indices
            count from the end). A list indexes the selected parts' blocks in order; a dict
            `{"language": [-4, -3, -2, -1]}` selects per part (a part it does not name gets every block).
        modules_to_save: base modules that train beside the injected ones and are saved in the adapter
            (peft's name): names the host row declares (e.g. "projector") or attribute paths.
        freeze_base: freeze every parameter of the host so only injected weights train.
        fuse_qkv_skip: removed (see `FUSE_QKV_SKIP_REMOVED`); accepted as False so old adapter files load.
        compute_dtype: "input" (fp32 weights computing in the host's/autocast's dtype) or "float32".
        host: None = detect the host row; a row name (`mmpreproj.hosts.HOSTS`) forces that row; a description
            dict says where the blocks, norms and attention are (`mmpreproj.hosts.spec`; data, never code).
        injection: what the injection resolved, written by the tuner and read on reload (not set by hand).
        format_version: the adapter file format the config was written in (`ADAPTER_FORMAT`; not set by
            hand). A newer format than this library reads is refused, naming both library versions.
    """

    INIT_KEYS: ClassVar[tuple[str, ...]] = PEFT_TARGETING  # `from_dict` hands them on: refused or translated

    preproj: bool = True
    skip: bool = True
    expansion: float = 1.25
    activation: str = "silu"
    init: str = "paper"
    skip_init_std: float | None = None  # resolved in __post_init__: the init's own
    skip_rank: int | None = None
    parts: list[str] | None = None
    layers: list[int] | dict[str, list[int]] | None = None
    modules_to_save: list[str] | None = None
    freeze_base: bool = True
    compute_dtype: str = "input"
    host: str | dict | None = None
    injection: dict | None = field(default=None, compare=False)
    library_version: str = field(default=__version__, compare=False)
    format_version: int = field(default=ADAPTER_FORMAT, compare=False)
    fuse_qkv_skip: InitVar[bool | None] = None  # removed; not stored, not saved
    # peft's targeting words (LoraConfig's): mapped onto `layers` or refused, naming `layers` / `parts`
    target_modules: InitVar[Any] = None
    exclude_modules: InitVar[Any] = None
    layers_to_transform: InitVar[Any] = None
    layers_pattern: InitVar[Any] = None

    def __post_init__(
        self,
        fuse_qkv_skip: bool | None,
        target_modules: Any = None,
        exclude_modules: Any = None,
        layers_to_transform: Any = None,
        layers_pattern: Any = None,
    ) -> None:
        _removed_fuse_qkv_skip(fuse_qkv_skip, warn=True)
        self._peft_targeting(target_modules, exclude_modules, layers_to_transform, layers_pattern)
        PeftConfig.__post_init__(self)
        self.peft_type = PREPROJ
        check_field_types(self, skip=(*PEFT_FIELDS, "host", "injection"))
        _check_format(self.format_version, self.library_version)
        check_rule(
            self.host is None or isinstance(self.host, (str, dict)),
            "PreProjConfig",
            "host",
            self.host,
            "None, a host row name or a host description (an object)",
        )
        check_rule(
            isinstance(self.inference_mode, bool), "PreProjConfig", "inference_mode", self.inference_mode, "a bool"
        )
        check_rule(
            self.injection is None or isinstance(self.injection, dict),
            "PreProjConfig",
            "injection",
            self.injection,
            "None or an object (written by the tuner)",
        )
        if not (self.preproj or self.skip):
            raise ValueError("PreProjConfig: at least one of preproj=True or skip=True is required")
        check_choice("PreProjConfig", "activation", self.activation, sorted(ACTIVATIONS))
        check_choice("PreProjConfig", "init", self.init, list(PREPROJ_INITS))
        if self.skip_init_std is None:
            self.skip_init_std = SKIP_INIT_STD[self.init]
        check_choice("PreProjConfig", "compute_dtype", self.compute_dtype, list(COMPUTE_DTYPES))
        check_rule(
            0 < self.expansion <= MAX_EXPANSION,
            "PreProjConfig",
            "expansion",
            self.expansion,
            f"a finite number in (0, {MAX_EXPANSION}] (the inner width int(expansion*d) is 1..{MAX_EXPANSION}*d)",
        )
        check_rule(
            self.skip_init_std >= 0, "PreProjConfig", "skip_init_std", self.skip_init_std, "a finite number >= 0"
        )
        _check_skip_rank(self.skip_rank, self.skip)
        for name in ("parts", "modules_to_save"):
            value = getattr(self, name)
            if value is not None:
                check_rule(
                    bool(value) and all(value),
                    "PreProjConfig",
                    name,
                    value,
                    "None or a non-empty list of non-empty names",
                )
                if len(set(value)) != len(value):
                    raise ValueError(f"PreProjConfig.{name} has duplicates: {value}")
        for i, name in enumerate(self.modules_to_save or []):  # names or paths: data, never calls or dunders
            try:
                check_path(name, f"PreProjConfig.modules_to_save[{i}]")
            except PathError as e:
                raise ValueError(str(e)) from None
        if isinstance(self.layers, dict):
            self.layers = {k: _layer_list(v, f"layers[{k!r}]") for k, v in self.layers.items()}
        elif self.layers is not None:
            self.layers = _layer_list(self.layers, "layers")

    def _peft_targeting(
        self, target_modules: Any, exclude_modules: Any, layers_to_transform: Any, layers_pattern: Any
    ) -> None:
        """peft's targeting words: `layers_to_transform` (block indices) is `layers`; the others name modules,
        but PREPROJ's sites are the host table's norm -> attention seams (`mmpreproj.hosts`), so they are
        refused, pointing to `layers` and `parts`."""
        for name, value in (
            ("target_modules", target_modules),
            ("exclude_modules", exclude_modules),
            ("layers_pattern", layers_pattern),
        ):
            if value is not None:
                raise ValueError(
                    f"PreProjConfig.{name}={value!r:.80}: PREPROJ does not pick modules by name; it wraps each "
                    "block's attention at the seam the host table names (mmpreproj.hosts). Choose blocks with "
                    "layers=[...] (or {part: [...]}) and the parts of a multimodal model with parts=[...]"
                )
        if layers_to_transform is not None:
            if self.layers is not None:
                raise ValueError(
                    f"PreProjConfig: layers_to_transform={layers_to_transform!r:.60} and layers={self.layers!r:.60} "
                    "both given; layers_to_transform is peft's name for layers: pass one"
                )
            self.layers = [layers_to_transform] if type(layers_to_transform) is int else layers_to_transform

    @property
    def method(self) -> str:
        """The method this config injects, by its name in `mmpreproj.train.METHODS`: "preproj_skip", "preproj"
        or "skip" (saved as the adapter's `method` tag)."""
        return {(True, True): "preproj_skip", (True, False): "preproj", (False, True): "skip"}[
            (self.preproj, self.skip)
        ]

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str, subfolder: str | None = None, **kwargs: Any
    ) -> PreProjConfig:
        """peft's `PeftConfig.from_pretrained`, then, for a local folder, the weights beside it
        (`check_folder_weights`), read before peft's loaders and `AutoPeftModel*` inject anything."""
        config = super().from_pretrained(pretrained_model_name_or_path, subfolder=subfolder, **kwargs)
        folder = Path(pretrained_model_name_or_path, subfolder or "")
        if isinstance(config, PreProjConfig) and folder.is_dir():  # a hub id: peft downloads the weights later
            check_folder_weights(config, folder)
        return config

    def save_pretrained(self, save_directory: str, **kwargs: Any) -> None:
        """peft's writer of `adapter_config.json`, which never writes through a link: a symlink (or any
        non-file) placed at `save_directory/adapter_config.json` is removed first, so the file it points to,
        inside the folder or out of it, is left as it was and a plain file takes the link's place.

        peft's `PeftModel.save_pretrained` calls it last, after writing `README.md` and the weights in place,
        following any link there (peft hands no hook the folder before those writes). A link found at one of
        them is refused here, naming it: the config is not written, so the folder is not a pair a loader takes
        (with an older config beside it, the digest refuses the mix)."""
        followed = [n for n in PEFT_WRITES_BEFORE_CONFIG if Path(save_directory, n).is_symlink()]
        if followed:
            link = Path(save_directory, followed[0])
            raise ValueError(
                f"PreProjConfig.save_pretrained: {link} is a symlink (to {os.readlink(link)}); peft's "
                "save_pretrained writes it before the config and follows links, so what it points to may have been "
                "overwritten. adapter_config.json was not written (the folder does not load); remove the link and "
                "save again, or save with mmpreproj.save_adapter(model, DIR), which never follows links"
            )
        if Path(save_directory, "adapter_model.bin").exists():  # peft's `safe_serialization=False`
            self._refuse_unpaired_weights(save_directory)
        target = Path(save_directory, "adapter_config.json")
        if target.is_symlink():
            os.unlink(target)
        elif target.exists() and not target.is_file():
            raise ValueError(f"PreProjConfig.save_pretrained: {target} exists and is not a file; nothing was written")
        super().save_pretrained(save_directory, **kwargs)

    def _refuse_unpaired_weights(self, save_directory: str) -> None:
        """With an `adapter_model.bin` in the folder (peft writes one for `safe_serialization=False`), write the
        config only when the folder's safetensors are the weights it was saved with: loaders read those alone, so
        a config over other weights would leave the folder's earlier, complete save unloadable."""
        weights = Path(save_directory, ADAPTER_WEIGHTS_NAME)
        try:
            tensors = load_file(str(weights))
            heads = peft_head_keys(self, tensors)
            check_weights_digest(
                (self.injection or {}).get(DIGEST_KEY), {k: v for k, v in tensors.items() if k not in heads}, weights
            )
        except (OSError, SafetensorError, ValueError):
            raise ValueError(
                f"PreProjConfig.save_pretrained: {save_directory} holds adapter_model.bin and no "
                f"{ADAPTER_WEIGHTS_NAME} of these weights (peft's save_pretrained(safe_serialization=False)?): a "
                "PREPROJ folder's weights are its safetensors, which every loader reads and checks. "
                "adapter_config.json was not written (an earlier save there still loads); save with "
                "safe_serialization=True (peft's default)"
            ) from None

    def check_sizes(self, dim: int) -> None:
        """Refuse `expansion` or `skip_rank` out of range for model width `dim`, naming the field and the
        range, before anything is allocated: the inner width `int(expansion*dim)` must be `1..MAX_EXPANSION*dim`,
        the skip's rank 1..dim."""
        if self.preproj:
            width = self.inner_width(dim)
            if width > MAX_EXPANSION * dim:
                raise ValueError(
                    f"PreProjConfig.expansion={self.expansion} gives an inner width of {width} at hidden "
                    f"size {dim}; allowed: 1..{MAX_EXPANSION * dim} (expansion in "
                    f"[{1 / dim:.4g}, {MAX_EXPANSION}])"
                )
        if self.skip and self.skip_rank is not None and not 1 <= self.skip_rank <= dim:
            raise ValueError(
                f"PreProjConfig.skip_rank={self.skip_rank} at hidden size {dim}; allowed: 1..{dim} "
                "(or None, the full d x d skip)"
            )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PreProjConfig:
        """As `JsonConfig.from_dict`; `fuse_qkv_skip: false` (written by mmpreproj <= 0.1) is dropped silently;
        a newer `format_version` than `ADAPTER_FORMAT` is refused, naming both library versions."""
        if isinstance(d, dict) and isinstance(d.get("format_version"), int):  # before any other check
            _check_format(d["format_version"], str(d.get("library_version", "?")))
        if isinstance(d, dict) and "fuse_qkv_skip" in d:
            _removed_fuse_qkv_skip(d["fuse_qkv_skip"], warn=False)
            d = {k: v for k, v in d.items() if k != "fuse_qkv_skip"}
        return super().from_dict(d)

    @classmethod
    def for_budget(cls, model: nn.Module, fraction: float, **kwargs: Any) -> PreProjConfig:
        """The pre-projection + a rank-r skip sized to train about `fraction` of `model`'s parameters (the
        budget study's sizing, `method/config.py`): the size a LoRA user expects, e.g. `for_budget(model, 0.01)`
        trains 1.35M weights on SmolLM2-135M where `PreProjConfig()` trains 34.8M (20.6%), within about one
        `2 d L` unit (d the width, L the blocks sized). `kwargs` are other fields (`layers`, `parts`,
        `skip_init_std`, ...): the blocks `layers`, `parts` and `host` select are the ones sized; `expansion` and
        `skip_rank` are what it chooses. A fraction under the smallest modules (inner width 1, rank 1: 4 d L weights)
        is refused, naming the smallest fraction."""
        taken = sorted({"expansion", "skip_rank", "preproj", "skip"} & set(kwargs))
        if taken:
            raise ValueError(
                f"PreProjConfig.for_budget chooses expansion and skip_rank (pre-projection + skip); "
                f"drop {', '.join(taken)} or build PreProjConfig(...) directly"
            )
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"PreProjConfig.for_budget(model=...): got {type(model).__name__}; pass the torch.nn.Module to size "
                "for (its parameter count and width set the sizes)"
            )
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise ValueError(
                f"PreProjConfig.for_budget: fraction={fraction!r}; must be in (0, 1] (a share of the "
                "model's parameters, e.g. 0.01)"
            )
        sites = selected_sites(model, cls(**kwargs))  # `layers`, `parts`, `host` as inject will read them
        widths = sorted({site.width for site in sites})
        if len(widths) != 1:
            raise ValueError(
                f"PreProjConfig.for_budget: the selected blocks have widths {widths}, and one size fits one width; "
                "pass parts=[...] to size one part"
            )
        dim, layers = widths[0], len(sites)
        total = sum(p.numel() for p in model.parameters())
        budget = round(fraction * total)
        # per block, the smallest modules: inner width 1 and a rank-1 skip
        smallest = PreProjection.num_params(dim, expansion_for_width(1, dim)) + ContentSkip.num_params(dim, 1)
        if budget < 0.75 * smallest * layers:  # the sizes round to 2 d L units: below, the smallest is far over
            raise ValueError(
                f"PreProjConfig.for_budget: fraction={fraction} is {budget:,} weights, under the smallest these "
                f"modules reach on the {layers} selected blocks of width {dim} (inner width 1 and a rank-1 skip: "
                f"{smallest * layers:,}); use fraction >= {smallest * layers / total:.3g}, or select fewer blocks "
                "(layers=[...])"
            )
        sizes = preproj_sizes(budget, dim=dim, layers=layers)
        if sizes is None:
            raise ValueError(
                f"PreProjConfig.for_budget: fraction={fraction} puts the skip's rank at the width "
                f"{dim}; use a smaller fraction, or PreProjConfig() for the full-size modules"
            )
        return cls(**sizes, **kwargs)

    def inner_width(self, dim: int) -> int:
        """The pre-projection's inner width at model width `dim`; refuses a width of 0."""
        width = int(self.expansion * dim)
        if width < 1:
            raise ValueError(
                f"PreProjConfig.expansion={self.expansion} gives an inner width of int({self.expansion} * {dim}) = "
                f"{width} at hidden size {dim}; use expansion >= {1 / dim:.4g}"
            )
        return width

    def resolve_layers(self, num_blocks: int, part: str | None = None) -> list[int]:
        """The sorted, non-negative block indices this config selects among `num_blocks` blocks.

        With a per-part dict, `part` names the part (a part the dict does not name gets every block).
        """
        layers = self.layers.get(part) if isinstance(self.layers, dict) else self.layers
        if layers is None:
            return list(range(num_blocks))
        out = []
        for i in layers:
            j = i + num_blocks if i < 0 else i
            if not 0 <= j < num_blocks:
                raise ValueError(
                    f"PreProjConfig.layers contains {i}, but the model has {num_blocks} blocks "
                    f"(allowed: -{num_blocks}..{num_blocks - 1})"
                )
            out.append(j)
        if len(set(out)) != len(out):
            raise ValueError(f"PreProjConfig.layers selects a block twice: {self.layers}")
        return sorted(out)


def check_folder_weights(config: PreProjConfig, folder: str | Path) -> None:
    """ValueError naming the file unless `folder` (a local adapter folder) holds `ADAPTER_WEIGHTS_NAME` as a
    readable file whose tensors are the ones `config` (read from the folder) was saved with (`check_saved_weights`).
    A config saved without weights (no `injection` record, no weights file) is not checked."""
    weights = Path(folder, ADAPTER_WEIGHTS_NAME)
    if config.injection is None and not os.path.lexists(weights):
        return
    if not weights.is_file():
        what = "is a directory" if weights.is_dir() else "is missing"
        other = " (adapter_model.bin is not read)" if Path(folder, "adapter_model.bin").exists() else ""
        raise ValueError(
            f"adapter weights {weights} {what}{other}: a PREPROJ folder holds its weights in {ADAPTER_WEIGHTS_NAME} "
            "beside adapter_config.json (peft's save_pretrained, safe_serialization=True: the default); nothing was "
            "loaded"
        )
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"corrupt adapter weights {weights}: {e}; nothing was loaded") from None
    check_saved_weights(config, tensors, weights)


def check_saved_weights(config: PreProjConfig, tensors: dict[str, torch.Tensor], weights_file: str | Path) -> None:
    """ValueError naming `weights_file` unless `tensors` (peft's file keys) are what `config` describes: every tensor,
    of the shape its sizes give, floating point and finite, nothing else, the heads peft saves for a classification
    task as its `injection.head_shapes` records them (`method/file_check.py`), and ours from the same save as
    the config (`method/file_check.py`: a save cut short is refused)."""
    modules = (config.injection or {}).get("modules")
    named = renamed_slots(tensors, modules, PEFT_PREFIX) if isinstance(modules, list) else tensors
    check_file_tensors(config, named, weights_file)  # names, shapes, dtypes, values
    heads = peft_head_keys(config, tensors)  # peft's own tensors, set aside from the digest
    ours = {k: v for k, v in tensors.items() if k not in heads}
    check_weights_digest((config.injection or {}).get(DIGEST_KEY), ours, weights_file)  # the pair is one save


def check_layer_parts(config: PreProjConfig, injected: list[str]) -> None:
    """A per-part `layers` dict names only parts that are `injected`."""
    unknown = [p for p in config.layers if p not in injected] if isinstance(config.layers, dict) else []
    if unknown:
        raise ValueError(f"PreProjConfig.layers names parts {unknown} that are not injected; injected: {injected}")


def selected_sites(model: nn.Module, config: PreProjConfig) -> list[Site]:
    """The sites `config` selects on `model` (its host, parts and layers), as `plan_injection` picks them; nothing is
    built and the model is not touched."""
    spec = as_host(model, config.host)
    return select_sites(resolve_sites(model, spec), spec, config)[1]


def select_sites(sites: list[Site], spec: HostSpec, config: PreProjConfig) -> tuple[list[str], list[Site]]:
    """The parts the config selects (checked against the model's) and the sites its `layers` pick."""
    present = list(dict.fromkeys(s.part for s in sites))
    wanted = config.parts or [p for p in (spec.default_parts or present) if p in present] or present
    missing = [p for p in wanted if p not in present]
    if missing:
        raise ValueError(f"PreProjConfig.parts names {missing}, but this {spec.name!r} model has parts {present}")
    if isinstance(config.layers, dict):
        check_layer_parts(config, wanted)
        chosen = []
        for part in wanted:
            mine = [s for s in sites if s.part == part]
            chosen += [mine[i] for i in config.resolve_layers(len(mine), part)]
        return wanted, chosen
    pool = [s for s in sites if s.part in wanted]
    return wanted, [pool[i] for i in config.resolve_layers(len(pool))]


def _check_format(format_version: int, library_version: str) -> None:
    """Refuse a config written in a newer file format than this library reads, naming both versions."""
    if format_version > ADAPTER_FORMAT:
        raise ValueError(
            f"this adapter was saved by mmpreproj {library_version} in adapter format {format_version}; "
            f"mmpreproj {__version__} reads formats up to {ADAPTER_FORMAT}: upgrade mmpreproj "
            f"(pip install -U mmpreproj) to load it"
        )
    check_rule(format_version >= 1, "PreProjConfig", "format_version", format_version, "an int >= 1")


def _layer_list(value: object, name: str) -> list[int]:
    if isinstance(value, (str, int)) or not isinstance(value, (list, tuple)) or not all(type(i) is int for i in value):
        raise ValueError(f"PreProjConfig.{name} must be None or a list of ints, got {value!r}")
    if not value:
        raise ValueError(f"PreProjConfig.{name}=[]; must be None (every block) or a non-empty list of block indices")
    if len(set(value)) != len(value):
        raise ValueError(f"PreProjConfig.{name} has duplicates: {list(value)}")
    return list(value)


def _check_skip_rank(rank: int | None, skip: bool) -> None:
    """`skip_rank`: None or an int >= 1, and only with a skip to shape."""
    check_rule(
        rank is None or rank >= 1, "PreProjConfig", "skip_rank", rank, "None (the full d x d skip) or an int >= 1"
    )
    if rank is not None and not skip:
        raise ValueError(
            f"PreProjConfig.skip_rank={rank!r} with skip=False: there is no skip to shape; "
            "set skip=True or skip_rank=None"
        )


def _removed_fuse_qkv_skip(value: object, *, warn: bool) -> None:
    """Refuse `fuse_qkv_skip=True` (and non-bools) with the reason; False is what old files carry."""
    if value is None:
        return
    if value is not False:
        raise ValueError(f"{FUSE_QKV_SKIP_REMOVED}; got fuse_qkv_skip={value!r}, drop the field (False is accepted)")
    if warn:
        warnings.warn(f"{FUSE_QKV_SKIP_REMOVED}; drop the argument", DeprecationWarning, stacklevel=4)
