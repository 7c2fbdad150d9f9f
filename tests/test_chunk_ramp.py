"""Chunk-size ramp: after the first chunk, sizes grow geometrically so the
client's playback buffer grows instead of draining.

The playback simulator drives the real StreamingDecoder with rows at a fixed
rate and plays the chunks as a client would; the ramp must leave no underrun
after the first chunk while the talker runs at >= ``chunk_growth`` x real
time, and jumping straight to ``chunk_frames`` must stall."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime_engine.codec.errors import InvalidChunkingError
from realtime_engine.codec.playback import (
    FRAME_S,
    REAL_TIME_ROWS_PER_S,
    ChunkArrival,
    chunk_arrivals,
    simulate_playback,
)
from realtime_engine.codec.presets import (
    PRESETS,
    chunk_schedule,
    first_chunk_rows,
    next_chunk_frames,
    validate_chunking,
)
from realtime_engine.engines.base import ChunkingParams

ramped = st.builds(
    ChunkingParams,
    first_chunk_frames=st.integers(1, 8),
    chunk_frames=st.integers(1, 40),
    left_context_frames=st.integers(0, 14),
    right_holdback_frames=st.integers(0, 12),
    chunk_growth=st.floats(1.0, 4.0),
)


def with_growth(name: str, growth: float | None) -> ChunkingParams:
    return dataclasses.replace(PRESETS[name], chunk_growth=growth)


# -- the schedule ----------------------------------------------------------


def test_doubling_ramp_of_the_balanced_preset() -> None:
    # F = 2, g = 2: n <= 2 + S -> 2, 4 (S=2), 8 (S=6), 16 capped at 15 (S=14).
    assert chunk_schedule(with_growth("balanced", 2.0)) == [2, 4, 8, 15]


def test_without_ramp_the_second_chunk_is_steady() -> None:
    for params in PRESETS.values():
        plain = dataclasses.replace(params, chunk_growth=None)
        assert chunk_schedule(plain) == [params.first_chunk_frames, params.chunk_frames]


@settings(max_examples=300, deadline=None)
@given(params=ramped)
def test_each_chunk_fits_the_buffer_at_the_assumed_speed(params: ChunkingParams) -> None:
    sizes = chunk_schedule(params, max_chunks=200)
    first, steady, growth = params.first_chunk_frames, params.chunk_frames, params.chunk_growth
    assert growth is not None
    assert sizes[0] == first
    emitted = first
    for previous, size in itertools.pairwise(sizes):
        budget = first + (growth - 1.0) * emitted  # what the client's buffer covers
        assert size <= budget + 1e-9
        assert size == steady or size > budget - 1  # as large as allowed (floor)
        assert size >= min(previous, steady)  # never shrinks
        emitted += size
    if growth >= 1.1 or first >= steady:
        assert sizes[-1] == steady or sizes == [first]  # the ramp ends at the steady size
        assert next_chunk_frames(params, 10**6) == steady
    if growth == 1.0:
        assert next_chunk_frames(params, 10**6) == min(first, steady)  # real time: no growth


def test_real_time_growth_keeps_the_first_size() -> None:
    params = with_growth("balanced", 1.0)
    assert set(chunk_schedule(params)) == {params.first_chunk_frames}


@pytest.mark.parametrize("growth", [0.0, 0.99, math.nan, math.inf, -2.0])
def test_invalid_growth_is_refused(growth: float) -> None:
    with pytest.raises(InvalidChunkingError):
        validate_chunking(with_growth("latency", growth))


# -- the playback simulator ------------------------------------------------


def test_simulator_on_hand_made_arrivals() -> None:
    on_time = simulate_playback([ChunkArrival(0.5, 2), ChunkArrival(0.58, 3), ChunkArrival(0.6, 1)])
    assert on_time.underruns == 0 and on_time.stall_s == 0.0
    assert on_time.first_audio_s == 0.5
    assert on_time.audio_s == pytest.approx(6 * FRAME_S)
    assert on_time.min_buffer_s == pytest.approx(0.0)  # second chunk came exactly in time
    late = simulate_playback([ChunkArrival(0.0, 2), ChunkArrival(0.1, 1), ChunkArrival(0.3, 1)])
    assert late.underruns == 2
    assert late.stall_s == pytest.approx(0.02 + 0.16)
    assert late.longest_stall_s == pytest.approx(0.16)
    assert simulate_playback([ChunkArrival(1.0, 4)]).min_buffer_s is None
    with pytest.raises(ValueError):
        simulate_playback([])


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_first_audio_does_not_depend_on_the_ramp(name: str) -> None:
    for growth in (None, 1.0, 1.5, 3.0):
        arrivals = chunk_arrivals(with_growth(name, growth), 80, REAL_TIME_ROWS_PER_S)
        assert arrivals[0].frames == PRESETS[name].first_chunk_frames
        assert arrivals[0].at_s == pytest.approx(first_chunk_rows(PRESETS[name]) * FRAME_S)
        assert sum(a.frames for a in arrivals) == 80


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("speed", [1.0, 1.1, 1.25, 1.5])
def test_ramp_never_underruns_and_no_ramp_stalls(name: str, speed: float) -> None:
    """The fix: at 1.0x-1.5x real time a ramp with growth <= speed plays
    without a pause, and the plain schedule (first chunk, then steady)
    pauses right after the first chunk."""
    rows_per_s = speed * REAL_TIME_ROWS_PER_S
    frames = 150  # 6 s: the ramp reaches the steady size well before the end
    ramp = simulate_playback(chunk_arrivals(with_growth(name, speed), frames, rows_per_s))
    assert ramp.underruns == 0 and ramp.stall_s == 0.0
    plain_arrivals = chunk_arrivals(with_growth(name, None), frames, rows_per_s)
    plain = simulate_playback(plain_arrivals)
    p = PRESETS[name]
    # The second chunk needs chunk_frames more rows while only the first
    # chunk's audio plays.
    expected = p.chunk_frames / rows_per_s - p.first_chunk_frames * FRAME_S
    assert plain.underruns >= 1 and plain.longest_stall_s == pytest.approx(expected)
    assert plain.longest_stall_s > 0.1
    assert ramp.first_audio_s == plain.first_audio_s


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("speed", [1.5, 2.0, 3.0, 10.0])
def test_default_ramp_is_safe_from_one_and_a_half_times_real_time(name: str, speed: float) -> None:
    params = PRESETS[name]
    assert params.chunk_growth == 1.5
    report = simulate_playback(chunk_arrivals(params, 200, speed * REAL_TIME_ROWS_PER_S))
    assert report.underruns == 0


def test_benchmarked_stall_of_the_plain_balanced_schedule() -> None:
    # A talker at ~3x real time: 15 rows take 200 ms, 80 ms of audio is queued.
    rows_per_s = 3.0 * REAL_TIME_ROWS_PER_S
    plain = simulate_playback(chunk_arrivals(with_growth("balanced", None), 100, rows_per_s))
    assert plain.longest_stall_s == pytest.approx(0.2 - 0.08)
    ramp = simulate_playback(chunk_arrivals(PRESETS["balanced"], 100, rows_per_s))
    assert ramp.underruns == 0 and ramp.min_buffer_s is not None and ramp.min_buffer_s > 0


@settings(max_examples=150, deadline=None)
@given(
    params=ramped,
    frames=st.integers(1, 160),
    margin=st.floats(1.0, 3.0),
    decode_s=st.floats(0.0, 0.05),
)
def test_no_underrun_while_the_talker_keeps_up_with_the_growth(
    params: ChunkingParams, frames: int, margin: float, decode_s: float
) -> None:
    assert params.chunk_growth is not None
    rows_per_s = params.chunk_growth * margin * REAL_TIME_ROWS_PER_S
    report = simulate_playback(chunk_arrivals(params, frames, rows_per_s, decode_s))
    assert report.underruns == 0


@settings(max_examples=150, deadline=None)
@given(params=ramped, frames=st.integers(1, 120))
def test_at_real_time_any_growth_costs_its_size_in_stall(
    params: ChunkingParams, frames: int
) -> None:
    """At exactly real time the buffer never grows: the total pause is the
    largest chunk beyond the first chunk's size (the final chunk needs H
    fewer rows, as nothing is held back)."""
    arrivals = chunk_arrivals(params, frames, REAL_TIME_ROWS_PER_S)
    first = params.first_chunk_frames
    excess = [a.frames - first for a in arrivals[1:-1]]
    if len(arrivals) > 1:
        excess.append(arrivals[-1].frames - params.right_holdback_frames - first)
    expected = max([0, *excess]) * FRAME_S
    assert simulate_playback(arrivals).stall_s == pytest.approx(expected, abs=1e-9)


# -- the wire protocol -----------------------------------------------------


def test_session_chunking_carries_the_growth_to_the_engine() -> None:
    from gateway.protocol.config import Chunking, SessionConfig, apply_session_update

    session = apply_session_update(SessionConfig(), {"latency_preset": "balanced"})
    assert session.chunking is not None and session.chunking.chunk_growth == 1.5
    custom = apply_session_update(session, {"chunking": {"chunk_growth": 2.0}})
    assert custom.latency_preset == "custom" and custom.chunking is not None
    assert chunk_schedule(ChunkingParams(**custom.chunking.model_dump())) == [2, 4, 8, 15]
    plain = apply_session_update(session, {"chunking": {"chunk_growth": None}})
    assert plain.chunking is not None
    assert chunk_schedule(ChunkingParams(**plain.chunking.model_dump())) == [2, 15]
    with pytest.raises(ValueError):
        Chunking(
            first_chunk_frames=1,
            chunk_frames=10,
            left_context_frames=10,
            right_holdback_frames=2,
            chunk_growth=0.5,
        )
