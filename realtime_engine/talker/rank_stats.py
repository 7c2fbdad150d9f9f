"""Per-rank talker counters: which data-parallel engine core served how much.

With ``data_parallel_size > 1`` vLLM runs one engine core per rank and
balances requests across them; each core sends its own audio, stamped with
its rank. The runner records here what arrived from each rank, and the
gateway turns :meth:`RankStats.report` into ``rank``-labelled metrics.
Plain bookkeeping: no I/O, no locks (the runner calls it from its event loop).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from realtime_engine.format import SAMPLE_RATE

# First-chunk samples kept between two reports (older ones are dropped).
MAX_PENDING_SAMPLES = 4096


@dataclass(frozen=True)
class RankCounters:
    """Cumulative totals for one rank."""

    streams: int = 0  # streams whose first audio came from this rank
    active: int = 0  # of those, the ones still running
    chunks: int = 0
    audio_seconds: float = 0.0


@dataclass(frozen=True)
class RankReport:
    counters: dict[int, RankCounters]
    # (rank, seconds from the request's start to its first chunk), since the last report.
    first_chunk_s: list[tuple[int, float]]


class RankStats:
    def __init__(self) -> None:
        self._counters: dict[int, RankCounters] = {}
        self._pending: deque[tuple[int, float]] = deque(maxlen=MAX_PENDING_SAMPLES)

    def chunk(self, rank: int, samples: int, first_after_s: float | None = None) -> None:
        """A chunk of ``samples`` from ``rank``; ``first_after_s`` on a stream's first chunk."""
        c = self._counters.get(rank, RankCounters())
        c = replace(c, chunks=c.chunks + 1, audio_seconds=c.audio_seconds + samples / SAMPLE_RATE)
        if first_after_s is not None:
            c = replace(c, streams=c.streams + 1, active=c.active + 1)
            self._pending.append((rank, first_after_s))
        self._counters[rank] = c

    def ended(self, rank: int) -> None:
        """A stream that ``rank`` served is over (finished, failed or cancelled)."""
        c = self._counters.get(rank)
        if c is not None and c.active > 0:
            self._counters[rank] = replace(c, active=c.active - 1)

    def report(self) -> RankReport:
        """The totals, and the first-chunk samples recorded since the previous report."""
        samples = list(self._pending)
        self._pending.clear()
        return RankReport(dict(self._counters), samples)
