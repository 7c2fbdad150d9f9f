"""The playback simulator: exact table-driven cases and invariants."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.playback import PlaybackOrderError, PlaybackSimulator, Stall, simulate

# (chunks as (arrival_s, duration_s), prebuffer_s, expected stalls, expected end_s, min_lead_s)
CASES = [
    pytest.param([], 0.0, [], None, None, id="nothing"),
    pytest.param([(1.0, 0.5)], 0.0, [], 1.5, None, id="one-chunk"),
    # back-to-back: each chunk lands exactly as the previous one finishes
    pytest.param([(0.0, 0.5), (0.5, 0.5), (1.0, 0.5)], 0.0, [], 1.5, 0.0, id="just-in-time"),
    # a burst: everything queued at once, no stall
    pytest.param([(0.0, 0.25), (0.0, 0.25), (0.0, 0.25)], 0.0, [], 0.75, 0.25, id="burst"),
    # second chunk 0.125 s late: one stall, playback resumes from its arrival
    pytest.param(
        [(0.0, 0.5), (0.625, 0.5), (1.0, 0.25)],
        0.0,
        [Stall(at_s=0.5, duration_s=0.125, chunk_index=1)],
        1.375,
        -0.125,
        id="one-stall",
    ),
    # the same arrivals with a 0.25 s jitter buffer never run dry
    pytest.param([(0.0, 0.5), (0.625, 0.5), (1.0, 0.25)], 0.25, [], 1.5, 0.125, id="prebuffer"),
    # two stalls, one short (not an underrun), one long
    pytest.param(
        [(0.0, 0.25), (0.3125, 0.25), (1.0, 0.25)],
        0.0,
        [
            Stall(at_s=0.25, duration_s=0.0625, chunk_index=1),
            Stall(at_s=0.5625, duration_s=0.4375, chunk_index=2),
        ],
        1.25,
        -0.4375,
        id="short-and-long-stall",
    ),
    # zero-length chunks move nothing
    pytest.param([(0.0, 0.0), (0.0, 0.5)], 0.0, [], 0.5, 0.0, id="empty-chunk"),
]


@pytest.mark.parametrize(("chunks", "prebuffer", "stalls", "end_s", "min_lead"), CASES)
def test_playback_table(
    chunks: list[tuple[float, float]],
    prebuffer: float,
    stalls: list[Stall],
    end_s: float | None,
    min_lead: float | None,
) -> None:
    report = simulate(chunks, prebuffer_s=prebuffer)
    assert report.stalls == stalls
    assert report.end_s == end_s
    assert report.min_lead_s == min_lead
    assert report.chunks == len(chunks)


def test_underrun_threshold_is_strict() -> None:
    # stalls of exactly 0.125 s and 0.0625 s with a 0.125 s threshold: neither is an underrun
    chunks = [(0.0, 0.25), (0.375, 0.25), (0.6875, 0.25)]
    report = simulate(chunks, underrun_threshold_s=0.125)
    assert [s.duration_s for s in report.stalls] == [0.125, 0.0625]
    assert report.underruns == []
    assert report.stall_s == 0.1875
    report = simulate(chunks, underrun_threshold_s=0.0625)
    assert [s.duration_s for s in report.underruns] == [0.125]
    assert report.underrun_s == 0.125


def test_default_threshold_is_100_ms() -> None:
    report = simulate([(0.0, 0.25), (0.375, 0.25), (0.7, 0.25), (0.9, 0.1)])
    assert [round(s.duration_s, 9) for s in report.stalls] == [0.125, 0.075]
    assert [round(s.duration_s, 9) for s in report.underruns] == [0.125]


def test_feed_returns_the_stall_it_ended() -> None:
    sim = PlaybackSimulator()
    assert sim.feed(0.0, 0.5) is None
    assert sim.feed(0.25, 0.5) is None
    stall = sim.feed(1.5, 0.5)
    assert stall == Stall(at_s=1.0, duration_s=0.5, chunk_index=2)


def test_rejects_out_of_order_and_negative() -> None:
    sim = PlaybackSimulator()
    sim.feed(1.0, 0.5)
    with pytest.raises(PlaybackOrderError):
        sim.feed(0.5, 0.5)
    with pytest.raises(PlaybackOrderError):
        sim.feed(2.0, -0.1)
    with pytest.raises(ValueError):
        PlaybackSimulator(prebuffer_s=-1)


dyadic = st.integers(0, 4096).map(lambda k: k / 64)


@given(st.lists(st.tuples(dyadic, dyadic), min_size=1, max_size=40), st.sampled_from([0.0, 0.25]))
def test_wall_time_is_audio_plus_stalls(pairs: list[tuple[float, float]], prebuffer: float) -> None:
    arrivals = sorted(a for a, _ in pairs)
    chunks = [(a, d) for a, (_, d) in zip(arrivals, pairs, strict=True)]
    report = simulate(chunks, prebuffer_s=prebuffer)
    assert report.start_s is not None and report.end_s is not None
    # playback time = audio played + time spent waiting on a dry buffer (exact with dyadics)
    assert report.end_s - report.start_s == report.audio_s + report.stall_s
    assert all(s.duration_s > 0 for s in report.stalls)
    assert (report.min_lead_s is not None and report.min_lead_s < 0) == bool(report.stalls)
    # the last sample cannot play before the last chunk has arrived
    assert report.end_s >= arrivals[-1] + chunks[-1][1]
