"""One voice across the segments of a context.

A context's text is spoken as several segments, each a separate talker
request. Without a reference every zero-shot request samples its own
speaker, so a reply could change voice mid-sentence. The policy
(docs/voices.md):

- a context with a cloned voice prompts every segment with that reference;
- otherwise the first segment is zero-shot, and what it generated (codes and
  text) becomes the context's *anchor*: later segments are voice-clone
  prompts on the anchor. The anchor grows by whole segments only while it is
  shorter than ``min_frames`` (a very short first segment is a weak
  reference) and is never longer than ``max_frames``: past that, its last
  ``max_frames`` frames are kept without the transcript, which no longer
  matches. Prefill therefore stays flat however long the reply runs, and the
  anchor never moves once set, so the voice does not drift segment to
  segment.

Segments of a context run one after another (``gateway.realtime.contexts``), so a
segment always sees the anchor its predecessors left. Sans-I/O: the engine
calls :meth:`record` after a segment finished normally.
"""

from __future__ import annotations

import numpy as np

from realtime_engine.engines.voice_reference import VoiceReference
from realtime_engine.format import FRAMES_PER_SECOND

DEFAULT_MIN_ANCHOR_FRAMES = 2 * FRAMES_PER_SECOND
DEFAULT_MAX_ANCHOR_FRAMES = 8 * FRAMES_PER_SECOND


class VoiceContinuity:
    """The voice anchor of one context."""

    def __init__(
        self,
        min_frames: int = DEFAULT_MIN_ANCHOR_FRAMES,
        max_frames: int = DEFAULT_MAX_ANCHOR_FRAMES,
    ) -> None:
        if not 1 <= min_frames <= max_frames:
            raise ValueError(f"need 1 <= min_frames <= max_frames, got {min_frames}, {max_frames}")
        self.min_frames = min_frames
        self.max_frames = max_frames
        self._codes: np.ndarray | None = None
        self._texts: list[str] = []
        self._trimmed = False

    @property
    def frames(self) -> int:
        return 0 if self._codes is None else int(self._codes.shape[0])

    @property
    def settled(self) -> bool:
        """The anchor is final: later segments add nothing."""
        return self.frames >= self.min_frames

    def anchor(self) -> VoiceReference | None:
        """The reference for the next segment, or None before any audio exists."""

        if self._codes is None:
            return None
        text = None if self._trimmed else " ".join(self._texts)
        return VoiceReference(self._codes, text)

    def record(self, codes: np.ndarray, text: str) -> None:
        """A segment finished normally with these raw codes ``[frames, 8]`` for ``text``."""
        if self.settled or codes.shape[0] == 0:
            return
        joined = codes if self._codes is None else np.concatenate([self._codes, codes])
        if joined.shape[0] > self.max_frames:
            joined = joined[-self.max_frames :]
            self._trimmed = True
        self._codes = np.ascontiguousarray(joined, dtype=np.int64)
        self._texts.append(text.strip())
