"""The API reference's tables fit the content column at 1280 px, measured in headless Chromium."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = ["reference/runtime/index.html", "reference/gate-api/index.html", "reference/contracts/index.html"]

# Reports every table wider than its column, and every cell whose content sticks out of it.
_MEASURE = """<script>window.addEventListener('load', () => setTimeout(() => {
  const out = [];
  const article = document.querySelector('article');
  document.querySelectorAll('article table').forEach((t, i) => {
    if (t.getBoundingClientRect().right > article.getBoundingClientRect().right + 1)
      out.push('table ' + i + ' is wider than the column');
    if (t.scrollWidth > t.clientWidth + 1)  // material tables scroll inside themselves
      out.push('table ' + i + ' scrolls sideways: ' + t.scrollWidth + ' > ' + t.clientWidth + ' px');
    t.querySelectorAll('td').forEach(td => {
      const right = td.getBoundingClientRect().right;
      if ([...td.querySelectorAll('code')].some(c => c.getBoundingClientRect().right > right + 1))
        out.push('table ' + i + ': ' + td.textContent.trim().slice(0, 40) + ' sticks out');
    });
  });
  const pre = document.createElement('pre');
  pre.id = 'ts-measure';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 300));</script></body>"""


def _screenshot_module():
    spec = importlib.util.spec_from_file_location("screenshot_docs", REPO / "scripts" / "screenshot_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # one headless Chromium per page
@pytest.mark.parametrize("page", PAGES)
def test_reference_tables_fit_at_1280_px(built_site: Path, page: str) -> None:
    shots = _screenshot_module()
    try:
        chromium = shots.find_chromium(None)
    except shots.ScreenshotError as exc:
        pytest.skip(str(exc))
    measured = built_site / page.replace("index.html", "measure-1280.html")
    measured.write_text((built_site / page).read_text(encoding="utf-8").replace("</body>", _MEASURE))
    with shots.serve(built_site) as base, tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [chromium, *shots.CLOSED_NETWORK_FLAGS, f"--user-data-dir={profile}", "--window-size=1280,1800",
             "--virtual-time-budget=5000", "--dump-dom", base + str(measured.relative_to(built_site))],
            capture_output=True, text=True, timeout=120, check=False,
        )
    measured.unlink()
    found = re.search(r'<pre id="ts-measure">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"the page was not measured (chromium exit {proc.returncode}): {proc.stderr[-500:]}"
    assert json.loads(found.group(1).replace("&quot;", '"')) == []
    assert shutil.which(chromium)
