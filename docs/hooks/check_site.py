"""mkdocs hook (and a command): the built site works opened from disk (`site/index.html`, file://), as the README
says, and reads as written. After every build it reads each built page and fails the build when

- a local link leads to a directory (from disk that shows a directory listing, not a page), to a file that is not
  there, or out of the site;
- a link's `#anchor` names no element of the page it leads to;
- a page loads a script, stylesheet or image from the network (nothing can be fetched offline), or lacks the
  local shim that lets the search worker start from file://;
- the offline search index (`search/search_index.js`, which the offline plugin inlines) is missing, or a search
  result would lead to a directory, a missing page or a missing anchor;
- a list is printed as a paragraph with literal dashes (python-markdown needs a blank line before a list);
- a `*` product (`d*d ... 2*r*d`) is read as italics (write it as code).

Alone, on a site already built: `python docs/hooks/check_site.py site`."""

from __future__ import annotations

import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

SEARCH_INDEX = "search/search_index.js"
INDEX_PREFIX = "var __index = "  # what the offline plugin writes before the JSON
SHIM = "iframe-worker"  # Web Workers cannot start from file://; the shim runs the search worker in an iframe
LOADS = {"script": "src", "img": "src", "iframe": "src", "source": "src", "link": "href"}  # fetched with the page
MAX_LISTED = 25
LIST_IN_PARAGRAPH = re.compile(r"\n\s*([-*+]|\d+[.)]) \S")  # a line of a <p> that reads as a list item
SERVER_ONLY = {"404.html"}  # a web server's page for a missing one: absolute links by design, never read from disk


class _Page(HTMLParser):
    """The ids (anchors) of one page, its links (`<a href>`), what it loads (`<script src>`, `<link href>` ...), its
    paragraphs that hold a list and its italics that start or end inside a word."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.loads: list[str] = []
        self.lists_in_paragraphs: list[str] = []
        self.products_in_italics: list[str] = []
        self._paragraph: list[str] | None = None
        self._code = 0
        self._text = ""  # the page's last characters of text, for the context of a finding
        self._em_closed = self._em_in_word = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "p":
            self._paragraph = []
        elif tag in ("code", "pre"):
            self._code += 1
        elif tag == "em":
            self._em_in_word = self._text[-1:].isalnum()  # `d*d`: italics that start inside a word
            if self._em_in_word:
                self.products_in_italics.append(self._text[-40:])
        self.ids.update(v for k, v in attrs if k in ("id", "name") and v and (k == "id" or tag == "a"))
        if tag == "a" and a.get("href") is not None:
            self.links.append(a["href"])
        elif tag in LOADS and a.get(LOADS[tag]):
            self.loads.append(a[LOADS[tag]])

    def handle_endtag(self, tag):
        self._em_closed = tag == "em"
        if tag in ("code", "pre"):
            self._code = max(0, self._code - 1)
        elif tag == "p" and self._paragraph is not None:
            text, self._paragraph = "".join(self._paragraph), None
            if LIST_IN_PARAGRAPH.search(text):
                self.lists_in_paragraphs.append(" ".join(text.split())[:80])

    def handle_data(self, data):
        if self._em_closed and data[:1].isalnum() and not self._em_in_word:  # `(t*h*w)`: ... that end in a word
            self.products_in_italics.append(self._text[-40:] + data[:20])
        self._em_closed, self._text = False, (self._text + data)[-80:]
        if self._paragraph is not None:
            self._paragraph.append("`code`" if self._code else data)  # a line that starts with code is no list


class _Site:
    def __init__(self, root: Path):
        self.root = root.resolve()
        self._pages: dict[Path, _Page] = {}

    def page(self, path: Path) -> _Page:
        if path not in self._pages:
            parsed = _Page()
            parsed.feed(path.read_text(encoding="utf-8", errors="replace"))
            self._pages[path] = parsed
        return self._pages[path]

    def follow(self, page: Path, url: str) -> str | None:
        """What is wrong with the local link `url` on `page` (None: it leads to what it names)."""
        parts = urlsplit(url)
        path = unquote(parts.path)
        if path.startswith("/"):
            return "is an absolute path: from disk it starts at the file system's root"
        target = (page.parent / path).resolve() if path else page
        if not target.is_relative_to(self.root):
            return "leads out of the site"
        if path.endswith("/") or target.is_dir():
            return "leads to a directory (from disk: a directory listing, not a page)"
        if not target.is_file():
            return "leads to a file that is not there"
        if parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in self.page(target).ids:
            return f"names #{parts.fragment}, which {target.relative_to(self.root).as_posix()} does not have"
        return None


def _network(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") or (not parts.scheme and bool(parts.netloc))  # `//host/x` too


def check_site(root: Path) -> list[str]:
    """Every problem found in the site built in `root`, one line each (an empty list: it works from disk)."""
    site, problems = _Site(Path(root)), []
    pages = sorted(p for p in site.root.rglob("*.html") if p.relative_to(site.root).as_posix() not in SERVER_ONLY)
    if not pages:
        return [f"{root}: no built page (*.html)"]
    for path in pages:
        name, page = path.relative_to(site.root).as_posix(), site.page(path)
        for url in page.links:
            if urlsplit(url).scheme or urlsplit(url).netloc:
                continue  # http(s), mailto, ...: a page elsewhere
            wrong = site.follow(path, url)
            if wrong:
                problems.append(f"{name}: the link {url!r} {wrong}")
        for url in page.loads:
            if _network(url):
                problems.append(f"{name}: loads {url!r} from the network (opened offline it is missing)")
            elif not urlsplit(url).scheme:  # data: URLs are in the page
                wrong = site.follow(path, urlsplit(url)._replace(fragment="").geturl())
                if wrong:
                    problems.append(f"{name}: loads {url!r}, which {wrong}")
        if not any(SHIM in Path(urlsplit(u).path).name for u in page.loads if not _network(u)):
            problems.append(f"{name}: no local {SHIM} script (search cannot start its worker from file://)")
        for text in page.lists_in_paragraphs:
            problems.append(f"{name}: a list printed as a paragraph (add a blank line before it): {text!r}")
        for text in page.products_in_italics:
            problems.append(f"{name}: a `*` read as italics (write the product as code): {' '.join(text.split())!r}")
    problems += _check_search(site)
    return problems


def _check_search(site: _Site) -> list[str]:
    index = site.root / SEARCH_INDEX
    if not index.is_file():
        return [f"{SEARCH_INDEX} is missing: search does not work from file:// (the `offline` plugin writes it)"]
    text = index.read_text(encoding="utf-8")
    if not text.startswith(INDEX_PREFIX):
        return [f"{SEARCH_INDEX} does not start with {INDEX_PREFIX!r}"]
    problems = []
    for doc in json.loads(text[len(INDEX_PREFIX) :])["docs"]:
        wrong = site.follow(site.root / "index.html", doc["location"])  # locations are relative to the site
        if wrong:
            problems.append(f"search result {doc['location']!r} {wrong}")
    return problems


def on_post_build(config, **kwargs):
    """After the offline plugin (priority -100) has written the inlined search index."""
    problems = check_site(Path(config["site_dir"]))
    if problems:
        from mkdocs.exceptions import PluginError

        listed = "\n  ".join(problems[:MAX_LISTED])
        more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
        raise PluginError(f"the built site has {len(problems)} problems (docs/hooks/check_site.py):\n  {listed}{more}")


on_post_build.mkdocs_priority = -200  # mkdocs.plugins.event_priority(-200), without importing mkdocs here


if __name__ == "__main__":
    found = check_site(Path(sys.argv[1] if len(sys.argv) > 1 else "site"))
    print("\n".join(found) or "the site works from disk: every link leads to a page; search index present")
    sys.exit(1 if found else 0)
