"""The gateway serves the browser demo: the page, its files, nothing else."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette

from gateway.app import _FALLBACK_PAGE
from gateway.web_demo import (
    CONTENT_TYPES,
    DATA_SUBDIR,
    SOURCE_DIR,
    DemoFiles,
    demo_routes,
    find_demo_dir,
)
from tests.gateway_support import fake_app
from tests.live_server import live_server

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "web_demo"
DEMO_FILES = sorted(p for p in DEMO.iterdir() if p.is_file())


async def _raw_get(base_url: str, target: str) -> tuple[int, bytes]:
    """GET with the request target exactly as given (HTTP clients normalise '..')."""
    host, port = base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    response = await reader.read()
    writer.close()
    await writer.wait_closed()
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, body


def test_the_checkout_serves_its_own_web_demo_folder() -> None:
    assert SOURCE_DIR == DEMO
    assert find_demo_dir() == DEMO
    assert DEMO_FILES, "web_demo/ is empty"
    assert all(p.suffix in CONTENT_TYPES for p in DEMO_FILES), "a demo file would not be served"


async def test_root_and_every_demo_file_are_served_with_their_content_type() -> None:
    async with live_server(fake_app()) as url, httpx.AsyncClient(base_url=url) as http:
        index = await http.get("/")
        assert index.status_code == 200
        assert index.headers["content-type"] == "text/html; charset=utf-8"
        assert index.content == (DEMO / "index.html").read_bytes()
        for path in DEMO_FILES:
            response = await http.get(f"/demo/{path.name}")
            assert response.status_code == 200, path.name
            assert response.headers["content-type"] == CONTENT_TYPES[path.suffix], path.name
            assert response.headers["x-content-type-options"] == "nosniff"
            assert response.content == path.read_bytes(), path.name
        # The page's own references resolve against "/" to served files.
        for ref in re.findall(r'(?:src|href)="([^"]+)"', index.text):
            if ref.startswith("data:"):
                continue  # inline (the icon): nothing to fetch
            assert (await http.get("/" + ref)).status_code == 200, ref
        # The API next to it is untouched.
        assert (await http.get("/health")).json() == {"status": "ok"}


async def test_paths_outside_the_folder_are_refused(tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "index.html").write_text("<p>demo</p>")
    (demo / "app.js").write_text("export {};")
    (demo / "notes.txt").write_text("not a demo file type")
    (demo / ".hidden.js").write_text("dot file")
    (demo / "sub").mkdir()
    (demo / "sub" / "inner.js").write_text("nested")
    secret = tmp_path / "secret.js"
    secret.write_text("SECRET")
    os.symlink(secret, demo / "link.js")
    app = Starlette(routes=demo_routes("fallback", demo))
    attempts = [
        "/demo/../secret.js",
        "/demo/..%2fsecret.js",
        "/demo/%2e%2e/secret.js",
        "/demo/%2e%2e%2fsecret.js",
        "/demo/..%5csecret.js",
        "/demo/%2fetc%2fpasswd",
        "/demo//etc/passwd",
        "/demo/sub/inner.js",
        "/demo/sub%2finner.js",
        "/demo/link.js",
        "/demo/.hidden.js",
        "/demo/notes.txt",
        "/demo/",
        "/demo/missing.js",
        "/demo/app.js%00.html",
    ]
    async with live_server(app) as url:
        assert await _raw_get(url, "/demo/app.js") == (200, b"export {};")
        for target in attempts:
            status, body = await _raw_get(url, target)
            assert status in (400, 404), target
            assert b"SECRET" not in body and b"nested" not in body, target


_NAME_PARTS = st.sampled_from([*(p.name for p in DEMO_FILES), "..", ".", "/", "\\", "%2e", "\x00"])


@given(st.one_of(st.text(max_size=40), st.lists(_NAME_PARTS, max_size=4).map("".join)))
def test_any_name_resolves_inside_the_folder_or_not_at_all(name: str) -> None:
    files = DemoFiles(DEMO)
    path = files.resolve(name)
    if path is not None:
        assert path.parent == DEMO.resolve()
        assert path.is_file()
        assert path.name == name


async def test_without_a_demo_folder_the_fallback_page_is_served(tmp_path: Path) -> None:
    folder = find_demo_dir(source=tmp_path / "absent", prefixes=[tmp_path])
    assert folder is None
    app = Starlette(routes=demo_routes(_FALLBACK_PAGE, folder))
    async with live_server(app) as url, httpx.AsyncClient(base_url=url) as http:
        index = await http.get("/")
        assert index.status_code == 200
        assert index.text == _FALLBACK_PAGE
        assert (await http.get("/demo/app.js")).status_code == 404


def test_a_built_wheel_ships_the_demo_where_the_gateway_finds_it(tmp_path: Path) -> None:
    # Build from a copy holding just what the wheel's demo needs, so the
    # checkout's build/ folder is left alone.
    source = tmp_path / "src"
    (source / "gateway").mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    shutil.copy(REPO / "gateway" / "__init__.py", source / "gateway" / "__init__.py")
    shutil.copytree(DEMO, source / "web_demo")
    out = tmp_path / "dist"
    build = "import sys, setuptools.build_meta as b; print(b.build_wheel(sys.argv[1]))"
    subprocess.run(
        [sys.executable, "-c", build, str(out)],
        cwd=source,
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = out.glob("*.whl")
    prefix = tmp_path / "prefix"
    with zipfile.ZipFile(wheel) as archive:  # what an installer does with .data/data/
        for member in archive.namelist():
            data_dir, sep, rest = member.partition(".data/data/")
            if sep and "/" not in data_dir:
                target = prefix / rest
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(member))
    found = find_demo_dir(source=tmp_path / "no-checkout", prefixes=[tmp_path / "x", prefix])
    assert found == prefix / DATA_SUBDIR
    assert sorted(p.name for p in found.iterdir()) == [p.name for p in DEMO_FILES]
    for path in DEMO_FILES:
        assert (found / path.name).read_bytes() == path.read_bytes(), path.name
