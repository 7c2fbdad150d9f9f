"""HAProxy run with the shipped ``deploy/haproxy.cfg``, only its addresses
changed to loopback ports, so the tests exercise the real balancer config.

Debian's ``haproxy`` package (scripts/_install.sh installs it for CI; GPL-2.0,
run as a separate program). Without it the test skips, except where
``VOICE_STORE_TESTS_REQUIRED=1`` (CI) makes it a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import httpx
import pytest
from redis_support import free_port

CONFIG = Path(__file__).resolve().parent.parent / "deploy" / "haproxy.cfg"


def local_config(listen_port: int, backends: Sequence[tuple[str, int]]) -> str:
    """The shipped config with ``bind`` and each ``server`` address on loopback, and a
    ``maxconn`` that fits a test machine's open-file limit (HAProxy needs two
    descriptors per connection)."""
    text = CONFIG.read_text(encoding="utf-8")
    text, limits = re.subn(r"(?m)^(\s*maxconn) \d+$", r"\1 1000", text)
    assert limits == 1, "deploy/haproxy.cfg no longer sets maxconn"
    text, binds = re.subn(r"(?m)^(\s*bind) :8000$", rf"\1 127.0.0.1:{listen_port}", text)
    assert binds == 1, "deploy/haproxy.cfg no longer binds :8000"
    for index, (host, port) in enumerate(backends, start=1):
        text, found = re.subn(
            rf"(?m)^(\s*server gateway-{index}) gateway-{index}:8000", rf"\1 {host}:{port}", text
        )
        assert found == 1, f"deploy/haproxy.cfg has no server gateway-{index}"
    return text


@contextlib.asynccontextmanager
async def haproxy(directory: Path, backends: Sequence[tuple[str, int]]) -> AsyncIterator[str]:
    """Run HAProxy in the foreground; yield ``http://127.0.0.1:PORT`` once ``/ready``
    answers 200 through it."""
    binary = shutil.which("haproxy")
    if binary is None:
        message = "haproxy is not installed (apt-get install haproxy)"
        if os.environ.get("VOICE_STORE_TESTS_REQUIRED") == "1":
            pytest.fail(message)
        pytest.skip(message)
    port = free_port()
    config = directory / "haproxy.cfg"
    config.write_text(local_config(port, backends), encoding="utf-8")
    proc = subprocess.Popen(
        [binary, "-db", "-f", str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with asyncio.timeout(30), httpx.AsyncClient() as http:
            while proc.poll() is None:
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get(f"{url}/ready")).status_code == 200:
                        break
                await asyncio.sleep(0.05)  # readiness polling of a starting process
        assert proc.poll() is None, (proc.stdout.read() if proc.stdout else b"").decode()
        yield url
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 10)
