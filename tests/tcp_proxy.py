"""A minimal round-robin TCP load balancer, like HAProxy in ``mode tcp``.

Each accepted connection goes to the next backend in turn and stays there
(a WebSocket is therefore sticky to one replica); bytes are copied both ways
until either side closes. ``picks`` records the backend of every connection
so a test can tell which replica served what.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Sequence


class RoundRobinProxy:
    def __init__(self, backends: Sequence[tuple[str, int]]) -> None:
        self._backends = list(backends)
        self._next = itertools.cycle(range(len(self._backends)))
        self.picks: list[int] = []  # backend index of each accepted connection
        self._pipes: set[asyncio.Task[None]] = set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = next(self._next)
        self.picks.append(index)
        host, port = self._backends[index]
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        pipes = [
            asyncio.create_task(_pipe(reader, up_writer)),
            asyncio.create_task(_pipe(up_reader, writer)),
        ]
        self._pipes.update(pipes)
        try:
            await asyncio.gather(*pipes)
        finally:
            self._pipes.difference_update(pipes)
            writer.close()
            up_writer.close()

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        """Listen on a free loopback port; yield ``http://127.0.0.1:PORT``."""
        server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.close()
            for pipe in list(self._pipes):
                pipe.cancel()
            await asyncio.gather(*self._pipes, return_exceptions=True)
            await server.wait_closed()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, then half-close, as a TCP proxy does."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()  # one side reset: the whole connection is over
