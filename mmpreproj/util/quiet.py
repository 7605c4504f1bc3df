"""Known messages from dependencies that `import mmpreproj` would otherwise print, dropped by exact text.

`import mmpreproj` imports peft, which imports torchao and bitsandbytes; on torch 2.14 they log, on every
import, messages a user cannot act on:

- torch's `torch.utils._pytree` logger: "<enum ...> is an Enum subclass and is now natively supported by
  torch.compile as an opaque value type. ..." (torchao registers its enums the deprecated way);
- bitsandbytes' `bitsandbytes.backends.cpu.ops` logger: "Failed to load CPU gemm_4bit_forward from
  kernels-community: ..." (an optional CPU kernel package that is not installed);
- with `HF_HUB_OFFLINE=1` (as the Makefile and the tests run), the `kernels` package's
  `kernels._internals.hf_hub` logger, asked by bitsandbytes for that CPU kernel: "Skipping publisher trust check
  for 'kernels-community/quantization-bitsandbytes' because Hugging Face Hub is in offline mode." (kernels
  0.19, which transformers 5.25 requires; only that repository's message is dropped).

`install()` (called first thing by `mmpreproj/__init__.py`) adds one `logging.Filter` to each of those
named loggers that drops a record only when its format string starts with the known text. Nothing else
changes: no `warnings` filter, no logger level, no handler, no environment variable; any other message of
those loggers, and every other logger, is printed as before (`tests/test_quiet_import.py`).
"""

from __future__ import annotations

import logging

# logger name -> the start of the format string (`record.msg`) of the one message dropped there
KNOWN_MESSAGES: dict[str, str] = {
    "torch.utils._pytree": (
        "%s is an Enum subclass and is now natively supported by torch.compile as an opaque value type."
    ),
    "bitsandbytes.backends.cpu.ops": "Failed to load CPU gemm_4bit_forward from kernels-community: %s.",
    "kernels._internals.hf_hub": (
        "Skipping publisher trust check for 'kernels-community/quantization-bitsandbytes' because Hugging Face "
        "Hub is in offline mode."
    ),
}


class KnownMessageFilter(logging.Filter):
    """Drops the records of one logger whose format string starts with `prefix`; keeps every other record."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.prefix))


def install() -> None:
    """Add the filters (once per logger, however often it is called)."""
    for name, prefix in KNOWN_MESSAGES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, KnownMessageFilter) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(KnownMessageFilter(prefix))
