"""Sphinx roles in docstrings (``:class:`X```), rendered as code — linked when the page defines X.

Docstrings across the packages use reStructuredText roles; mkdocstrings renders Google-style
docstrings as Markdown, which leaves the role's name in front of the code span
(``:meth:<code>step</code>``). This pass, run on every page's HTML, drops the role, applies Sphinx's
``~`` rule (``~a.b.C`` shows ``C``) and links the name to its heading when the page documents it
(one anchor whose id is the name or ends with ``.name``).
"""

from __future__ import annotations

import re

__all__ = ["ROLE_PATTERN", "render_roles"]

ROLE_PATTERN = re.compile(r":(?:py:)?(?:meth|class|func|mod|attr|data|exc|obj|const):<code>([^<]*)</code>")
_ANCHOR = re.compile(r'\bid="([A-Za-z_][\w.]*)"')


def _shown(target: str) -> str:
    if target.startswith("~"):
        return target.lstrip("~.").rsplit(".", 1)[-1]
    return target.lstrip(".")


def render_roles(page_html: str) -> str:
    """The page with every role replaced by a code span (a link where the target is on the page)."""
    anchors = set(_ANCHOR.findall(page_html))

    def replace(match: re.Match[str]) -> str:
        target = match.group(1).lstrip("~.").removesuffix("()")
        code = f"<code>{_shown(match.group(1))}</code>"
        hits = [a for a in anchors if a == target or a.endswith("." + target)]
        if len(hits) == 1:
            return f'<a class="autorefs autorefs-internal" href="#{hits[0]}">{code}</a>'
        return code

    return ROLE_PATTERN.sub(replace, page_html)
