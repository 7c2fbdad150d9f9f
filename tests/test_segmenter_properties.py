"""TextSegmenter properties over generated text split into random fragments."""

from __future__ import annotations

import itertools
import unicodedata
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from realtime_engine.text import Segment, SegmenterConfig, TextSegmenter
from realtime_engine.text.boundaries import find_cuts, spoken_weight

# Atoms that must never be cut inside. Every one is written without spaces.
PROTECTED = {
    "number": ["3.14", "1,000", "10:30", "-5", "2.5%", "1,234.56", "0.5", "$9.99"],
    "abbreviation": ["Dr.", "Mr.", "e.g.", "i.e.", "U.S.", "etc.", "a.m.", "J."],
    "url": ["https://example.com/a.b?x=1,2", "http://x.org/p.html", "www.test.io/a:b"],
    "email": ["bob@example.org", "a.b@c.co.uk"],
    "ellipsis": ["...", "…"],
    "tag": ["<|emotion:anger|>", "<|sfx:laughter|>", "<|prosody:pause|>", "<|style:singing|>"],
    "grapheme": ["cafe\u0301", "👨\u200d👩\u200d👧", "👍\U0001f3fd", "か\u3099"],
}
WORDS = ["hello", "world", "the", "quick", "brown", "fox", "speech", "a", "I", "No", "Okay"]
CJK = ["你好", "我们", "今天天气很好", "こんにちは", "ありがとう", "カタカナ"]
# Text between atoms: spaces and punctuation (a tag may also follow text directly).
SEPARATORS = [
    " ", " ", " ", "  ", "\n", ", ", ". ", "! ", "? ", "; ", ": ", " — ", " - ", '." ',
    "。", "，", "！", "、", "?\u3000", "\u00a0", "\u00a0", "", "", ".", "!",
]  # fmt: skip


@dataclass
class Generated:
    text: str
    protected: list[tuple[int, int]]  # [start, end) spans no cut may fall strictly inside
    tag_ends: list[int]  # positions right after a control tag


@st.composite
def generated_text(draw: st.DrawFn) -> Generated:
    parts: list[str] = []
    protected: list[tuple[int, int]] = []
    tag_ends: list[int] = []
    pos = 0
    for _ in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(["word", "word", "cjk", *PROTECTED]))
        if kind == "word":
            atom = draw(st.sampled_from(WORDS))
        elif kind == "cjk":
            atom = draw(st.sampled_from(CJK))
        else:
            atom = draw(st.sampled_from(PROTECTED[kind]))
        # An atom glued to the previous one would make a different token; keep them apart
        # except where gluing is what we test (a tag right after text).
        if parts and not parts[-1][-1:].isspace() and kind != "tag":
            parts.append(" ")
            pos += 1
        parts.append(atom)
        if kind != "cjk":  # CJK runs may be cut between characters
            protected.append((pos, pos + len(atom)))
        if kind == "tag":
            tag_ends.append(pos + len(atom))
        pos += len(atom)
        sep = draw(st.sampled_from(SEPARATORS))
        parts.append(sep)
        pos += len(sep)
    return Generated("".join(parts), protected, tag_ends)


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


def feed_all(
    chunks: list[str], config: SegmenterConfig, final: str = "flush"
) -> tuple[list[Segment], str]:
    seg = TextSegmenter(config)
    out: list[Segment] = []
    for chunk in chunks:
        out += seg.feed(chunk, 0)
    out += seg.flush() if final == "flush" else seg.end()
    return out, seg.pending_text


@st.composite
def configs(draw: st.DrawFn) -> SegmenterConfig:
    # Small limits make length cuts (word boundaries) frequent.
    max_chars = draw(st.integers(12, 120))
    return SegmenterConfig(
        first_clause_min_chars=draw(st.integers(1, max_chars)),
        sentence_min_chars=draw(st.integers(1, max_chars)),
        clause_min_chars=draw(st.integers(1, max_chars)),
        max_chars=max_chars,
    )


FRAGMENT_CUTS = st.lists(st.integers(0, 400), max_size=60)


@settings(max_examples=150, deadline=None)
@given(gen=generated_text(), cuts=FRAGMENT_CUTS, config=configs())
def test_streaming_equals_whole_and_joins_back(
    gen: Generated, cuts: list[int], config: SegmenterConfig
) -> None:
    streamed, rest_streamed = feed_all(split(gen.text, cuts), config)
    whole, rest_whole = feed_all([gen.text], config)
    assert [(s.text, s.reason) for s in streamed] == [(s.text, s.reason) for s in whole]
    assert rest_streamed == rest_whole
    joined = "".join(s.text for s in streamed)
    assert joined + rest_streamed == gen.text
    assert rest_streamed.strip() == ""


@settings(max_examples=150, deadline=None)
@given(gen=generated_text(), cuts=FRAGMENT_CUTS, config=configs())
def test_no_cut_inside_protected_text(
    gen: Generated, cuts: list[int], config: SegmenterConfig
) -> None:
    segments, _ = feed_all(split(gen.text, cuts), config, final="end")
    ends = [s.end for s in segments[:-1]]
    for end in ends:
        for start, stop in gen.protected:
            assert not start < end < stop, (gen.text[start:stop], gen.text[:end])
        assert end not in gen.tag_ends, gen.text[:end]
        assert not unicodedata.combining(gen.text[end])
        assert gen.text[end] not in ("\u200d", "\u00a0") and gen.text[end - 1] != "\u200d"
    for s in segments:
        assert s.text.strip(), "a segment with nothing to speak"
    assert "".join(s.text for s in segments) == gen.text[: segments[-1].end if segments else 0]
    assert gen.text[segments[-1].end if segments else 0 :].strip() == ""


@settings(max_examples=100, deadline=None)
@given(gen=generated_text(), cuts=FRAGMENT_CUTS, config=configs())
def test_segments_respect_max_length_when_a_cut_exists(
    gen: Generated, cuts: list[int], config: SegmenterConfig
) -> None:
    segments, _ = feed_all(split(gen.text, cuts), config)
    for s in segments:
        if spoken_weight(s.text) > config.max_chars:
            # Over the limit only when the segment is one unbreakable piece.
            assert find_cuts(s.text) == [], s.text


@settings(max_examples=100, deadline=None)
@given(
    gen=generated_text(),
    cuts=FRAGMENT_CUTS,
    gaps=st.lists(st.integers(0, 400), min_size=60, max_size=60),
)
def test_time_cuts_keep_text_whole_and_protected(
    gen: Generated, cuts: list[int], gaps: list[int]
) -> None:
    seg = TextSegmenter(SegmenterConfig(max_buffer_delay_ms=250))
    out: list[Segment] = []
    now = 0.0
    for chunk, gap in zip(split(gen.text, cuts), gaps, strict=False):
        out += seg.feed(chunk, now)
        # A timer at each deadline, as a server would run it: every wake-up cuts.
        deadline = seg.next_deadline_ms()
        while deadline is not None and deadline <= now + gap:
            now = max(now, deadline)
            due = seg.poll(now)
            assert due and all(s.reason == "timeout" for s in due)
            out += due
            deadline = seg.next_deadline_ms()
        now += gap
    out += seg.end()
    if out:
        assert "".join(s.text for s in out) == gen.text[: out[-1].end]
    for s in out[:-1]:
        for start, stop in gen.protected:
            assert not start < s.end < stop, (gen.text[start:stop], gen.text[: s.end])
        assert s.end not in gen.tag_ends
