"""Waiting on other processes and threads in tests.

Tests wait for the work, not for a clock: on a loaded 2-core machine a child that imports torch, peft and
transformers takes minutes, so a short `timeout=` fails a correct run. `HANG_GUARD_S` only guards against a
hang (a child or thread that never ends), far above any loaded machine's time for the small work these tests
start; the CI job's own limit is the real bound.
"""

HANG_GUARD_S = 1800
