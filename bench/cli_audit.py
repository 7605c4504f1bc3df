"""Audit: the `mmpreproj` command line against its docs and `--help` (refusals, interruptions, what a tiny run writes).

Run:  OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 PYTHONPATH=. python bench/cli_audit.py [--only SUBSTRING]

Written by an independent audit from README.md, docs/cli.md, docs/limits.md, docs/troubleshooting.md and each
subcommand's `--help` alone (not from the code's intent). Every case runs the command in a subprocess as
`python -m mmpreproj_cli ...` (the `mmpreproj` entry point; docs/cli.md: the same command) with a 60 s timeout (a hang
is a FAIL), offline, on the shipped assets only (`--preset mini`, `assets/mini-pythia`, the local data), in temporary
folders, one process at a time. It checks:
  (a) refusal: every bad argument the docs name (and a few of the same kind) exits 1 or 2 within 5 s, with ONE
      error line on stderr (the offline banner line aside) that names the flag and the allowed values/range, and
      writes nothing to the output folder (an existing folder keeps its bytes and listing; a new one is not made);
  (b) interruption: a run killed with SIGTERM/SIGINT leaves an existing finished folder as it was where the docs say
      nothing changes yet, and never leaves a folder that a later run, `eval` or `analyze` reads as finished;
  (c) claims: what the docs say a tiny (`--steps 2`) offline run writes is there (file names, JSON fields).
One line per case: PASS/FAIL | area | case | details; then TOTAL. Documented limits (docs/limits.md) are not FAILs.
About 3 minutes on one core. Output: bench/results/cli_audit.txt (write it with `| tee`).

Its run on commit 53001b8: 102 cases, 95 PASS, 7 FAIL, none of them a change left behind or a folder read as finished:
`--layers 99` and `--parts bogus` (in range only once the model is loaded) and a bad hub id (`--model org/typo`) are
refused in one line only after torch loads (about 6 s), the first two naming `PreProjConfig.layers/parts` rather than
the flag; `--limit 3` stops with "no row passed the filters" without naming `--limit`, leaving an empty new OUT;
`--save-every 0` (the TrainConfig docstring: never) is accepted; `--resume` into an OUT with no run yet starts from
step 0 and `train` writes beside foreign files in a non-empty OUT, where the help said otherwise: the help now says
what happens (`--resume`: "an OUT with no run yet: start from step 0"; `--overwrite`: "an OUT that holds a run").
That run's lines: bench/results/cli_audit_before.txt.

Run again after the fixes (the commit after b875702; `DOCUMENTED_HELP` and `LATE_REFUSALS` added to read what the help
and docs/cli.md now state): 102 cases, 101 PASS, 1 FAIL (bench/results/cli_audit.txt). A bad hub id is refused before
torch loads (0.2 s); `--layers 99` / `--parts bogus` name the flag; `--limit 3` names `--limit` and leaves no OUT, but
still only after the model loads (about 7 s), the one FAIL. Run it in the foreground: a shell's background job
inherits SIGINT ignored, and the SIGINT cases then read as hangs."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
CMD = [sys.executable, "-m", "mmpreproj_cli"]
TMP = Path(tempfile.mkdtemp(prefix="cli_audit_"))
RESULTS: list[tuple[bool, str, str, str]] = []
QUICK_S = 5.0


def run(args, timeout=60):
    t = time.perf_counter()
    try:
        p = subprocess.run(CMD + args, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", "TIMEOUT", time.perf_counter() - t
    return p.returncode, p.stdout, p.stderr, time.perf_counter() - t


def snapshot(folder: Path):
    if not folder.exists():
        return None
    snap = {}
    for f in sorted(folder.rglob("*")):
        rel = str(f.relative_to(folder))
        snap[rel] = hashlib.sha256(f.read_bytes()).hexdigest() if f.is_file() else "<dir>"
    return snap


def diff(a, b):
    if a == b:
        return ""
    if a is None or b is None:
        return f"folder {'created' if a is None else 'removed'}"
    added = sorted(set(b) - set(a))
    gone = sorted(set(a) - set(b))
    changed = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    return f"added={added[:4]} removed={gone[:4]} changed={changed[:4]}"


def record(ok, area, case, details):
    RESULTS.append((ok, area, case, details))
    print(f"{'PASS' if ok else 'FAIL'} | {area} | {case} | {details}", flush=True)


def error_lines(stderr):
    """stderr lines besides the documented offline banner and progress noise."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    return [ln for ln in lines if ": offline: " not in ln and "%|" not in ln]


def existing_out(name):
    d = TMP / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True, exist_ok=True)
    (d / "keep.txt").write_text("user file\n")
    return d


# ---------------------------------------------------------------------------------------------------- (a) refusals
# (subcommand + args, words the one line must hold (flag + allowed values/range)); {OUT} is an existing folder with
# a user file, {NEW} a path that must not be created, {RUN} a finished tiny run folder.
REFUSALS = [
    ("train --preset nonsense", ["--preset", "mini"]),
    ("train --method dora", ["--method", "preproj_skip"]),
    ("train --model smollm2-136m", ["--model", "smollm2-135m"]),
    ("train --model dinov2-small", ["--model", "dinov2-small"]),
    ("train --model org/typo", ["--model", "org/typo", "--online"]),
    ("train --model /nonexistent/model", ["--model", "/nonexistent/model"]),
    ("train --data /nonexistent/data.txt", ["--data", "/nonexistent/data.txt"]),
    ("train --data {RUN}/train_config.json --data-config wikitext-2-raw-v1", ["--data-config"]),
    ("train --expansion -1", ["--expansion", "(0, 16]"]),
    ("train --expansion nan", ["--expansion"]),
    ("train --lr 0", ["--lr", "> 0"]),
    ("train --lr inf", ["--lr", "finite"]),
    ("train --steps -5", ["--steps"]),
    ("train --steps 0", ["--steps"]),
    ("train --steps 5 --warmup-steps 10", ["--warmup-steps"]),
    ("train --seed -1", ["--seed"]),
    ("train --batch-size 0", ["--batch-size"]),
    ("train --grad-accum 0", ["--grad-accum"]),
    ("train --max-len 0", ["--max-len"]),
    ("train --num-lines 0", ["--num-lines"]),
    ("train --steps 2 --save-every 0", ["--save-every"]),
    ("train --lora-r 0 --method lora", ["--lora-r"]),
    ("train --skip-rank 0", ["--skip-rank"]),
    ("train --layers a,b", ["--layers"]),
    ("train --layers=-1,-1", ["--layers"]),
    ("train --steps 2 --layers 99", ["--layers", "99"]),
    ("train --steps 2 --parts bogus", ["--parts", "bogus"]),
    ("train --precision fp16", ["--precision", "bf16", "fp32"]),
    ("train --steps two", ["--steps", "int"]),
    ("train --resume --overwrite", ["--resume", "--overwrite"]),
    ("train --steps 2 --resume --out {NEW}", ["--resume"]),
    ("train --steps 2", ["--overwrite"]),  # --help: --overwrite "start afresh in a non-empty OUT",
    ("train --out ''", ["--out"]),
    ("train --bogus-flag 1", ["--bogus-flag"]),
    ("eval --tasks bogus", ["--tasks", "ppl", "lambada"]),
    ("eval --tasks ppl,ppl", ["--tasks", "ppl"]),
    ("eval --tasks ''", ["--tasks"]),
    ("eval --adapter /nonexistent/adapter", ["--adapter", "/nonexistent/adapter"]),
    ("eval --adapter {OUT}", ["--adapter"]),
    ("eval --model dinov2-small", ["--model", "dinov2-small"]),
    ("eval --limit 0", ["--limit"]),
    ("eval --limit -3", ["--limit"]),
    ("eval --batch-size 0", ["--batch-size"]),
    ("eval --json ''", ["--json"]),
    ("eval --protocol nope", ["--protocol", "paper", "lm-eval"]),
    ("eval --ppl-split train", ["--ppl-split", "validation"]),
    ("analyze /nonexistent/run", ["/nonexistent/run"]),
    ("analyze {OUT}", ["{OUT}"]),
    ("analyze {RUN} --texts -1", ["--texts"]),
    ("analyze {RUN} --out ''", ["--out"]),
    ("reproduce --preset mini --methods dora", ["--methods", "preproj_skip"]),
    ("reproduce --preset mini --methods lora,lora", ["--methods", "lora"]),
    ("reproduce --preset mini --methods ''", ["--methods"]),
    ("reproduce --preset mini --seeds 0", ["--seeds"]),
    ("reproduce --preset mini --seeds 1,1", ["--seeds"]),
    ("reproduce --preset mini --seeds=-1", ["--seeds"]),
    ("reproduce --preset mini --limit 0", ["--limit"]),
    ("reproduce --preset mini --steps -1", ["--steps"]),
    ("reproduce --preset mini --expansion 0", ["--expansion"]),
    ("sweep --lrs 0", ["--lrs", "> 0"]),
    ("sweep --lrs 1e-3,1e-3", ["--lrs"]),
    ("sweep --lrs abc", ["--lrs"]),
    ("sweep --lrs nan", ["--lrs", "finite"]),
    ("sweep --methods dora", ["--methods", "preproj_skip"]),
    ("sweep --seed -1", ["--seed"]),
    ("budget --budgets 0", ["--budgets"]),
    ("budget --budgets 2", ["--budgets"]),
    ("budget --budgets abc", ["--budgets"]),
    ("budget --budgets 0.1,0.1", ["--budgets"]),
    ("budget --seeds 0", ["--seeds"]),
    ("budget --max-extend -1", ["--max-extend"]),
    ("budget --methods dora", ["--methods"]),
    ("budget --seed-methods dora", ["--seed-methods"]),
    ("budget --lrs 0", ["--lrs"]),
    ("demo --methods dora", ["--methods", "preproj_skip"]),
    ("demo --seeds 0", ["--seeds"]),
    ("demo --steps 0", ["--steps"]),
]
OUT_FLAG = {"train": "--out", "reproduce": "--out", "sweep": "--out", "budget": "--out", "demo": "--out"}

# Added after the first run (commit b875702): cases whose behaviour --help or docs/cli.md now states. A documented
# case passes when it behaves as stated and the statement is there (read from the help or the page at run time).
DOCUMENTED_HELP = {  # accepted (rc 0) as `train --help` says
    "train --steps 2 --save-every 0": "0 = never",
    "train --steps 2 --resume --out {NEW}": "an OUT with no run yet: start from step 0",
    "train --steps 2": "start afresh in an OUT that holds a run",
}
LATE_REFUSALS = {  # refused after the model loads (over QUICK_S), as docs/cli.md says
    "train --steps 2 --layers 99": "refused once it loads",
    "train --steps 2 --parts bogus": "refused once it loads",
}


def words_of(text: str) -> str:
    return " ".join(text.split())


def documented(spec: str, rc, problems: list[str]) -> tuple[list[str], str]:
    """`problems` less what --help or docs/cli.md states for `spec`, and a note saying where it is stated."""
    if spec in DOCUMENTED_HELP and rc == 0:
        phrase = DOCUMENTED_HELP[spec]
        if phrase in words_of(run(["train", "--help"])[1]):
            return [], f"documented in train --help: {phrase!r}"
    if spec in LATE_REFUSALS:
        phrase = LATE_REFUSALS[spec]
        if phrase in words_of((ROOT / "docs" / "cli.md").read_text()):
            rest = [p for p in problems if not p.startswith("took ")]
            return rest, f"docs/cli.md: {phrase!r}"
    return problems, ""


def check_refusal(spec, words, run_dir):
    import shlex

    key = spec
    out = existing_out("refuse-out")
    new = TMP / "refuse-new"
    shutil.rmtree(new, ignore_errors=True)
    subs = {"{OUT}": str(out), "{NEW}": str(new), "{RUN}": str(run_dir)}
    for k, v in subs.items():
        spec = spec.replace(k, v)
        words = [w.replace(k, v) for w in words]
    args = shlex.split(spec)
    sub = args[0]
    if sub in OUT_FLAG and "--out" not in args:
        args += ["--out", str(out)]
    if sub == "eval" and "--json" not in args:
        args += ["--json", str(out / "eval.json")]
    before_out, before_run = snapshot(out), snapshot(run_dir)
    rc, so, se, dt = run(args)
    errs = error_lines(se)
    problems = []
    if rc is None:
        problems.append("hang (60 s)")
    elif rc not in (1, 2):
        problems.append(f"rc={rc}")
    if dt > QUICK_S:
        problems.append(f"took {dt:.1f}s")
    if len(errs) != 1:
        problems.append(f"{len(errs)} stderr lines")
    msg = errs[-1] if errs else (so.strip().splitlines() or [""])[-1]
    missing = [w for w in words if w.lower() not in msg.lower()]
    if missing:
        problems.append(f"line lacks {missing}")
    d = diff(before_out, snapshot(out)) or diff(before_run, snapshot(run_dir))
    if d:
        problems.append(f"output touched: {d}")
    if new.exists():
        problems.append("new --out folder created")
    problems, note = documented(key, rc, problems)
    shown = " ".join(shlex.quote(a) for a in args).replace(str(TMP), "$TMP")
    record(
        not problems,
        "refuse",
        spec.replace(str(TMP), "$TMP"),
        f"{'; '.join(problems) or 'ok'}{' (' + note + ')' if note else ''} | rc={rc} {dt:.1f}s | "
        f"{msg[:150].replace(str(TMP), '$TMP')} | cmd: mmpreproj {shown}",
    )


# ------------------------------------------------------------------------------------------------ (b) interruptions
def start(args):
    return subprocess.Popen(CMD + args, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill_after(p, sig, seconds):
    time.sleep(seconds)
    if p.poll() is None:
        p.send_signal(sig)
    try:
        so, se = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        so, se = p.communicate()
        return None, so, se
    return p.returncode, so, se


def reads_finished(folder: Path):
    """What a later reader sees: metrics.json's status and whether `eval` scores the folder without complaint."""
    m = folder / "metrics.json"
    status = None
    if m.exists():
        try:
            status = json.loads(m.read_text()).get("status")
        except ValueError:
            status = "<unparseable>"
    rc, so, se, _ = run(["eval", "--adapter", str(folder), "--tasks", "ppl", "--limit", "20", "--no-progress"])
    return status, rc, (error_lines(se) or [""])[-1]


def fresh_run(name, extra=()):
    d = TMP / name
    shutil.rmtree(d, ignore_errors=True)
    rc, so, se, dt = run(["train", "--preset", "mini", "--steps", "2", "--out", str(d), "--no-progress", *extra])
    if rc != 0:
        raise RuntimeError(f"tiny train failed rc={rc}: {se[-400:]}")
    return d


def case_interrupt_existing(sig, seconds, flag, run_dir_name):
    d = fresh_run(run_dir_name)
    before = snapshot(d)
    args = ["train", "--preset", "mini", "--steps", "400", "--out", str(d), "--no-progress", flag]
    rc, so, se = kill_after(start(args), sig, seconds)
    after = snapshot(d)
    dd = diff(before, after)
    name = f"{flag} into finished run, {signal.Signals(sig).name} at {seconds}s"
    cmd = f"mmpreproj train --preset mini --steps 400 --out RUN {flag}  (kill -{signal.Signals(sig).name[3:]})"
    if rc is None:
        record(False, "interrupt", name, f"did not stop within 60 s after the signal | {cmd}")
        return
    if not dd:
        record(True, "interrupt", name, f"rc={rc}; folder unchanged (bytes + listing)")
        return
    status, erc, emsg = reads_finished(d)
    ok = status != "completed" and erc != 0
    note = "(docs/cli.md: --overwrite clears the old run only after loading; a change after that is documented)"
    record(
        ok,
        "interrupt",
        name,
        f"rc={rc}; folder changed: {dd}; metrics status={status}; eval rc={erc} "
        f"{emsg[:100]} {note if flag == '--overwrite' else ''} | {cmd}",
    )


def case_interrupt_fresh(sig, seconds):
    d = TMP / "int-fresh"
    shutil.rmtree(d, ignore_errors=True)
    args = ["train", "--preset", "mini", "--steps", "400", "--out", str(d), "--no-progress"]
    rc, so, se = kill_after(start(args), sig, seconds)
    listing = sorted(str(p.relative_to(d)) for p in d.rglob("*")) if d.exists() else None
    if not d.exists():
        record(True, "interrupt", f"fresh train, {signal.Signals(sig).name} at {seconds}s", f"rc={rc}; no folder")
        return
    status, erc, emsg = reads_finished(d)
    ok = rc is not None and status != "completed" and erc != 0
    record(
        ok,
        "interrupt",
        f"fresh train, {signal.Signals(sig).name} at {seconds}s",
        f"rc={rc}; left {listing}; metrics status={status}; eval rc={erc} {emsg[:120]} | "
        f"mmpreproj train --preset mini --steps 400 --out NEW (kill -{signal.Signals(sig).name[3:]} after {seconds}s)",
    )
    # a later plain run into the half-written folder: refused (not silently resumed/overwritten) or docs'd --resume
    lock = ".mmpreproj-run.lock"  # a stale lock is taken over (docs/cli.md), so its removal is not a change
    before = {k: v for k, v in (snapshot(d) or {}).items() if k != lock}
    rc2, so2, se2, dt2 = run(["train", "--preset", "mini", "--steps", "2", "--out", str(d), "--no-progress"])
    errs = error_lines(se2)
    changed = diff(before, {k: v for k, v in (snapshot(d) or {}).items() if k != lock})
    ok2 = rc2 in (1, 2) and len(errs) == 1 and not changed and ("--resume" in errs[0] or "--overwrite" in errs[0])
    record(
        ok2,
        "interrupt",
        "plain train into the killed run's folder",
        f"rc={rc2}; {errs[-1][:160] if errs else ''}; changed={changed or 'no'} | "
        f"mmpreproj train --preset mini --steps 2 --out KILLED_RUN",
    )


def case_lock():
    d = TMP / "int-lock"
    shutil.rmtree(d, ignore_errors=True)
    p = start(["train", "--preset", "mini", "--steps", "400", "--out", str(d), "--no-progress"])
    try:
        for _ in range(100):
            if (d / ".mmpreproj-run.lock").exists() or p.poll() is not None:
                break
            time.sleep(0.2)
        before = snapshot(d)
        rc, so, se, dt = run(
            ["train", "--preset", "mini", "--steps", "2", "--out", str(d), "--no-progress", "--overwrite"]
        )
        errs = error_lines(se)
        msg = errs[-1] if errs else ""
        ok = rc in (1, 2) and "in use" in msg and ".mmpreproj-run.lock" in msg and len(errs) == 1
        record(
            ok,
            "interrupt",
            "second train --overwrite into a folder in use",
            f"rc={rc} {dt:.1f}s; {msg[:160].replace(str(TMP), '$TMP')}; lock seen={before is not None}",
        )
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
    rc2, so2, se2, dt2 = run(
        ["train", "--preset", "mini", "--steps", "2", "--out", str(d), "--no-progress", "--overwrite"]
    )
    record(
        rc2 == 0,
        "interrupt",
        "stale lock after SIGTERM is taken over (--overwrite)",
        f"rc={rc2}; {(error_lines(se2) or [''])[-1][:160]}",
    )


def case_small_limit():
    d = TMP / "small-limit"
    shutil.rmtree(d, ignore_errors=True)
    args = [
        "reproduce",
        "--preset",
        "mini",
        "--methods",
        "lora",
        "--steps",
        "2",
        "--limit",
        "3",
        "--out",
        str(d),
        "--no-progress",
    ]
    rc, so, se, dt = run(args)
    errs = error_lines(se)
    left = sorted(str(p.relative_to(d)) for p in d.rglob("*")) if d.exists() else None
    ok = rc == 0 or (rc in (1, 2) and dt < QUICK_S and len(errs) == 1 and "--limit" in errs[0] and not left)
    record(
        ok,
        "refuse",
        "reproduce --limit 3 (in range per --help): runs, or is refused at once naming --limit",
        f"rc={rc} {dt:.1f}s; {errs[-1][:140] if errs else ''}; left in --out: {left} | "
        f"mmpreproj {' '.join(args).replace(str(TMP), '$TMP')}",
    )


def case_reproduce_interrupt():
    d = TMP / "int-repro"
    shutil.rmtree(d, ignore_errors=True)
    args = [
        "reproduce",
        "--preset",
        "mini",
        "--methods",
        "preproj_skip,lora",
        "--steps",
        "2",
        "--limit",
        "20",
        "--out",
        str(d),
        "--no-progress",
    ]
    p = start(args)
    # kill as soon as one arm's eval.json exists (mid-reproduction)
    t0 = time.time()
    while time.time() - t0 < 50 and p.poll() is None and not list(d.rglob("eval.json")):
        time.sleep(0.2)
    time.sleep(0.5)
    rc, so, se = kill_after(p, signal.SIGTERM, 0)
    bad = []
    for f in d.rglob("*.json"):
        try:
            json.loads(f.read_text())
        except ValueError:
            bad.append(str(f.relative_to(d)))
    evals = sorted(str(f.relative_to(d)) for f in d.rglob("eval.json"))
    record(
        not bad,
        "interrupt",
        "reproduce SIGTERM after first eval.json: every JSON left parses",
        f"rc={rc}; eval.json: {evals}; unparseable: {bad}",
    )
    rc2, so2, se2, dt2 = run(args, timeout=120)
    tail = (so2 + se2).strip().splitlines()[-1:] or [""]
    record(
        rc2 == 0,
        "interrupt",
        "reproduce restarted with the same command finishes",
        f"rc={rc2} {dt2:.0f}s; {tail[0][:160]} | mmpreproj {' '.join(args).replace(str(TMP), '$TMP')}",
    )
    return d if rc2 == 0 else None


# ------------------------------------------------------------------------------------------------------ (c) claims
def case_claims(run_dir):
    rc, so, se, dt = run(["train", "--preset", "mini", "--steps", "2", "--out", str(TMP / "banner"), "--no-progress"])
    first = (se.splitlines() or [""])[0]
    want = "mmpreproj train: offline: HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1"
    record(first.startswith(want), "claims", "cli.md: first stderr line names the offline flags", first[:140])
    env = dict(ENV)
    env.pop("HF_HUB_OFFLINE")
    env.pop("HF_DATASETS_OFFLINE", None)
    an = TMP / "banner-analyze"
    p = subprocess.run(
        CMD + ["analyze", str(run_dir), "--texts", "0", "--out", str(an)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    first = (p.stderr.splitlines() or [""])[0]
    record(
        "set by mmpreproj" in first and "HF_HUB_OFFLINE=1" in first,
        "claims",
        "cli.md: no HF_HUB_OFFLINE in env -> both set to 1, '(set by mmpreproj ...)'",
        first[:140],
    )

    files = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    record(
        (run_dir / "loss_curve.png").is_file(), "claims", "cli.md: every run folder gets loss_curve.png", f"{files}"
    )
    tc = json.loads((run_dir / "train_config.json").read_text())
    record(
        tc.get("method") == "preproj_skip",
        "claims",
        "peft-guide: run folder's train_config.json names the method",
        f"method={tc.get('method')}",
    )
    has_pair = any(
        (q / "adapter_config.json").is_file() and (q / "adapter_model.safetensors").is_file()
        for q in [run_dir, *run_dir.rglob("*")]
        if q.is_dir()
    )
    record(
        has_pair,
        "claims",
        "adapter pair (adapter_config.json + adapter_model.safetensors) in the run folder",
        f"{files}",
    )
    if has_pair:
        cfgs = [json.loads(q.read_text()) for q in run_dir.rglob("adapter_config.json")]
        record(
            any(c.get("peft_type") == "PREPROJ" and "injection" in c for c in cfgs),
            "claims",
            "getting-started: adapter_config.json has peft_type PREPROJ + injection",
            f"{[(c.get('peft_type'), 'injection' in c) for c in cfgs]}",
        )
    lock = list(run_dir.rglob(".mmpreproj-run.lock"))
    record(not lock, "claims", "cli.md: no lock file left in a finished run folder", f"{lock}")
    modes = {oct(q.stat().st_mode & 0o777) for q in run_dir.rglob("*") if q.is_file()}
    record(modes <= {"0o644"}, "claims", "cli.md: files get the umask's mode (0644 under 022)", f"{modes}")

    js = TMP / "eval-out" / "e.json"
    rc, so, se, dt = run(
        [
            "eval",
            "--adapter",
            str(run_dir),
            "--tasks",
            "ppl,lambada",
            "--limit",
            "20",
            "--json",
            str(js),
            "--no-progress",
        ]
    )
    data = json.loads(js.read_text()) if js.exists() else None
    ok = rc == 0 and data is not None and "ppl" in json.dumps(data) and "lambada" in json.dumps(data)
    record(
        ok,
        "claims",
        "eval --adapter RUN --tasks ppl,lambada --json: both tasks in the JSON",
        f"rc={rc}; keys={list(data) if isinstance(data, dict) else type(data).__name__}",
    )

    js2 = TMP / "eval-out" / "arc.json"
    rc, so, se, dt = run(
        ["eval", "--tasks", "arc_easy", "--data-source", "local", "--json", str(js2), "--no-progress"]
    )
    msg = (error_lines(se) or [""])[-1]
    record(
        rc in (0, 1, 2) and "hub" in msg,
        "claims",
        "limits.md (documented limit): arc_easy only via --data-source hub; local says so in one line",
        f"rc={rc}; {msg[:160]}",
    )

    run2 = fresh_run("claims-lora", ["--method", "lora"])
    rc, so, se, dt = run(
        ["eval", "--adapter", f"{run_dir},{run2}", "--tasks", "ppl", "--limit", "20", "--no-progress"]
    )
    out = so + se
    record(
        rc == 0 and str(run_dir.name) in out and str(run2.name) in out,
        "claims",
        "cli.md: eval --adapter a,b scores both, one row each",
        f"rc={rc}; {out.strip().splitlines()[-3:]}"[:220],
    )

    rc, so, se, dt = run(["analyze", str(run_dir), "--texts", "4"])
    made = [n for n in ("skip_norms.json", "skip_norms.png") if (run_dir / n).exists()]
    record(
        rc == 0 and len(made) == 2,
        "claims",
        "cli.md: analyze RUN writes skip_norms.json/png in the run folder",
        f"rc={rc}; found {made}; {(error_lines(se) or [''])[-1][:120]}",
    )
    if (run_dir / "skip_norms.json").exists():
        sn = json.loads((run_dir / "skip_norms.json").read_text())
        txt = json.dumps(sn)
        record(
            "routing" in txt,
            "claims",
            "cli.md: analyze gives skip norms + routing ratios",
            f"top-level keys={list(sn)[:8] if isinstance(sn, dict) else type(sn).__name__}",
        )


def case_reproduce_claims(d):
    files = sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())
    curves = [f for f in files if f.endswith("loss_curve.png")]
    evals = [f for f in files if f.endswith("eval.json")]
    record(
        len(evals) >= 2 and len(curves) >= 2,
        "claims",
        "reproduce: each arm has eval.json + loss_curve.png",
        f"eval.json={evals}; loss_curve.png={curves}",
    )
    record(
        any(f.endswith("report.md") for f in files),
        "claims",
        "cli.md: reproduce writes report.md beside the tables",
        f"top-level files={[f for f in files if '/' not in f]}",
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    only = ap.parse_args().only.lower()
    t0 = time.time()
    print(f"# cli_audit: python -m mmpreproj_cli, offline, tmp={TMP}")
    run_dir = None

    def want(name):
        return only in name.lower()

    try:
        run_dir = fresh_run("finished")
        for spec, words in REFUSALS:
            if want("refuse " + spec):
                try:
                    check_refusal(spec, words, run_dir)
                except Exception as e:  # noqa: BLE001
                    record(False, "refuse", spec, f"HARNESS ERROR {e!r}")
        cases = [
            (
                "interrupt existing --overwrite sigint",
                lambda: case_interrupt_existing(signal.SIGINT, 1.5, "--overwrite", "ow1"),
            ),
            (
                "interrupt existing --overwrite sigterm late",
                lambda: case_interrupt_existing(signal.SIGTERM, 7, "--overwrite", "ow2"),
            ),
            (
                "interrupt existing --resume sigterm",
                lambda: case_interrupt_existing(signal.SIGTERM, 2, "--resume", "rs1"),
            ),
            ("interrupt fresh sigterm", lambda: case_interrupt_fresh(signal.SIGTERM, 7)),
            ("interrupt lock", case_lock),
            ("claims run", lambda: case_claims(run_dir)),
            ("refuse reproduce small limit", case_small_limit),
        ]
        for name, fn in cases:
            if want(name):
                try:
                    fn()
                except Exception:  # noqa: BLE001
                    record(False, "harness", name, "HARNESS ERROR " + traceback.format_exc(limit=2)[-300:])
        if want("interrupt reproduce") or want("claims reproduce"):
            d = case_reproduce_interrupt()
            if d is not None:
                case_reproduce_claims(d)
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    n = len(RESULTS)
    p = sum(r[0] for r in RESULTS)
    print(f"TOTAL {n}: {p} PASS, {n - p} FAIL  ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
