"""The documentation site works opened from disk (`make docs`, then `site/index.html`, as the README says): the
checker every build runs (docs/hooks/check_site.py) finds each way a page can fail there, the site is configured
for file:// (pages as files, the offline search index, no network), and a real build passes it. Also the hook
that gives the evidence reports' lists their blank line (docs/hooks/lists.py)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.helpers.procs import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ROOT / "docs" / "hooks"


def _hook(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", HOOKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_site = _hook("check_site").check_site
add_blank_lines = _hook("lists").add_blank_lines

HEAD = '<script src="{up}assets/javascripts/iframe-worker.js"></script>'
GOOD = {
    "index.html": f'{HEAD.format(up="")}<h1 id="top">x</h1><a href="guide.html#part">guide</a>'
    '<a href="https://example.org/">out</a><a href="#top">up</a>',
    "guide.html": f'{HEAD.format(up="")}<h2 id="part">part</h2><p>a <em>stress</em>, <code>d*d</code></p>'
    '<a href="sub/page.html">sub</a><img src="assets/pic.png">',
    "sub/page.html": f'{HEAD.format(up="../")}<a href="../index.html">home</a><p>text</p><ul><li>item</li></ul>',
    "404.html": '<a href="/index.html">servers only</a>',
    "assets/javascripts/iframe-worker.js": "",
    "assets/pic.png": "",
    "search/search_index.js": 'var __index = {"docs": [{"location": ""}, {"location": "guide.html#part"}]}',
}


def _site(tmp_path: Path, changed: dict[str, str | None] | None = None) -> Path:
    """A tiny built site: GOOD with some files changed (a text) or left out (None)."""
    for name, text in {**GOOD, **(changed or {})}.items():
        if text is not None:
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(text)
    return tmp_path


def test_a_site_that_works_from_disk_passes(tmp_path):
    assert check_site(_site(tmp_path)) == []


@pytest.mark.parametrize(
    "page,found",
    [
        ('<a href="sub/">a folder</a>', "leads to a directory"),
        ('<a href="sub">a folder</a>', "leads to a directory"),
        ('<a href="guide/">directory URLs</a>', "leads to a directory"),
        ('<a href="gone.html">gone</a>', "a file that is not there"),
        ('<a href="guide.html#nowhere">anchor</a>', "#nowhere, which guide.html does not have"),
        ('<a href="#nowhere">anchor</a>', "#nowhere, which index.html does not have"),
        ('<a href="/guide.html">absolute</a>', "an absolute path"),
        ('<a href="../outside.html">out</a>', "leads out of the site"),
        ('<script src="https://unpkg.com/iframe-worker/shim"></script>', "from the network"),
        ('<link rel="stylesheet" href="//fonts.example.org/css">', "from the network"),
        ('<img src="assets/missing.png">', "loads 'assets/missing.png', which leads to a file that is not there"),
        ("<p>What to know:\n- one\n- two</p>", "a list printed as a paragraph"),
        ("<p>Steps:\n1. one\n2. two</p>", "a list printed as a paragraph"),
        ("<p>weights: d<em>d weights, 2</em>r*d</p>", "a `*` read as italics"),
        ("<p>tokens (B, P + t<em>h</em>w, dim)</p>", "a `*` read as italics"),
    ],
)
def test_each_way_a_page_fails_from_disk_is_found(tmp_path, page, found):
    problems = check_site(_site(tmp_path, {"index.html": GOOD["index.html"] + page}))
    assert len(problems) == 1 and problems[0].startswith("index.html: ") and found in problems[0], problems


def test_code_and_plain_text_are_not_findings(tmp_path):
    page = "<p>a line\n<code>x</code> + y, and <code>- not a list</code></p><p>an <em>emphasis</em>.</p>"
    assert check_site(_site(tmp_path, {"index.html": GOOD["index.html"] + page})) == []


def test_search_must_work_offline(tmp_path):
    no_shim = GOOD["index.html"].replace(HEAD.format(up=""), "")
    index = "search/search_index.js"
    assert "no local iframe-worker script" in check_site(_site(tmp_path / "a", {"index.html": no_shim}))[0]
    assert "search_index.js is missing" in check_site(_site(tmp_path / "b", {index: None}))[0]
    wrong = 'var __index = {"docs": [{"location": "guide/"}]}'
    assert "leads to a directory" in check_site(_site(tmp_path / "c", {index: wrong}))[0]


def test_the_site_is_configured_for_file_urls():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["use_directory_urls"] is False
    assert "offline" in config["plugins"] and "search" in config["plugins"]
    assert "docs/hooks/check_site.py" in config["hooks"] and "docs/hooks/lists.py" in config["hooks"]
    assert config["theme"]["font"] is False  # web fonts come from the network
    shims = [p for p in config["extra"]["polyfills"] if "iframe-worker" in p]
    assert shims and all((ROOT / "docs" / p).is_file() for p in shims)  # local: the plugin adds none from a CDN


def test_lists_get_their_blank_line():
    text = "Here:\n- one\n- two\n\nSteps:\n1. first\n2. second\n\nyear\n2024. no list\n"
    assert add_blank_lines(text) == "Here:\n\n- one\n- two\n\nSteps:\n\n1. first\n2. second\n\nyear\n2024. no list\n"
    untouched = "- a\n  wrapped\n- b\n\n```\ncode:\n- no\n```\n\n| t |\n|---|\n\n  - nested\n"
    assert add_blank_lines(untouched) == untouched


@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> Path:
    """`mkdocs build --strict` into a temporary folder (the hook runs the checker and fails the build on a finding)."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    assert mkdocs, "mkdocs is not installed: pip install -e '.[docs]' (the dev extra includes it)"
    site, start = tmp_path_factory.mktemp("docs") / "site", time.perf_counter()
    run = subprocess.run(
        [mkdocs, "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    print(f"site built in {time.perf_counter() - start:.1f} s")
    return site


@pytest.mark.slow
def test_the_built_site_works_from_disk(built_site):
    """The checker again on the result, so a build without the hook cannot pass here either."""
    assert check_site(built_site) == []
    assert (built_site / "index.html").is_file() and (built_site / "howto-mixed-model.html").is_file()


@pytest.mark.slow
def test_search_works_in_a_browser_from_disk(built_site):
    """A headless Chromium opens index.html from disk with a search deep link (`?q=`, mkdocs-material's own);
    the results show only when the search worker started from file:// and read the inlined index. Skipped on a
    machine without Chromium (`apt-get install chromium-headless-shell`)."""
    browser = next(filter(None, map(shutil.which, ("chromium-headless-shell", "chromium", "chromium-browser"))), None)
    if browser is None:
        pytest.skip("no Chromium on this machine")
    url = (built_site / "index.html").as_uri() + "?q=multimodal"
    run = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=15000", "--dump-dom", url],
        capture_output=True, text=True, timeout=HANG_GUARD_S,
    )  # fmt: skip
    found = re.search(r'class="md-search-result__meta"[^>]*>(\d+) matching document', run.stdout)
    assert found and int(found.group(1)) > 0, run.stdout[-2000:] + run.stderr[-2000:]
    links = re.findall(r'<a href="([^"]+)" class="md-search-result__link', run.stdout)
    assert links and all(urlsplit(u).path.endswith(".html") for u in links), links  # results lead to pages
