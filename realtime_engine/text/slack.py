"""How much audio a listener still has queued, estimated from the text already spoken.

Sans-I/O and deliberately simple: each segment is assumed to start playing
when it is cut (or when the audio before it ends, whichever is later) and to
last ``ms_per_char`` per unit of spoken weight. Both assumptions err towards
*less* queued audio than the listener really has: real synthesis adds its
time to first audio, and ``ms_per_char`` is set for fast speech. A segmenter
that waits only while this estimate shows slack therefore never waits into an
underrun that the old, always-cut-early rule would have avoided, as long as
synthesis runs faster than real time (which is what the server is sized for).
"""

from __future__ import annotations


class PlaybackEstimate:
    def __init__(self, ms_per_char: float) -> None:
        self.ms_per_char = ms_per_char
        self._ends_at = float("-inf")  # no audio queued yet: no slack

    def add(self, weight: int, now_ms: float) -> None:
        """A segment of ``weight`` was handed to synthesis at ``now_ms``."""
        if self.ms_per_char <= 0:
            return
        self._ends_at = max(self._ends_at, now_ms) + weight * self.ms_per_char

    def ends_at(self) -> float:
        """When the queued audio runs out (``-inf`` before any, or when disabled)."""
        return self._ends_at

    def queued_ms(self, now_ms: float) -> float:
        return max(0.0, self._ends_at - now_ms)
