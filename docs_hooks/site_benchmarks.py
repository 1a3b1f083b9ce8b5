"""The Benchmarks page, generated from ``benchmarks/results.json`` (written by ``benchmarks/run_all.py``).

The page shows the latest recorded run exactly as written; with no results file it says how to make
one. Numbers never come from anywhere else.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

__all__ = ["RESULTS_FILE", "render_benchmarks_page"]

RESULTS_FILE = Path("benchmarks") / "results.json"
_COMMAND = "python benchmarks/run_all.py"
_COLUMNS = ("id", "benchmark", "measure", "ours", "baseline", "ratio", "unit", "target", "pass")

_INTRO = f"""# Benchmarks

Every benchmark measures tokenstate and its baseline side by side, interleaved in one run, and
reports the ratio: absolute times on a shared machine drift, ratios measured together do not.
`{_COMMAND}` runs them all, prints one table and writes `{RESULTS_FILE.as_posix()}`, which this page
shows as written (`--quick` for a smoke run with fewer repetitions, `--only NAME ...` for a subset).
"""


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "PASS" if value else "**FAIL**"
    if isinstance(value, float):
        text = f"{value:.4g}"
    else:
        text = str(value)
    return html.escape(text).replace("|", "&#124;")


def render_benchmarks_page(repo_root: Path) -> str:
    path = repo_root / RESULTS_FILE
    out = [_INTRO]
    if not path.is_file():
        out += [
            '!!! info "No benchmark results recorded yet"',
            f"    `{RESULTS_FILE.as_posix()}` does not exist in this checkout. Produce it with",
            "",
            "    ```bash",
            f"    {_COMMAND}",
            "    ```",
            "",
            "    and rebuild the site.",
        ]
        return "\n".join(out) + "\n"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        rows: list[dict[str, Any]] = data["rows"]
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise TypeError("rows must be a list of objects")
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{path}: not a results file written by {_COMMAND} ({exc}); re-run it."
        ) from exc
    quick = " — a `--quick` smoke run" if data.get("quick") else ""
    out += [
        f"Latest run: {_cell(data.get('generated', 'unknown time'))} on {_cell(data.get('machine', 'an unrecorded machine'))}{quick}.",
        "",
    ]
    extra = sorted({k for r in rows for k in r} - set(_COLUMNS))
    columns = [c for c in _COLUMNS if any(c in r for r in rows)] + extra
    out += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        out.append("| " + " | ".join(_cell(r.get(c, "")) for c in columns) + " |")
    failed = sum(1 for r in rows if r.get("pass") is False)
    out += ["", f"{len(rows) - failed} of {len(rows)} measures meet their target."]
    return "\n".join(out) + "\n"
