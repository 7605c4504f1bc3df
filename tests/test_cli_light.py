"""A light command (issue 32 s4, issue 44): `mmpreproj --help`, a subcommand's --help and every refused argument
(a range, a list, a path, a name) answer without importing torch, peft or transformers (`mmpreproj_cli`), with the
library's own rules and names (one table each, in `mmpreproj_tables`, which both read); the command sets and says
the hub's offline flags; and `import mmpreproj` leaves the optional parts (plots, hub data, lm-eval, open_clip,
GGUF, video) unloaded."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mmpreproj_tables.sources
from mmpreproj_cli.command import main
from mmpreproj_cli.parser import TRAIN_FLAGS, build_parser
from mmpreproj_tables import offline, packaged, tables, values
from tests.helpers.procs import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]
LIGHT = ("mmpreproj_cli", "mmpreproj_tables")  # the command and the plain tables it reads
HEAVY = ("torch", "peft", "transformers", "mmpreproj")
OPTIONAL = ("matplotlib", "datasets", "lm_eval", "open_clip", "gguf", "av", "pandas", "diffusers", "trl")

# Run `main(argv)` in a fresh interpreter; the last line says how it exited and which heavy modules it loaded.
_MAIN = """
import json, sys
from mmpreproj_cli.command import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "loaded": [m for m in %r if m in sys.modules]}))
"""


def _python(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv,code",
    [(["--help"], 0), (["train", "--help"], 0), (["train", "--preset", "nonsense"], 2)],
    ids=["help", "train-help", "bad-preset"],
)
def test_help_and_argument_errors_import_neither_peft_nor_transformers(argv, code):
    run = _python("-c", _MAIN % (HEAVY,), *argv)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result == {"code": code, "loaded": []}, run.stderr
    if code == 2:  # argparse's one line (no usage block before it), naming every allowed value
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1, run.stderr
        last = lines[0]
        assert last.startswith("mmpreproj train: error: argument --preset: invalid choice: 'nonsense'"), last
        assert all(name in last for name in tables.PRESETS), last


@pytest.mark.slow
def test_every_module_of_the_tables_and_the_command_imports_without_the_library():
    """`mmpreproj_tables` and `mmpreproj_cli` whole, `run.py` included (its subcommands import the library inside
    their functions): imported in a fresh interpreter, not one heavy module loads."""
    modules = [f"{p.parent.name}.{p.stem}" for package in LIGHT for p in sorted((ROOT / package).glob("*.py"))]
    modules = [m for m in modules if not m.endswith(("__init__", "__main__"))]
    assert {"mmpreproj_cli.run", "mmpreproj_tables.tables", "mmpreproj_tables.sources"} <= set(modules)
    statement = f"import sys, {', '.join(modules)}; print([m for m in {HEAVY!r} if m in sys.modules])"
    run = _python("-c", statement)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[]"


# (argv, exit code, the error after `mmpreproj CMD: error: `): each kind of argument checked without the library
REFUSED = [
    (["train", "--expansion", "-1"], 1, "--expansion -1.0; must be a finite number in (0, 16]"),
    (["eval", "--adapter", "/nonexistent/adapter"], 1, "--adapter /nonexistent/adapter: no such file or folder"),
    (["eval", "--adapter", "."], 1, "--adapter .: holds no adapter (adapter_config.json"),
    (["train", "--method", "dora"], 2, "argument --method: invalid choice: 'dora'"),
    (["train", "--preset", "nonsense"], 2, "argument --preset: invalid choice: 'nonsense'"),
    (["eval", "--tasks", "ppl,bogus"], 1, "--tasks 'ppl,bogus': unknown ['bogus']; allowed:"),
    (["sweep", "--methods", "preproj_skip,dora"], 1, "--methods 'preproj_skip,dora': unknown"),
    (["train", "--model", "./no-such-model"], 1, "--model ./no-such-model: no such folder"),
    (["train", "--model", "dinov2-small"], 1, "--model dinov2-small: an image backbone"),
    (["eval", "--model", "smollm2-136m"], 1, "--model smollm2-136m: unknown model name; did you mean smollm2-135m?"),
    (
        ["eval", "--model", "mini-pythia"],
        1,
        "--model mini-pythia: unknown model name; did you mean assets/mini-pythia?",
    ),
    (["eval", "--model", "assets/mini-vit"], 1, "--model assets/mini-vit: its config.json names no model_type"),
    (["train", "--data", "./no-such.txt"], 1, "--data ./no-such.txt: no such file"),
    (["train", "--steps", "-5"], 1, "--steps -5; must be a positive int"),
    (["train", "--lr", "nan"], 1, "--lr nan; must be a finite number > 0"),
    (["train", "--warmup-steps", "300"], 1, "--warmup-steps 300; must be in [0, steps=200]"),
    (["sweep", "--lrs", "1e-3,x"], 1, "--lrs '1e-3,x': 'x' is not a number"),
    (["sweep", "--lrs", "1e-3,0"], 1, "--lrs '1e-3,0': 0.0 is not a finite number > 0"),
    (["budget", "--budgets", "0.01,2"], 1, "--budgets: '2' is not in (0, 1]"),
    (["demo", "--seeds", "0,0"], 1, "--seeds '0,0': seed 0 is named twice"),
    (["reproduce", "--preset", "mini", "--layers", "0,x"], 1, "--layers '0,x': pass"),
    (["train", "--method", "preproj", "--skip-rank", "16"], 1, "--skip-rank sizes a skip, which --method preproj"),
    (["train", "--method", "lora", "--layers=-1"], 1, "--layers sizes injected modules, which --method lora"),
    (["train", "--method", "skip", "--expansion", "0.5"], 1, "--expansion sizes a pre-projection, which --method"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "code", "says"), REFUSED, ids=[" ".join(a) for a, _, _ in REFUSED])
def test_a_refused_argument_answers_before_torch_transformers_or_peft_load(argv, code, says):
    """In a fresh interpreter: the exit code, one error line naming the option, and not one heavy module loaded (so
    this fails whenever a check moves behind an import of the library)."""
    run = _python("-c", _MAIN % (HEAVY,), *argv)
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"code": code, "loaded": []}, run.stderr
    err = run.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"mmpreproj {argv[0]}: error: {says}"), run.stderr  # argparse too


# every `train` flag with a TrainConfig range, at the first value outside it
_OUTSIDE = [
    (f, b.low if b.low_open else b.low - 1)
    for f, b in values.TRAIN_BOUNDS.items()
    if f in TRAIN_FLAGS or f in ("expansion", "skip_rank")
]


@pytest.mark.parametrize(("field", "value"), _OUTSIDE, ids=[f for f, _ in _OUTSIDE])
def test_every_train_range_is_checked_by_the_command_with_the_librarys_rule(field, value, capsys):
    argv = ["train", "--" + field.replace("_", "-"), str(value)]
    assert main(argv) == 1
    parsed = getattr(build_parser().parse_args(argv), field)  # as the parser typed it (0 -> 0.0 for --lr)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"mmpreproj train: error: {argv[1]} {parsed}; must be {values.TRAIN_BOUNDS[field].says}"], err


def test_a_packaged_model_not_installed_is_refused_by_the_command_naming_the_install(monkeypatch, capsys):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert main(["train", "--preset", "smollm2-135m-cpu"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "mmpreproj train: error: --preset smollm2-135m-cpu: model smollm2-135m: not installed; install it "
        f"with: {packaged.GGUF_MODELS['smollm2-135m'].install}"
    ], err


_OFF = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.mark.parametrize(
    ("environ", "online", "after", "line"),
    [
        (
            {},
            False,
            _OFF,
            "offline: HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 (set by mmpreproj; pass --online to allow hub downloads)",
        ),
        (dict(_OFF), False, _OFF, "offline: HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 (from the environment)"),
        (
            {"HF_HUB_OFFLINE": "0"},
            False,
            {"HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0"},
            "online: HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0 (from the environment; hub downloads allowed)",
        ),
        (
            dict(_OFF),
            True,
            {"HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0"},
            "online: HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0 (--online: hub downloads allowed)",
        ),
    ],
    ids=["unset", "environment-offline", "environment-online", "online-flag"],
)
def test_the_offline_flags_default_to_on_and_the_line_says_where_they_came_from(environ, online, after, line):
    assert offline.choose_offline(online, environ) == line
    assert environ == after


@pytest.mark.slow
def test_import_mmpreproj_leaves_the_optional_parts_unloaded():
    statement = (
        "import sys, mmpreproj, mmpreproj.train, mmpreproj.eval, mmpreproj.analysis, mmpreproj.experiments, "
        f"mmpreproj.integrations.quantized, mmpreproj_cli.run; print([m for m in {OPTIONAL!r} if m in sys.modules])"
    )
    run = _python("-c", statement)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[]"


def test_the_console_script_is_the_light_entry_point():
    lines = (ROOT / "pyproject.toml").read_text().splitlines()  # (tomllib is 3.11+; the floor is 3.10)
    assert any(line.startswith('mmpreproj = "mmpreproj_cli.command:main"') for line in lines)


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level package named, inside a function) for each import in `path` (relative ones: its own package)."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((a.name.split(".")[0], in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                found.append((path.parent.name if child.level else (child.module or "").split(".")[0], in_function))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(path.read_text()), False)
    return found


@pytest.mark.parametrize("package", LIGHT)
def test_the_light_packages_import_only_the_standard_library_and_each_other_at_the_top(package):
    """The command imports the library only inside functions: `command.main` imports `run` after the arguments are
    checked, and each subcommand of `run.py` imports the modules it runs. The tables import not even the command;
    one function of theirs reads huggingface_hub's cache (`sources.hub_cached`, no torch: checked above)."""
    allowed = set(sys.stdlib_module_names) | {"mmpreproj_tables"}
    if package == "mmpreproj_cli":
        allowed.add("mmpreproj_cli")
    bad = []
    for path in sorted((ROOT / package).glob("*.py")):
        for name, deferred in _imports(path):
            if name == "mmpreproj" and deferred and package == "mmpreproj_cli" and path.name == "run.py":
                continue
            if name == "huggingface_hub" and deferred and path.name == "sources.py":
                continue
            if name not in allowed:
                bad.append(f"{path.name}: {name}{' (in a function)' if deferred else ''}")
    assert bad == []


def test_the_library_reads_the_plain_tables_never_the_command():
    """The library's facts (names, ranges, where a name points, the offline flags) come from `mmpreproj_tables`;
    the command's parser and checks are the command's own (only `mmpreproj/__main__.py`, an entry point, calls it)."""
    bad = []
    for path in sorted((ROOT / "mmpreproj").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            named = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            named += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.split(".")[0] == "mmpreproj_cli" for n in named) and path.name != "__main__.py":
                bad.append(f"{path.relative_to(ROOT)}: {', '.join(named)}")
    assert bad == []


def test_the_choices_shown_are_the_librarys_own():
    """One fact in one place: the library's names are the very objects of the table the parser shows."""
    from mmpreproj.experiments import budget, sweep
    from mmpreproj.train import config, methods, presets, sizes

    evaluate = importlib.import_module("mmpreproj.eval.evaluate")  # the package's `evaluate` is the function

    assert methods.METHOD_SPECS is tables.METHOD_SPECS and config.METHODS is tables.METHODS
    assert presets.PRESETS is tables.PRESETS and sizes.BUDGET_METHODS is tables.BUDGET_METHODS
    assert evaluate.TASKS is tables.TASKS and evaluate.PROTOCOLS is tables.PROTOCOLS
    assert sweep.DEFAULT_LRS is tables.DEFAULT_LRS and budget.DEFAULT_BUDGETS is tables.DEFAULT_BUDGETS
    train = build_parser()._subparsers._group_actions[0].choices["train"]  # the parser's own record
    choices = {a.dest: a.choices for a in train._actions if a.choices}
    assert choices["method"] == tables.METHODS and choices["preset"] == sorted(tables.PRESETS)
    assert choices["precision"] == tables.PRECISIONS and choices["parallel"] == tables.PARALLEL


def test_the_rules_the_command_checks_are_the_librarys_own():
    """One rule in one place: the bounds, list parsers, locator and model tables the command checks with are the very
    objects the library checks with."""
    from mmpreproj.data import assets, gguf_source, hub, model_source, onnx_source
    from mmpreproj.experiments import budget, reproduce, sweep
    from mmpreproj.method import config as tuner_config
    from mmpreproj.method import files
    from mmpreproj.train import adapters, config, sources

    assert tuner_config.MAX_EXPANSION is tables.MAX_EXPANSION and config.TRAIN_BOUNDS is values.TRAIN_BOUNDS
    assert sweep.check_lrs is budget.check_lrs is values.check_lrs and budget.parse_budgets is values.parse_budgets
    assert reproduce.parse_seeds is values.parse_seeds and hub.offline_flags is offline.offline_flags
    assert assets.resolve_path is mmpreproj_tables.sources.resolve_path is sources.resolve_path
    assert sources.looks_like_path is mmpreproj_tables.sources.looks_like_data_path
    assert model_source.looks_like_model_path is mmpreproj_tables.sources.looks_like_model_path
    assert files.adapter_folder is mmpreproj_tables.sources.adapter_folder
    assert files.ADAPTER_CONFIG_NAME is tables.ADAPTER_CONFIG_NAME and adapters.ADAPTER_DIR is tables.ADAPTER_DIR
    assert gguf_source.GGUF_MODELS is packaged.GGUF_MODELS and onnx_source.ONNX_MODELS is packaged.ONNX_MODELS
    with pytest.raises(ValueError, match=r"TrainConfig.expansion=17.0; must be a finite number in \(0, 16\]"):
        config.TrainConfig(expansion=17.0)


def test_demo_help_names_the_methods_the_demo_runs():
    from mmpreproj.experiments.reproduce import DEMO_METHODS
    from mmpreproj_cli.parser import build_parser

    demo = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "demo")[1]
    text = " ".join(demo.format_help().split())
    assert f"default: the paper's five: {', '.join(DEMO_METHODS)})" in text and len(DEMO_METHODS) == 5


@pytest.mark.slow
def test_a_hub_id_missing_from_the_cache_is_refused_offline_before_torch_loads():
    """The hub-cache check reads huggingface_hub's cache only: refused in a fresh interpreter with the offline line
    first and the error second, and not one heavy module loaded."""
    argv = ["train", "--model", "no-such-org/no-such-model", "--no-progress"]
    run = _python("-c", _MAIN % (HEAVY,), *argv)
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"code": 1, "loaded": []}, run.stderr
    first, error = run.stderr.strip().splitlines()
    assert first.startswith("mmpreproj train: offline:") and error.startswith(
        "mmpreproj train: error: --model no-such-org/no-such-model: not in the local hub cache"
    ), run.stderr


def test_save_every_help_says_that_zero_writes_no_checkpoint():
    (sub,) = [a for a in build_parser()._actions if a.dest == "command"]
    (action,) = [a for a in sub.choices["train"]._actions if a.dest == "save_every"]
    assert "0 = never" in action.help and values.TRAIN_BOUNDS["save_every"].holds(0)
