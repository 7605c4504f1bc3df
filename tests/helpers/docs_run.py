"""The child side of `tests/test_docs_blocks.py`: `python -m tests.helpers.docs_run MODE SPEC RESULT`.

MODE `page`: run one page's Python blocks in order in one namespace, as a reader runs the page top to bottom,
with the network refused; the first failing block stops the page (the later ones are reported as not reached).
Each block is compiled under the page's own file name and line numbers, so a traceback names the page's line.

MODE `scripts`: for each script command of the docs, `SCRIPT --help` must exit 0 and the command's own arguments
must parse through the script's argparse parser (the script runs up to its `parse_args` call and stops there);
for each launcher (`torchrun`, `accelerate launch`), its arguments must parse through the launcher's parser.
Scripts run in this one process (torch and the library are imported once), each as `__main__` with its folder
first on `sys.path`, as `python SCRIPT` would.

SPEC is a JSON file written by the test; RESULT the JSON file this writes: {id: {"ok": bool, "error": str, ...}}.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import runpy
import socket
import sys
import time
import traceback
from pathlib import Path


def refuse_network() -> None:
    """Every socket connect and DNS lookup raises: a block that reaches for the hub fails, naming the call."""

    def refuse(what: str):
        def call(*args, **kwargs):
            raise OSError(f"network access refused while running the docs ({what})")

        return call

    socket.socket.connect = refuse("connect")
    socket.socket.connect_ex = refuse("connect_ex")
    socket.create_connection = refuse("create_connection")
    socket.getaddrinfo = refuse("getaddrinfo")


def run_page(blocks: list[dict]) -> dict:
    refuse_network()
    ns: dict = {"__name__": "__main__"}
    results: dict = {}
    failed = None
    for b in blocks:
        if failed:
            results[b["id"]] = {"ok": False, "error": f"not reached: {failed} failed first"}
            continue
        start = time.perf_counter()
        source = "\n" * (b["line"] - 1) + b["code"]  # the page's line numbers in tracebacks
        saved = {k: ns.get(k) for k in ("__name__", "__package__")}
        if b.get("module"):  # a block that is a module's text: run as that module (relative imports resolve)
            ns["__name__"], ns["__package__"] = b["module"], b["module"].rpartition(".")[0]
        try:
            exec(compile(source, b["file"], "exec"), ns)
        except BaseException as e:  # SystemExit and KeyboardInterrupt of a block are its failure too
            frames = e.__traceback__.tb_next if e.__traceback__ else None  # from the block's own line on
            results[b["id"]] = {"ok": False, "error": "".join(traceback.format_exception(type(e), e, frames))}
            failed = b["id"]
        else:
            results[b["id"]] = {"ok": True, "seconds": round(time.perf_counter() - start, 1)}
        finally:
            ns.update(saved)
    return results


class _Parsed(BaseException):
    """Raised right after a script's parser accepted the arguments: the script stops before doing any work."""


def _run_script(script: str, argv: list[str], stop_after_parse: bool) -> dict:
    """`python SCRIPT ARGV` in this process, stdout and stderr captured; how it ended."""
    original = argparse.ArgumentParser.parse_args
    parsed = []

    def parse_and_stop(self, args=None, namespace=None):
        ns = original(self, args, namespace)
        parsed.append(ns)
        raise _Parsed

    if stop_after_parse:
        argparse.ArgumentParser.parse_args = parse_and_stop
    out, err = io.StringIO(), io.StringIO()
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv, sys.path[0] = [script, *argv], str(Path(script).resolve().parent)
    code: object = "ran to its end"
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(script, run_name="__main__")
    except _Parsed:
        code = "parsed"
    except SystemExit as e:
        code = e.code if e.code is not None else 0
    except BaseException:
        code = "raised"
        err.write(traceback.format_exc(limit=-6))
    finally:
        argparse.ArgumentParser.parse_args = original
        sys.argv, sys.path[:] = old_argv, old_path
    return {"code": code, "stderr": err.getvalue()[-3000:], "stdout": out.getvalue()[-300:]}


def _launcher_parser(name: str) -> argparse.ArgumentParser:
    if name == "torchrun":
        from torch.distributed.run import get_args_parser

        return get_args_parser()
    if name == "accelerate launch":
        from accelerate.commands.launch import launch_command_parser

        return launch_command_parser()
    raise ValueError(f"no parser known for the launcher {name!r}")


def check_scripts(checks: list[dict]) -> dict:
    refuse_network()
    results: dict = {}
    helps: dict = {}  # script -> its --help run (once per script)
    for c in checks:
        if c["kind"] == "launcher":
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    _launcher_parser(c["launcher"]).parse_args(c["argv"])
                results[c["id"]] = {"ok": True}
            except SystemExit as e:
                results[c["id"]] = {"ok": False, "error": f"exit {e.code}: {err.getvalue()[-2000:]}"}
            continue
        script, argv = c["script"], c["argv"]
        if not Path(script).is_file():
            results[c["id"]] = {"ok": False, "error": f"{script}: no such file (from {Path.cwd()})"}
            continue
        help_run = helps.setdefault(script, _run_script(script, ["--help"], stop_after_parse=False))
        if help_run["code"] != 0:
            results[c["id"]] = {"ok": False, "error": f"{script} --help: {help_run['code']!r}\n{help_run['stderr']}"}
            continue
        parse_run = _run_script(script, argv, stop_after_parse=True)
        ok = parse_run["code"] == "parsed"
        error = "" if ok else f"{script} {' '.join(argv)}: {parse_run['code']!r}\n{parse_run['stderr']}"
        results[c["id"]] = {"ok": ok, "error": error}
    return results


def main() -> None:
    mode, spec, result = sys.argv[1:4]
    items = json.loads(Path(spec).read_text())
    results = run_page(items) if mode == "page" else check_scripts(items)
    Path(result).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
