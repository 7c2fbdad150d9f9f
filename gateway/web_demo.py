"""Serve the browser demo: ``/`` is its page, ``/demo/<file>`` the rest.

The demo's source is the repository's top-level ``web_demo/`` folder; a
source checkout serves it straight from there (edit, reload), and an installed
wheel carries the same files as data under ``<prefix>/share/<dist>/web_demo``
(see ``[tool.setuptools.data-files]`` in pyproject.toml). Only plain files
directly inside that folder, with a known extension, are ever served.
"""

from __future__ import annotations

import re
import site
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

DEMO_PREFIX = "/demo"
DATA_SUBDIR = Path("share") / "realtime-speech-gateway" / "web_demo"
INDEX = "index.html"

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".json": "application/json",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
# One path segment, no dot files: "app.js" yes; "../x", "a/b.js", ".env" no.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")


SOURCE_DIR = Path(__file__).resolve().parent.parent / "web_demo"  # in a source checkout


def install_prefixes() -> list[Path]:
    """Where an installer may have put the wheel's data files."""
    bases = (sysconfig.get_path("data"), sys.prefix, site.USER_BASE)
    return [Path(base) for base in bases if base]


def find_demo_dir(source: Path = SOURCE_DIR, prefixes: Iterable[Path] | None = None) -> Path | None:
    """The folder the demo is served from, or None when none is present.

    The source folder wins, so a checkout always serves what it holds even
    when an older copy was installed as data.
    """
    installed = install_prefixes() if prefixes is None else prefixes
    candidates = [source, *(prefix / DATA_SUBDIR for prefix in installed)]
    for folder in candidates:
        if (folder / INDEX).is_file():
            return folder
    return None


class DemoFiles:
    """Maps a requested name to a file of the demo folder, refusing everything else."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def resolve(self, name: str) -> Path | None:
        if not _SAFE_NAME.match(name) or Path(name).suffix not in CONTENT_TYPES:
            return None
        path = (self.root / name).resolve()
        # resolve() follows links: a link pointing out of the folder is refused too.
        if path.parent != self.root or not path.is_file():
            return None
        return path

    def response(self, name: str) -> Response:
        path = self.resolve(name)
        if path is None:
            return PlainTextResponse("not found", status_code=404)
        return Response(
            path.read_bytes(),
            media_type=CONTENT_TYPES[path.suffix],
            # Small files, and a page that must match the server it talks to.
            headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
        )


def demo_routes(fallback_page: str, folder: Path | None) -> list[BaseRoute]:
    """``/`` and ``/demo/<file>`` from ``folder``; without one, ``/`` is ``fallback_page``."""
    files = DemoFiles(folder) if folder is not None else None

    async def index(request: Request) -> Response:
        if files is None:
            return HTMLResponse(fallback_page)
        return files.response(INDEX)

    async def demo_file(request: Request) -> Response:
        if files is None:
            return PlainTextResponse("not found", status_code=404)
        return files.response(request.path_params["name"])

    return [
        Route("/", index),
        Route(DEMO_PREFIX + "/{name:path}", demo_file),
    ]
