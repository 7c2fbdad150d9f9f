"""``/metrics`` with several workers: two real apps on real uvicorn, each listening on
TCP and on its own private Unix socket, as ``serve --workers 2`` runs them. A
scrape reaching either answers for both; ``?scope=worker`` for one alone."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from gateway_support import fake_app, open_session
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import ASGIApp

from gateway import metrics_fanout
from gateway.metrics_merge import UNREACHABLE, WORKER_LABEL, WORKERS
from realtime_engine.engines.fake import FakeEngine


class _Server(uvicorn.Server):
    """A uvicorn server that says when it listens (an event, not a polled flag)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.listening.set()


@contextlib.asynccontextmanager
async def worker(app: ASGIApp, unix_path: str) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port) and on ``unix_path``; yield its TCP URL."""
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(64)
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(unix_path)
    unix.listen(64)
    config = uvicorn.Config(app, lifespan="on", log_level="warning", ws_per_message_deflate=False)
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[tcp, unix]))
    listening = asyncio.create_task(server.listening.wait())
    try:
        await asyncio.wait({task, listening}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        if not listening.done():
            if task.done():
                task.result()  # surfaces a startup failure
            raise RuntimeError("the test worker did not start")
        yield f"http://127.0.0.1:{tcp.getsockname()[1]}"
    finally:
        listening.cancel()
        server.should_exit = True
        await asyncio.wait_for(task, 10)


@contextlib.contextmanager
def socket_dir() -> Iterator[Path]:
    # Short: a Unix socket's path must fit in 108 bytes, which a pytest tmp_path may not.
    with tempfile.TemporaryDirectory(prefix="gw-metrics-") as folder:
        yield Path(folder)


def app_for(index: int, paths: tuple[str, ...]) -> ASGIApp:
    return fake_app(FakeEngine(), workers=len(paths), worker_index=index, worker_sockets=paths)


async def scrape(url: str, **params: str) -> dict[str, Metric]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        response = await client.get("/metrics", params=params)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(response.text)}


def by_worker(families: dict[str, Metric], family: str, sample: str) -> dict[str, float]:
    return {s.labels[WORKER_LABEL]: s.value for s in families[family].samples if s.name == sample}


def unlabelled(families: dict[str, Metric], family: str, sample: str) -> float:
    (value,) = [s.value for s in families[family].samples if s.name == sample]
    assert all(WORKER_LABEL not in s.labels for s in families[family].samples)
    return value


async def test_a_scrape_of_either_worker_answers_for_both() -> None:
    with socket_dir() as folder:
        paths = (str(folder / "w0.sock"), str(folder / "w1.sock"))
        async with (
            worker(app_for(0, paths), paths[0]) as first,
            worker(app_for(1, paths), paths[1]) as second,
        ):
            ws = await open_session(first)  # a session on worker 0
            try:
                merged = await scrape(second)
                sessions = by_worker(merged, "speech_sessions", "speech_sessions_total")
                assert sessions == {"0": 1, "1": 0}
                active = by_worker(merged, "speech_sessions_active", "speech_sessions_active")
                assert active == {"0": 1, "1": 0}
            finally:
                await ws.close()
            # A speech request on worker 1, seen from worker 0.
            async with httpx.AsyncClient(base_url=second, timeout=10) as client:
                response = await client.post(
                    "/v1/audio/speech",
                    json={"input": "Hello there.", "response_format": "pcm", "stream": False},
                )
            assert response.status_code == 200 and response.content
            merged = await scrape(first)
            sent = by_worker(merged, "speech_audio_seconds_out", "speech_audio_seconds_out_total")
            assert sent["0"] == 0 and sent["1"] > 0
            assert unlabelled(merged, WORKERS, WORKERS) == 2
            assert unlabelled(merged, UNREACHABLE, UNREACHABLE) == 0
            # The shared engine's families once, unlabelled.
            assert unlabelled(merged, "speech_engine_rows", "speech_engine_rows_total") == 0

            # scope=worker: that worker alone, unmerged, over TCP as over its socket.
            alone = await scrape(first, scope="worker")
            assert unlabelled(alone, "speech_sessions", "speech_sessions_total") == 1
            assert WORKERS not in alone and UNREACHABLE not in alone
            transport = httpx.AsyncHTTPTransport(uds=paths[1])
            async with httpx.AsyncClient(transport=transport, timeout=10) as client:
                answer = await client.get("http://worker/metrics", params={"scope": "worker"})
            alone = {f.name: f for f in text_string_to_metric_families(answer.text)}
            assert unlabelled(alone, "speech_sessions", "speech_sessions_total") == 0
            own_sent = "speech_audio_seconds_out_total"
            assert unlabelled(alone, "speech_audio_seconds_out", own_sent) == sent["1"]


async def test_a_stopped_worker_is_left_out_and_counted() -> None:
    with socket_dir() as folder:
        paths = (str(folder / "w0.sock"), str(folder / "w1.sock"))
        async with worker(app_for(0, paths), paths[0]) as first:
            async with worker(app_for(1, paths), paths[1]) as second:
                ws = await open_session(second)
                await ws.close()
                merged = await scrape(first)
                assert unlabelled(merged, UNREACHABLE, UNREACHABLE) == 0
            # Worker 1 has stopped; its socket file is left behind, refusing connections.
            assert Path(paths[1]).exists()
            merged = await scrape(first)
            assert unlabelled(merged, UNREACHABLE, UNREACHABLE) == 1
            assert unlabelled(merged, WORKERS, WORKERS) == 2
            assert by_worker(merged, "speech_sessions", "speech_sessions_total") == {"0": 0}


async def test_a_worker_that_never_answers_is_left_out_after_the_timeout(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(metrics_fanout, "PEER_TIMEOUT_S", 0.2)
    accepted, release = asyncio.Event(), asyncio.Event()
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # reads nothing, answers nothing, keeps the connection open
        accepted.set()
        await release.wait()

    with socket_dir() as folder:
        paths = (str(folder / "w0.sock"), str(folder / "w1.sock"), str(folder / "none.sock"))
        hung = await asyncio.start_unix_server(silent, path=paths[1])
        try:
            async with worker(app_for(0, paths), paths[0]) as first:
                merged = await asyncio.wait_for(scrape(first), 5)
                assert accepted.is_set()
                assert unlabelled(merged, UNREACHABLE, UNREACHABLE) == 2  # silent, and no socket
                assert unlabelled(merged, WORKERS, WORKERS) == 3
                assert set(by_worker(merged, "speech_sessions", "speech_sessions_total")) == {"0"}
            timed_out = [r.getMessage() for r in caplog.records if "TimeoutError" in r.getMessage()]
            assert len(timed_out) == 1 and paths[1] in timed_out[0]
        finally:
            release.set()
            for writer in held:
                writer.close()
            hung.close()
            await hung.wait_closed()


async def test_one_worker_answers_as_before() -> None:
    app = fake_app(FakeEngine())
    with socket_dir() as folder:
        async with worker(app, str(folder / "only.sock")) as url:
            plain = await scrape(url)
            alone = await scrape(url, scope="worker")
    assert WORKERS not in plain and UNREACHABLE not in plain
    assert plain.keys() == alone.keys()
    assert all(WORKER_LABEL not in s.labels for f in plain.values() for s in f.samples)
