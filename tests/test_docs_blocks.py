"""The documentation's examples work (issue 44): every fenced block of README.md and docs/**/*.md (and of the files
the docs include with `--8<--`, such as ARCHITECTURE.md) is checked, one test per block, named `file:line`.

Python blocks: the blocks of one page run in order in one fresh interpreter, in one namespace, as a reader runs a
page top to bottom (a later block may use an earlier one's names, never another page's). Each page runs in its
own temporary folder holding a link to the repository's `assets/` (so `"assets/mini-pythia"` resolves, and what
the blocks write stays there), offline, with the network refused; pages run in parallel, one thread each.

A block that cannot run here carries a marker on the line right before its fence, with the reason:
`<!-- docs-test: skip: needs the hub (downloads meta-llama/Llama-3.2-1B) -->`; a Python block that is the text
of a module (relative imports) runs as that module: `<!-- docs-test: as-module: mmpreproj.hosts.my_decoder -->`.
A marker without a reason, of another kind or away from a fence fails.

Command blocks (bash, sh, shell, console, and bare fences: a bare fence is commands; output or data is fenced
as `text`) are read line by line (`\\` continues, `&&` and `;` separate, leading `VAR=value` and `nice -n N` are
set aside). Inline code in the evidence reports (docs/evidence/) that starts with a command is checked the same
way: those are the reports' rerun commands. Every command has one of these shapes, or the test fails:

  shape                                 checked                                         not run, because
  make T ...                            `make -n T` succeeds (T is a target)            it builds the venv, trains
  mmpreproj ..., .venv/bin/mmpreproj,   parsed by mmpreproj_cli's parser, then its      it trains or evaluates
  python -m mmpreproj[_cli] ...         library-free checks; `--help` runs for real     (minutes to hours)
  python SCRIPT.py ARGS (any python)    the script exists, `--help` exits 0, ARGS       a study (hours)
                                        parse through its argparse parser
  torchrun ..., accelerate launch ...   the launcher's parser takes its options; what   several processes, GPUs
                                        it launches is checked as above
  python -c CODE ...                    CODE compiles, its imports are installed        its arguments are another
                                                                                        program's (lm-eval)
  pip install ...                       a torch / torchvision pin is the Makefile's     needs the package index
  git clone, cd, source                 nothing                                         they change the machine
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from mmpreproj_cli.checks import check_args
from mmpreproj_cli.parser import build_parser
from tests.helpers.procs import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]
COMMAND_LANGS = {"", "bash", "sh", "shell", "console"}
NOT_RUN_LANGS = {"text", "json", "yaml", "toml"}  # output and data: nothing to run
MARKER = re.compile(r"<!--\s*docs-test:(.*?)-->")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+.-]*)[^`]*$")  # indent, fence, language (then any attributes)
INCLUDE = re.compile(r'^--8<--\s+"([^"]+)"\s*$')
PYTHONS = {"python", "python3", ".venv/bin/python", ".venv/bin/python3"}
CLIS = {"mmpreproj", ".venv/bin/mmpreproj"}
NOT_RUN = {"git", "cd", "source"}


@dataclass(frozen=True)
class Block:
    file: str  # relative to the repository root
    line: int  # the first line of the block's text (the fence's line + 1)
    lang: str
    text: str
    marker: str | None  # the marker's text after "docs-test:", stripped, or None

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line - 1}"  # the fence's line, as an editor shows it


def doc_files() -> list[Path]:
    """README.md, docs/**/*.md, and the files those include (`--8<-- "ARCHITECTURE.md"`), each once."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for f in list(files):
        for line in f.read_text().splitlines():
            if m := INCLUDE.match(line.strip()):
                files.append(ROOT / m.group(1))
    return list(dict.fromkeys(files))


def fenced_blocks(path: Path) -> list[Block]:
    lines, blocks, i = path.read_text().splitlines(), [], 0
    rel = path.relative_to(ROOT).as_posix()
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        closing = re.compile(re.escape(fence) + re.escape(fence[0]) + "*")  # as long as the opening one, or longer
        end = next((j for j in range(i + 1, len(lines)) if closing.fullmatch(lines[j].strip())), len(lines))
        text = "\n".join(ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : end])
        before = MARKER.search(lines[i - 1]) if i else None
        blocks.append(Block(rel, i + 2, lang.lower(), text + "\n", before.group(1).strip() if before else None))
        i = end + 1
    return blocks


ALL_BLOCKS = [b for f in doc_files() for b in fenced_blocks(f)]


def marker(block: Block) -> tuple[str, str] | None:
    """(kind, reason or module) of a block's marker; ValueError for a malformed one."""
    if block.marker is None:
        return None
    kind, _, rest = block.marker.partition(":")
    kind, rest = kind.strip(), rest.strip()
    if kind not in ("skip", "as-module"):
        raise ValueError(
            f"{block.id}: unknown docs-test marker {block.marker!r}; use 'skip: WHY' or 'as-module: NAME'"
        )
    if not rest:
        what = "reason" if kind == "skip" else "module"
        raise ValueError(f"{block.id}: docs-test marker {block.marker!r} gives no {what}")
    if kind == "as-module" and block.lang != "python":
        raise ValueError(f"{block.id}: 'as-module' is for a Python block, not {block.lang or 'a bare fence'}")
    return kind, rest


def skipped(block: Block) -> bool:
    m = marker(block)
    return m is not None and m[0] == "skip"


# ---------------------------------------------------------------------------------------------------------------
# Commands: a line of a command block -> shapes -> checks


@dataclass(frozen=True)
class Command:
    shape: str  # make | cli | script | launcher | python-c | pip | not-run
    argv: tuple[str, ...]  # what the check reads (targets, CLI argv, script + args, code + its modules, ...)
    launcher: str = ""  # for shape "launcher": "torchrun" or "accelerate launch"


def command_lines(block: Block) -> list[tuple[int, str]]:
    """(line number, command) of a block: continuations joined, comments and console output left out."""
    out, pending, start = [], "", 0
    for n, raw in enumerate(block.text.splitlines(), block.line):
        line = raw.rstrip()
        if block.lang == "console":
            if not pending and not line.startswith("$ "):
                continue  # output
            line = line if pending else line.removeprefix("$ ")
        start = start if pending else n
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.strip() and not line.lstrip().startswith("#"):
            out.append((start, line.strip()))
    return out


def split_commands(line: str) -> list[list[str]]:
    """`a && b ; c` -> [[a...], [b...], [c...]] (quotes kept as the shell reads them; `# ...` dropped)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split, lex.commenters = True, "#"
    words, commands = list(lex), [[]]
    for w in words:
        if w in ("&&", ";", "||"):
            commands.append([])
        elif set(w) <= set("|&<>()"):
            raise ValueError(f"{line!r}: {w!r} (pipes, redirections, subshells) is no shape this test knows")
        else:
            commands[-1].append(w)
    return [c for c in commands if c]


def _strip_prefixes(words: list[str]) -> list[str]:
    """Leading `VAR=value` assignments and `nice [-n N]` set aside."""
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words = words[1:]
    if words[:1] == ["nice"]:
        words = words[3:] if words[1:2] == ["-n"] else words[1:]
    return words


def _module_or_script(words: list[str], where: str) -> Command:
    """`-m mmpreproj ARGS` / `-m mmpreproj_cli ARGS` / `SCRIPT.py ARGS` after a python or a launcher."""
    if words[:1] == ["-m"] and len(words) > 1 and words[1] in ("mmpreproj", "mmpreproj_cli"):
        return Command("cli", tuple(words[2:]))
    if words and words[0].endswith(".py"):
        return Command("script", tuple(words))
    raise ValueError(f"{where}: runs {' '.join(words[:2])!r}; known: -m mmpreproj, -m mmpreproj_cli, SCRIPT.py")


def classify(words: list[str]) -> list[Command]:
    """The checks of one command (a launcher gives two: its own options, and what it launches)."""
    words = _strip_prefixes(list(words))
    where = " ".join(words)
    if not words:
        raise ValueError("an empty command")
    prog, rest = words[0], words[1:]
    if prog == "make":
        return [Command("make", tuple(rest))]
    if prog in CLIS:
        return [Command("cli", tuple(rest))]
    if prog in PYTHONS:
        if rest[:1] == ["-c"] and len(rest) > 1:
            return [Command("python-c", (rest[1],))]
        if rest[:3] == ["-m", "pip", "install"]:
            return [Command("pip", tuple(rest[3:]))]
        return [_module_or_script(rest, where)]
    if prog in ("pip", ".venv/bin/pip") and rest[:1] == ["install"]:
        return [Command("pip", tuple(rest[1:]))]
    if prog == "torchrun" or words[:2] == ["accelerate", "launch"]:
        launcher = "torchrun" if prog == "torchrun" else "accelerate launch"
        opts = words[1:] if prog == "torchrun" else words[2:]
        at = next((i for i, w in enumerate(opts) if w == "-m" or w.endswith(".py")), None)
        if at is None:
            raise ValueError(f"{where}: a launcher with nothing to launch")
        return [Command("launcher", tuple(opts), launcher), _module_or_script(opts[at:], where)]
    if prog in NOT_RUN:
        return [Command("not-run", tuple(words))]
    raise ValueError(f"{where!r}: no known command shape (see the table at the top of tests/test_docs_blocks.py)")


COMMAND_START = (  # what a command in prose starts with: assignments, `nice -n N`, then a program
    r"(?:[A-Z_][A-Z0-9_]*=\S* )*(?:nice -n \d+ )?"
    r"(?:mmpreproj |\.venv/bin/|python3? |make |torchrun |accelerate launch |pip install )"
)
INLINE_COMMAND = re.compile(rf"`({COMMAND_START}[^`]*)`")


def evidence_commands() -> list[tuple[str, str]]:
    """(file:line, command) of the evidence reports' inline code and indented code blocks that start with a
    command (their rerun commands; fenced blocks are checked as blocks)."""
    found = []
    for path in sorted((ROOT / "docs" / "evidence").rglob("*.md")):
        rel, lines, in_fence = path.relative_to(ROOT).as_posix(), path.read_text().splitlines(), False
        n = 0
        while n < len(lines):
            line = lines[n]
            in_fence ^= bool(FENCE.match(line))
            run_end = n
            while run_end < len(lines) and lines[run_end].startswith("    "):
                run_end += 1
            indented = run_end > n and (n == 0 or not lines[n - 1].strip())
            if not in_fence and indented and re.match(COMMAND_START, line.strip()):
                block = Block(rel, n + 1, "", "\n".join(ln[4:] for ln in lines[n:run_end]) + "\n", None)
                found += [(f"{rel}:{k}", c) for k, c in command_lines(block)]
                n = run_end
                continue
            if not in_fence:
                found += [(f"{rel}:{n + 1}", c) for c in INLINE_COMMAND.findall(line)]
            n += 1
    return found


def command_items() -> list[tuple[str, str]]:
    """(id, line) of every command to check: the command blocks' lines, then the evidence reports' inline ones."""
    items = []
    for b in ALL_BLOCKS:
        if b.lang in COMMAND_LANGS and not skipped(b):
            items += [(f"{b.file}:{n}", line) for n, line in command_lines(b)]
    return items + evidence_commands()


def _makefile_pins() -> dict[str, str]:
    text = (ROOT / "Makefile").read_text()
    return dict(re.findall(r"\b(torch|torchvision)==([\w.+]+)", text))


def check_pip(args: tuple[str, ...]) -> None:
    pins = _makefile_pins()
    for a in args:
        name, _, version = a.partition("==")
        if version and name in pins:
            assert version == pins[name], f"pip install {a}: the Makefile installs {name}=={pins[name]}"


def check_cli(argv: tuple[str, ...], made: set[str] = frozenset()) -> None:
    """The console script's own parse and library-free checks, as `mmpreproj ARGV` does before it loads torch.

    `made`: make targets the same line ran first; a packaged model they install may be missing here (CI has
    neither `make smollm2` nor `make dinov2`), so only that refusal passes, naming one of those targets."""
    if argv in (("--help",), ("-h",)) or (len(argv) == 2 and argv[1] in ("--help", "-h")):
        run = subprocess.run(
            [sys.executable, "-m", "mmpreproj_cli", *argv],
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
        )
        assert run.returncode == 0 and "usage: mmpreproj" in run.stdout, run.stderr
        return
    try:
        args = build_parser().parse_args(list(argv))
    except SystemExit as e:  # argparse printed the reason to stderr (shown by pytest)
        raise AssertionError(f"mmpreproj {' '.join(argv)}: refused by the parser (exit {e.code})") from None
    try:
        check_args(args)
    except ValueError as e:
        # a run folder under runs/ is what the reader's own earlier command writes (`train --out runs/...`); CI has
        # none, so only that refusal passes, and only for a path under runs/
        installs = re.search(r"not installed; install it with: make (\w+)", str(e))
        if not RUN_FOLDER_MISSING.fullmatch(str(e)) and not (installs and installs.group(1) in made):
            raise


RUN_FOLDER_MISSING = re.compile(r"(--adapter|run folder) runs/[\w.+-]+: no such file or folder")


def check_python_c(code: str) -> None:
    tree = ast.parse(code)
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level]
    missing = [n for n in names if importlib.util.find_spec(n.split(".")[0]) is None]
    assert not missing, f"python -c: imports {missing}, not installed"


# ---------------------------------------------------------------------------------------------------------------
# The child processes: one per page of Python blocks, one for every script and launcher; all started together


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {
        **os.environ,
        "PYTHONPATH": path,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }


def _child(mode: str, items: list[dict]) -> dict:
    with tempfile.TemporaryDirectory(prefix="docs-test-") as tmp:
        work = Path(tmp)
        (work / "assets").symlink_to(ROOT / "assets", target_is_directory=True)
        spec, result = work / "spec.json", work / "result.json"
        spec.write_text(json.dumps(items))
        run = subprocess.run(
            [sys.executable, "-m", "tests.helpers.docs_run", mode, str(spec), str(result)],
            cwd=ROOT if mode == "scripts" else work,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
        )
        if not result.exists():
            return {
                i["id"]: {"ok": False, "error": f"the child died (exit {run.returncode}):\n{run.stderr[-4000:]}"}
                for i in items
            }
        return json.loads(result.read_text())


def _pages() -> dict[str, list[dict]]:
    pages: dict[str, list[dict]] = {}
    for b in ALL_BLOCKS:
        if b.lang == "python" and not skipped(b):
            m = marker(b)
            pages.setdefault(b.file, []).append(
                {"id": b.id, "file": str(ROOT / b.file), "line": b.line, "code": b.text, "module": m[1] if m else None}
            )
    return pages


def _script_checks() -> list[dict]:
    checks = []
    for where, line in command_items():
        for words in split_commands(line):
            for c in classify(words):
                cid = f"{where} {shlex.join(words)} [{c.shape}]"
                if c.shape == "script":
                    checks.append({"id": cid, "kind": "script", "script": c.argv[0], "argv": list(c.argv[1:])})
                elif c.shape == "launcher":
                    checks.append({"id": cid, "kind": "launcher", "launcher": c.launcher, "argv": list(c.argv)})
    return checks


def _jobs_of(item: pytest.Item) -> set[str]:
    """The children a selected test of this module reads: its page, or "scripts"."""
    spec = getattr(item, "callspec", None)
    if spec is None or item.path != Path(__file__):
        return set()
    if item.originalname == "test_python_block_runs":
        block = spec.params["block"]
        return {block.file} if block.lang == "python" and not skipped(block) else set()
    if item.originalname != "test_command_example":
        return set()
    try:
        shapes = {c.shape for words in split_commands(spec.params["line"]) for c in classify(words)}
    except ValueError:  # the test itself says so
        return set()
    return {"scripts"} if shapes & {"script", "launcher"} else set()


@pytest.fixture(scope="module")
def jobs(request):
    """Start the children the selected tests need, all at once (as many at a time as there are CPUs)."""
    wanted = set().union(*(_jobs_of(item) for item in request.session.items))
    specs = [("page", page, blocks) for page, blocks in _pages().items() if page in wanted]
    if "scripts" in wanted:
        specs.append(("scripts", "scripts", _script_checks()))
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        yield {name: pool.submit(_child, mode, items) for mode, name, items in specs}


def _result(jobs: dict, job: str, item: str) -> dict:
    return jobs[job].result(timeout=HANG_GUARD_S)[item]


# ---------------------------------------------------------------------------------------------------------------
# The tests


PY_BLOCKS = [b for b in ALL_BLOCKS if b.lang == "python"]


def test_the_docs_have_blocks_of_every_kind():
    # the collector sees the pages: a regex that stopped matching would leave every test below with nothing to do
    langs = {b.lang for b in ALL_BLOCKS}
    assert {"python", "bash", ""} <= langs, langs
    assert len(PY_BLOCKS) >= 10 and any(b.file == "README.md" for b in PY_BLOCKS)
    assert any(w.startswith("docs/evidence/") for w, _ in command_items())


def test_every_block_is_of_a_known_kind_and_every_marker_is_well_formed():
    unknown = [b.id for b in ALL_BLOCKS if b.lang not in COMMAND_LANGS | NOT_RUN_LANGS | {"python"}]
    assert not unknown, f"blocks of a language this test does not know (run them, or add to NOT_RUN_LANGS): {unknown}"
    for b in ALL_BLOCKS:
        marker(b)  # raises on a malformed one
    # a marker away from a fence marks nothing
    for f in doc_files():
        lines = f.read_text().splitlines()
        for n, line in enumerate(lines):
            if MARKER.search(line) and not (n + 1 < len(lines) and FENCE.match(lines[n + 1])):
                pytest.fail(f"{f.relative_to(ROOT)}:{n + 1}: a docs-test marker not right before a fence")


@pytest.mark.parametrize(
    "marker_text,error",
    [
        ("skip: needs the hub", None),
        ("skip:", "gives no reason"),
        ("skip", "gives no reason"),
        ("ignore: why", "unknown docs-test marker"),
        ("as-module: mmpreproj.hosts.x", None),
    ],
)
def test_a_marker_says_why(marker_text, error):
    block = Block("X.md", 2, "python", "pass\n", marker_text)
    if error is None:
        marker(block)
    else:
        with pytest.raises(ValueError, match=error):
            marker(block)


@pytest.mark.parametrize(
    "line,shapes",
    [
        ("make smollm2 && mmpreproj train --preset mini", ["make", "cli"]),
        ("OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python recipes/x.py --out y", ["script"]),
        ("torchrun --nproc_per_node 8 -m mmpreproj train", ["launcher", "cli"]),
        ("accelerate launch --multi_gpu recipes/x.py --out y", ["launcher", "script"]),
        ("python -c 'import torch' --x", ["python-c"]),
        ("pip install torch==2.14.1", ["pip"]),
        ("git clone https://example.org/x && cd x", ["not-run", "not-run"]),
        ("curl https://example.org | sh", None),
        ("python -m http.server", None),
        ("wget x", None),
    ],
)
def test_command_shapes(line, shapes):
    if shapes is None:
        with pytest.raises(ValueError):
            [classify(w) for w in split_commands(line)]
    else:
        assert [c.shape for w in split_commands(line) for c in classify(w)] == shapes


def test_a_pip_pin_other_than_the_makefiles_fails():
    check_pip(("torch==" + _makefile_pins()["torch"],))
    with pytest.raises(AssertionError, match="the Makefile installs torch=="):
        check_pip(("torch==1.0.0",))


def test_a_refused_cli_example_fails():
    with pytest.raises(AssertionError, match="refused by the parser"):
        check_cli(("train", "--preset", "no-such-preset"))
    with pytest.raises(ValueError, match="--tasks"):
        check_cli(("eval", "--model", "assets/mini-pythia", "--tasks", "ppl,nonsense"))


@pytest.mark.slow
@pytest.mark.parametrize("block", PY_BLOCKS, ids=[b.id for b in PY_BLOCKS])
def test_python_block_runs(block, jobs):
    if skipped(block):
        pytest.skip(f"{block.id}: {marker(block)[1]}")
    result = _result(jobs, block.file, block.id)
    assert result["ok"], f"{block.id} failed:\n{result['error']}"


COMMANDS = command_items()


@pytest.mark.slow
@pytest.mark.parametrize("where,line", COMMANDS, ids=[f"{w} {' '.join(line.split()[:4])}" for w, line in COMMANDS])
def test_command_example(where, line, jobs):
    made: set[str] = set()  # make targets run earlier on the same line (`make smollm2 && mmpreproj ...`)
    for words in split_commands(line):
        for c in classify(words):
            if c.shape == "make":
                made.update(c.argv)
                for target in c.argv:
                    run = subprocess.run(
                        ["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S
                    )
                    assert run.returncode == 0, f"{where}: make {target}: {run.stderr.strip()}"
            elif c.shape == "cli":
                check_cli(c.argv, made)
            elif c.shape in ("script", "launcher"):
                result = _result(jobs, "scripts", f"{where} {shlex.join(words)} [{c.shape}]")
                assert result["ok"], f"{where}: {line}\n{result['error']}"
            elif c.shape == "python-c":
                check_python_c(c.argv[0])
            elif c.shape == "pip":
                check_pip(c.argv)
