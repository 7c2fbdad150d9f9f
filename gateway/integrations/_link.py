"""One gateway connection shared by a framework plug-in: opened lazily, reopened after a drop.

Both plug-ins hold one :class:`GatewayLink`. Every utterance asks it for the
connection; a connection that has closed (the server restarted, the network
dropped) is replaced by a new one there and then, so the next utterance after
a drop reconnects by itself. A refusal that carries the server's retry hint
(``retry_after_ms``: warming up, draining, at its session limit) is retried
after that hint, a bounded number of times.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import get_args

from gateway.client import (
    Connection,
    EngineOverloadedError,
    RateLimitError,
    ServerError,
    connect,
)
from gateway.protocol import NATIVE_SAMPLE_RATE, SampleRate

TokenProvider = Callable[[], Awaitable[str]]
SAMPLE_RATES: tuple[int, ...] = get_args(SampleRate)
PCM_FORMAT = "pcm16"  # what both frameworks carry: 16-bit little-endian mono
DEFAULT_RETRY_AFTER_S = 1.0  # a retryable refusal that names no wait


@dataclass(frozen=True)
class GatewayOptions:
    """Where the gateway is and what every utterance asks of it.

    ``token`` is an ephemeral token (``POST /v1/tokens``) or an async callable
    that mints one; the callable is called for every new connection, since a
    token expires but a reconnect must still get in.
    """

    url: str
    api_key: str | None = None
    token: str | TokenProvider | None = None
    voice: str = "default"
    sample_rate: int = NATIVE_SAMPLE_RATE
    model: str | None = None
    connect_attempts: int = 3  # refusals with a retry hint tried this many times in all
    max_retry_after_s: float = 10.0  # a longer hint is not waited for: the refusal is raised

    def __post_init__(self) -> None:
        if self.sample_rate not in SAMPLE_RATES:
            raise ValueError(
                f"the gateway sends {', '.join(map(str, SAMPLE_RATES))} Hz, not {self.sample_rate}"
            )
        if self.connect_attempts < 1:
            raise ValueError("connect_attempts must be at least 1")


def retry_after_s(error: ServerError) -> float | None:
    """The wait a refusal asks for, or None when retrying would not help."""
    if not error.retryable or not isinstance(error, RateLimitError | EngineOverloadedError):
        return None
    hint = error.detail.retry_after_ms
    return DEFAULT_RETRY_AFTER_S if hint is None else hint / 1000.0


class GatewayLink:
    """The plug-in's connection to the gateway (one WebSocket, many contexts)."""

    def __init__(
        self,
        options: GatewayOptions,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,  # tests: a fake clock
    ) -> None:
        self.options = options
        self._sleep = sleep
        self._connection: Connection | None = None
        self._lock = asyncio.Lock()
        self.connects = 0  # connections opened so far (the first one included)
        self._connected = asyncio.Event()

    @property
    def current(self) -> Connection | None:
        """The open connection, if there is one (never opens one)."""
        conn = self._connection
        return conn if conn is not None and not conn.closed else None

    async def connection(self) -> Connection:
        """The open connection; a new one if there is none or it has closed."""
        async with self._lock:
            if self.current is None:
                self._connected.clear()
                self._connection = await self._open()
                self.connects += 1
                self._connected.set()
            assert self._connection is not None
            return self._connection

    async def discard(self, conn: object) -> None:
        """``conn`` failed a send: drop it now, before its reader notices the close,
        so the next :meth:`connection` opens a new one."""
        async with self._lock:
            dropped = self._connection if self._connection is conn else None
            if dropped is not None:
                self._connection = None
        if dropped is not None:
            await dropped.close()

    async def wait_connected(self) -> Connection:
        """Wait until a connection is open (opened by someone else) and return it."""
        while True:
            conn = self.current
            if conn is not None:
                return conn
            self._connected.clear()
            await self._connected.wait()

    async def _open(self) -> Connection:
        options = self.options
        for attempt in range(1, options.connect_attempts + 1):
            token = options.token
            if callable(token):
                token = await token()
            try:
                conn = await connect(
                    options.url, api_key=options.api_key, token=token, model=options.model
                )
            except ServerError as e:
                wait = retry_after_s(e)
                if (
                    wait is None
                    or attempt == options.connect_attempts
                    or wait > options.max_retry_after_s
                ):
                    raise
                await self._sleep(wait)  # the server said when to come back
                continue
            try:
                await conn.session.update(
                    voice=options.voice,
                    output={"format": PCM_FORMAT, "sample_rate": options.sample_rate},
                )
            except BaseException:
                await conn.close()
                raise
            return conn
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def aclose(self) -> None:
        async with self._lock:
            conn, self._connection = self._connection, None
        if conn is not None:
            await conn.close()
