"""The segmenter's time rule under LLM pacing: it waits while queued audio gives slack.

A model of the listener's queue (each segment plays ``speech_ms_per_char`` per
unit of weight from when it was cut, back to back) and of the engine's backlog
(each segment made in ``synthesis_rtf`` of its duration, one after another) is
rebuilt here from the segments alone and checked against every time cut.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.segment_sim import simulate
from bench.textfeed import REPLIES
from realtime_engine.text import Segment, SegmenterConfig, TextSegmenter
from realtime_engine.text.boundaries import TAG_PATTERN, char_weight, spoken_weight
from realtime_engine.text.segmenter import SegmenterError
from tests.test_segmenter_properties import FRAGMENT_CUTS, Generated, generated_text, split

GAPS = st.lists(st.integers(0, 600), min_size=60, max_size=60)
SLACK = SegmenterConfig(
    max_buffer_delay_ms=250, speech_ms_per_char=55, low_water_ms=800, synthesis_rtf=0.7
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


def weight(text: str) -> int:
    """Weight as the segmenter counts it: every character, tags excluded."""
    return sum(char_weight(c) for c in TAG_PATTERN.sub("", text))


@settings(max_examples=80, deadline=None)
@given(gen=generated_text(), cuts=FRAGMENT_CUTS, gaps=GAPS)
def test_a_time_cut_waits_while_the_queue_has_slack(
    gen: Generated, cuts: list[int], gaps: list[int]
) -> None:
    """The listener's queue and the engine's backlog, modelled from the segments
    alone: no time cut comes before the latest safe moment, when there is one."""
    ms, rtf = SLACK.speech_ms_per_char, SLACK.synthesis_rtf
    timed = run_timed(split(gen.text, cuts), gaps, SLACK)
    plays_until = made_until = float("-inf")
    for at, segment, buffered in timed:
        if segment.reason == "timeout" and plays_until > float("-inf"):
            latest = plays_until - SLACK.low_water_ms - rtf * weight(buffered) * ms
            if made_until <= latest:  # the engine can make it in time: slack to use
                assert at >= latest - 1e-6, (at, segment.text, latest)
                # ... so the queue was down to low water plus time to make the text
                assert plays_until - at <= SLACK.low_water_ms + rtf * weight(buffered) * ms + 1e-6
        duration = weight(segment.text) * ms
        plays_until = max(plays_until, at) + duration
        made_until = max(made_until, at) + rtf * duration
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
    # A long first sentence is cut at once: ~6 s of queued audio, made in ~4 s.
    first = seg.feed(
        "This is the first sentence and it is fairly long indeed so that it keeps "
        "the listener busy for quite a good while. And",
        0,
    )
    assert [s.reason for s in first] == ["sentence"]
    duration = spoken_weight(first[0].text) * SLACK.speech_ms_per_char
    ends_at, made_at = duration, SLACK.synthesis_rtf * duration

    def latest_safe_cut(waiting: str) -> float:
        weight = sum(char_weight(c) for c in waiting)
        making = SLACK.synthesis_rtf * weight * SLACK.speech_ms_per_char
        return ends_at - SLACK.low_water_ms - making

    seg.feed(" then", 100)
    # Without slack the words would be cut at 250 ms; here they wait for the queue.
    assert latest_safe_cut(" And then") > made_at
    assert seg.next_deadline_ms() == latest_safe_cut(" And then")
    assert seg.poll(250) == []
    assert seg.feed(" some more", 600) == []
    deadline = latest_safe_cut(" And then some more")  # more text waiting: sooner
    assert seg.next_deadline_ms() == deadline
    assert seg.poll(deadline - 1) == []
    assert [(s.text, s.reason) for s in seg.poll(deadline)] == [(" And then some", "timeout")]
    # Text the engine could not make in time behind its backlog: no slack, cut at once.
    long_tail = " words that go on and on and on for so long that the engine cannot keep up"
    assert latest_safe_cut(" more" + long_tail) < made_at
    cut = seg.feed(long_tail + " now", deadline + 10)
    assert [s.reason for s in cut] == ["timeout"]


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
    assert short_slack <= max(1, short_plain // 2), (short_slack, short_plain)
    for text in REPLIES:  # the first segment (TTFA) is the same
        assert simulate(text, rate, SLACK)[0] == simulate(text, rate, NO_SLACK)[0]


@pytest.mark.parametrize("field", ["speech_ms_per_char", "low_water_ms", "max_buffer_delay_ms"])
def test_negative_slack_settings_are_refused(field: str) -> None:
    with pytest.raises(SegmenterError):
        SegmenterConfig(**{field: -1})
