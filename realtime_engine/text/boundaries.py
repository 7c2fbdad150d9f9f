"""Where a text may be cut, and how good each cut is.

Cuts happen only at three kinds of places, which is what keeps words, numbers
(``3.14``, ``1,000``, ``10:30``, ``-5``, ``2.5%``), URLs, e-mail addresses,
abbreviations, ellipses and control tags whole without having to recognise
each of them:

* before a run of breaking whitespace (no-break spaces do not count);
* right after CJK punctuation (``。！？，、；：`` and their closing quotes), or
  ``!``/``?`` directly followed by a CJK character: scripts written without
  spaces;
* before an inline control tag ``<|category:tag|>`` that follows text with
  no space (``Done.<|emotion:joy|>Great``).

Between two CJK characters is a weak ``WORD`` cut used only by the length
fallback. A cut is never placed before a combining mark, a zero-width joiner,
a variation selector or an emoji modifier, nor after a zero-width joiner, so
grapheme clusters stay whole.

Each cut gets a strength from the text just before it: ``SENTENCE`` after
``. ! ?`` (unless the word is a known abbreviation, an initial such as
``J.`` or ``U.S.``, or a list number opening the segment), ``CLAUSE`` after
``, ; : — –``, a lone ``-`` or an ellipsis, ``WORD`` otherwise, and no cut at
all right after a control tag (a tag belongs to the text it precedes).

A cut needs at most the character at its position and the one after it, so a
cut is *decided* once that text has arrived; a trailing ``3.`` or ``Dr.`` or
``<|emo`` simply has no decided cut yet and waits for more text.
"""

from __future__ import annotations

import enum
import re
import unicodedata
from dataclasses import dataclass


class Strength(enum.IntEnum):
    WORD = 1
    CLAUSE = 2
    SENTENCE = 3


@dataclass(frozen=True)
class Cut:
    pos: int  # the segment ends before text[pos]
    strength: Strength


SENTENCE_MARKS = frozenset(".!?‽")
CJK_SENTENCE_MARKS = frozenset("。！？｡")
CJK_CLAUSE_MARKS = frozenset("，、；：､")
CLAUSE_MARKS = frozenset(",;:—–") | CJK_CLAUSE_MARKS
ELLIPSES = ("...", "…", "⋯")
CLOSING = frozenset("\"')]}»›”’」』）】〉》〕〗〙〛〞＂＇")
NO_BREAK_SPACES = frozenset("\u00a0\u2007\u202f\ufeff")
ZWJ = "\u200d"

# Lower-case, without the final dot. "no" is left out on purpose: "No." is a
# common one-word sentence in dialogue and "No. 5" is rare in speech text.
_ABBREVIATION_WORDS = """
    mr mrs ms mx dr prof sr jr st mt ft vs etc e.g i.e cf al approx dept est
    inc ltd co corp gen col lt sgt capt rev hon gov sen rep ave blvd rd
    jan feb mar apr jun jul aug sep sept oct nov dec mon tue wed thu fri sat sun
    vol ch pp fig eq ed eds min max misc ph.d a.m p.m u.s u.k u.n e.u
"""
ABBREVIATIONS = frozenset(_ABBREVIATION_WORDS.split())

TAG_PATTERN = re.compile(r"<\|[A-Za-z0-9_:\-]{1,64}\|>")
_TAG_AT_END = re.compile(TAG_PATTERN.pattern + r"\Z")
_PARTIAL_TAG = re.compile(r"<(?:\|[A-Za-z0-9_:\-]{0,64}\|?)?\Z")
_INITIALS = re.compile(r"(?:[^\W\d_]\.)+", re.UNICODE)
_LIST_NUMBER = re.compile(r"\(?\d{1,3}\.")
_OPENING = "\"'([{«‹“‘「『（【〈《〔"


def is_break_space(ch: str) -> bool:
    return ch.isspace() and ch not in NO_BREAK_SPACES


def is_cjk(ch: str) -> bool:
    """Characters of scripts written without spaces between words."""
    code = ord(ch)
    return (
        0x3040 <= code <= 0x30FF  # Hiragana, Katakana
        or 0x3400 <= code <= 0x4DBF  # CJK Extension A
        or 0x4E00 <= code <= 0x9FFF  # CJK Unified Ideographs
        or 0xF900 <= code <= 0xFAFF  # CJK Compatibility Ideographs
        or 0xFF66 <= code <= 0xFF9D  # half-width Katakana
        or 0x20000 <= code <= 0x3134F  # CJK Extensions B-G
    )


# Kana that cannot begin a word (small kana, prolonged sound and iteration marks).
_NON_INITIAL_KANA = frozenset("ぁぃぅぇぉっゃゅょゎァィゥェォッャュョヮヵヶーゝゞヽヾ々〻")


def is_extender(ch: str) -> bool:
    """A character that extends the previous grapheme: never the first of a segment."""
    code = ord(ch)
    return (
        unicodedata.combining(ch) != 0
        or unicodedata.category(ch) in ("Mn", "Me", "Mc")
        or ch in (ZWJ, "\u200c")
        or 0xFE00 <= code <= 0xFE0F  # variation selectors
        or 0xE0100 <= code <= 0xE01EF
        or 0x1F3FB <= code <= 0x1F3FF  # emoji skin-tone modifiers
        or 0xE0020 <= code <= 0xE007F  # emoji tag characters
        or 0xDC00 <= code <= 0xDFFF  # low surrogate (only in malformed text)
    )


def _can_start_segment(text: str, pos: int) -> bool:
    ch = text[pos]
    prev = text[pos - 1]
    return not (
        is_extender(ch)
        or prev == ZWJ
        or 0xD800 <= ord(prev) <= 0xDBFF  # a high surrogate keeps its pair
        or ch in CLOSING
    )


def char_weight(ch: str) -> int:
    """Spoken weight of one character: 3 for wide (CJK) characters, else 1."""
    return 3 if unicodedata.east_asian_width(ch) in "WF" else 1


def spoken_weight(text: str) -> int:
    """Length that tracks speaking time: a wide (CJK) character counts 3, others 1.

    Control tags are not spoken and weigh nothing. Leading whitespace is not
    counted, so a segment's weight does not depend on the space that
    separates it from the previous one.
    """
    stripped = TAG_PATTERN.sub("", text).lstrip()
    wide = sum(1 for ch in stripped if unicodedata.east_asian_width(ch) in "WF")
    return len(stripped) + 2 * wide


def _strip_closing(token: str) -> str:
    end = len(token)
    while end and token[end - 1] in CLOSING:
        end -= 1
    return token[:end]


def _is_abbreviation(word: str) -> bool:
    """``word`` ends with a dot; is that dot part of an abbreviation or initial?"""
    bare = word.lstrip(_OPENING)
    if bare[:-1].lower() in ABBREVIATIONS:
        return True
    return _INITIALS.fullmatch(bare) is not None and len(bare) <= 8


def token_strength(token: str, opens_segment: bool) -> Strength | None:
    """Strength of a cut right after ``token`` (a run of text without spaces).

    ``opens_segment`` says the token is the first of its segment, where ``1.``
    is a list number rather than the end of a sentence. ``None``: no cut here.
    """
    if _TAG_AT_END.search(token) is not None:
        return None
    core = _strip_closing(token)
    if not core:
        return Strength.WORD
    last = core[-1]
    if core.endswith(ELLIPSES):
        return Strength.CLAUSE
    if last in CJK_SENTENCE_MARKS:
        return Strength.SENTENCE
    if last in SENTENCE_MARKS:
        if last == "." and (
            _is_abbreviation(core) or (opens_segment and _LIST_NUMBER.fullmatch(core))
        ):
            return Strength.WORD
        return Strength.SENTENCE
    if last in CLAUSE_MARKS or core in ("-", "--"):
        return Strength.CLAUSE
    return Strength.WORD


class CutScanner:
    """Finds the decided cuts of a growing text, resuming where it stopped.

    ``advance(text)`` is called with the same text plus whatever arrived since;
    work per call is proportional to the new text. A control tag still
    arriving pauses the scan at its ``<`` until it completes (or turns out
    not to be a tag), unless the text is ``final``.
    """

    def __init__(self) -> None:
        self.cuts: list[Cut] = []
        self._pos = 0  # next character to look at
        self._token_start = 0  # first character of the current run without spaces
        self._spoken_before = False  # the text has a run before the current one

    @property
    def scanned(self) -> int:
        return self._pos

    def advance(self, text: str, final: bool = False, stop: int | None = None) -> list[Cut]:
        """Scan ``text`` up to its end (or ``stop``); return all cuts found so far."""
        end = len(text) if stop is None else min(stop, len(text))
        pos = self._pos
        while pos < end:
            ch = text[pos]
            if ch == "<" and (text.startswith("<|", pos) or pos + 1 == len(text)):
                match = TAG_PATTERN.match(text, pos)
                if match is not None:
                    if pos > self._token_start:
                        self._close_token(text, pos)
                    self._token_start, pos = pos, match.end()
                    continue
                if not final and _PARTIAL_TAG.match(text, pos) is not None:
                    break  # wait: this may still become a tag
            if ch < "\x7f" and ch > " " and ch != "<" and pos and text[pos - 1] < "\x7f":
                pos += 1  # fast path: an inline cut needs a CJK mark or character nearby
                continue
            if is_break_space(ch):
                if pos > self._token_start:
                    self._close_token(text, pos)
                while pos < len(text) and is_break_space(text[pos]):
                    pos += 1
                self._token_start = pos
                continue
            if pos > self._token_start and _can_start_segment(text, pos):
                strength = _inline_cut(text, self._token_start, pos)
                if strength is not None:
                    self.cuts.append(Cut(pos, strength))
                    self._token_start, self._spoken_before = pos, True
            pos += 1
        self._pos = max(pos, self._pos)
        return self.cuts

    def _close_token(self, text: str, pos: int) -> None:
        strength = token_strength(text[self._token_start : pos], not self._spoken_before)
        if strength is not None:
            self.cuts.append(Cut(pos, strength))
        self._spoken_before = True


def find_cuts(text: str, start: int = 0, final: bool = False) -> list[Cut]:
    """Decided cuts of ``text[start:]``, at positions ``start < pos < len(text)``.

    No cut falls inside a control tag, and none right after one.
    """
    return [Cut(c.pos + start, c.strength) for c in CutScanner().advance(text[start:], final=final)]


def pending_tag_start(text: str) -> int | None:
    """Start of a control tag still arriving at the end of ``text`` (``<``, ``<|emo``...)."""
    match = _PARTIAL_TAG.search(text)
    return None if match is None else match.start()


def _inline_cut(text: str, token_start: int, pos: int) -> Strength | None:
    """A cut inside a run without spaces: after CJK punctuation, or between CJK characters."""
    ch = text[pos]
    if is_break_space(ch):
        return None
    back = pos
    while back > token_start and text[back - 1] in CLOSING:
        back -= 1
    if back == token_start:
        return None
    mark = text[back - 1]
    if ch.startswith("<") and text.startswith("<|", pos):
        return None  # handled as a tag (or a tag still arriving)
    if mark in CJK_SENTENCE_MARKS and ch not in CJK_SENTENCE_MARKS:
        return Strength.SENTENCE
    if mark in CJK_CLAUSE_MARKS and ch not in CJK_CLAUSE_MARKS | CJK_SENTENCE_MARKS:
        return Strength.CLAUSE
    if mark in "!?" and is_cjk(ch):
        return Strength.SENTENCE
    if back == pos and is_cjk(mark) and is_cjk(ch) and ch not in _NON_INITIAL_KANA:
        return Strength.WORD
    return None


def ends_safely(text: str) -> bool:
    """Whether complete-looking text may be cut at its very end before more arrives.

    Used only by the time-based cut. The last word must be a plain word
    (letters, inner ``'`` or ``-``, quotes around it) followed by ``!``/``?``,
    CJK sentence punctuation, or ``.`` when the word has two or more letters
    and is not an abbreviation. Anything else (``3.``, ``Dr.``, ``www.``,
    ``https://x.org/?``) may continue and is not cut.
    """
    if not text or is_break_space(text[-1]):
        return False
    begin = len(text)
    while begin and not is_break_space(text[begin - 1]):
        begin -= 1
    core = _strip_closing(text[begin:])
    marks = len(core) - len(core.rstrip("!?‽.。！？｡"))
    if marks == 0 or core.endswith(ELLIPSES):
        return False
    word = core[:-marks].lstrip(_OPENING)
    if not word or not word.replace("'", "").replace("-", "").replace("’", "").isalpha():
        return False
    if core[-1] != ".":
        return True
    return marks == 1 and len(word) >= 2 and word.lower() != "www" and not _is_abbreviation(core)
