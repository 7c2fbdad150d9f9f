"""The web demo in a real browser: the distribution's Chromium, driven by puppeteer-core.

A live gateway with the embedded CPU voice serves the page; ``browser/drive_demo.mjs``
clicks through it as a user would and measures inside the page: Opus frames
decoded by WebCodecs, the level on the page's output analyser, how soon a
barge-in or a disconnect makes the output silent, what the page says when the
server goes away, that it reconnects when the server is back, and that it
fits a 375 px screen. Screenshots of the idle and speaking states go to
``out/web_demo_browser/`` (or ``$TEST_OUTPUT_DIR/web_demo_browser/``).

Needs Chromium (``/usr/bin/chromium`` or ``$CHROMIUM``), Node and
``tests/browser/node_modules`` (``npm ci --prefix tests/browser``); all three are
installed by ``scripts/_install.sh``. Without them the test is skipped, unless
``WEB_DEMO_BROWSER_REQUIRED=1`` (set by ``scripts/test.sh``) makes that a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from gateway.app import create_app
from gateway.settings import GatewaySettings
from realtime_engine.engines.cpu_voice import CpuVoiceEngine

pytestmark = pytest.mark.slow

BROWSER_DIR = Path(__file__).resolve().parent / "browser"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
NODE = shutil.which("node")
OUTPUT = (Path(os.environ.get("TEST_OUTPUT_DIR", "out")) / "web_demo_browser").resolve()
SILENT_WITHIN_MS = 50


def _missing() -> str | None:
    if not Path(CHROMIUM).is_file():
        return f"no Chromium at {CHROMIUM}"
    if NODE is None:
        return "no node"
    if not (BROWSER_DIR / "node_modules" / "puppeteer-core").is_dir():
        return "puppeteer-core is not installed (npm ci --prefix tests/browser)"
    return None


def _require_browser() -> None:
    missing = _missing()
    if missing is None:
        return
    if os.environ.get("WEB_DEMO_BROWSER_REQUIRED") == "1":
        pytest.fail(f"the real-browser test cannot run: {missing}")
    pytest.skip(missing)


class GatedCpuVoice(CpuVoiceEngine):
    """The CPU voice, whose warm-up waits for a gate: the server refuses sessions
    with a retryable 1013 ("the engine is warming up") for as long as the test likes."""

    def __init__(self, gate: asyncio.Event) -> None:
        super().__init__()
        self._gate = gate

    async def start(self) -> None:
        await self._gate.wait()
        await super().start()


class RestartableServer:
    """The gateway with the CPU voice on one port that survives a stop and a start."""

    def __init__(self) -> None:
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.warm_gate: asyncio.Event | None = None

    async def start(self, gated: bool = False) -> None:
        if gated:
            # Accept connections at once, refuse sessions until the gate opens.
            self.warm_gate = asyncio.Event()
            settings = GatewaySettings(warm_in_background=True)
            engine: CpuVoiceEngine = GatedCpuVoice(self.warm_gate)
        else:
            settings, engine = GatewaySettings(), CpuVoiceEngine()
        app = create_app(settings, engine)  # fresh state, as a restart has
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, lifespan="on", log_level="warning"
        )
        config.timeout_graceful_shutdown = 5
        self._server = server = uvicorn.Server(config)
        self._task = task = asyncio.create_task(server.serve())
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the test server stopped before it started")
            await asyncio.sleep(0.01)
        self.port = server.servers[0].sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        await asyncio.wait_for(self._task, 30)
        self._server = self._task = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def _drive(server: RestartableServer, out_dir: Path) -> dict[str, Any]:
    """Run the driver; answer its requests to stop and start the server."""
    assert NODE is not None
    process = await asyncio.create_subprocess_exec(
        NODE,
        str(BROWSER_DIR / "drive_demo.mjs"),
        server.url,
        str(out_dir),
        cwd=BROWSER_DIR,
        env={**os.environ, "CHROMIUM": CHROMIUM},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    stderr_task = asyncio.create_task(process.stderr.read())  # type: ignore[union-attr]
    result: dict[str, Any] | None = None
    async for raw in process.stdout:
        line = raw.decode().strip()
        if not line.startswith("{"):
            continue
        message = json.loads(line)
        if "result" in message:
            result = message["result"]
        elif message.get("ask") == "stop-server":
            await server.stop()
            process.stdin.write(b"ok\n")
        elif message.get("ask") == "start-server-warming":
            await server.start(gated=True)
            process.stdin.write(b"ok\n")
        elif message.get("ask") == "finish-warm-up":
            assert server.warm_gate is not None
            server.warm_gate.set()
            process.stdin.write(b"ok\n")
        await process.stdin.drain()
    await process.wait()
    stderr = (await stderr_task).decode()
    assert process.returncode == 0 and result is not None, stderr[-4000:]
    return result


@pytest.fixture
async def server() -> AsyncIterator[RestartableServer]:
    _require_browser()
    server = RestartableServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_the_demo_plays_barges_in_and_survives_a_restart_in_chromium(
    server: RestartableServer,
) -> None:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    page = await asyncio.wait_for(_drive(server, OUTPUT), 400)
    (OUTPUT / "measured.json").write_text(json.dumps(page, indent=1))

    # Loads and speaks with no console error and no failed request.
    assert page["initialState"] == "disconnected"
    assert page["errorsBeforeOutage"] == []
    assert page["failedBeforeOutage"] == []  # no 404 either (the icon is inline)
    assert page["format"] == "opus"  # Chromium has WebCodecs Opus: no PCM fallback

    # The sentence was decoded by WebCodecs and really reached the output.
    speak = page["speak"]
    assert speak["finalState"] == "ready"
    assert speak["receivedFrames"] > 50
    assert speak["decodedFrames"] == speak["receivedFrames"]
    assert speak["scheduledS"] > 2.0
    assert speak["loudest"] > 0.05
    assert speak["nonSilentShare"] > 0.3
    assert page["ttfa"].endswith(" ms")

    # Barge-in while seconds of audio are still buffered: silent within 50 ms.
    barge = page["bargeIn"]
    assert barge["peakBefore"] > 0 and barge["bufferedBefore"] > 2
    assert barge["silentAfterMs"] is not None
    assert barge["silentAfterMs"] <= SILENT_WITHIN_MS, barge
    assert barge["bufferedAfter"] == 0
    assert page["stateAfterBargeIn"] in ("cancelled", "ready")

    # Disconnect mid-playback: silent too, and the page says it is disconnected.
    gone = page["disconnect"]
    assert gone["peakBefore"] > 0 and gone["bufferedBefore"] > 2
    assert gone["silentAfterMs"] is not None
    assert gone["silentAfterMs"] <= SILENT_WITHIN_MS, gone
    assert page["stateAfterDisconnect"] == "disconnected"

    # The server goes away mid-playback: the page stops the sound and says so ...
    lost = page["lost"]
    assert lost["state"].startswith("connection lost: ")
    assert lost["buffered"] == 0
    assert any("connection lost" in line for line in lost["log"])
    # ... retries while the restarted server refuses (1013, warming up), no sooner
    # than the server's retry_after_ms (1000 ms) ...
    refusal = page["warmingLine"]
    assert "the engine is warming up" in refusal
    waited = re.search(r"reconnecting in (\d+\.\d) s", refusal)
    assert waited is not None and float(waited.group(1)) >= 1.0, refusal
    # ... and comes back by itself once the server is ready.
    assert any(line.endswith("reconnected") for line in page["reconnectedLog"])
    assert page["speaksAfterReconnect"] is True

    assert "Nothing to speak" in page["emptyHint"]

    for narrow in page["narrow"]:
        assert narrow["scrollWidth"] <= narrow["width"], narrow
        assert narrow["disconnectRight"] <= narrow["width"], narrow

    for shot in ("idle.png", "speaking.png"):
        assert (OUTPUT / shot).stat().st_size > 10_000
