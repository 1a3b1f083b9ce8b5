"""Render pages of the built docs site to PNG with headless Chromium, for reviewing the site.

Usage::

    python -m mkdocs build --strict                     # builds ./site
    python scripts/screenshot_docs.py                   # overview + stale-host-ids spec page
    python scripts/screenshot_docs.py specs/index.html reference/cli/ --out shots --width 1280

Pages are paths inside the built site (``index.html``, ``specs/stale-host-ids/``); a folder means
its ``index.html``. The site is served from a local ``http.server`` on 127.0.0.1 (an ephemeral port),
and Chromium runs with a fresh profile and every background network feature off, so the script works
on a closed network and leaves nothing behind. It needs a Chromium binary: Debian's ``chromium``
(``apt-get install -y chromium``) or one named by ``--chromium`` / ``$CHROMIUM``.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

DEFAULT_PAGES = ("index.html", "specs/stale-host-ids/")
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Headless, no GPU, no sandbox (containers run as root), and nothing that reaches out to a network.
CLOSED_NETWORK_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--hide-scrollbars",
    "--mute-audio",
)


class ScreenshotError(RuntimeError):
    """A page could not be rendered; the message says what to do."""


def find_chromium(explicit: str | None) -> str:
    for name in (explicit, os.environ.get("CHROMIUM"), *CANDIDATES):
        if name and shutil.which(name):
            return str(shutil.which(name))
    raise ScreenshotError(
        "no Chromium found: install Debian's chromium (`apt-get install -y chromium`) or pass "
        "--chromium /path/to/chromium."
    )


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Serve silently: the script's output is the list of PNGs."""


@contextmanager
def serve(site: Path) -> Iterator[str]:
    """Serve ``site`` on 127.0.0.1 for the duration of the block; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def page_file(site: Path, page: str) -> Path:
    target = site / page
    return target / "index.html" if page.endswith("/") or target.is_dir() else target


def png_name(page: str) -> str:
    stem = page.strip("/").removesuffix(".html").removesuffix("/index") or "index"
    return stem.replace("/", "_") + ".png"


def screenshot(
    chromium: str, url: str, out: Path, *, width: int, height: int, timeout_s: float
) -> None:
    with tempfile.TemporaryDirectory(prefix="tokenstate-chromium-") as profile:
        cmd = [
            chromium,
            *CLOSED_NETWORK_FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            f"--screenshot={out}",
            url,
        ]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise ScreenshotError(
                f"chromium did not finish {url} within {timeout_s:.0f} s."
            ) from exc
    if proc.returncode != 0 or not out.is_file() or out.stat().st_size == 0:
        raise ScreenshotError(
            f"chromium failed on {url} (exit {proc.returncode}); its output:\n{proc.stderr.strip()[-2000:]}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "pages", nargs="*", default=list(DEFAULT_PAGES), help="pages inside the built site"
    )
    parser.add_argument(
        "--site", type=Path, default=Path("site"), help="the built site (default: ./site)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("build") / "docs-screenshots", help="folder for the PNGs"
    )
    parser.add_argument("--width", type=int, default=1280, help="viewport width in pixels")
    parser.add_argument(
        "--height", type=int, default=1800, help="viewport height (the PNG's height)"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds allowed per page")
    parser.add_argument("--chromium", default=None, help="Chromium binary (default: found on PATH)")
    args = parser.parse_args(argv)
    try:
        if not (args.site / "index.html").is_file():
            raise ScreenshotError(
                f"{args.site} is not a built site (no index.html): run `python -m mkdocs build --strict` "
                "first, or pass --site."
            )
        missing = [p for p in args.pages if not page_file(args.site, p).is_file()]
        if missing:
            raise ScreenshotError(f"not in the built site {args.site}: {', '.join(missing)}")
        if args.width < 200 or args.height < 200:
            raise ScreenshotError("--width and --height must each be at least 200 pixels.")
        chromium = find_chromium(args.chromium)
        args.out.mkdir(parents=True, exist_ok=True)
        with serve(args.site.resolve()) as base:
            for page in args.pages:
                out = (args.out / png_name(page)).resolve()
                screenshot(
                    chromium,
                    base + page,
                    out,
                    width=args.width,
                    height=args.height,
                    timeout_s=args.timeout,
                )
                print(out)
    except ScreenshotError as exc:
        print(f"screenshot_docs: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
