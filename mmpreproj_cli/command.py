"""`main`: parse and check the arguments without the library, say (and set) the hub's offline flags, then load
the library and run the subcommand."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Sequence

from mmpreproj_tables.offline import choose_offline

from .checks import check_args, check_hub_cache
from .parser import build_parser


def main(argv: Sequence[str] | None = None) -> int:
    """The `mmpreproj` command: 0 on success, 1 with a one-line error (-v: the traceback), 2 on a usage error."""
    args = build_parser().parse_args(argv)  # --help and usage errors end here, before torch or peft load
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        check_args(args)
        print(f"mmpreproj {args.command}: {choose_offline(args.online)}", file=sys.stderr, flush=True)
        check_hub_cache(args)
        from .run import run  # the library: peft, transformers, the subcommand's modules (after the flags)

        summary = run(args)
    except KeyboardInterrupt:
        print("mmpreproj: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one line for the user; -v shows the traceback
        if args.verbose:
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        msg = _flag_names(msg, args)
        print(f"mmpreproj {args.command}: error: {msg}", file=sys.stderr)
        return 1
    print(f"mmpreproj {args.command}: {summary}")
    return 0


_FIELD = re.compile(r"\b(?:TrainConfig|PreProjConfig)\.([a-z_]+)(=?)")


def _flag_names(msg: str, args: argparse.Namespace) -> str:
    """The library's message with each config field this subcommand has a flag for named as the flag:
    "PreProjConfig.layers contains 99" -> "--layers contains 99", "TrainConfig.device='x'" -> "--device 'x'"."""

    def flag(m: re.Match[str]) -> str:
        if not hasattr(args, m[1]):
            return m[0]
        return "--" + m[1].replace("_", "-") + (" " if m[2] else "")

    return _FIELD.sub(flag, msg)
