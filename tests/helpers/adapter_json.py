"""Read and rewrite our `adapter_config.json` in the in-memory description form (`InjectionState.describe`
plus `config`), whichever layout the file has (peft's, or mmpreproj <= 0.3's): tests edit the description,
as an attacker or a damaged disk would, and write it back in today's peft layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmpreproj.method.files import as_description, peft_config_from_description


def load_desc(cfg_file: str | Path) -> dict[str, Any]:
    """The description in an `adapter_config.json`."""
    return as_description(json.loads(Path(cfg_file).read_text()), str(cfg_file))


def dump_desc(cfg_file: str | Path, desc: dict[str, Any]) -> None:
    """Write `desc` to `cfg_file` as today's writers would (peft layout)."""
    Path(cfg_file).write_text(json.dumps(peft_config_from_description(desc), indent=2))
