"""``speech-gateway serve`` in its own process, for signals, RSS and log checks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    url: str  # http://127.0.0.1:PORT
    lines: list[str] = field(default_factory=list)  # everything it printed so far
    eof: threading.Event = field(default_factory=threading.Event)  # its output is all read

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/v1/realtime"

    def output(self) -> str:
        return "".join(self.lines)

    async def wait(self, timeout: float) -> int:
        """Its exit status, once it exited and everything it printed is in ``lines``."""
        status = await asyncio.to_thread(self.proc.wait, timeout)
        await asyncio.to_thread(self.eof.wait, timeout)
        return status


@contextlib.asynccontextmanager
async def server_process(
    args: Sequence[str], ready_timeout: float = 120
) -> AsyncIterator[ServerProcess]:
    """Start ``gateway.cli serve --port 0 *args``; yield once it says it is ready."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("SPEECH_GATEWAY_API_KEYS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    eof = threading.Event()
    ready = asyncio.get_running_loop().create_future()
    loop = asyncio.get_running_loop()

    def pump() -> None:  # reads until the process exits, so its pipe never fills
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if (match := re.search(r"open (http://\S+)/ ", line)) is not None:
                loop.call_soon_threadsafe(_resolve, ready, match.group(1))
        eof.set()
        loop.call_soon_threadsafe(_resolve, ready, None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        url = await asyncio.wait_for(ready, ready_timeout)
        assert url is not None, "the server exited before it was ready:\n" + "".join(lines)
        yield ServerProcess(proc, url, lines, eof)
    finally:
        if proc.poll() is None:
            proc.kill()
        await asyncio.to_thread(proc.wait, 30)
        await asyncio.to_thread(reader.join, 10)


def _resolve(future: asyncio.Future[str | None], value: str | None) -> None:
    if not future.done():
        future.set_result(value)
