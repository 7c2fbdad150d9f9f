"""A real ``redis-server`` for the shared voice store tests: a free port, a
temporary directory, no persistence, gone when the test ends.

The server comes from Debian's ``redis-server`` package (7.0, BSD-3-Clause;
scripts/_install.sh installs it for CI). Without it the tests skip, except
where ``VOICE_STORE_TESTS_REQUIRED=1`` (CI) makes a missing server a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

READY_LINE = "Ready to accept connections"


@dataclass
class RedisServer:
    url: str  # redis://127.0.0.1:PORT/0
    proc: subprocess.Popen[str]

    async def stop(self) -> None:
        """Stop the server now (a store that goes away under a running gateway)."""
        if self.proc.poll() is None:
            self.proc.terminate()
        await asyncio.to_thread(self.proc.wait, 10)


def redis_server_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        message = "redis-server is not installed (apt-get install redis-server)"
        if os.environ.get("VOICE_STORE_TESTS_REQUIRED") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def redis_server(directory: Path, tries: int = 3) -> AsyncIterator[RedisServer]:
    """Start redis-server; yield it once it accepts connections.

    The port is picked free just before the start; if another process takes it
    in between, the server exits at once and the next try picks another.
    """
    binary = redis_server_binary()
    for attempt in range(tries):
        port = free_port()
        # fmt: off
        args = [
            binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
            "--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes",
        ]
        # fmt: on
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: list[str] = []
        ready = await _wait_ready(proc, lines)
        if ready:
            server = RedisServer(f"redis://127.0.0.1:{port}/0", proc)
            try:
                yield server
            finally:
                await server.stop()
            return
        proc.kill()
        await asyncio.to_thread(proc.wait, 10)
        if attempt == tries - 1:
            raise RuntimeError("redis-server did not start:\n" + "".join(lines))


async def _wait_ready(proc: subprocess.Popen[str], lines: list[str]) -> bool:
    """True once the server says it is ready; False if it exits first."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[bool] = loop.create_future()

    def settle(value: bool) -> None:
        if not ready.done():
            ready.set_result(value)

    def pump() -> None:  # reads to the end, so the pipe never fills
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if READY_LINE in line:
                loop.call_soon_threadsafe(settle, True)
        loop.call_soon_threadsafe(settle, False)

    threading.Thread(target=pump, daemon=True).start()
    return await asyncio.wait_for(ready, 30)


def require_redis_client() -> None:
    """Skip without redis-py (the ``[redis]`` extra), or fail where CI requires it."""
    try:
        import redis  # noqa: F401
    except ImportError:
        message = "the redis client is not installed (pip install -e '.[redis]')"
        if os.environ.get("VOICE_STORE_TESTS_REQUIRED") == "1":
            pytest.fail(message)
        pytest.skip(message)
