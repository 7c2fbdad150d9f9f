"""How much audio a listener still has queued, estimated from the text already spoken.

Sans-I/O and deliberately simple. Two clocks are kept per context:

- playback: each segment plays ``ms_per_char`` per unit of spoken weight,
  starting when it is cut or when the audio before it ends, whichever is
  later. This errs towards *less* queued audio than the listener really has
  (real synthesis adds its time to first audio, and ``ms_per_char`` is set
  for fast speech).
- synthesis: the engine makes one segment after another, each in
  ``synthesis_rtf`` of its duration, and (worst case: the CPU voice does this
  per clause group) sends none of it before it is all made. This errs towards
  a *busier* engine than it usually is.

A new segment is safe to cut at time ``t`` when its audio, made after the
engine's backlog, is ready ``low_water_ms`` before the queue runs out:
``max(t, synthesis end) + synthesis_rtf * its duration <= playback end - low_water_ms``.
:meth:`PlaybackEstimate.latest_safe_cut` is the latest such ``t``.
"""

from __future__ import annotations

_NEVER = float("-inf")


class PlaybackEstimate:
    def __init__(self, ms_per_char: float, synthesis_rtf: float) -> None:
        self.ms_per_char = ms_per_char
        self.synthesis_rtf = synthesis_rtf
        self._ends_at = _NEVER  # playback: no audio queued yet, no slack
        self._made_at = _NEVER  # synthesis: when the engine's backlog is done

    def add(self, weight: int, now_ms: float) -> None:
        """A segment of ``weight`` was handed to synthesis at ``now_ms``."""
        if self.ms_per_char <= 0:
            return
        duration = weight * self.ms_per_char
        self._ends_at = max(self._ends_at, now_ms) + duration
        self._made_at = max(self._made_at, now_ms) + self.synthesis_rtf * duration

    def ends_at(self) -> float:
        """When the queued audio runs out (``-inf`` before any, or when disabled)."""
        return self._ends_at

    def queued_ms(self, now_ms: float) -> float:
        return max(0.0, self._ends_at - now_ms)

    def latest_safe_cut(self, waiting_weight: int, low_water_ms: float) -> float:
        """The latest time text of ``waiting_weight`` can be cut and still play on
        time; ``-inf`` when there is no such time (no slack: cut as soon as possible)."""
        if self._ends_at == _NEVER:
            return _NEVER
        making = self.synthesis_rtf * waiting_weight * self.ms_per_char
        latest = self._ends_at - low_water_ms - making
        return latest if self._made_at <= latest else _NEVER
