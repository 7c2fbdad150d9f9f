"""A real-time audio player, simulated: where would a listener hear gaps?

Definitions (used by every report of this harness):

- Playback starts ``prebuffer_s`` after the first chunk arrives (0 by
  default: the player starts at the first audio) and then consumes audio at
  real time, one second of audio per second of wall clock.
- ``play_end`` is the wall-clock time at which everything received so far
  will have been played if nothing else arrives.
- A chunk arriving at ``t > play_end`` found the buffer dry: that is a
  **stall** of ``t - play_end`` seconds. Playback resumes at once with the new
  chunk (no re-buffering), so ``play_end = t + duration``.
- An **underrun** is a stall longer than ``underrun_threshold_s`` (100 ms by
  default): a gap a listener clearly hears. Shorter stalls are still counted
  (``stalls``, ``stall_s``), since a player without concealment clicks on them.
- The **lead** at an arrival is ``play_end - t``, the audio still queued when
  the chunk lands; ``min_lead_s`` is the tightest margin seen over the stream
  (negative exactly when a stall happened).

The simulator is sans-I/O: feed it (arrival time, duration) pairs in arrival
order; it never reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

DEFAULT_UNDERRUN_THRESHOLD_S = 0.1


@dataclass(frozen=True)
class Stall:
    at_s: float  # wall-clock time the buffer ran dry
    duration_s: float
    chunk_index: int  # the chunk whose late arrival ended the stall


@dataclass
class PlaybackReport:
    chunks: int = 0
    audio_s: float = 0.0
    start_s: float | None = None  # wall-clock time playback starts
    end_s: float | None = None  # wall-clock time the last sample has played
    stalls: list[Stall] = field(default_factory=list)
    underrun_threshold_s: float = DEFAULT_UNDERRUN_THRESHOLD_S
    min_lead_s: float | None = None  # None with fewer than two chunks

    @property
    def stall_s(self) -> float:
        return math.fsum(s.duration_s for s in self.stalls)

    @property
    def underruns(self) -> list[Stall]:
        return [s for s in self.stalls if s.duration_s > self.underrun_threshold_s]

    @property
    def underrun_s(self) -> float:
        return math.fsum(s.duration_s for s in self.underruns)


class PlaybackOrderError(ValueError):
    """Chunks were fed out of arrival order or with a negative duration."""


class PlaybackSimulator:
    def __init__(
        self,
        prebuffer_s: float = 0.0,
        underrun_threshold_s: float = DEFAULT_UNDERRUN_THRESHOLD_S,
    ) -> None:
        if prebuffer_s < 0 or underrun_threshold_s < 0:
            raise ValueError("prebuffer_s and underrun_threshold_s must be >= 0")
        self._prebuffer_s = prebuffer_s
        self._report = PlaybackReport(underrun_threshold_s=underrun_threshold_s)
        self._play_end: float | None = None
        self._last_arrival: float | None = None

    def feed(self, arrival_s: float, duration_s: float) -> Stall | None:
        """One chunk lands; returns the stall it ended, if the buffer was dry."""
        if duration_s < 0:
            raise PlaybackOrderError(f"negative chunk duration {duration_s}")
        if self._last_arrival is not None and arrival_s < self._last_arrival:
            raise PlaybackOrderError(
                f"chunk at {arrival_s} s fed after one at {self._last_arrival} s"
            )
        self._last_arrival = arrival_s
        report = self._report
        index = report.chunks
        report.chunks += 1
        report.audio_s += duration_s
        if self._play_end is None:
            report.start_s = arrival_s + self._prebuffer_s
            self._play_end = report.start_s + duration_s
            report.end_s = self._play_end
            return None
        lead = self._play_end - arrival_s
        report.min_lead_s = lead if report.min_lead_s is None else min(report.min_lead_s, lead)
        stall: Stall | None = None
        if lead < 0:
            stall = Stall(at_s=self._play_end, duration_s=-lead, chunk_index=index)
            report.stalls.append(stall)
            self._play_end = arrival_s
        self._play_end += duration_s
        report.end_s = self._play_end
        return stall

    def finish(self) -> PlaybackReport:
        return self._report


def simulate(
    chunks: list[tuple[float, float]],
    prebuffer_s: float = 0.0,
    underrun_threshold_s: float = DEFAULT_UNDERRUN_THRESHOLD_S,
) -> PlaybackReport:
    """Offline convenience: play ``(arrival_s, duration_s)`` pairs in order."""
    sim = PlaybackSimulator(prebuffer_s, underrun_threshold_s)
    for arrival_s, duration_s in chunks:
        sim.feed(arrival_s, duration_s)
    return sim.finish()
