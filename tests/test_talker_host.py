"""The talker host: one engine served to worker processes' runners over ZMQ.

A fake :class:`EngineLink` (the interface the host serves, implemented with
events, no vLLM) behind a real :class:`TalkerHost`, reached by real
:class:`RemoteEngineLink` sockets over ``ipc://`` endpoints.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from realtime_engine.talker.talker_host import RemoteEngineLink, TalkerHost
from realtime_engine.talker.types import TalkerError
from realtime_engine.talker.vllm_link import EngineRequest

pytestmark = pytest.mark.timeout(60)


@dataclass
class FakeEngine:
    """Runs each request until released; records what it was asked."""

    started: dict[str, asyncio.Event] = field(default_factory=dict)
    release: dict[str, asyncio.Future[int]] = field(default_factory=dict)
    requests: list[EngineRequest] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    profile_calls: list[str] = field(default_factory=list)
    dead: str | None = None
    profile_error: str | None = None

    def _future(self, key: str) -> asyncio.Future[int]:
        return self.release.setdefault(key, asyncio.get_running_loop().create_future())

    async def run(self, request: EngineRequest) -> int:
        self.requests.append(request)
        self.started.setdefault(request.request_id, asyncio.Event()).set()
        return await self._future(request.request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def start_profile(self) -> None:
        self.profile_calls.append("start")
        if self.profile_error:
            raise RuntimeError(self.profile_error)

    async def stop_profile(self) -> None:
        self.profile_calls.append("stop")

    def failure(self) -> str | None:
        return self.dead

    def shutdown(self) -> None:
        pass

    async def wait_started(self, count: int) -> list[EngineRequest]:
        while len(self.requests) < count:
            await asyncio.sleep(0)  # yields to the host's tasks; bounded by the timeout
        return self.requests


def _request(rid: str, prompt: tuple[int, ...] = (1, 2, 3)) -> EngineRequest:
    return EngineRequest(rid, list(prompt), 9, [7], {"higgs": {"endpoint": "ipc://x"}})


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[tuple[TalkerHost, FakeEngine]]:
    engine = FakeEngine()
    served = TalkerHost(engine, f"ipc://{tmp_path}/talker")
    task = asyncio.create_task(served.serve())
    yield served, engine
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    served.close()


@pytest.fixture
async def links(
    host: tuple[TalkerHost, FakeEngine],
) -> AsyncIterator[tuple[RemoteEngineLink, RemoteEngineLink]]:
    a = RemoteEngineLink(host[0].endpoint, identity="worker-a")
    b = RemoteEngineLink(host[0].endpoint, identity="worker-b")
    yield a, b
    a.shutdown()
    b.shutdown()


async def _started(engine: FakeEngine, count: int) -> list[EngineRequest]:
    return await asyncio.wait_for(engine.wait_started(count), 10)


async def test_each_worker_gets_its_own_answer_for_the_same_request_id(
    host: tuple[TalkerHost, FakeEngine], links: tuple[RemoteEngineLink, RemoteEngineLink]
) -> None:
    _, engine = host
    a, b = links
    run_a = asyncio.create_task(a.run(_request("seg-1", (1, 2))))
    run_b = asyncio.create_task(b.run(_request("seg-1", (5, 6, 7))))
    requests = await _started(engine, 2)
    keys = {r.request_id for r in requests}
    assert len(keys) == 2, "the host keeps the two workers' requests apart"
    by_prompt = {tuple(r.prompt_ids): r for r in requests}
    # Everything else arrives as the worker sent it.
    assert by_prompt[(5, 6, 7)].max_tokens == 9
    assert by_prompt[(5, 6, 7)].stop_token_ids == [7]
    assert by_prompt[(5, 6, 7)].extra_args == {"higgs": {"endpoint": "ipc://x"}}
    engine.release[by_prompt[(1, 2)].request_id].set_result(11)
    engine.release[by_prompt[(5, 6, 7)].request_id].set_result(22)
    assert await asyncio.wait_for(run_a, 10) == 11
    assert await asyncio.wait_for(run_b, 10) == 22


async def test_a_failed_request_fails_with_the_engines_reason_and_the_link_goes_on(
    host: tuple[TalkerHost, FakeEngine], links: tuple[RemoteEngineLink, RemoteEngineLink]
) -> None:
    _, engine = host
    a, _ = links
    run = asyncio.create_task(a.run(_request("bad")))
    (request,) = await _started(engine, 1)
    engine.release[request.request_id].set_exception(ValueError("prompt too long"))
    with pytest.raises(TalkerError, match="prompt too long"):
        await asyncio.wait_for(run, 10)
    again = asyncio.create_task(a.run(_request("good")))
    requests = await _started(engine, 2)
    engine.release[requests[1].request_id].set_result(3)
    assert await asyncio.wait_for(again, 10) == 3


async def test_abort_reaches_the_engine_under_the_hosts_key(
    host: tuple[TalkerHost, FakeEngine], links: tuple[RemoteEngineLink, RemoteEngineLink]
) -> None:
    _, engine = host
    a, _ = links
    run = asyncio.create_task(a.run(_request("stop-me")))
    (request,) = await _started(engine, 1)
    await a.abort("stop-me")
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(run, 10)
    while not engine.aborted:
        await asyncio.sleep(0)
    assert engine.aborted == [request.request_id]


async def test_a_caller_that_gives_up_aborts_the_engines_work(
    host: tuple[TalkerHost, FakeEngine], links: tuple[RemoteEngineLink, RemoteEngineLink]
) -> None:
    _, engine = host
    a, _ = links
    run = asyncio.create_task(a.run(_request("left")))
    (request,) = await _started(engine, 1)
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)
    await asyncio.wait_for(_until(lambda: engine.aborted == [request.request_id]), 10)


async def test_an_engine_that_dies_fails_every_waiting_request_and_every_later_one(
    host: tuple[TalkerHost, FakeEngine], links: tuple[RemoteEngineLink, RemoteEngineLink]
) -> None:
    _, engine = host
    a, b = links
    runs = [asyncio.create_task(link.run(_request("r"))) for link in (a, b)]
    await _started(engine, 2)
    engine.dead = "the vLLM engine core died"
    for run in runs:
        with pytest.raises(TalkerError, match="engine core died"):
            await asyncio.wait_for(run, 10)
    assert a.failure() == b.failure() == "the vLLM engine core died"
    with pytest.raises(TalkerError, match="engine core died"):
        await a.run(_request("later"))


async def test_a_host_process_that_is_gone_fails_the_link(tmp_path: Path) -> None:
    alive = True
    link = RemoteEngineLink(f"ipc://{tmp_path}/nobody", host_alive=lambda: alive)
    try:
        run = asyncio.create_task(link.run(_request("r")))
        await asyncio.sleep(0)  # sent into a socket nobody binds
        assert link.failure() is None
        alive = False
        assert link.failure() == "the talker host process exited"
        with pytest.raises(TalkerError, match="host process exited"):
            await asyncio.wait_for(run, 10)
    finally:
        link.shutdown()


async def test_profiling_passes_through_and_its_errors_come_back(
    host: tuple[TalkerHost, FakeEngine], links: tuple[RemoteEngineLink, RemoteEngineLink]
) -> None:
    _, engine = host
    a, _ = links
    await asyncio.wait_for(a.start_profile(), 10)
    await asyncio.wait_for(a.stop_profile(), 10)
    assert engine.profile_calls == ["start", "stop"]
    engine.profile_error = "no profiler_config"
    with pytest.raises(TalkerError, match="no profiler_config"):
        await asyncio.wait_for(a.start_profile(), 10)


async def test_a_malformed_message_is_dropped_and_the_host_keeps_serving(
    host: tuple[TalkerHost, FakeEngine], links: tuple[RemoteEngineLink, RemoteEngineLink]
) -> None:
    served, engine = host
    context = zmq.asyncio.Context()
    rogue = context.socket(zmq.DEALER)
    rogue.connect(served.endpoint)
    try:
        for raw in (b"not json", b"[1, 2]", json.dumps({"op": "run"}).encode(), b'{"op": "x"}'):
            await rogue.send(raw)
        await rogue.send_multipart([b"two", b"frames"])
        a, _ = links
        run = asyncio.create_task(a.run(_request("fine")))
        (request,) = await _started(engine, 1)
        engine.release[request.request_id].set_result(5)
        assert await asyncio.wait_for(run, 10) == 5
    finally:
        rogue.close(linger=0)
        context.term()


async def _until(condition: object) -> None:
    assert callable(condition)
    while not condition():
        await asyncio.sleep(0.01)


@dataclass
class PromptLengthEngine(FakeEngine):
    """Finishes every request at once, with its prompt's length as its token count."""

    async def run(self, request: EngineRequest) -> int:
        self.requests.append(request)
        return len(request.prompt_ids)


async def test_a_worker_that_reads_late_still_gets_every_answer(tmp_path: Path) -> None:
    """Thousands of answers pile up for a worker that is not reading (a stalled
    event loop): ZMQ's default queue of 1,000 messages per peer would drop the
    rest, and those requests would wait for an answer that never comes."""
    count = 6000
    engine = PromptLengthEngine()
    served = TalkerHost(engine, f"ipc://{tmp_path}/talker")
    task = asyncio.create_task(served.serve())
    context = zmq.asyncio.Context()
    worker = context.socket(zmq.DEALER)  # ZMQ's default queue: 1,000 messages
    worker.connect(served.endpoint)
    try:
        for i in range(count):
            request = _request(f"r{i}", tuple(range(1 + i % 5)))
            await worker.send(json.dumps({"op": "run", **request.to_wire()}).encode())
        # every request has run and been answered before the worker reads any answer
        await asyncio.wait_for(_until(lambda: len(engine.requests) == count), 30)
        await asyncio.wait_for(_until(lambda: not served._running), 30)
        answers: dict[str, dict[str, object]] = {}
        while len(answers) < count:
            message = json.loads(await asyncio.wait_for(worker.recv(), 10))
            answers[message["id"]] = message
        assert {m["op"] for m in answers.values()} == {"finished"}
        assert all(answers[f"r{i}"]["tokens"] == 1 + i % 5 for i in range(count))
    finally:
        worker.close(linger=0)
        context.term()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        served.close()
