"""Graceful drain of a real server process on SIGTERM / SIGINT (``gateway.drain``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from server_process import ServerProcess, server_process
from websockets.asyncio.client import connect
from ws_recorder import Client, is_event, open_client

from gateway.protocol import CLOSE_GOING_AWAY, CLOSE_TRY_AGAIN, ErrorCode, unpack_audio_frame

pytestmark = pytest.mark.slow

# Real-time fake audio: a 400-character context speaks for 20 s, far past the drain.
FAKE = json.dumps({"realtime_factor": 1.0, "chunk_samples": 2400})
LONG_TEXT = "This context keeps speaking for a long while. " * 9
DRAIN_S = 2.0

Stop = Callable[[int, Any], None]  # a signal handler of the server


async def open_session(server: ServerProcess) -> Client:
    return await open_client(server.ws_url)


async def speak(client: Client, context_id: str, text: str) -> None:
    await client.send(type="session.update", session={"output": {"format": "pcm16"}})
    await client.wait_for(is_event("session.updated"))
    await client.send(type="text.append", context_id=context_id, text=text)
    await client.send(type="context.end", context_id=context_id)
    await client.wait_for(lambda item: isinstance(item, bytes))


async def ready_status(server: ServerProcess) -> int:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"{server.url}/ready")).status_code


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_signal_drains_then_cancels_with_server_shutting_down(signum: int) -> None:
    args = ["--engine", "fake", "--fake-options", FAKE, "--drain-timeout", str(DRAIN_S)]
    async with server_process(args) as server:
        assert await ready_status(server) == 200
        long = await open_session(server)
        await speak(long, "long", LONG_TEXT)
        short = await open_session(server)
        await speak(short, "short", "Short one.")

        server.proc.send_signal(signum)
        signalled = time.perf_counter()
        async with asyncio.timeout(2):  # at once: the first answer after the signal
            while await ready_status(server) != 503:
                pass
        body = httpx.get(f"{server.url}/ready").json()
        assert body["status"] == "draining"

        # A new session is refused with a reason and a retry hint, not by TCP.
        late = Client(await connect(server.ws_url))
        assert await late.closed_with() == CLOSE_TRY_AGAIN
        refusal = late.events[0][1]
        assert isinstance(refusal, dict) and refusal["type"] == "error"
        assert refusal["error"]["code"] == ErrorCode.SERVER_SHUTTING_DOWN
        assert refusal["error"]["retryable"] and refusal["error"]["retry_after_ms"] > 0

        # An open session cannot start a new context, but its open one finishes.
        await short.send(type="text.append", context_id="another", text="More words.")
        await short.wait_for(is_event("error", code="server_shutting_down", context_id="another"))
        done = await short.wait_for(is_event("context.done", context_id="short"))
        assert done["status"] == "completed"

        # The long context outlives the drain: cancelled with an error, then 1001.
        cancelled = await long.wait_for(
            is_event("error", code="server_shutting_down", context_id="long"), timeout=DRAIN_S + 5
        )
        assert cancelled["error"]["retryable"]
        assert await long.closed_with() == CLOSE_GOING_AWAY
        assert await short.closed_with() == CLOSE_GOING_AWAY
        closed_after = long.events[-1][0] - signalled
        assert DRAIN_S - 0.2 <= closed_after <= DRAIN_S + 3, closed_after
        # Nothing of the cancelled context after its error.
        at = next(i for i, (_, item) in enumerate(long.events) if item is cancelled)
        assert not any(isinstance(item, bytes) for _, item in long.events[at:])
        frames = [unpack_audio_frame(item) for _, item in long.events if isinstance(item, bytes)]
        assert [f.seq for f in frames] == list(range(len(frames)))

        code = await server.wait(15)
        assert code in (0, -signum), server.output()
        assert "Traceback" not in server.output()


async def test_second_signal_exits_at_once() -> None:
    args = ["--engine", "fake", "--fake-options", FAKE, "--drain-timeout", "60"]
    async with server_process(args) as server:
        client = await open_session(server)
        await speak(client, "long", LONG_TEXT)
        server.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(2):
            while await ready_status(server) != 503:
                pass
        started = time.perf_counter()
        server.proc.send_signal(signal.SIGTERM)
        await server.wait(10)
        assert time.perf_counter() - started < 5, server.output()
        await asyncio.wait_for(client.task, 10)  # the connection ended too


@contextlib.asynccontextmanager
async def served_in_process() -> AsyncIterator[tuple[Any, Any, dict[int, Stop]]]:
    """A gateway server on port 0 in this process, started; yields it, its state and
    its stop handlers by signal, and shuts it down after."""
    from gateway.drain import SUPERVISOR_STOP_SIGNAL
    from gateway.serving import build_server
    from gateway.settings import GatewaySettings
    from realtime_engine.engines.fake import FakeEngine

    server, state = build_server(GatewaySettings(port=0), FakeEngine(), log_level="warning")
    stop: dict[int, Stop] = {
        signal.SIGTERM: server.handle_exit,
        signal.SIGINT: server.handle_exit,
        SUPERVISOR_STOP_SIGNAL: server.handle_supervisor_stop,
    }
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done()
            await asyncio.sleep(0.01)
        yield server, state, stop
    finally:
        # uvicorn re-raises the signals it captured once it stops: none were sent
        getattr(server, "_captured_signals", []).clear()
        server.should_exit = True
        await asyncio.wait_for(task, 15)


async def test_a_supervisors_stop_and_a_direct_signal_are_counted_apart() -> None:
    """A worker of ``serve --workers N`` whose process group is signalled gets one
    stop twice, directly and through its supervisor, as far apart as scheduling
    puts them: one of each kind drains; a second of either kind exits now."""
    from gateway.drain import SUPERVISOR_STOP_SIGNAL

    for first, then in [
        (signal.SIGTERM, SUPERVISOR_STOP_SIGNAL),
        (SUPERVISOR_STOP_SIGNAL, signal.SIGINT),
    ]:
        async with served_in_process() as (server, state, stop):
            stop[first](first, None)
            assert state.draining and not server.force_exit
            stop[then](then, None)  # the same stop's other copy, however late
            assert not server.force_exit
            stop[then](then, None)  # a second stop of that kind
            assert server.force_exit


async def test_the_other_copy_of_a_stop_after_the_drain_ended_is_not_a_second_stop() -> None:
    """The forwarded copy of a stop can come after this worker's drain finished
    (nothing was open, the supervisor slow to pass it on): it is the same stop,
    so the worker still ends through its drain, not with an exit now."""
    from gateway.drain import SUPERVISOR_STOP_SIGNAL

    for first, then in [
        (signal.SIGTERM, SUPERVISOR_STOP_SIGNAL),
        (SUPERVISOR_STOP_SIGNAL, signal.SIGTERM),
    ]:
        async with served_in_process() as (server, state, stop):
            stop[first](first, None)
            assert state.draining
            async with asyncio.timeout(15):  # nothing open: the drain ends at once
                while not server.should_exit:
                    await asyncio.sleep(0.01)
            stop[then](then, None)
            assert not server.force_exit
