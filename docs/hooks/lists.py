"""mkdocs hook: a list may start right after a paragraph line, as on GitHub (CommonMark); python-markdown needs a
blank line there and otherwise prints the items as one paragraph with literal dashes. The reports under
docs/evidence/ are written by the recipes and left as they are, so the blank line is added here, at build time
(pages written by hand have it: docs/hooks/check_site.py fails the build on a list read as a paragraph).
Pages included with `--8<--` (CHANGELOG.md, ARCHITECTURE.md) are expanded later and need it in the file."""

import re

_FENCE = re.compile(r"^\s*(```|~~~)")
# a bullet, or an ordered list that starts at 1: the two kinds CommonMark lets interrupt a paragraph
_STARTS_LIST = re.compile(r"^\s*([-*+]|1[.)])\s+\S")
_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s+\S")


def add_blank_lines(markdown: str) -> str:
    """`markdown` with a blank line before every list that starts right after a line of text (not in code)."""
    out, fence, in_list, after_text = [], False, False, False
    for line in markdown.split("\n"):
        if _FENCE.match(line):
            fence, after_text = not fence, False
        elif not fence:
            if not line.strip():
                in_list = after_text = False
            elif _ITEM.match(line):
                if after_text and not in_list and _STARTS_LIST.match(line):
                    out.append("")
                in_list = in_list or bool(_STARTS_LIST.match(line))
                after_text = True
            else:
                after_text = True
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown, **kwargs):
    return add_blank_lines(markdown)
