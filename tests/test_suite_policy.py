"""The suite holds under load: no test waits on a clock shorter than `HANG_GUARD_S` (it waits on the work),
and every test module that starts processes marks those tests `slow` (`pytest -m "not slow"` leaves them out;
`make test` runs them all)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.procs import HANG_GUARD_S

TESTS = Path(__file__).resolve().parent
WAITS = {"run", "communicate", "wait", "join", "check_output", "check_call", "call", "get", "result"}


def _modules():
    return sorted(p for p in TESTS.rglob("*.py") if "fixtures" not in p.parts)


def test_no_short_clock_limit_on_a_wait():
    short = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WAITS):
                continue
            for kw in node.keywords:
                if kw.arg == "timeout" and isinstance(kw.value, ast.Constant) and kw.value.value < HANG_GUARD_S:
                    short.append(f"{path.relative_to(TESTS)}:{node.lineno} timeout={kw.value.value}")
    assert not short, f"wait on the work, or use tests.helpers.procs.HANG_GUARD_S: {short}"


def test_process_starting_modules_mark_slow_tests():
    starts = ("subprocess.run(", "subprocess.Popen(", "torch.distributed.run", "run_two_ranks(")
    unmarked = [
        str(p.relative_to(TESTS))
        for p in _modules()
        if p.parent == TESTS and any(s in p.read_text() for s in starts) and "pytest.mark.slow" not in p.read_text()
    ]
    assert not unmarked, f"modules that start processes without a slow test: {unmarked}"
