"""Opening a connection: the endpoint URL and ``connect``."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import websockets
from pydantic import ValidationError
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI
from websockets.typing import Subprotocol

from gateway.client.connection import Connection
from gateway.client.errors import (
    ConnectionClosedError,
    HandshakeError,
    ProtocolViolationError,
    closed_error,
    error_from_detail,
)
from gateway.protocol import SUBPROTOCOL, ErrorEvent, SessionCreated, parse_server_event


def realtime_url(url: str, model: str | None = None, token: str | None = None) -> str:
    """``http(s)://`` or ``ws(s)://`` base URL -> the realtime endpoint URL."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise ValueError(f"unsupported URL scheme {parts.scheme!r} in {url!r}")
    path = parts.path if parts.path not in ("", "/") else "/v1/realtime"
    query = [q for q in parts.query.split("&") if q]
    extra = {k: v for k, v in (("model", model), ("token", token)) if v}
    if extra:
        query.append(urlencode(extra))
    return urlunsplit((scheme, parts.netloc, path, "&".join(query), ""))


class connect:  # lower case: used like a function, `async with connect(url) as conn`
    """Open a realtime connection: ``async with connect(url, api_key=...) as conn``
    (or ``conn = await connect(url)`` and ``await conn.close()``)."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        token: str | None = None,
        model: str | None = None,
        open_timeout: float = 10.0,
        request_timeout: float = 30.0,
        max_message_bytes: int | None = 16 * 1024 * 1024,
    ) -> None:
        self._url = realtime_url(url, model=model, token=token)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._open_timeout = open_timeout
        self._request_timeout = request_timeout
        self._max_size = max_message_bytes
        self._connection: Connection | None = None

    async def _open(self) -> Connection:
        try:
            ws = await websockets.connect(
                self._url,
                additional_headers=self._headers,
                subprotocols=[Subprotocol(SUBPROTOCOL)],
                open_timeout=self._open_timeout,
                max_size=self._max_size,
                compression=None,  # audio does not compress; deflate only costs CPU
            )
        except InvalidStatus as e:
            body = e.response.body.decode("utf-8", "replace")[:200] if e.response.body else ""
            raise HandshakeError(e.response.status_code, body) from e
        except InvalidURI as e:
            raise ValueError(str(e)) from e
        except (OSError, TimeoutError) as e:
            raise ConnectionClosedError(None, f"cannot connect to {self._url}: {e}") from e
        try:
            first = await asyncio.wait_for(ws.recv(), self._open_timeout)
            event = parse_server_event(first)
        except ConnectionClosed as e:
            raise closed_error(
                e.rcvd.code if e.rcvd else None, e.rcvd.reason if e.rcvd else ""
            ) from e
        except (ValidationError, ValueError) as e:
            await ws.close()
            raise ProtocolViolationError(f"first message is not session.created: {e}") from e
        except TimeoutError as e:
            await ws.close()
            raise ConnectionClosedError(None, "no session.created in time") from e
        if isinstance(event, ErrorEvent):
            await ws.close()
            raise error_from_detail(event.error)
        if not isinstance(event, SessionCreated):
            await ws.close()
            raise ProtocolViolationError(f"expected session.created, got {event.type}")
        return Connection(ws, event, self._request_timeout)

    def __await__(self) -> Generator[Any, None, Connection]:
        return self._open().__await__()

    async def __aenter__(self) -> Connection:
        self._connection = await self._open()
        return self._connection

    async def __aexit__(self, *exc: object) -> None:
        if self._connection is not None:
            await self._connection.close()
