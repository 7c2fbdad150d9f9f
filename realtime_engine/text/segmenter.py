"""Incremental text segmenter: text arriving token by token in, speakable segments out.

Sans-I/O: the caller passes the clock (``now_ms``) and asks again with
:meth:`TextSegmenter.poll` at :meth:`TextSegmenter.next_deadline_ms`.

Where a cut may fall and how strong it is (sentence, clause, word) is decided
by :mod:`realtime_engine.text.boundaries`; in short, cuts fall only before
breaking whitespace, after CJK punctuation, between CJK characters and before
an inline ``<|category:tag|>``, so words, numbers, abbreviations, URLs,
e-mails, ellipses, tags and grapheme clusters are never split. This module
decides which cut to take. In ``auto`` mode, measuring length as spoken weight
(a CJK character counts 3, control tags and leading whitespace 0):

1. The first segment of a context is cut at the first sentence end, or at the
   first clause boundary once it weighs ``first_clause_min_chars``: fast first
   audio.
2. Later segments are cut at the first sentence end once they weigh
   ``sentence_min_chars`` (shorter sentences are joined to the next, for
   prosody), or at a clause boundary once they weigh ``clause_min_chars``.
3. A segment never weighs more than ``max_chars`` when it can help it: once
   the text is longer, it is cut at the last sentence end within the limit,
   else the last clause boundary, else the last word boundary; a single word
   longer than the limit is kept whole.
4. Time: when ``max_buffer_delay_ms`` has passed since the first unspoken
   character arrived, everything up to the last decided cut is spoken; the
   very end of the buffer counts as a cut when it looks finished (``!``/``?``,
   CJK sentence punctuation, or ``.`` after a plain word). While the listener
   still has audio queued (the *slack*, estimated from the text already
   spoken, see :mod:`realtime_engine.text.slack`), the time cut waits as long
   as the waiting text can still be made and queued ``low_water_ms`` before
   that audio runs out: rules 1-3 get the chance to cut at a clause or
   sentence instead of one or two words.
5. A cut is taken only when it is decided, which needs the character after it:
   a trailing ``3.``, ``Dr.`` or ``<|emo`` waits for more text (or a flush).

``flush()`` speaks everything buffered (cutting by rules 1-3 on the way) and
``end()`` does the same and closes the segmenter. In ``manual`` mode ``feed``
and ``poll`` only buffer; ``flush``/``end`` cut as in ``auto``.

Whitespace rule: whitespace between two segments opens the later one, so a
segment never ends in whitespace unless it is the last text of a flush.
Segments joined give back the input exactly, except whitespace that was never
followed by more text at ``end()`` (nothing to speak), which is dropped; a
flush keeps such whitespace buffered, in front of the next text.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Literal

from realtime_engine.text.boundaries import (
    TAG_PATTERN,
    Cut,
    CutScanner,
    Strength,
    char_weight,
    ends_safely,
    pending_tag_start,
)
from realtime_engine.text.slack import PlaybackEstimate

Mode = Literal["auto", "manual"]
CutReason = Literal["sentence", "clause", "length", "timeout", "flush", "end"]


class SegmenterError(ValueError):
    """Invalid configuration, or text fed after ``end()``."""


@dataclass(frozen=True)
class SegmenterConfig:
    mode: Mode = "auto"
    max_buffer_delay_ms: float = 250.0
    first_clause_min_chars: int = 12
    sentence_min_chars: int = 24
    clause_min_chars: int = 80
    max_chars: int = 240
    # Slack estimate (speech_ms_per_char=0 turns it off): how long one unit of
    # spoken weight plays at the fastest likely speaking rate; how much audio
    # must still be queued when a delayed segment's audio is ready; and the
    # engine speed assumed (work per second of audio, whole segment first).
    speech_ms_per_char: float = 55.0
    low_water_ms: float = 800.0
    synthesis_rtf: float = 0.8

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "manual"):
            raise SegmenterError(f"mode must be 'auto' or 'manual', got {self.mode!r}")
        slack = (self.speech_ms_per_char, self.low_water_ms, self.synthesis_rtf)
        if min(self.max_buffer_delay_ms, *slack) < 0:
            raise SegmenterError(
                "max_buffer_delay_ms, speech_ms_per_char, low_water_ms and synthesis_rtf "
                "must be >= 0"
            )
        sizes = (self.first_clause_min_chars, self.sentence_min_chars, self.clause_min_chars)
        if min(sizes) < 1 or self.max_chars < max(sizes):
            raise SegmenterError(
                "segment sizes must be >= 1 and max_chars >= every minimum, got "
                f"{sizes} and max_chars={self.max_chars}"
            )


@dataclass(frozen=True)
class Segment:
    text: str  # exactly as received, including the whitespace that opened it
    index: int  # 0 for the first segment of the context
    start: int  # character offsets in the context's whole text
    end: int
    reason: CutReason

    @property
    def speech_text(self) -> str:
        """The text without surrounding whitespace, as a speech engine wants it."""
        return self.text.strip()


_REASONS: dict[Strength, CutReason] = {Strength.SENTENCE: "sentence", Strength.CLAUSE: "clause"}
# Characters scanned past the length limit before giving up on a nearby cut.
_VIEW_MARGIN = 256
# First scan step when looking for a rule cut; steps double from there.
_FIRST_STEP = 64
# Longest control tag, for finding one that a new fragment completed.
_MAX_TAG_LEN = 68
# Consumed weight entries are dropped once this many pile up.
_CUM_COMPACT_AT = 1 << 16
_LEADING_SPACE = re.compile(r"\s*")


def _leading_space(text: str) -> int:
    match = _LEADING_SPACE.match(text)
    return 0 if match is None else match.end()


class TextSegmenter:
    """One context's segmenter. Times are milliseconds on any monotonic clock."""

    def __init__(self, config: SegmenterConfig | None = None) -> None:
        self.config = config or SegmenterConfig()
        self._text = ""  # buffered, unspoken text
        self._offset = 0  # context offset of _text[0]
        self._arrivals: list[tuple[int, float]] = []  # (context offset, time) per fragment
        self._scanner = CutScanner()  # cuts of _text, kept across feeds
        # Running spoken weight: _cum[_cum0 + i] - _cum[_cum0] weighs _text[:i].
        self._cum = [0]
        self._cum0 = 0
        self._index = 0
        self._ended = False
        self._now: float | None = None  # the latest time given to feed/poll
        self._playback = PlaybackEstimate(self.config.speech_ms_per_char, self.config.synthesis_rtf)

    # ------------------------------------------------------------------ state

    @property
    def pending_text(self) -> str:
        """Text received but not yet cut into a segment."""
        return self._text

    @property
    def ended(self) -> bool:
        return self._ended

    def next_deadline_ms(self) -> float | None:
        """When :meth:`poll` will cut by time; None while no time cut is possible.

        None in manual mode, and when the buffered text has no cut a time rule
        could take (only new text can change that), so a caller's timer never
        fires in vain. A returned deadline may already have passed: poll now.
        """
        if self.config.mode != "auto" or self._ended:
            return None
        first = self._first_spoken_arrival()
        if first is None or self._time_cut_pos() is None:
            return None
        return self._time_deadline(first)

    def _time_deadline(self, first_arrival: float) -> float:
        """The buffer delay, pushed back while queued audio has slack to spare.

        The slack must cover the engine's backlog and the time to voice the
        waiting text itself (see :mod:`realtime_engine.text.slack`), so the
        more text waits, the sooner it is cut.
        """
        cfg = self.config
        by_delay = first_arrival + cfg.max_buffer_delay_ms
        waiting = self._cum[-1] - self._cum[self._cum0]
        return max(by_delay, self._playback.latest_safe_cut(waiting, cfg.low_water_ms))

    # ------------------------------------------------------------------ input

    def feed(self, fragment: str, now_ms: float) -> list[Segment]:
        if self._ended:
            raise SegmenterError("feed() after end()")
        if not isinstance(fragment, str):
            raise SegmenterError(f"text must be str, got {type(fragment).__name__}")
        self._tick(now_ms)
        if fragment:
            self._arrivals.append((self._offset + len(self._text), now_ms))
            self._append(fragment)
        if self.config.mode == "manual":
            return []
        return self._cut_by_rules(final=False) + self._cut_by_time(now_ms)

    def poll(self, now_ms: float) -> list[Segment]:
        if self._ended or self.config.mode == "manual":
            return []
        self._tick(now_ms)
        return self._cut_by_time(now_ms)

    def flush(self) -> list[Segment]:
        if self._ended:
            return []
        return self._speak_all("flush")

    def end(self) -> list[Segment]:
        if self._ended:
            return []
        segments = self._speak_all("end")
        self._ended = True
        self._drop(len(self._text))  # only whitespace can be left: nothing to speak
        return segments

    # ------------------------------------------------------------------ policy

    def _speak_all(self, reason: CutReason) -> list[Segment]:
        segments = self._cut_by_rules(final=True)
        if self._text.strip():
            segments.append(self._emit(len(self._text), reason))
        return segments

    def _cut_by_rules(self, final: bool) -> list[Segment]:
        segments = []
        while _leading_space(self._text) < len(self._text):
            choice = self._choose_cut(final)
            if choice is None:
                break
            pos, reason = choice
            segments.append(self._emit(pos, reason))
        return segments

    def _choose_cut(self, final: bool) -> tuple[int, CutReason] | None:
        text, cum, base = self._text, self._cum, self._cum0
        lead = _leading_space(text)
        # limit: the longest prefix that weighs at most max_chars.
        limit = bisect.bisect_right(cum, cum[base + lead] + self.config.max_chars, lo=base) - 1
        limit -= base
        # Scan in growing steps and no further than needed: cuts far past the
        # limit never matter, and a long flush stays linear.
        horizon = limit + _VIEW_MARGIN
        checked = 0
        while True:
            stop = min(horizon, max(_FIRST_STEP, 2 * self._scanner.scanned))
            cuts = self._scanner.advance(text, final=final, stop=stop)
            for cut in cuts[checked:]:
                if cut.pos > limit:
                    break
                if self._acceptable(cut, cum[base + cut.pos] - cum[base + lead]):
                    return cut.pos, _REASONS[cut.strength]
            checked = len(cuts)
            if (
                stop >= horizon
                or self._scanner.scanned >= len(text)
                or stop > self._scanner.scanned
            ):
                break
        if limit >= len(text):
            return None  # within the length limit: wait for a better cut
        if self._scanner.scanned <= limit:
            return None  # a control tag still arriving may hold a cut within the limit
        within = [c for c in cuts if c.pos <= limit]
        if within:
            return max(within, key=lambda c: (c.strength, c.pos)).pos, "length"
        beyond = next((c.pos for c in cuts if c.pos > limit), None)
        if beyond is None and self._scanner.scanned < len(text):
            cuts = self._scanner.advance(text, final=final)  # one very long word
            beyond = next((c.pos for c in cuts if c.pos > limit), None)
        return None if beyond is None else (beyond, "length")

    def _acceptable(self, cut: Cut, weight: int) -> bool:
        cfg = self.config
        if cut.strength is Strength.SENTENCE:
            return self._index == 0 or weight >= cfg.sentence_min_chars
        if cut.strength is Strength.CLAUSE:
            minimum = cfg.first_clause_min_chars if self._index == 0 else cfg.clause_min_chars
            return weight >= minimum
        return False

    def _cut_by_time(self, now_ms: float) -> list[Segment]:
        first = self._first_spoken_arrival()
        if first is None or now_ms < self._time_deadline(first):
            return []
        pos = self._time_cut_pos()
        return [] if pos is None else [self._emit(pos, "timeout")]

    def _time_cut_pos(self) -> int | None:
        """Where a time cut would fall: the finished-looking end, else the last decided cut."""
        text = self._text
        pending = pending_tag_start(text)
        body = text if pending is None else text[:pending]
        if body.strip() and ends_safely(body):
            return len(body)
        cuts = self._scanner.advance(text)
        return cuts[-1].pos if cuts else None

    # ------------------------------------------------------------------ bookkeeping

    def _append(self, fragment: str) -> None:
        before = len(self._text)
        self._text += fragment
        total = self._cum[-1]
        for ch in fragment:
            total += char_weight(ch)
            self._cum.append(total)
        # A control tag completed by this fragment is not spoken: take its
        # characters back out of the running weight.
        for match in TAG_PATTERN.finditer(self._text, max(0, before - _MAX_TAG_LEN)):
            if match.end() <= before:
                continue
            start, end, base = match.start(), match.end(), self._cum0
            for i in range(start + 1, len(self._text) + 1):
                self._cum[base + i] -= min(i, end) - start

    def _tick(self, now_ms: float) -> None:
        # A clock that steps back (another source) never moves the estimate back.
        self._now = now_ms if self._now is None else max(self._now, now_ms)

    def _emit(self, pos: int, reason: CutReason) -> Segment:
        if self._now is not None:
            weight = self._cum[self._cum0 + pos] - self._cum[self._cum0]
            self._playback.add(weight, self._now)
        segment = Segment(
            text=self._text[:pos],
            index=self._index,
            start=self._offset,
            end=self._offset + pos,
            reason=reason,
        )
        self._index += 1
        self._drop(pos)
        return segment

    def _drop(self, pos: int) -> None:
        self._text = self._text[pos:]
        self._offset += pos
        self._cum0 += pos
        if self._cum0 > _CUM_COMPACT_AT:
            self._cum, self._cum0 = self._cum[self._cum0 :], 0
        self._scanner = CutScanner()
        # Keep the arrival that covers the new first character.
        keep = bisect.bisect_right(self._arrivals, (self._offset, float("inf"))) - 1
        self._arrivals = self._arrivals[max(keep, 0) :]

    def _first_spoken_arrival(self) -> float | None:
        """Arrival time of the first non-whitespace unspoken character."""
        stripped = _leading_space(self._text)
        if stripped == len(self._text):
            return None
        at = self._offset + stripped
        i = bisect.bisect_right(self._arrivals, (at, float("inf"))) - 1
        return self._arrivals[i][1]
