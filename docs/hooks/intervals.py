"""mkdocs hook: the reports write two confidence intervals side by side (`[+0.3, +3.9] [+1.5, +2.8]`), which
Markdown reads as a reference link `[text] [label]`; escape the second bracket so it stays text. The report
files themselves are left as they are (other reports and the README link to them)."""

import re

_PAIR = re.compile(r"\] \[(?=[+-]?\d)")


def on_page_markdown(markdown, **kwargs):
    return _PAIR.sub(r"] \\[", markdown)
