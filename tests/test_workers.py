"""``speech-gateway serve --workers N``: real processes on one listening socket."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from gateway_support import next_event, open_session, speak_context
from server_process import ServerProcess, server_process
from vllm_support.cpu_env import vllm_available
from websockets.asyncio.client import ClientConnection, connect

from gateway.cli import build_parser, main, settings_from_args
from gateway.drain import SUPERVISOR_STOP_SIGNAL
from gateway.settings import GatewaySettings
from gateway.workers import (
    DEFAULT_TALKER_HOST_WORKERS,
    Supervisor,
    resolve_workers,
    worker_settings,
)
from realtime_engine.talker.backends import parse_talker_options

pytestmark = pytest.mark.timeout(300)

FAKE = ["--engine", "fake", "--workers", "2"]


def worker_pids(server: ServerProcess) -> list[int]:
    match = re.search(r"workers accepting on port \d+ \(pids \[([\d, ]+)\]\)", server.output())
    assert match is not None, server.output()
    return [int(pid) for pid in match.group(1).split(",")]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes: its parent has not reaped it yet.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


async def speak(ws: ClientConnection, context_id: str, text: str) -> tuple[str, int]:
    """One context's final status and the audio bytes it got."""
    events, audio = await speak_context(ws, context_id, text)
    return events[-1]["status"], audio


async def test_every_session_on_two_workers_gets_its_speech() -> None:
    async with server_process(FAKE) as server:
        assert len(worker_pids(server)) == 2
        sessions = await asyncio.gather(*(open_session(server.url) for _ in range(8)))
        try:
            results = await asyncio.gather(
                *(speak(ws, f"c{i}", f"Hello number {i}.") for i, ws in enumerate(sessions))
            )
        finally:
            await asyncio.gather(*(ws.close() for ws in sessions))
        assert [status for status, _ in results] == ["completed"] * 8
        assert all(audio > 0 for _, audio in results)
        async with httpx.AsyncClient(base_url=server.url) as http:
            for _ in range(4):  # whichever worker answers is ready
                ready = await http.get("/ready")
                assert ready.status_code == 200, ready.text


async def test_the_session_limit_is_the_servers_not_each_workers() -> None:
    """``--max-sessions 2`` with two workers: two sessions in all, wherever the
    kernel hands the connections; a freed place is free on every worker."""
    async with server_process([*FAKE, "--max-sessions", "2"]) as server:
        url = server.url.replace("http", "ws") + "/v1/realtime"
        admitted: list[ClientConnection] = []
        refused = []

        async def attempt() -> None:
            ws = await connect(url)
            event = await next_event(ws)
            if event["type"] == "session.created":
                admitted.append(ws)
            else:
                refused.append(event["error"]["code"])
                await ws.close()

        try:
            # at once, so that both workers take some (each alone would admit 2)
            await asyncio.gather(*(attempt() for _ in range(8)))
            assert len(admitted) == 2, server.output()
            assert refused == ["session_limit"] * 6
            await admitted.pop().close()
            for _ in range(100):  # the worker counts the session closed once it has ended
                ws = await connect(url)
                if (await next_event(ws))["type"] == "session.created":
                    admitted.append(ws)
                    break
                await ws.close()
            assert len(admitted) == 2
        finally:
            await asyncio.gather(*(ws.close() for ws in admitted))


async def test_sigterm_stops_every_worker_and_exits_cleanly() -> None:
    async with server_process(FAKE) as server:
        pids = worker_pids(server)
        server.proc.send_signal(signal.SIGTERM)
        assert await server.wait(60) == 0, server.output()
        assert not any(alive(pid) for pid in pids)


async def test_a_stop_sent_to_the_whole_process_group_still_drains_open_contexts() -> None:
    """timeout(1) and systemd signal every process: each worker gets the stop
    twice (directly and forwarded), which must not count as a second signal."""
    paced = ["--fake-options", json.dumps({"realtime_factor": 1.0})]
    async with server_process([*FAKE, *paced]) as server:
        pids = worker_pids(server)
        ws = await open_session(server.url)
        text = "This sentence takes a few seconds to speak at the pace of real time."
        await ws.send(json.dumps({"type": "text.append", "context_id": "c", "text": text}))
        await ws.send(json.dumps({"type": "context.end", "context_id": "c"}))
        while not isinstance(await ws.recv(), bytes):
            pass  # until its audio has started
        for pid in (server.proc.pid, *pids):
            os.kill(pid, signal.SIGTERM)
        status = None
        while status is None:
            message = await ws.recv()
            if isinstance(message, str) and json.loads(message)["type"] == "context.done":
                status = json.loads(message)["status"]
        assert status == "completed", server.output()
        assert await server.wait(60) == 0, server.output()
        assert "exiting now" not in server.output()


async def test_a_second_stop_sent_to_the_supervisor_alone_exits_at_once() -> None:
    """systemd's KillMode=process or ``kill PID`` reach the supervisor only: its first
    stop drains the workers, its second ends them without waiting for the drain."""
    paced = ["--fake-options", json.dumps({"realtime_factor": 1.0}), "--drain-timeout", "60"]
    async with server_process([*FAKE, *paced]) as server:
        ws = await open_session(server.url)
        text = "This sentence takes a few seconds to speak at the pace of real time. " * 6
        await ws.send(json.dumps({"type": "text.append", "context_id": "c", "text": text}))
        await ws.send(json.dumps({"type": "context.end", "context_id": "c"}))
        while not isinstance(await ws.recv(), bytes):
            pass  # until its audio has started
        server.proc.send_signal(signal.SIGTERM)
        async with httpx.AsyncClient() as http:
            while (await http.get(f"{server.url}/ready", timeout=5)).status_code != 503:
                await asyncio.sleep(0.05)  # a worker drains: this session holds it open
        server.proc.send_signal(signal.SIGTERM)
        started = asyncio.get_running_loop().time()
        await server.wait(30)
        assert asyncio.get_running_loop().time() - started < 10, server.output()
        assert "exiting now" in server.output()


async def test_a_worker_that_dies_stops_the_server_with_an_error() -> None:
    async with server_process(FAKE) as server:
        first, second = worker_pids(server)
        os.kill(first, signal.SIGKILL)
        status = await server.wait(60)
        assert status == 1
        assert "worker-0 was killed by SIGKILL: stopping the others" in server.output()
        assert not alive(second)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not vllm_available(), reason="vllm and triton are not installed")
async def test_the_default_workers_speak_through_one_vllm_talker(tiny_checkpoint: Path) -> None:
    from vllm_support.cpu_env import apply_cpu_vllm_env

    apply_cpu_vllm_env()  # the talker host's engine processes inherit it
    options = {
        "max_num_seqs": 4,
        "max_model_len": 1024,
        "dtype": "float32",
        "enforce_eager": True,
        "engine_args": {"block_size": 32, "num_gpu_blocks_override": 4 * 1024 // 32 + 1},
    }
    args = [
        *("--model", str(tiny_checkpoint), "--engine", "higgs", "--talker", "vllm"),
        *("--device", "cpu", "--talker-options", json.dumps(options)),
    ]
    async with server_process(args, ready_timeout=600) as server:
        # The vLLM talker gets several workers without being asked.
        assert len(worker_pids(server)) == DEFAULT_TALKER_HOST_WORKERS
        assert "starting the vLLM talker for every worker" in server.output()
        sessions = await asyncio.gather(*(open_session(server.url) for _ in range(4)))
        try:
            results = await asyncio.gather(
                *(speak(ws, f"c{i}", "Hello there.") for i, ws in enumerate(sessions))
            )
        finally:
            await asyncio.gather(*(ws.close() for ws in sessions))
        assert [status for status, _ in results] == ["completed"] * 4, server.output()
        assert all(audio > 0 for _, audio in results)
        server.proc.send_signal(signal.SIGTERM)
        assert await server.wait(120) == 0, server.output()


@pytest.mark.parametrize(
    ("requested", "kind", "talker", "expected"),
    [
        (None, "higgs", "vllm", DEFAULT_TALKER_HOST_WORKERS),
        (1, "higgs", "vllm", 1),
        (4, "higgs", "vllm", 4),
        (None, "higgs", "reference", 1),
        (None, "cpu-voice", None, 1),
        (3, "cpu-voice", None, 3),
    ],
)
def test_the_vllm_talker_gets_several_workers_by_default_and_others_one(
    requested: int | None, kind: str, talker: str | None, expected: int
) -> None:
    options = None if talker is None else parse_talker_options(talker)  # type: ignore[arg-type]
    assert resolve_workers(requested, kind, options) == expected
    assert DEFAULT_TALKER_HOST_WORKERS > 1


def test_the_workers_flag_is_parsed_and_zero_is_refused() -> None:
    args = build_parser().parse_args(["serve", "--workers", "3"])
    assert settings_from_args(args).workers == 3
    assert build_parser().parse_args(["serve"]).workers is None
    assert main(["serve", "--workers", "0"]) == 2


async def test_a_talker_host_that_stops_by_itself_stops_every_worker() -> None:
    """Workers left without their engine would wait forever: the supervisor stops them."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    @dataclass
    class Worker:  # what the supervisor reads of a multiprocessing.Process
        pid: int
        name: str = "speech-gateway-worker-0"
        exitcode: int | None = None

    said: list[str] = []
    events, _ = multiprocessing.Pipe(duplex=False)
    supervisor = Supervisor([Worker(sleeper.pid)], events, said.append)

    async def host_that_fails() -> None:
        raise RuntimeError("socket gone")

    task = asyncio.create_task(host_that_fails())
    await asyncio.gather(task, return_exceptions=True)
    try:
        supervisor._host_ended(task)
        # a stand-in with no handler dies of the supervisor's stop signal
        assert await asyncio.to_thread(sleeper.wait, 30) == -SUPERVISOR_STOP_SIGNAL
        assert supervisor.failed and supervisor.stopping
        assert said == [
            "error: the talker host stopped: RuntimeError('socket gone'); stopping the workers"
        ]
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("shared", [True, False])
def test_each_worker_gets_its_socket_among_all_and_whether_the_engine_is_shared(
    tmp_path: Path, shared: bool
) -> None:
    settings = GatewaySettings(workers=3)
    mine = worker_settings(settings, 1, str(tmp_path), str(tmp_path / "voices"), shared)
    assert mine.worker_index == 1
    assert mine.worker_sockets == tuple(str(tmp_path / f"worker-{i}.sock") for i in range(3))
    assert mine.voice_dir == str(tmp_path / "voices")
    assert mine.workers_share_engine is shared
    assert mine.admission_file == str(tmp_path / "admission")  # the server's session counters
