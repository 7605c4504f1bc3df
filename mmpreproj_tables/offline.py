"""Whether the command may download from the Hugging Face Hub: offline unless the user opts in.

    line = choose_offline(args.online)   # sets HF_HUB_OFFLINE / HF_DATASETS_OFFLINE, says which in one line

Without the flags, a mistyped hub id waits on network retries (~23 s) before it fails; with them, transformers,
huggingface_hub and datasets read the local cache only and fail at once. The flags are read when those packages
are imported, so `choose_offline` runs before the library loads (`mmpreproj_cli.command.main`). The library
reads the same flags (`mmpreproj.data.hub.hub_offline`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

OFFLINE_FLAGS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
TRUE = frozenset({"1", "true", "yes", "on"})  # the values huggingface_hub and datasets read as "on"


def flag_on(value: str | None) -> bool:
    return value is not None and value.strip().lower() in TRUE


def hub_offline(environ: MutableMapping[str, str] = os.environ) -> bool:
    """True when `HF_DATASETS_OFFLINE` or `HF_HUB_OFFLINE` asks for offline mode (cache only)."""
    return any(flag_on(environ.get(k)) for k in OFFLINE_FLAGS)


def offline_flags(environ: MutableMapping[str, str] = os.environ) -> str:
    """The offline flags that are set, as `NAME=value` words ("HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1")."""
    return " ".join(f"{k}={environ[k]}" for k in OFFLINE_FLAGS if k in environ)


def choose_offline(online: bool, environ: MutableMapping[str, str] = os.environ) -> str:
    """Set the offline flags for this run and return the one line that says which it uses and why.

    `online` (the `--online` flag): both "0". Else HF_HUB_OFFLINE as the environment has it (HF_DATASETS_OFFLINE
    follows it unless also set); else both "1", set here."""
    hub, data = OFFLINE_FLAGS
    if online:
        environ.update({hub: "0", data: "0"})
        why = "--online: hub downloads allowed"
    elif hub in environ:
        environ.setdefault(data, environ[hub])
        why = "from the environment" + ("" if flag_on(environ[hub]) else "; hub downloads allowed")
    else:
        environ.setdefault(data, "1")
        environ[hub] = "1"
        why = "set by mmpreproj; pass --online to allow hub downloads"
    _update_loaded(environ)
    state = "offline" if flag_on(environ[hub]) else "online"
    return f"{state}: {offline_flags(environ)} ({why})"


def _update_loaded(environ: MutableMapping[str, str]) -> None:
    """`python -m mmpreproj` imports the library (and huggingface_hub) before the command runs: give the flags
    to the modules that have already read them at import (found in `sys.modules`, never imported here)."""
    hub_on, data_on = (flag_on(environ.get(k)) for k in OFFLINE_FLAGS)
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = hub_on
    config = sys.modules.get("datasets.config")
    if config is not None:
        config.HF_HUB_OFFLINE = config.HF_DATASETS_OFFLINE = data_on
