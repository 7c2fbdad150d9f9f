"""A recording WebSocket client for tests: every event and frame, with arrival times."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

Item = dict[str, Any] | bytes


class Client:
    """One session: every event and frame it receives, in order, with arrival times."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[tuple[float, dict[str, Any] | bytes]] = []
        self.closed = False
        self.changed = asyncio.Event()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for message in self.ws:
                item = message if isinstance(message, bytes) else json.loads(message)
                self.events.append((time.perf_counter(), item))
                self.changed.set()
        self.closed = True
        self.changed.set()

    async def send(self, **event: Any) -> None:
        await self.ws.send(json.dumps(event))

    async def wait_for(self, predicate: Callable[[Item], bool], timeout: float = 10) -> Any:
        async with asyncio.timeout(timeout):
            while True:
                for _, item in self.events:
                    if predicate(item):
                        return item
                if self.closed:
                    raise AssertionError(f"closed before a match: {self.events[-5:]}")
                self.changed.clear()
                await self.changed.wait()

    async def closed_with(self, timeout: float = 15) -> int:
        await asyncio.wait_for(self.task, timeout)
        assert self.ws.close_code is not None
        return self.ws.close_code


def is_event(type_: str, **match: Any) -> Callable[[Item], bool]:
    return lambda item: (
        isinstance(item, dict)
        and item["type"] == type_
        and all(item.get(k) == v or item.get("error", {}).get(k) == v for k, v in match.items())
    )


async def open_client(ws_url: str) -> Client:
    client = Client(await connect(ws_url))
    await client.wait_for(is_event("session.created"))
    return client
