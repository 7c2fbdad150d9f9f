"""Waiting for an engine stream's next chunk, with a stall limit.

This runs once per audio chunk of every stream, so it waits in the caller's
own task with one timer handle, rather than wrapping each ``anext`` in a task
plus ``asyncio.wait`` (a task creation, a waiter future and an extra loop
turn per chunk).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np

from realtime_engine.engines.base import EngineError

log = logging.getLogger("gateway.realtime.engine_wait")


class EngineStalledError(EngineError):
    """The engine produced nothing within the stall limit; the request was aborted."""


async def next_chunk_or_stall(
    stream: AsyncIterator[np.ndarray],
    timeout_s: float,
    abort: Callable[[], Awaitable[None]],
) -> np.ndarray:
    """The stream's next chunk; ``EngineStalledError`` if none comes within ``timeout_s``.

    A stalled request is aborted first and only then abandoned (its pending
    ``anext`` cancelled), so the engine hears about it the way it hears about
    a cancel. ``StopAsyncIteration`` passes through when the stream ends in time.
    """
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("next_chunk_or_stall must run inside a task")
    loop = asyncio.get_running_loop()
    waiting = True
    interrupted = False
    aborting: asyncio.Task[None] | None = None

    async def abort_then_interrupt() -> None:
        nonlocal interrupted
        try:
            await abort()
        finally:
            # Even when the abort fails: the wait must end either way.
            if waiting:
                interrupted = True
                task.cancel()

    def on_stall() -> None:
        nonlocal aborting
        aborting = loop.create_task(abort_then_interrupt())
        aborting.add_done_callback(_log_abort_failure)

    handle = loop.call_later(timeout_s, on_stall)
    try:
        chunk = await anext(stream)
    except asyncio.CancelledError:
        # Ours only if the stall fired and nobody else cancelled this task too.
        if interrupted and task.uncancel() == 0:
            raise _stalled(timeout_s) from _abort_error(aborting)
        raise
    except StopAsyncIteration:
        if aborting is None:
            raise
        waiting = False
        await aborting  # the end came while the stall's abort was in flight
        raise _stalled(timeout_s) from None
    finally:
        waiting = False
        handle.cancel()
    if aborting is not None:
        # The chunk came while the stall's abort was in flight: the request is
        # aborted all the same, so the context fails as a stall.
        await aborting
        raise _stalled(timeout_s)
    return chunk


def _abort_error(aborting: asyncio.Task[None] | None) -> BaseException | None:
    if aborting is None or not aborting.done() or aborting.cancelled():
        return None
    return aborting.exception()


def _log_abort_failure(aborting: asyncio.Task[None]) -> None:
    """Report an abort that failed where no waiter is left to raise it."""
    if (error := _abort_error(aborting)) is not None:
        log.warning("aborting a stalled engine request failed", exc_info=error)


def _stalled(timeout_s: float) -> EngineStalledError:
    return EngineStalledError(f"no audio from the engine for {timeout_s:g} s; request aborted")
