"""Transport of code rows from engine workers to the serving process over ZMQ.

Workers PUSH (never blocking the engine: a high-water mark and ``NOBLOCK``
sends; a message that cannot be queued is dropped and counted, and the
receiver notices the gap through the row indices). The serving process binds
one PULL socket and hands rows to per-request queues.

With data parallelism every engine core pushes to that same socket: ZMQ
fair-queues many PUSH peers into one PULL, keeping each peer's messages in
order, and a request is served by one engine core only, so each request's
messages still arrive in order. Audio carries the sending core's rank
(:func:`set_process_rank`) for per-rank metrics.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import uuid
from collections.abc import Callable, Sequence

import numpy as np
import zmq

from realtime_engine.talker.vllm_protocol import (
    Event,
    PcmHeader,
    RowHeader,
    StepStats,
    decode_message,
    encode_failure,
    encode_pcm,
    encode_rows,
    encode_stats,
)

logger = logging.getLogger(__name__)

SEND_HWM = 1 << 20

# The data-parallel rank of the engine core this process runs (None: not an
# engine core, or not known). One engine core per process, so one rank.
_process_rank: int | None = None


def set_process_rank(rank: int | None) -> None:
    """Record this engine core's data-parallel rank; pushers made after it send it."""
    global _process_rank
    _process_rank = rank


def new_ipc_endpoint() -> str:
    return f"ipc://{os.path.join(tempfile.gettempdir(), f'higgs-rows-{uuid.uuid4().hex[:12]}')}"


class RowPusher:
    """Worker side: one PUSH socket per destination endpoint, opened on first use."""

    def __init__(self, rank: int | None = None) -> None:
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sockets: dict[str, zmq.Socket[bytes]] = {}
        self.dropped_messages = 0
        # Stamped on the audio this pusher sends; by default the process's rank.
        self.rank = rank if rank is not None else _process_rank

    def _socket(self, endpoint: str) -> zmq.Socket[bytes]:
        sock = self._sockets.get(endpoint)
        if sock is None:
            if self._ctx is None:
                self._ctx = zmq.Context()
            sock = self._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, SEND_HWM)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            self._sockets[endpoint] = sock
        return sock

    def push(self, endpoint: str, headers: Sequence[RowHeader], rows: np.ndarray) -> None:
        self._send(endpoint, encode_rows(headers, rows))

    def push_pcm(
        self, endpoint: str, headers: Sequence[PcmHeader], chunks: Sequence[np.ndarray]
    ) -> None:
        self._send(endpoint, encode_pcm(headers, chunks, self.rank))

    def push_stats(self, endpoint: str, stats: StepStats) -> None:
        self._send(endpoint, encode_stats(stats, self.rank))

    def push_failure(self, endpoint: str, correlation_id: str, reason: str) -> None:
        self._send(endpoint, encode_failure(correlation_id, reason))

    def _send(self, endpoint: str, frames: list[bytes]) -> None:
        try:
            self._socket(endpoint).send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            # Never stall the engine for a slow or vanished consumer; it sees the gap.
            self.dropped_messages += 1
            logger.warning("row message to %s dropped (queue full)", endpoint)

    def close(self) -> None:
        for sock in self._sockets.values():
            sock.close(linger=0)
        self._sockets.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None


class RowReceiver:
    """Serving side: a thread that receives rows and calls ``deliver`` for each event.

    ``deliver(event)`` runs on the receiver thread; callers hop to their
    event loop themselves (``loop.call_soon_threadsafe``).
    """

    def __init__(
        self,
        deliver: Callable[[Event], None],
        endpoint: str | None = None,
    ) -> None:
        self.endpoint = endpoint or new_ipc_endpoint()
        self._deliver = deliver
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pull.bind(self.endpoint)
        self._stop = self._ctx.socket(zmq.PAIR)
        self._stop_endpoint = f"inproc://stop-{uuid.uuid4().hex}"
        self._stop.bind(self._stop_endpoint)
        # Created here, used only by the thread from now on.
        self._stop_peer = self._ctx.socket(zmq.PAIR)
        self._stop_peer.connect(self._stop_endpoint)
        self._thread = threading.Thread(target=self._run, name="talker-rows", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        stop = self._stop_peer
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        poller.register(stop, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll())
                if stop in events:
                    return
                if self._pull in events:
                    for event in decode_message(self._pull.recv_multipart()):
                        self._deliver(event)
        except Exception:
            logger.exception("row receiver stopped")
            raise
        finally:
            stop.close(linger=0)

    def close(self) -> None:
        if self._thread.is_alive():
            self._stop.send(b"stop")
            self._thread.join(timeout=5)
        self._stop.close(linger=0)
        self._pull.close(linger=0)
        self._ctx.term()
        if self.endpoint.startswith("ipc://"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.endpoint[len("ipc://") :])
