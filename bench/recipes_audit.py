"""Audit: the scripts under `recipes/` as a new user meets them (`--help`, refusals, cheap documented runs, offline).

Run:  OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONPATH=. python bench/recipes_audit.py \
          [--only SUBSTRING] | tee bench/results/recipes_audit.txt

Written by an independent audit from README.md, docs/*.md, recipes/*/README.md and each script's `--help` and module
docstring alone (not from the code's intent). Every case runs a script in a subprocess, offline, one at a time, with a
timeout (a hang is a FAIL), in temporary folders (the working directory of a refusal is an empty temporary folder, so
a relative default cannot land in the repository). The helper modules (`recipes/kit/`, `recipes/claim.py`,
`recipes/numbers_pages.py`, `recipes/mixed/cifar_tasks.py`, `recipes/mixed/qwen2vl_arms.py`, the packages
`recipes/mixed/tinyvlm/` and `recipes/mixed/dinov2_smollm2/`, `recipes/vision/dinov2_probe_report.py`,
`recipes/vision/dinov2_random.py`: their docstrings say they are imported by the scripts) are not audited. It checks:
  (a) help: `--help` exits 0 within 30 s (the seconds are reported) and lists every option with a help text; an
      option whose only text is argparse's "(default: X)" is counted in the details (not a FAIL), one with no text
      at all is a FAIL;
  (b) refusal: a bad value for an option with a documented choice set or range (unknown choice, 0 or a negative
      count, a path that does not exist, an empty string) exits non-zero within 10 s with ONE error line (argparse's
      usage block and the torch/kernels import warnings every run prints aside; both counted in the details), no
      traceback, naming the flag, and creates neither the new `--out` nor anything in the working directory; the
      details say whether torch was imported before the refusal ("torch=1") -- the project's complaint was
      "60 s to refuse a bad flag";
      a GPU-only run (`--device cuda`) on a machine without one says so in one line, the same way;
  (c) claims: the cheap commands the docs give (`--quick`, `--dry-run`, a random/tiny stand-in, `--steps 2` where a
      test runs 2 steps) run within 90 s, write the files the docs name, their JSON parses, and a second identical
      run reuses (a restartable recipe: finished files keep their bytes) or reproduces (the same numbers, times
      aside) where run; a recipe whose smallest documented run is longer is listed as NOT RUN (a PASS line);
  (d) offline: a hub id with downloads off is refused in one line within 10 s, naming the id or offline mode;
  and that the repository's tracked files and `runs/` are as they were when the audit started.
One line per case: PASS/FAIL | area | case | details; then TOTAL. Documented limits (docs/limits.md, a recipe's README)
are not FAILs: they read "(documented: where)". About 12 minutes on one core.
Output: bench/results/recipes_audit.txt.

Its run on commit b875702 (741 s, one core): 99 cases, 51 PASS, 48 FAIL. (a) every `--help` exits 0 in 0.0-7.0 s
(no FAIL on time; 20 of 23 import torch before argparse, 19 take 5.5-7 s on imports); most options' only text is
"(default: X)"; train_lora / train_preproj (4 options), gpu_table2 `--data-source` and tiny_qwen2vl's `path` have
none. (b) no refusal came near the 60 s complaint (each refused one in 0-8 s, the imports first), but only 5
of 45 are one argparse line naming the flag (the empty-value guards, `--micro-batch 3`, table2 `--groups bogus`):
30 bad choices / paths / counts end in a ValueError / FileNotFoundError traceback from the recipe's config (right
values listed, flag not named), 6 zero counts (`--steps 0`, `--max-steps 0`) are accepted and write a run,
`--workers 0` (table2, dinov2_probe) runs past 25 s, tiny_qwen2vl '' writes the model into the working directory,
frozen_probe `--data /nonexistent` is reported as the default model's hub id; 18 FAILs created `--out` (or wrote
into cwd). `--device cuda` without a GPU: torch's RuntimeError traceback. (c) every cheap documented run passes
in 7-16 s and writes what the docs say; the restartable ones (mini_vit_probe, dinov2_probe, dinov2_smollm2) read
their finished points back, clip_order and hf_trainer give the same numbers again. (d) frozen_probe and cifar_probe
refuse a hub id in one line; hf_trainer (transformers' 89-line traceback) and quantized_base (a traceback ending
in the library's clear ModelUnavailableError) do not. Nothing in the repository changed. Not fixed here.
That run's lines: bench/results/recipes_audit_before.txt.

Run again after the fixes (recipes/command.py `run_main` in every script, `parse_config`'s counts and flag names, the
per-recipe checks; and one harness fix: torch's import warnings are logged with the path relative to the first
`sys.path` entry, `.venv/lib/.../torch/...` when the venv sits inside the checkout, so the noise pattern takes any
prefix): 99 cases, 99 PASS in 675 s (bench/results/recipes_audit.txt)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(
    os.environ,
    OMP_NUM_THREADS="1",
    HF_HUB_OFFLINE="1",
    HF_DATASETS_OFFLINE="1",
    TRANSFORMERS_OFFLINE="1",
    PYTHONPATH=str(ROOT),
    PYTHONUNBUFFERED="1",
)
TMP = Path(tempfile.mkdtemp(prefix="recipes_audit_"))
CWD = TMP / "cwd"
RESULTS: list[tuple[bool, str, str, str]] = []
HELP_S = 30.0
REFUSE_S = 10.0
REFUSE_TIMEOUT = 25
CLAIM_TIMEOUT = 90
MARK = "@@AUDIT torch="
# run a script as `python path args` would, then say on stderr whether torch was imported by then
WRAP = (
    "import os, runpy, sys\n"
    "p = sys.argv[1]; sys.argv = sys.argv[1:]; sys.path.insert(0, os.path.dirname(os.path.abspath(p)))\n"
    "try:\n"
    "    runpy.run_path(p, run_name='__main__')\n"
    "finally:\n"
    "    sys.stderr.write('\\n" + MARK + "%d\\n' % ('torch' in sys.modules)); sys.stderr.flush()\n"
)

SCRIPTS = [
    "recipes/gpu_real_models.py",
    "recipes/headline.py",
    "recipes/integrations/hf_trainer.py",
    "recipes/integrations/quantized_base.py",
    "recipes/integrations/sft_trainer.py",
    "recipes/mixed/cifar_vqa.py",
    "recipes/mixed/dinov2_smollm2.py",
    "recipes/peft_port/train_lora.py",
    "recipes/peft_port/train_preproj.py",
    "recipes/smollm2/gpu_table2.py",
    "recipes/smollm2/table2.py",
    "recipes/text/pretrain_mini.py",
    "recipes/video/clip_order.py",
    "recipes/video/dinov2_clip_order.py",
    "recipes/vision/cifar_probe.py",
    "recipes/vision/cifar_scratch.py",
    "recipes/vision/dinov2_probe.py",
    "recipes/vision/mini_vit_open_clip.py",
    "recipes/vision/mini_vit_probe.py",
    "recipes/vision/pack_cifar_split.py",
    "recipes/vision/pretrain_mini_vit.py",
    "recipes/vlm/frozen_probe.py",
    "recipes/vlm/tiny_qwen2vl.py",
]


def record(ok, area, case, details):
    details = details.replace(str(TMP), "$TMP").replace(str(ROOT), "$ROOT")
    RESULTS.append((ok, area, case, details))
    print(f"{'PASS' if ok else 'FAIL'} | {area} | {case} | {details}", flush=True)


def run(cmd, timeout, cwd):
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        se = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        so = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, so, se, time.perf_counter() - t
    return p.returncode, p.stdout, p.stderr, time.perf_counter() - t


def run_wrapped(script, args, timeout, cwd=None):
    return run([sys.executable, "-c", WRAP, str(ROOT / script), *args], timeout, cwd or CWD)


def run_plain(script, args, timeout=CLAIM_TIMEOUT):
    return run([sys.executable, str(ROOT / script), *args], timeout, ROOT)


NOISE = (
    re.compile(r"^[WI]\d{4} [\d:.]+ \d+ \S*torch/"),  # torch's pytree / compile import warnings (path as logged)
    re.compile(r"^Skipping publisher trust check"),  # the kernels package, offline
    re.compile(r"^Failed to load CPU gemm_4bit_forward from kernels-community"),  # bitsandbytes' kernels, offline
    re.compile(r": offline: "),  # the library's offline banner
    re.compile(r"%\|"),  # progress bars
)


def split_stderr(stderr):
    """(error lines, noise lines, usage lines, torch flag) of a run's stderr."""
    torch_flag = None
    errs, noise, usage = [], 0, 0
    in_usage = False
    for ln in stderr.splitlines():
        if ln.startswith(MARK):
            torch_flag = ln[len(MARK) :].strip()
            continue
        if not ln.strip():
            in_usage = False
            continue
        if any(rx.search(ln) for rx in NOISE):
            noise += 1
            continue
        if ln.startswith("usage: "):
            in_usage = True
            usage += 1
            continue
        if in_usage and ln.startswith(" ") and ": error:" not in ln:
            usage += 1
            continue
        in_usage = False
        errs.append(ln)
    return errs, noise, usage, torch_flag


def snapshot(folder: Path):
    if not folder.exists():
        return None
    snap = {}
    for f in sorted(folder.rglob("*")):
        rel = str(f.relative_to(folder))
        snap[rel] = hashlib.sha256(f.read_bytes()).hexdigest() if f.is_file() else "<dir>"
    return snap


# -------------------------------------------------------------------------------------------------------- (a) help
def parse_options(text):
    """{option: help text without argparse's default} from a --help text's options / positional sections."""
    opts: dict[str, str] = {}
    section = False
    cur = None
    for ln in text.splitlines():
        if re.match(r"^(options|optional arguments|positional arguments):", ln):
            section, cur = True, None
            continue
        if not section:
            continue
        if not ln.strip():
            cur = None
            continue
        m = re.match(r"^  (\S.*?)(?:\s{2,}(.*))?$", ln)
        if m and not ln.startswith("   "):
            names = m.group(1)
            if names.startswith("-h, --help"):
                cur = None
                continue
            cur = names.split(",")[0].split()[0]
            opts[cur] = m.group(2) or ""
        elif cur is not None:
            opts[cur] += " " + ln.strip()
    return {k: re.sub(r"\(default:[^)]*\)?", "", v).strip() for k, v in opts.items()}, {
        k: "(default:" in v for k, v in opts.items()
    }


def case_help(script):
    rc, so, se, dt = run_wrapped(script, ["--help"], 60)
    errs, noise, _, torch_flag = split_stderr(se)
    problems = []
    if rc is None:
        problems.append("hang (60 s)")
    elif rc != 0:
        problems.append(f"rc={rc}")
    if dt > HELP_S:
        problems.append(f"took {dt:.1f}s > {HELP_S:.0f}s")
    if "Traceback" in se:
        problems.append("traceback")
    opts, has_default = parse_options(so)
    bare = sorted(k for k, v in opts.items() if not v and not has_default[k])
    only_default = sorted(k for k, v in opts.items() if not v and has_default[k])
    if not opts and rc == 0 and "usage:" not in so:
        problems.append("no usage text")
    if bare:
        problems.append(f"{len(bare)} option(s) with no help text at all: {' '.join(bare)}")
    record(
        not problems,
        "help",
        f"{script} --help",
        f"{'; '.join(problems) or 'ok'} | rc={rc} {dt:.1f}s torch={torch_flag} | {len(opts)} options, "
        f"{len(only_default)} with only '(default: X)' as text"
        f"{': ' + ' '.join(only_default[:6]) if only_default else ''}{' ...' if len(only_default) > 6 else ''}; "
        f"{noise} torch/kernels warning lines on stderr",
    )


# ---------------------------------------------------------------------------------------------------- (b) refusals
# (script, args, words the one error line must hold); {NEW} is an --out path that must not be created. Every bad value
# is of a kind the script's --help / docstring / README documents: a choice set, a count, a path, an empty string.
REFUSALS = [
    ("recipes/integrations/hf_trainer.py", "--method dora --out {NEW}", ["--method"]),
    ("recipes/integrations/hf_trainer.py", "--method '' --out {NEW}", ["--method"]),
    ("recipes/integrations/hf_trainer.py", "--steps 0 --out {NEW}", ["--steps"]),
    ("recipes/integrations/hf_trainer.py", "--model /nonexistent/model --out {NEW}", ["--model"]),
    ("recipes/integrations/sft_trainer.py", "--method dora --out {NEW}", ["--method"]),
    ("recipes/integrations/quantized_base.py", "--scheme int3 --out {NEW}", ["--scheme"]),
    ("recipes/integrations/quantized_base.py", "--steps 0 --out {NEW}", ["--steps"]),
    ("recipes/peft_port/train_preproj.py", "--max-steps 0 --out {NEW}", ["--max-steps"]),
    ("recipes/peft_port/train_lora.py", "--num-lines 0 --out {NEW}", ["--num-lines"]),
    ("recipes/text/pretrain_mini.py", "--books /nonexistent/books --out {NEW}", ["--books"]),
    ("recipes/text/pretrain_mini.py", "--steps 0 --out {NEW}", ["--steps"]),
    ("recipes/mixed/cifar_vqa.py", "--arms bogus --out {NEW}", ["--arms"]),
    ("recipes/mixed/cifar_vqa.py", "--arms '' --out {NEW}", ["--arms"]),
    ("recipes/mixed/cifar_vqa.py", "--data /nonexistent/cifar --out {NEW}", ["--data"]),
    ("recipes/mixed/cifar_vqa.py", "--steps 0 --quick --out {NEW}", ["--steps"]),
    ("recipes/mixed/dinov2_smollm2.py", "--tower bogus --out {NEW} --runs {NEW}-runs", ["--tower"]),
    ("recipes/mixed/dinov2_smollm2.py", "--lm bogus --out {NEW} --runs {NEW}-runs", ["--lm"]),
    ("recipes/smollm2/table2.py", "--preset nonsense --out {NEW} --runs {NEW}-runs", ["--preset"]),
    ("recipes/smollm2/table2.py", "--workers 0 --out {NEW} --runs {NEW}-runs", ["--workers"]),
    ("recipes/smollm2/table2.py", "--groups bogus --out {NEW} --runs {NEW}-runs", ["--groups"]),
    ("recipes/smollm2/gpu_table2.py", "--micro-batch 3 --out {NEW}", ["--micro-batch"]),
    ("recipes/smollm2/gpu_table2.py", "--methods dora --dry-run --out {NEW}", ["--methods"]),
    ("recipes/gpu_real_models.py", "--parts bogus --dry-run --out {NEW}", ["--parts"]),
    ("recipes/video/clip_order.py", "--task bogus --out {NEW}", ["--task"]),
    ("recipes/video/clip_order.py", "--variants bogus --out {NEW}", ["--variants"]),
    ("recipes/video/clip_order.py", "--video /nonexistent/v.mp4 --out {NEW}", ["--video"]),
    ("recipes/video/clip_order.py", "--steps 0 --quick --out {NEW}", ["--steps"]),
    ("recipes/video/dinov2_clip_order.py", "--variants bogus --out {NEW} --runs {NEW}-runs", ["--variants"]),
    ("recipes/video/dinov2_clip_order.py", "--backbone bogus --quick --out {NEW} --runs {NEW}-runs", ["--backbone"]),
    ("recipes/vision/cifar_probe.py", "--methods dora --backbone random-tiny --out {NEW}", ["--methods"]),
    ("recipes/vision/cifar_probe.py", "--backbone bogus --quick --out {NEW}", ["--backbone"]),
    ("recipes/vision/cifar_scratch.py", "--variants bogus --out {NEW}", ["--variants"]),
    ("recipes/vision/cifar_scratch.py", "--steps 0 --quick --out {NEW}", ["--steps"]),
    ("recipes/vision/dinov2_probe.py", "--arms bogus --out {NEW} --runs {NEW}-runs", ["--arms"]),
    ("recipes/vision/dinov2_probe.py", "--workers 0 --out {NEW} --runs {NEW}-runs", ["--workers"]),
    ("recipes/vision/dinov2_probe.py", "--backbone bogus --quick --out {NEW} --runs {NEW}-runs", ["--backbone"]),
    ("recipes/vision/mini_vit_probe.py", "--arms bogus --out {NEW}", ["--arms"]),
    ("recipes/vision/mini_vit_probe.py", "--checkpoint /nonexistent/vit --quick --out {NEW}", ["--checkpoint"]),
    ("recipes/vision/pretrain_mini_vit.py", "--train-zip /nonexistent/t.zip --out {NEW}", ["--train-zip"]),
    ("recipes/vision/pretrain_mini_vit.py", "--steps 0 --quick --out {NEW}", ["--steps"]),
    ("recipes/vision/pack_cifar_split.py", "--src /nonexistent/cifar10-images --out {NEW}", ["--src"]),
    ("recipes/vlm/frozen_probe.py", "--dtype int3 --model {NEW}-model --out {NEW}", ["--dtype"]),
    ("recipes/vlm/frozen_probe.py", "--data /nonexistent/cifar --out {NEW}", ["--data"]),
    ("recipes/vlm/frozen_probe.py", "--model '' --out {NEW}", ["--model"]),
    ("recipes/vlm/tiny_qwen2vl.py", "''", ["path"]),
    # GPU-only runs on a machine without a GPU: one line that says so
    ("recipes/smollm2/gpu_table2.py", "--device cuda --out {NEW}", ["cuda"]),
    ("recipes/gpu_real_models.py", "--device cuda --parts probe --out {NEW}", ["cuda"]),
]


def case_refusal(script, spec, words, area="refuse"):
    new = TMP / "refuse-new"
    for p in (new, Path(f"{new}-runs"), Path(f"{new}-model")):
        shutil.rmtree(p, ignore_errors=True)
    shutil.rmtree(CWD, ignore_errors=True)
    CWD.mkdir(parents=True)
    args = shlex.split(spec.replace("{NEW}", str(new)))
    rc, so, se, dt = run_wrapped(script, args, REFUSE_TIMEOUT)
    errs, noise, usage, torch_flag = split_stderr(se)
    problems = []
    if rc is None:
        problems.append(f"not refused within {REFUSE_TIMEOUT} s (killed)")
    elif rc == 0:
        problems.append("rc=0 (accepted)")
    if rc is not None and dt > REFUSE_S:
        problems.append(f"took {dt:.1f}s > {REFUSE_S:.0f}s")
    if "Traceback (most recent call last)" in se:
        problems.append("traceback")
    if rc is not None and rc != 0 and len(errs) != 1:
        problems.append(f"{len(errs)} error lines")
    msg = next((e for e in errs if ": error:" in e), errs[-1] if errs else "")
    if "Traceback (most recent call last)" in se or rc is None or rc == 0:
        msg = (errs[-1] if errs else (so.strip().splitlines() or [""])[-1]) if (errs or so.strip()) else ""
    missing = [w for w in words if w.lower() not in msg.lower()]
    if missing and rc not in (None, 0):
        problems.append(f"line lacks {missing}")
    made = [p.name for p in (new, Path(f"{new}-runs"), Path(f"{new}-model")) if p.exists()]
    if made:
        problems.append(f"created {made}")
    if any(CWD.iterdir()):
        problems.append(f"wrote into the working directory: {sorted(p.name for p in CWD.iterdir())[:4]}")
    record(
        not problems,
        area,
        f"{script} {spec}",
        f"{'; '.join(problems) or 'ok'} | rc={rc} {dt:.1f}s torch={torch_flag} usage-lines={usage} "
        f"warnings={noise} | {msg[:170]}",
    )


# ----------------------------------------------------------------------------------------------------- (d) offline
OFFLINE = [
    ("recipes/vlm/frozen_probe.py", "--model Qwen/Qwen2-VL-2B-Instruct --steps 2 --out {NEW}", "Qwen/Qwen2-VL-2B"),
    ("recipes/integrations/hf_trainer.py", "--model EleutherAI/pythia-14m --steps 2 --out {NEW}", "pythia-14m"),
    ("recipes/integrations/quantized_base.py", "--model EleutherAI/pythia-14m --steps 2 --out {NEW}", "pythia-14m"),
    ("recipes/vision/cifar_probe.py", "--backbone timm:vit_small_patch16_224 --quick --out {NEW}", "vit_small"),
]


def case_offline(script, spec, ident):
    new = TMP / "offline-new"
    shutil.rmtree(new, ignore_errors=True)
    shutil.rmtree(CWD, ignore_errors=True)
    CWD.mkdir(parents=True)
    args = shlex.split(spec.replace("{NEW}", str(new)))
    rc, so, se, dt = run_wrapped(script, args, 40)
    errs, noise, usage, torch_flag = split_stderr(se)
    problems = []
    if rc is None:
        problems.append("hang (40 s)")
    elif rc == 0:
        problems.append("rc=0")
    if rc is not None and dt > REFUSE_S:
        problems.append(f"took {dt:.1f}s > {REFUSE_S:.0f}s")
    if "Traceback (most recent call last)" in se:
        problems.append("traceback")
    if rc not in (None, 0) and len(errs) != 1:
        problems.append(f"{len(errs)} error lines")
    msg = errs[-1] if errs else ""
    if rc not in (None, 0) and ident.lower() not in msg.lower() and "offline" not in msg.lower():
        problems.append("line names neither the id nor offline mode")
    record(
        not problems,
        "offline",
        f"{script} {spec}",
        f"{'; '.join(problems) or 'ok'} | rc={rc} {dt:.1f}s torch={torch_flag} warnings={noise} | {msg[:170]}",
    )


# ------------------------------------------------------------------------------------------------------ (c) claims
TIMING = re.compile(
    r"(time|wall|second|_s$|cpu|date|host|machine|command|elapsed|duration|started|pid|path|dir|table|load|environ"
    r"|^trained$|^read$)",
    re.I,
)


def strip_timing(obj):
    if isinstance(obj, dict):
        return {k: strip_timing(v) for k, v in obj.items() if not TIMING.search(str(k))}
    if isinstance(obj, list):
        return [strip_timing(v) for v in obj]
    return obj


def numbers(obj):
    """The numbers of a JSON value, times, load, paths and rendered tables aside (a status string such as
    "trained" / "read back" is not a number, so a restart that reads its results back compares equal)."""
    obj = strip_timing(obj)
    if isinstance(obj, dict):
        return [n for k in sorted(obj) for n in numbers(obj[k])]
    if isinstance(obj, list):
        return [n for v in obj for n in numbers(v)]
    return [obj] if isinstance(obj, (int, float)) and not isinstance(obj, bool) else []


def load_json(path: Path):
    try:
        return json.loads(path.read_text()), ""
    except (OSError, ValueError) as e:
        return None, f"{path.name}: {type(e).__name__}"


def claim_run(name, script, args, expect, json_files=(), check=None, second=None, doc=""):
    """Run a documented cheap command; check the files it says it writes; optionally a second identical run.

    second: None, "reuse" (the finished files keep their bytes) or "reproduce" (the JSON numbers, times aside)."""
    rc, so, se, dt = run_plain(script, args)
    errs, *_ = split_stderr(se)
    cmd = f"{script} {' '.join(shlex.quote(a) for a in args)}"
    if rc != 0:
        why = "over 90 s (killed)" if rc is None else f"rc={rc}"
        tail = (errs[-1] if errs else (so.strip().splitlines() or [""])[-1])[:200]
        record(False, "claim", name, f"{why} after {dt:.0f}s | {tail} | cmd: {cmd}")
        return None
    problems = []
    base = Path(args[args.index("--out") + 1]) if "--out" in args else None
    missing = []
    for pat in expect:
        if not list(base.glob(pat)):
            missing.append(pat)
    if missing:
        problems.append(f"missing {missing} (has {sorted(p.name for p in base.iterdir())[:8]})")
    parsed = {}
    for pat in json_files:
        for f in sorted(base.glob(pat))[:20]:
            data, err = load_json(f)
            if err:
                problems.append(err)
            parsed[str(f.relative_to(base))] = data
    if check is not None and not missing:
        problems += check(base, parsed, so + se)
    note = ""
    if second and not problems:
        before = snapshot(base)
        rc2, so2, se2, dt2 = run_plain(script, args)
        if rc2 != 0:
            last = (split_stderr(se2)[0] or [""])[-1][:120]
            problems.append(f"second identical run: rc={rc2} after {dt2:.0f}s: {last}")
        else:
            after = snapshot(base)
            again = {}
            for pat in json_files:
                for f in sorted(base.glob(pat))[:20]:
                    again[str(f.relative_to(base))] = load_json(f)[0]
            same = numbers(parsed) == numbers(again)
            changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
            note = (
                f"; second run {dt2:.0f}s (first {dt:.0f}s), {len(changed)} of {len(before)} files rewritten, "
                f"{len(numbers(parsed))} numbers {'the same' if same else 'DIFFER'} (times aside)"
            )
            if second == "reuse":
                # summaries and logs are rewritten by design; a finished point's own files must keep their bytes
                regenerated = ("summary.json", "report.md", ".jsonl", ".png", ".lock", "study.json")
                result_changed = [k for k in changed if not k.endswith(regenerated)]
                if result_changed:
                    problems.append(f"second run rewrote finished results {result_changed[:4]} (docs: restartable)")
            if not same:
                problems.append("second identical run gives other numbers")
    record(not problems, "claim", name, f"{'; '.join(problems) or 'ok'} | {dt:.0f}s{note} {doc} | cmd: {cmd}")
    return base


def check_keys(fname, keys):
    def check(base, parsed, _out):
        data = parsed.get(fname)
        if not isinstance(data, dict):
            return [f"{fname} not a JSON object"]
        text = json.dumps(data)
        return [f"{fname} lacks {k!r}" for k in keys if f'"{k}"' not in text]

    return check


def check_reload(base, parsed, _out):
    data = parsed.get("summary.json")
    if not isinstance(data, dict) or "reload_max_diff" not in data:
        return ["summary.json lacks reload_max_diff"]
    return [] if data["reload_max_diff"] == 0.0 else [f"reload_max_diff={data['reload_max_diff']} (docs: 0.0)"]


def check_printed(pattern):
    def check(base, parsed, out):
        return [] if re.search(pattern, out) else [f"output has no {pattern!r}"]

    return check


def claims():
    c = TMP / "claims"
    c.mkdir(exist_ok=True)
    claim_run(
        "clip_order --quick",
        "recipes/video/clip_order.py",
        ["--quick", "--out", str(c / "clip")],
        ["metrics.json", "accuracy.png", "loss.png"],
        ["metrics.json"],
        second="reproduce",
        doc="(docstring: ~10 s smoke run; writes metrics.json, accuracy.png, loss.png)",
    )
    claim_run(
        "cifar_scratch --quick",
        "recipes/vision/cifar_scratch.py",
        ["--quick", "--out", str(c / "scratch")],
        ["metrics.json", "accuracy.png", "loss.png", "skip_norms.png"],
        ["metrics.json"],
        doc="(docstring: ~15 s smoke run)",
    )
    claim_run(
        "cifar_probe --backbone random-tiny --quick",
        "recipes/vision/cifar_probe.py",
        ["--backbone", "random-tiny", "--quick", "--out", str(c / "probe")],
        ["metrics.json", "accuracy.png", "loss.png"],
        ["metrics.json"],
        doc="(docstring: ~10 s smoke run)",
    )
    claim_run(
        "cifar_vqa --quick",
        "recipes/mixed/cifar_vqa.py",
        ["--quick", "--out", str(c / "vqa")],
        ["results.json", "results.md", "routing.png"],
        ["results.json"],
        doc="(docstring: ~30 s smoke run; README: ~10 CPU-s)",
    )
    claim_run(
        "mini_vit_probe --quick",
        "recipes/vision/mini_vit_probe.py",
        ["--quick", "--out", str(c / "mvp")],
        ["summary.json", "report.md", "*.png"],
        ["summary.json"],
        second="reuse",
        doc="(docstring: seconds; restartable, reads finished points back)",
    )
    claim_run(
        "pretrain_mini_vit --quick",
        "recipes/vision/pretrain_mini_vit.py",
        ["--quick", "--out", str(c / "vit")],
        ["TRAINING.md", "reference_logits.json"],
        ["reference_logits.json"],
        doc="(docstring: seconds, a smoke run)",
    )
    claim_run(
        "dinov2_probe --quick (random tiny)",
        "recipes/vision/dinov2_probe.py",
        [
            "--quick",
            "--backbone",
            "random-dinov2-tiny",
            "--timm-backbone",
            "timm:random-dinov2-tiny",
            "--out",
            str(c / "dprobe"),
            "--runs",
            str(c / "dprobe-runs"),
        ],
        ["**/metrics.json", "report.md"],
        ["**/metrics.json"],
        second="reuse",
        doc="(docstring: seconds; a restart trains nothing twice)",
    )
    claim_run(
        "dinov2_clip_order --quick (random tiny)",
        "recipes/video/dinov2_clip_order.py",
        [
            "--quick",
            "--backbone",
            "random-dinov2-tiny",
            "--pool",
            "1",
            "--grid-crop",
            "1",
            "--out",
            str(c / "dvid"),
            "--runs",
            str(c / "dvid-runs"),
        ],
        ["metrics.json", "report.md"],
        ["metrics.json"],
        doc="(docstring: seconds, on a random stand-in)",
    )
    claim_run(
        "dinov2_smollm2 --quick",
        "recipes/mixed/dinov2_smollm2.py",
        ["--quick", "--out", str(c / "vlm"), "--runs", str(c / "vlm-runs")],
        ["arms/**/select.json", "arms/**/times.jsonl"],
        ["arms/**/select.json", "arms/**/full.json"],
        second="reuse",
        doc="(README: --quick runs tiny random models in seconds; each finished step restartable)",
    )
    claim_run(
        "hf_trainer --steps 2",
        "recipes/integrations/hf_trainer.py",
        ["--steps", "2", "--save-steps", "1", "--num-lines", "64", "--out", str(c / "hf")],
        ["checkpoint-*/adapter_config.json", "checkpoint-*/adapter_model.safetensors", "final/adapter_config.json"],
        ["summary.json"],
        check=check_reload,
        second="reproduce",
        doc="(README: adapter-only OUT/checkpoint-N, OUT/final, summary.json reload_max_diff 0.0)",
    )
    claim_run(
        "train_preproj --max-steps 2",
        "recipes/peft_port/train_preproj.py",
        ["--max-steps", "2", "--out", str(c / "port")],
        ["checkpoint-*/adapter_config.json", "final/adapter_config.json", "final/adapter_model.safetensors"],
        ["final/adapter_config.json"],
        doc="(README: the test runs both for 2 steps; OUT/checkpoint-N, OUT/final)",
    )
    claim_run(
        "quantized_base --steps 2",
        "recipes/integrations/quantized_base.py",
        ["--steps", "2", "--eval-lines", "20", "--train-lines", "16", "--out", str(c / "quant")],
        ["metrics.json", "adapter/*"],
        ["metrics.json"],
        doc="(docstring: writes metrics.json and adapter/; default ~1 min)",
    )
    tiny = c / "tiny-qwen2vl"
    rc, so, se, dt = run_plain("recipes/vlm/tiny_qwen2vl.py", [str(tiny)])
    ok = rc == 0 and (tiny / "config.json").exists()
    record(ok, "claim", "tiny_qwen2vl PATH", f"rc={rc} {dt:.0f}s config.json={'yes' if ok else 'no'}")
    if ok:
        claim_run(
            "frozen_probe --model <tiny> --steps 20",
            "recipes/vlm/frozen_probe.py",
            ["--model", str(tiny), "--steps", "20", "--out", str(c / "vlmprobe")],
            ["results.json", "adapter/*"],
            ["results.json"],
            doc="(documented: docs/limits.md, run only on a random-tiny Qwen2-VL; docs/results.md: offline proof)",
        )
    claim_run(
        "pretrain_mini --steps 2",
        "recipes/text/pretrain_mini.py",
        ["--steps", "2", "--warmup-steps", "1", "--eval-every", "1", "--eval-batches", "1", "--out", str(c / "pm")],
        ["TRAINING.md", "config.json", "*.safetensors", "tokenizer*"],
        ["config.json"],
        doc="(README: fp16 safetensors + tokenizer + TRAINING.md, folder renamed to --out)",
    )
    rc, so, se, dt = run_plain("recipes/vision/mini_vit_open_clip.py", [])
    nums = re.findall(r"\d\.\d+e-?\d+|\d+\.\d+", so)
    record(
        rc == 0 and bool(nums),
        "claim",
        "mini_vit_open_clip (no args)",
        f"rc={rc} {dt:.0f}s | {(so.strip().splitlines() or [''])[-1][:150]} (docstring: prints the largest diff)",
    )
    before = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    rc, so, se, dt = run_plain("recipes/headline.py", ["--check"])
    after = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    record(
        rc == 0 and before == after,
        "claim",
        "headline --check",
        f"rc={rc} {dt:.0f}s tree {'unchanged' if before == after else 'CHANGED'} | "
        f"{((split_stderr(se)[0] or so.strip().splitlines() or [''])[-1])[:150]} "
        "(docstring: exit 1 naming a stale block)",
    )
    for name, why in [
        ("sft_trainer", "the only documented run is 60 steps, 141 CPU-s on 2 cores (README), over the 90 s budget"),
        ("gpu_table2 --dry-run --model tiny.gguf", "'checks the path in minutes' (--help); tiny.gguf is not shipped"),
        ("gpu_real_models --dry-run", "~1 CPU-minute (docstring) plus a tiny.gguf the docs do not say how to make"),
        ("table2 (--preset mini)", "the offline mini study takes hours of CPU (docs/results.md)"),
        ("train_lora", "the same script as train_preproj but for two lines (README); not run twice"),
        ("pack_cifar_split", "needs the shared cifar10-images folder, not in the repository (docstring)"),
        ("accelerate_launch.sh", "2 processes, 63 s each part (README): over budget on one core"),
    ]:
        record(True, "claim", f"NOT RUN {name}", why)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run only the cases whose area or name holds this substring")
    a = ap.parse_args()
    t0 = time.time()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    print(f"# recipes_audit: commit {commit.strip()}, {sys.executable}, offline, tmp=$TMP", flush=True)
    tracked0 = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    runs0 = snapshot(ROOT / "runs") if (ROOT / "runs").exists() else None
    CWD.mkdir(parents=True, exist_ok=True)
    try:
        for s in SCRIPTS:
            if a.only in f"help {s}":
                try:
                    case_help(s)
                except Exception:  # noqa: BLE001
                    record(False, "harness", s, "HARNESS ERROR " + traceback.format_exc(limit=2)[-300:])
        for s, spec, words in REFUSALS:
            area = "gpu-only" if "--device cuda" in spec else "refuse"
            if a.only in f"{area} {s} {spec}":
                try:
                    case_refusal(s, spec, words, area)
                except Exception:  # noqa: BLE001
                    record(False, "harness", s, "HARNESS ERROR " + traceback.format_exc(limit=2)[-300:])
        for s, spec, ident in OFFLINE:
            if a.only in f"offline {s} {spec}":
                try:
                    case_offline(s, spec, ident)
                except Exception:  # noqa: BLE001
                    record(False, "harness", s, "HARNESS ERROR " + traceback.format_exc(limit=2)[-300:])
        if a.only in "claim":
            try:
                claims()
            except Exception:  # noqa: BLE001
                record(False, "harness", "claims", "HARNESS ERROR " + traceback.format_exc(limit=2)[-300:])
        tracked1 = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
        runs1 = snapshot(ROOT / "runs") if (ROOT / "runs").exists() else None
        strip = lambda s: "\n".join(ln for ln in s.splitlines() if "recipes_audit" not in ln)  # noqa: E731
        record(
            strip(tracked0) == strip(tracked1) and runs0 == runs1,
            "repo",
            "tracked files and runs/ unchanged by the audit",
            f"git status {'same' if strip(tracked0) == strip(tracked1) else 'differs'}; "
            f"runs/ {'same' if runs0 == runs1 else 'differs'}",
        )
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    n = len(RESULTS)
    p = sum(r[0] for r in RESULTS)
    print(f"TOTAL {n}: {p} PASS, {n - p} FAIL ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
