"""The segmenter's time rule under LLM pacing: it waits while queued audio gives slack.

A model of the listener's queue (each segment plays ``speech_ms_per_char`` per
unit of spoken weight from when it was cut, back to back) is rebuilt here from
the segments alone and checked against every time cut the segmenter makes.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.segment_sim import simulate
from bench.textfeed import REPLIES
from realtime_engine.text import Segment, SegmenterConfig, TextSegmenter
from realtime_engine.text.boundaries import char_weight, spoken_weight
from realtime_engine.text.segmenter import SegmenterError
from tests.test_segmenter_properties import FRAGMENT_CUTS, Generated, generated_text, split

GAPS = st.lists(st.integers(0, 600), min_size=60, max_size=60)
SLACK = SegmenterConfig(
    max_buffer_delay_ms=250, speech_ms_per_char=55, low_water_ms=800, synthesis_rtf=0.5
)
NO_SLACK = SegmenterConfig(max_buffer_delay_ms=250, speech_ms_per_char=0)


def run_timed(
    chunks: list[str], gaps: list[int], config: SegmenterConfig
) -> list[tuple[float, Segment, str]]:
    """Feed ``chunks`` ``gaps`` ms apart, waking at every deadline as a server does.

    Each segment comes with when it was cut and the text buffered just before.
    """
    seg = TextSegmenter(config)
    out: list[tuple[float, Segment, str]] = []
    fed = ""

    def record(at: float, segments: list[Segment]) -> None:
        for s in segments:
            out.append((at, s, fed[s.start :]))

    now = 0.0
    for chunk, gap in zip(chunks, gaps, strict=False):
        fed += chunk
        record(now, seg.feed(chunk, now))
        deadline = seg.next_deadline_ms()
        while deadline is not None and deadline <= now + gap:
            now = max(now, deadline)
            due = seg.poll(now)
            assert due, "a timer set on next_deadline_ms() must cut"
            record(now, due)
            deadline = seg.next_deadline_ms()
        now += gap
    record(now, seg.end())
    return out


def queued_ms_before_each(
    timed: list[tuple[float, Segment, str]], ms_per_char: float
) -> list[float]:
    """The listener's queue (model) just before each segment is cut."""
    ends_at = float("-inf")
    queued = []
    for at, segment, _ in timed:
        queued.append(max(0.0, ends_at - at))
        ends_at = max(ends_at, at) + spoken_weight(segment.text) * ms_per_char
    return queued


@settings(max_examples=80, deadline=None)
@given(gen=generated_text(), cuts=FRAGMENT_CUTS, gaps=GAPS)
def test_a_time_cut_waits_until_the_queue_is_down_to_low_water(
    gen: Generated, cuts: list[int], gaps: list[int]
) -> None:
    timed = run_timed(split(gen.text, cuts), gaps, SLACK)
    queued = queued_ms_before_each(timed, SLACK.speech_ms_per_char)
    for (at, segment, buffered), before in zip(timed, queued, strict=True):
        if segment.reason == "timeout":
            # Low water, plus time for the engine to voice what is waiting (an
            # upper bound of its weight: tags and leading space counted too).
            waiting = sum(char_weight(c) for c in buffered) * SLACK.speech_ms_per_char
            bound = SLACK.low_water_ms + SLACK.synthesis_rtf * waiting
            assert before <= bound + 1e-6, (at, segment.text, before, bound)
    # The text still comes out whole and in order.
    if timed:
        assert "".join(s.text for _, s, _ in timed) == gen.text[: timed[-1][1].end]


@settings(max_examples=80, deadline=None)
@given(gen=generated_text(), cuts=FRAGMENT_CUTS, gaps=GAPS)
def test_the_first_segment_is_cut_as_early_as_without_slack(
    gen: Generated, cuts: list[int], gaps: list[int]
) -> None:
    chunks = split(gen.text, cuts)
    with_slack = run_timed(chunks, gaps, SLACK)
    without = run_timed(chunks, gaps, NO_SLACK)
    assert bool(with_slack) == bool(without)
    if with_slack:
        (at, first, _), (at_plain, first_plain, _) = with_slack[0], without[0]
        assert (at, first.text, first.reason) == (at_plain, first_plain.text, first_plain.reason)


@settings(max_examples=60, deadline=None)
@given(gen=generated_text(), cuts=FRAGMENT_CUTS, gaps=GAPS)
def test_without_slack_the_time_rule_is_the_plain_buffer_delay(
    gen: Generated, cuts: list[int], gaps: list[int]
) -> None:
    seg = TextSegmenter(NO_SLACK)
    now = 0.0
    for chunk, gap in zip(split(gen.text, cuts), gaps, strict=False):
        seg.feed(chunk, now)
        deadline = seg.next_deadline_ms()
        first = seg._first_spoken_arrival()
        if deadline is not None:
            assert first is not None and deadline == first + NO_SLACK.max_buffer_delay_ms
        now += gap
        seg.poll(now)


def test_queued_audio_postpones_the_time_cut_until_low_water() -> None:
    seg = TextSegmenter(SLACK)
    # A long first sentence is cut at once: ~3.1 s of queued audio (56 weight x 55 ms).
    first = seg.feed("This is the first sentence and it is fairly long indeed. And", 0)
    assert [s.reason for s in first] == ["sentence"]
    ends_at = spoken_weight(first[0].text) * SLACK.speech_ms_per_char

    def lead(waiting: str) -> float:  # low water plus time to voice the waiting text
        weight = sum(char_weight(c) for c in waiting)
        return SLACK.low_water_ms + SLACK.synthesis_rtf * weight * SLACK.speech_ms_per_char

    seg.feed(" then", 100)
    # Without slack the words would be cut at 250 ms; here they wait for the queue.
    assert seg.next_deadline_ms() == ends_at - lead(" And then")
    assert seg.poll(250) == []
    assert seg.feed(" some more words, arriving slowly enough to", 600) == []
    waiting = " And then some more words, arriving slowly enough to"
    deadline = ends_at - lead(waiting)  # more text waiting: the cut comes sooner
    assert seg.next_deadline_ms() == deadline
    assert seg.poll(deadline - 1) == []
    due = seg.poll(deadline)
    assert [(s.text, s.reason) for s in due] == [
        (" And then some more words, arriving slowly enough", "timeout")
    ]


@pytest.mark.parametrize("rate", [8.0, 30.0])
def test_llm_paced_replies_give_fewer_one_and_two_word_pieces(rate: float) -> None:
    def short_pieces(config: SegmenterConfig) -> tuple[int, int]:
        later = [
            t.segment.speech_text for text in REPLIES for t in simulate(text, rate, config)[1:]
        ]
        return sum(1 for text in later if len(text.split()) <= 2), len(later)

    short_plain, count_plain = short_pieces(NO_SLACK)
    short_slack, count_slack = short_pieces(SLACK)
    assert count_slack < count_plain
    assert short_slack <= short_plain // 2, (short_slack, short_plain)
    for text in REPLIES:  # the first segment (TTFA) is the same
        assert simulate(text, rate, SLACK)[0] == simulate(text, rate, NO_SLACK)[0]


@pytest.mark.parametrize("field", ["speech_ms_per_char", "low_water_ms", "max_buffer_delay_ms"])
def test_negative_slack_settings_are_refused(field: str) -> None:
    with pytest.raises(SegmenterError):
        SegmenterConfig(**{field: -1})
