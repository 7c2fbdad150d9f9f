"""The shared pool that encodes every session's long chunks, most urgent first.

A chunk's deadline is the moment its listener runs out of audio: when the
context's first packet was sent plus the audio queued for it so far. FIFO
order let a new stream's second chunk (its listener holds 120 ms) wait
behind a burst of other streams' one-second chunks whose listeners hold
seconds; at 128 streams that wait was 250 ms and most streams heard a gap
at 0.12 s. Earliest deadline first serves the new stream next.

:class:`DeadlineQueue` is the ordering alone (no threads, no clock);
:class:`EncodePool` runs it on a few threads (libopus releases the GIL, so a
few threads use a few cores; more only fight over the GIL).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(order=True)
class _Entry(Generic[T]):
    deadline: float
    seq: int  # equal deadlines: first come, first served
    item: T = field(compare=False)


class DeadlineQueue(Generic[T]):
    """Items out in deadline order, ties in arrival order."""

    def __init__(self) -> None:
        self._heap: list[_Entry[T]] = []
        self._seq = itertools.count()

    def push(self, deadline: float, item: T) -> None:
        heapq.heappush(self._heap, _Entry(deadline, next(self._seq), item))

    def pop(self) -> T:
        """The most urgent item; ``IndexError`` when empty."""
        return heapq.heappop(self._heap).item

    def drain(self) -> list[T]:
        """Every item, most urgent first, leaving the queue empty."""
        return [heapq.heappop(self._heap).item for _ in range(len(self._heap))]

    def __len__(self) -> int:
        return len(self._heap)


@dataclass
class _Job:
    future: Future[Any]
    fn: Callable[..., Any]
    args: tuple[Any, ...]


class PoolShutDownError(RuntimeError):
    """A job was submitted after :meth:`EncodePool.shutdown`."""


class EncodePool:
    """``threads`` workers taking jobs most urgent first (threads start on first use)."""

    def __init__(self, threads: int, name: str = "encode") -> None:
        if threads < 1:
            raise ValueError("an encode pool needs at least one thread")
        self._max_threads = threads
        self._name = name
        self._queue: DeadlineQueue[_Job] = DeadlineQueue()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._closed = False

    def submit(self, deadline: float, fn: Callable[..., T], /, *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on a worker; jobs with earlier ``deadline`` go first."""
        future: Future[T] = Future()
        with self._cond:
            if self._closed:
                raise PoolShutDownError("the encode pool is shut down")
            self._queue.push(deadline, _Job(future, fn, args))
            if self._idle == 0 and len(self._threads) < self._max_threads:
                self._start_thread()
            self._cond.notify()
        return future

    def shutdown(self, cancel_futures: bool = True) -> None:
        """Stop taking jobs; queued ones are cancelled (or still run when not
        ``cancel_futures``). Never waits for a running job."""
        with self._cond:
            self._closed = True
            if cancel_futures:
                for job in self._queue.drain():
                    job.future.cancel()
            self._cond.notify_all()

    @property
    def threads(self) -> int:
        return len(self._threads)

    def _start_thread(self) -> None:
        thread = threading.Thread(
            target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                if not self._queue:
                    return  # closed and empty
                job = self._queue.pop()
            if not job.future.set_running_or_notify_cancel():
                continue
            try:
                result = job.fn(*job.args)
            except BaseException as e:  # the waiting context fails with it
                job.future.set_exception(e)
            else:
                job.future.set_result(result)
