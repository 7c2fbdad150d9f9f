"""The engine dies while serving: the fake engine and the reference talker's thread.

(The vLLM talker's engine core process: tests/test_engine_death_vllm.py.)
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import threading
from pathlib import Path

import pytest
from engine_death import check_death_is_reported
from gateway_support import sentence_segmenter
from live_server import live_server
from server_process import server_process
from ws_recorder import is_event, open_client

from gateway.app import create_app
from gateway.drain import ENGINE_DEAD_EXIT_STATUS
from gateway.settings import GatewaySettings
from realtime_engine.engines.fake import FakeEngine
from realtime_engine.engines.higgs import HiggsEngine
from realtime_engine.talker.backends import ReferenceOptions
from realtime_engine.talker.reference_runner import ReferenceRunner


async def test_fake_engine_death_fails_every_context_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = FakeEngine(realtime_factor=1.0, chunk_samples=960)
    app = create_app(GatewaySettings(), engine, segmenter_factory=sentence_segmenter)
    async with live_server(app, lifespan="on") as url:
        await check_death_is_reported(url, lambda: engine.die("the core process exited"))
    deaths = [r for r in caplog.records if "died" in r.getMessage()]
    assert len(deaths) == 1 and "the core process exited" in deaths[0].getMessage()
    assert deaths[0].levelno == logging.ERROR


def kill_thread(thread: threading.Thread, runner: ReferenceRunner) -> None:
    """Raise SystemExit inside ``thread`` (a real thread death, from outside)."""
    assert thread.ident is not None
    hit = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(SystemExit)
    )
    assert hit == 1
    with runner._lock:  # a thread parked on its condition runs no bytecode: wake it
        runner._lock.notify_all()


async def test_reference_talker_thread_death(tiny_checkpoint: Path) -> None:
    engine = HiggsEngine.from_pretrained(str(tiny_checkpoint), "cpu", talker=ReferenceOptions())
    runner = engine._runner
    assert isinstance(runner, ReferenceRunner)
    app = create_app(GatewaySettings(), engine, segmenter_factory=sentence_segmenter)
    async with live_server(app, lifespan="on") as url:
        await check_death_is_reported(url, lambda: kill_thread(runner._thread, runner))
        assert not runner._thread.is_alive()
        assert "SystemExit" in (engine.failure() or "")


@pytest.mark.slow
async def test_exit_on_engine_death_ends_the_process_with_status_3() -> None:
    fake = json.dumps({"die_after_segments": 1})
    args = ["--engine", "fake", "--fake-options", fake, "--exit-on-engine-death"]
    async with server_process(args) as server:
        client = await open_client(server.ws_url)
        for context_id in ("first", "second"):
            await client.send(type="text.append", context_id=context_id, text="Hello there.")
            await client.send(type="context.end", context_id=context_id)
            done = await client.wait_for(is_event("context.done", context_id=context_id))
            assert done["status"] == ("completed" if context_id == "first" else "failed")
        await client.wait_for(is_event("error", code="engine_unavailable", context_id="second"))
        assert await server.wait(15) == ENGINE_DEAD_EXIT_STATUS
        await asyncio.wait_for(client.task, 10)
    assert "the engine died" in server.output()
