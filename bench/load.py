"""Load generation: closed-loop workers or open-loop Poisson arrivals.

Both run for ``warmup_s + duration_s``: streams are started during that whole
time, never after it; in-flight streams are then drained. The measurement
window is ``[begin + warmup_s, begin + warmup_s + duration_s)``; warm-up and
drain fall outside it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bench.records import StreamRecord

# (stream id, text) -> the finished record; must not raise (errors go in the record)
StreamFn = Callable[[int, str], Awaitable[StreamRecord]]
OnDone = Callable[[StreamRecord], None]


@dataclass
class LoadResult:
    mode: str  # "closed" or "open"
    level: float  # concurrency (closed) or arrival rate per second (open)
    t_begin: float
    t_window_start: float
    t_window_end: float
    t_end: float = 0.0
    records: list[StreamRecord] = field(default_factory=list)

    @property
    def window_s(self) -> float:
        return self.t_window_end - self.t_window_start

    def in_window(self) -> list[StreamRecord]:
        """Streams that started inside the measurement window."""
        return [r for r in self.records if self.t_window_start <= r.t_start < self.t_window_end]


def poisson_arrivals(rate_per_s: float, horizon_s: float, rng: random.Random) -> list[float]:
    """Start offsets in ``[0, horizon_s)`` of a Poisson process of ``rate_per_s``."""
    if rate_per_s <= 0:
        raise ValueError(f"arrival rate must be > 0, got {rate_per_s}")
    times: list[float] = []
    t = rng.expovariate(rate_per_s)
    while t < horizon_s:
        times.append(t)
        t += rng.expovariate(rate_per_s)
    return times


def _texts(seed: int, pool: tuple[str, ...]) -> Callable[[int], str]:
    rng = random.Random(seed)
    order = list(pool)
    rng.shuffle(order)
    return lambda i: order[i % len(order)]


async def closed_loop(
    stream: StreamFn,
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    texts: tuple[str, ...],
    seed: int = 0,
    on_done: OnDone | None = None,
) -> LoadResult:
    """``concurrency`` workers, each starting its next stream when the last one ends."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    text_for = _texts(seed, texts)
    begin = time.perf_counter()
    window_end = begin + warmup_s + duration_s
    result = LoadResult("closed", concurrency, begin, begin + warmup_s, window_end)
    next_id = 0

    async def worker() -> None:
        nonlocal next_id
        while time.perf_counter() < result.t_window_end:
            stream_id = next_id
            next_id += 1
            record = await stream(stream_id, text_for(stream_id))
            record.tags.setdefault("concurrency", concurrency)
            result.records.append(record)
            if on_done is not None:
                on_done(record)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.t_end = time.perf_counter()
    return result


async def open_loop(
    stream: StreamFn,
    rate_per_s: float,
    warmup_s: float,
    duration_s: float,
    texts: tuple[str, ...],
    seed: int = 0,
    on_done: OnDone | None = None,
) -> LoadResult:
    """Streams start at Poisson arrival times, whatever is still in flight."""
    text_for = _texts(seed, texts)
    offsets = poisson_arrivals(rate_per_s, warmup_s + duration_s, random.Random(seed))
    begin = time.perf_counter()
    result = LoadResult("open", rate_per_s, begin, begin + warmup_s, begin + warmup_s + duration_s)

    async def one(stream_id: int, offset: float) -> None:
        await asyncio.sleep(max(0.0, begin + offset - time.perf_counter()))
        record = await stream(stream_id, text_for(stream_id))
        record.tags.setdefault("rate_per_s", rate_per_s)
        result.records.append(record)
        if on_done is not None:
            on_done(record)

    await asyncio.gather(*(one(i, off) for i, off in enumerate(offsets)))
    result.t_end = time.perf_counter()
    return result
