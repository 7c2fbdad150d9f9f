"""One vLLM engine for several gateway worker processes (``serve --workers N``).

The process that owns the ``AsyncLLM`` runs a :class:`TalkerHost`: a ZMQ
ROUTER on a private ``ipc://`` endpoint. Each worker's runner reaches it
through a :class:`RemoteEngineLink` (a DEALER), the
:class:`~realtime_engine.talker.vllm_link.EngineLink` of a runner whose
engine lives elsewhere. Only requests travel here, one small JSON message
each way per request: the audio never does. The engine core pushes each
request's PCM straight to the endpoint of the worker that asked for it (its
``TalkerArgs.endpoint``), so the host's event loop does no per-chunk work.

Messages (JSON objects):

- worker → host: ``run`` (an :class:`EngineRequest`), ``abort``, ``profile``;
- host → worker: ``finished`` (tokens vLLM counted), ``failed`` (why),
  ``profiled`` (the answer to ``profile``), ``dead`` (the engine died: every
  request of that worker fails, and its ``failure()`` says why from then on).

Request ids are the workers' own: the host prefixes each with the worker's
socket identity, so two workers may use the same id.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable, Coroutine
from typing import Any

import zmq
import zmq.asyncio

from realtime_engine.talker.types import TalkerError
from realtime_engine.talker.vllm_link import EngineLink, EngineRequest

logger = logging.getLogger(__name__)

# How often the host asks its engine whether it is alive.
HEALTH_INTERVAL_S = 0.5


def _encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def _decode(raw: bytes) -> dict[str, Any]:
    message = json.loads(raw)
    if not isinstance(message, dict):
        raise ValueError("a message must be a JSON object")
    return message


class TalkerHost:
    """Serves an :class:`EngineLink` (the ``AsyncLLM`` of this process) to worker processes."""

    def __init__(self, link: EngineLink, endpoint: str) -> None:
        self._link = link
        self.endpoint = endpoint
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        # A ROUTER drops what it cannot queue for a peer. A worker busy for a while
        # with thousands of requests finishing must still get every answer: the
        # messages are small, so the queue has no limit (a worker that left is
        # dropped by ZMQ with its queue).
        self._socket.setsockopt(zmq.SNDHWM, 0)
        self._socket.bind(endpoint)
        self._running: dict[str, asyncio.Task[None]] = {}
        self._workers: set[bytes] = set()
        self._chores: set[asyncio.Task[None]] = set()
        self._dead: str | None = None
        self.requests = 0  # served in all (tests, logs)

    async def serve(self) -> None:
        """Answer workers until cancelled."""
        health = asyncio.create_task(self._watch_health())
        try:
            while True:
                frames = await self._socket.recv_multipart()
                if len(frames) != 2:  # [identity, message] is all a DEALER sends
                    logger.error("talker host: a message of %d frames dropped", len(frames))
                    continue
                identity, raw = frames
                self._workers.add(identity)
                try:
                    message = _decode(raw)
                    self._handle(identity, message)
                except (ValueError, KeyError, TypeError) as e:
                    logger.error("talker host: a malformed message from a worker: %s", e)
        finally:
            health.cancel()
            for task in list(self._running.values()):
                task.cancel()
            await asyncio.gather(health, *self._running.values(), return_exceptions=True)

    def _handle(self, identity: bytes, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "run":
            request = EngineRequest.from_wire(message)
            key = self._key(identity, request.request_id)
            if self._dead is not None:
                self._send(
                    identity, {"op": "failed", "id": request.request_id, "reason": self._dead}
                )
                return
            self.requests += 1
            routed = EngineRequest(
                key,
                request.prompt_ids,
                request.max_tokens,
                request.stop_token_ids,
                request.extra_args,
            )
            self._running[key] = asyncio.create_task(
                self._run(identity, request.request_id, routed)
            )
        elif op == "abort":
            key = self._key(identity, str(message["id"]))
            self._spawn(self._abort(key))
        elif op == "profile":
            self._spawn(self._profile(identity, message.get("seq"), bool(message["start"])))
        else:
            raise ValueError(f"unknown op {op!r}")

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` beside the receive loop (kept referenced until it ends)."""
        task = asyncio.create_task(work)
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    @staticmethod
    def _key(identity: bytes, request_id: str) -> str:
        return f"{identity.hex()}/{request_id}"

    async def _run(self, identity: bytes, request_id: str, request: EngineRequest) -> None:
        try:
            tokens = await self._link.run(request)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._send(identity, {"op": "failed", "id": request_id, "reason": str(e) or repr(e)})
        else:
            self._send(identity, {"op": "finished", "id": request_id, "tokens": tokens})
        finally:
            self._running.pop(request.request_id, None)

    async def _abort(self, key: str) -> None:
        task = self._running.pop(key, None)
        if task is None:
            return  # finished already (the answer is on its way) or never started
        try:
            await self._link.abort(key)
        finally:
            task.cancel()

    async def _profile(self, identity: bytes, seq: Any, start: bool) -> None:
        error = None
        try:
            await (self._link.start_profile() if start else self._link.stop_profile())
        except Exception as e:
            error = str(e) or repr(e)
        self._send(identity, {"op": "profiled", "seq": seq, "error": error})

    async def _watch_health(self) -> None:
        while self._dead is None:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            self._dead = self._link.failure()
        logger.error("talker host: %s", self._dead)
        for identity in self._workers:
            self._send(identity, {"op": "dead", "reason": self._dead})

    def _send(self, identity: bytes, message: dict[str, Any]) -> None:
        with contextlib.suppress(zmq.ZMQError):  # a worker that left
            self._socket.send_multipart([identity, _encode(message)], flags=zmq.NOBLOCK)

    def close(self) -> None:
        self._socket.close(linger=0)
        self._context.term()


class RemoteEngineLink:
    """:class:`EngineLink` to a :class:`TalkerHost` in another process."""

    def __init__(
        self,
        endpoint: str,
        *,
        identity: str | None = None,
        host_alive: Callable[[], bool] | None = None,
    ) -> None:
        """``host_alive``: whether the host's process still runs (the parent
        process, for a worker); the host cannot say so itself once it is gone."""
        self.endpoint = endpoint
        self._identity = (identity or f"worker-{os.getpid()}").encode()
        self._host_alive = host_alive
        self._context: zmq.asyncio.Context | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[str, asyncio.Future[int]] = {}
        self._profiles: dict[int, asyncio.Future[None]] = {}
        self._seq = 0
        self._dead: str | None = None

    def _connected(self) -> zmq.asyncio.Socket:
        """The socket, opened on first use (within the caller's event loop)."""
        if self._socket is None:
            self._context = zmq.asyncio.Context()
            sock = self._context.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, self._identity)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 0)  # every answer is kept until read
            sock.connect(self.endpoint)  # the host may bind later: ZMQ reconnects
            self._socket = sock
            self._reader = asyncio.create_task(self._read())
        return self._socket

    async def _read(self) -> None:
        assert self._socket is not None
        while True:
            raw = await self._socket.recv()
            try:
                self._on_message(_decode(raw))
            except (ValueError, KeyError, TypeError) as e:
                logger.error("a malformed message from the talker host: %s", e)

    def _on_message(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "finished":
            self._settle(str(message["id"]), result=int(message["tokens"]))
        elif op == "failed":
            self._settle(str(message["id"]), error=TalkerError(str(message["reason"])))
        elif op == "profiled":
            future = self._profiles.pop(int(message["seq"]), None)
            if future is not None and not future.done():
                if message.get("error"):
                    future.set_exception(TalkerError(str(message["error"])))
                else:
                    future.set_result(None)
        elif op == "dead":
            self._die(str(message["reason"]))
        else:
            raise ValueError(f"unknown op {op!r}")

    def _settle(self, request_id: str, *, result: int = 0, error: Exception | None = None) -> None:
        future = self._pending.pop(request_id, None)
        if future is None or future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def _die(self, reason: str) -> None:
        self._dead = reason
        for request_id in list(self._pending):
            self._settle(request_id, error=TalkerError(reason))
        for future in self._profiles.values():
            if not future.done():
                future.set_exception(TalkerError(reason))
        self._profiles.clear()

    async def run(self, request: EngineRequest) -> int:
        if (reason := self.failure()) is not None:
            raise TalkerError(reason)
        if request.request_id in self._pending:
            raise TalkerError(f"request {request.request_id!r} is already running")
        sock = self._connected()
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending[request.request_id] = future
        await sock.send(_encode({"op": "run", **request.to_wire()}))
        try:
            return await future
        except asyncio.CancelledError:
            # The caller gave up on it: so does the engine.
            if self._pending.pop(request.request_id, None) is not None:
                await self._send_abort(request.request_id)
            raise

    async def abort(self, request_id: str) -> None:
        future = self._pending.pop(request_id, None)
        if future is None:
            return
        await self._send_abort(request_id)
        if not future.done():
            future.cancel()

    async def _send_abort(self, request_id: str) -> None:
        if self._socket is not None:
            await self._socket.send(_encode({"op": "abort", "id": request_id}))

    async def _profile(self, start: bool) -> None:
        if (reason := self.failure()) is not None:
            raise TalkerError(reason)
        sock = self._connected()
        self._seq += 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._profiles[self._seq] = future
        await sock.send(_encode({"op": "profile", "seq": self._seq, "start": start}))
        await future

    async def start_profile(self) -> None:
        await self._profile(True)

    async def stop_profile(self) -> None:
        await self._profile(False)

    def failure(self) -> str | None:
        if self._dead is None and self._host_alive is not None and not self._host_alive():
            self._die("the talker host process exited")
        return self._dead

    def shutdown(self) -> None:
        """Close the link (the engine itself belongs to the host)."""
        if self._reader is not None:
            self._reader.cancel()
        for request_id in list(self._pending):
            self._settle(request_id, error=TalkerError("the talker link is closed"))
        if self._socket is not None:
            self._socket.close(linger=0)
        if self._context is not None:
            self._context.term()
        self._socket = self._context = None
