"""The encode pool: the listener closest to running dry is served first."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.encode_pool import DeadlineQueue, EncodePool, PoolShutDownError


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), max_size=50))
def test_the_queue_gives_deadline_order_with_ties_in_arrival_order(deadlines: list[float]) -> None:
    queue: DeadlineQueue[tuple[float, int]] = DeadlineQueue()
    for i, d in enumerate(deadlines):
        queue.push(d, (d, i))
    out = [queue.pop() for _ in range(len(queue))]
    assert out == sorted(out)  # by deadline, then by arrival
    assert len(queue) == 0
    with pytest.raises(IndexError):
        queue.pop()


def _blocked_pool() -> tuple[EncodePool, threading.Event, threading.Event]:
    """A one-thread pool whose thread is held inside a job until ``release`` is set."""
    pool = EncodePool(threads=1)
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        assert release.wait(10)

    pool.submit(0.0, hold)
    assert entered.wait(10)
    return pool, entered, release


def test_queued_jobs_run_most_urgent_first() -> None:
    pool, _, release = _blocked_pool()
    ran: list[str] = []
    # a burst of streams far ahead of their listeners, then a new stream
    # whose listener holds 120 ms
    futures = [pool.submit(10.0 + i, ran.append, f"ahead-{i}") for i in range(5)]
    futures.append(pool.submit(0.12, ran.append, "opening"))
    release.set()
    for f in futures:
        f.result(timeout=10)
    assert ran == ["opening"] + [f"ahead-{i}" for i in range(5)]
    pool.shutdown()


def test_a_job_failure_reaches_its_waiter_and_the_pool_goes_on() -> None:
    pool = EncodePool(threads=2)

    def broken() -> None:
        raise ValueError("bad frame")

    with pytest.raises(ValueError, match="bad frame"):
        pool.submit(0.0, broken).result(timeout=10)
    assert pool.submit(0.0, sum, [1, 2]).result(timeout=10) == 3
    pool.shutdown()


def test_threads_start_on_demand_up_to_the_limit() -> None:
    pool = EncodePool(threads=3)
    assert pool.threads == 0
    assert pool.submit(0.0, int, "7").result(timeout=10) == 7
    assert pool.threads == 1  # the idle thread takes the next job
    pool.submit(0.0, int, "8").result(timeout=10)
    assert pool.threads <= 3
    pool.shutdown()


def test_shutdown_cancels_queued_jobs_and_refuses_new_ones() -> None:
    pool, _, release = _blocked_pool()
    queued = pool.submit(1.0, int, "1")
    pool.shutdown(cancel_futures=True)
    release.set()
    with pytest.raises(CancelledError):
        queued.result(timeout=10)
    with pytest.raises(PoolShutDownError):
        pool.submit(0.0, int, "2")


def test_shutdown_without_cancelling_still_runs_queued_jobs() -> None:
    pool, _, release = _blocked_pool()
    queued = pool.submit(1.0, int, "5")
    pool.shutdown(cancel_futures=False)
    release.set()
    assert queued.result(timeout=10) == 5


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError):
        EncodePool(threads=0)
