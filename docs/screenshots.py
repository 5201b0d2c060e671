"""Screenshots of the built documentation site in headless Chromium, to look at before a release.

    python docs/screenshots.py                       # build the site, shoot the default pages
    python docs/screenshots.py --site site --pages / cli/ --width 1280 --height 1800

Builds the site (``mkdocs build --strict``) into a temporary folder unless ``--site`` names a
built one, serves it on 127.0.0.1, and writes one PNG per page into ``docs/screenshots/``
(``home.png``, ``finetune-tutorial.png``, ...). Needs Chromium (Debian: ``apt-get install
chromium``; or give ``--chromium PATH``). Nothing is fetched from the network: the site uses
system fonts and renders its math as MathML.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots"
# page path on the site → file name; the home page, a tutorial, an API page, and the pages
# whose tables and formulas are generated
DEFAULT_PAGES = {
    "": "home",
    "finetune-tutorial/": "finetune-tutorial",
    "api/calculator/": "api-calculator",
    "performance/": "performance",
    "training/": "training-math",
    "cli/": "cli-reference",
}
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


def find_chromium(explicit: str | None) -> str:
    for candidate in ([explicit] if explicit else []) + ["chromium", "chromium-browser", "google-chrome"]:
        path = shutil.which(candidate) if candidate else None
        if path:
            return path
    raise SystemExit("no Chromium found: install it (Debian: apt-get install chromium) or give --chromium PATH")


def build_site(dest: Path) -> None:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                    "-d", str(dest)], check=True, cwd=ROOT, env=env)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # one line per file served is noise here
        pass


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, int]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def shoot(chromium: str, url: str, png: Path, width: int, height: int) -> None:
    with tempfile.TemporaryDirectory() as profile:
        cmd = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
               f"--screenshot={png}", url]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or not png.is_file():
        raise SystemExit(f"Chromium failed on {url} (exit {proc.returncode}): {proc.stderr[-800:]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--site", type=Path, default=None, help="a built site folder (default: build one now)")
    p.add_argument("--pages", nargs="+", default=None, help="page paths on the site, e.g. '' api/model/")
    p.add_argument("--out", type=Path, default=OUT, help="folder for the PNGs (default: docs/screenshots)")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=1600)
    p.add_argument("--chromium", default=None, help="path of the Chromium binary")
    args = p.parse_args(argv)

    chromium = find_chromium(args.chromium)
    pages = {page: (page.strip("/").replace("/", "-") or "home") for page in args.pages} if args.pages \
        else DEFAULT_PAGES
    with tempfile.TemporaryDirectory() as tmp:
        site = args.site
        if site is None:
            site = Path(tmp) / "site"
            build_site(site)
        server, port = serve(site)
        try:
            args.out.mkdir(parents=True, exist_ok=True)
            for page, name in pages.items():
                png = args.out / f"{name}.png"
                partial = png.with_suffix(".partial.png")
                shoot(chromium, f"http://127.0.0.1:{port}/{page}", partial, args.width, args.height)
                partial.replace(png)  # a failed shot never leaves a half-written file under the real name
                print(png.relative_to(ROOT) if png.is_relative_to(ROOT) else png)
        finally:
            server.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
