"""Playback pacing: which audio streams sit out a decode step, and what that
does to a simulated engine's streams on a fake clock."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime_engine.codec.presets import next_chunk_frames
from realtime_engine.format import DELAY_ROWS, FRAMES_PER_SECOND, PRESETS, ChunkingParams
from realtime_engine.talker.pacing import (
    SUGGESTED_MAX_DECODE_BATCH,
    PacingConfigError,
    PacingPolicy,
    RunningStream,
    buffered_s,
    streams_to_hold,
    unsent_frames_bound,
)
from realtime_engine.talker.vllm_engine_config import PACED_SCHEDULER, talker_engine_args

NOW = 100.0
EXACT_FIRST_CHUNK_ROWS = DELAY_ROWS + 4 + 10
EXACT_UNSENT = unsent_frames_bound(PRESETS["exact"])

streams = st.lists(
    st.builds(
        RunningStream,
        rows=st.integers(0, 600),
        first_row_at=st.one_of(st.none(), st.floats(NOW - 20.0, NOW)),
        unsent_frames=st.one_of(st.none(), st.integers(0, 40)),
    ),
    max_size=40,
)
policies = st.builds(
    PacingPolicy, max_decode_batch=st.integers(0, 40), min_buffer_s=st.floats(0.0, 5.0)
)


def test_buffered_audio_is_what_was_sent_less_what_played_since_the_first_row() -> None:
    # 57 rows = 50 frames after the delay = 2 s of audio; 0.5 s played.
    stream = RunningStream(rows=50 + DELAY_ROWS, first_row_at=NOW - 0.5)
    assert buffered_s(stream, NOW) == pytest.approx(50 / FRAMES_PER_SECOND - 0.5)
    # Of those 50 frames, up to 34 (`exact`: holdback 10, chunks of up to 25)
    # may not have left yet.
    unsent = unsent_frames_bound(PRESETS["exact"])
    assert unsent == 34
    sent = RunningStream(rows=50 + DELAY_ROWS, first_row_at=NOW - 0.5, unsent_frames=unsent)
    assert buffered_s(sent, NOW) == pytest.approx(16 / FRAMES_PER_SECOND - 0.5)
    assert buffered_s(RunningStream(rows=3, first_row_at=NOW - 1.0), NOW) == pytest.approx(-1.0)
    assert buffered_s(RunningStream(rows=0, first_row_at=None), NOW) == 0.0


@settings(max_examples=200, deadline=None)
@given(
    chunking=st.one_of(
        st.sampled_from(list(PRESETS.values())),
        st.builds(
            ChunkingParams,
            first_chunk_frames=st.integers(1, 8),
            chunk_frames=st.integers(1, 40),
            left_context_frames=st.just(0),
            right_holdback_frames=st.integers(0, 12),
            chunk_growth=st.one_of(st.none(), st.floats(1.0, 3.0)),
        ),
    ),
    frames=st.integers(0, 2000),
)
def test_no_more_frames_than_the_bound_wait_unsent_under_the_real_chunk_schedule(
    chunking: ChunkingParams, frames: int
) -> None:
    """Replays the chunk planner's rule (``SlotCodec._plan``) frame by frame, as
    the engine plans after every step: once the frames past the holdback
    reach the next chunk's size (``next_chunk_frames``), all of them leave."""
    emitted = 0
    for complete in range(frames + 1):
        pending = complete - chunking.right_holdback_frames - emitted
        if pending > 0 and pending >= next_chunk_frames(chunking, emitted):
            emitted += pending
    assert frames - emitted <= unsent_frames_bound(chunking)


@settings(max_examples=300, deadline=None)
@given(policy=policies, running=streams)
def test_held_streams_are_the_most_buffered_audio_above_the_floor(
    policy: PacingPolicy, running: list[RunningStream]
) -> None:
    held = streams_to_hold(policy, running, NOW)
    assert held == sorted(set(held))
    if not policy.active or len(running) <= policy.max_decode_batch:
        assert held == []
        return
    eligible = [
        i
        for i, s in enumerate(running)
        if s.unsent_frames is not None
        and s.first_row_at is not None
        and buffered_s(s, NOW) >= policy.min_buffer_s
    ]
    # As many as bring the batch to the cap, or every eligible one if fewer.
    assert len(held) == min(len(running) - policy.max_decode_batch, len(eligible))
    assert set(held) <= set(eligible)
    # No stream left running has more buffered than one held.
    if held:
        least_held = min(buffered_s(running[i], NOW) for i in held)
        assert all(buffered_s(running[i], NOW) <= least_held for i in eligible if i not in held)


@dataclass
class SimStream:
    rows_total: int
    started_at: float
    rows: int = 0
    first_row_at: float | None = None
    lowest_buffer_after_reaching_floor: float | None = None
    first_audio_at: float | None = None  # when `exact`'s first chunk is due

    @property
    def done(self) -> bool:
        return self.rows >= self.rows_total


def simulate(
    policy: PacingPolicy, arrivals: list[float], lengths: list[int]
) -> tuple[list[SimStream], int]:
    """Streams decoding on a fake clock, a step 4 ms + 0.25 ms a decoding stream;
    checks each step's choice and returns the streams and the request-steps held."""
    sims = [SimStream(n, t) for n, t in zip(lengths, sorted(arrivals), strict=False)]
    now, held_total = 0.0, 0
    while not all(s.done for s in sims):
        live = [s for s in sims if s.started_at <= now and not s.done]
        views = [RunningStream(s.rows, s.first_row_at, EXACT_UNSENT) for s in live]
        held = set(streams_to_hold(policy, views, now))
        held_total += len(held)
        for i in held:
            assert buffered_s(views[i], now) >= policy.min_buffer_s
            assert live[i].first_row_at is not None  # newcomers always decode
        decoding = [s for i, s in enumerate(live) if i not in held]
        now += 0.004 + 0.00025 * len(decoding) if live else 0.01
        for s in decoding:
            s.rows += 1
            if s.first_row_at is None:
                s.first_row_at = now
            if s.rows == EXACT_FIRST_CHUNK_ROWS:
                s.first_audio_at = now
        for s in live:
            if s.first_row_at is None:
                continue
            buffer = buffered_s(RunningStream(s.rows, s.first_row_at, EXACT_UNSENT), now)
            seen = s.lowest_buffer_after_reaching_floor
            if seen is not None or buffer >= policy.min_buffer_s:
                s.lowest_buffer_after_reaching_floor = buffer if seen is None else min(seen, buffer)
    return sims, held_total


@settings(max_examples=25, deadline=None)
@given(
    cap=st.integers(4, 12),
    arrivals=st.lists(st.floats(0.0, 3.0), min_size=1, max_size=30),
    lengths=st.lists(st.integers(60, 400), min_size=30, max_size=30),
)
def test_a_simulated_engine_never_lets_a_buffered_stream_run_dry(
    cap: int, arrivals: list[float], lengths: list[int]
) -> None:
    """At a cap of 4 the simulated engine makes 4 / 0.005 = 800 rows a second,
    above the 30 x 25 = 750 that 30 streams playing in real time need, so a
    stream that once had the floor's buffer never falls more than about a step
    under it."""
    policy = PacingPolicy(max_decode_batch=cap, min_buffer_s=1.0)
    sims, _ = simulate(policy, arrivals, lengths)
    for s in sims:
        if s.lowest_buffer_after_reaching_floor is not None:
            assert s.lowest_buffer_after_reaching_floor >= policy.min_buffer_s - 0.02


def test_pacing_shortens_the_steps_newcomers_wait_through() -> None:
    """Twenty long streams decoding, then ten more arrive: paced at 8, the
    newcomers' first chunks (`exact`: 21 rows) are due sooner than unpaced."""
    arrivals = [0.0] * 20 + [2.0] * 10
    lengths = [1500] * 20 + [100] * 10

    def newcomers_first_audio(policy: PacingPolicy) -> tuple[float, int]:
        sims, held = simulate(policy, arrivals, lengths)
        late = [s for s in sims if s.started_at == 2.0]
        assert all(s.first_audio_at is not None for s in late)
        return max(s.first_audio_at or 0.0 for s in late), held

    paced, held = newcomers_first_audio(PacingPolicy(max_decode_batch=8))
    unpaced, none_held = newcomers_first_audio(PacingPolicy(max_decode_batch=0))
    assert none_held == 0 and held > 0
    assert paced < unpaced


def test_the_settings_come_from_the_engine_config_and_bad_ones_fail() -> None:
    assert PacingPolicy.from_config(None) == PacingPolicy()
    assert PacingPolicy().active is False  # off unless asked for
    assert PacingPolicy.from_config({"max_decode_batch": 0}).active is False
    assert PacingPolicy.from_config({"min_buffer_s": 2}).min_buffer_s == 2.0
    for bad in ([], {"max_decode_batch": -1}, {"min_buffer_s": "x"}, {"cap": 3}):
        with pytest.raises(PacingConfigError):
            PacingPolicy.from_config(bad)  # type: ignore[arg-type]


def test_the_talker_engine_is_paced_when_asked_and_checks_its_pacing_settings() -> None:
    def engine_args(**pacing: object) -> dict[str, object]:
        return talker_engine_args(
            "/models/higgs",
            enforce_eager=True,
            codec_precision="fp32",
            codec_batch=8,
            additional_config={"higgs_pacing": pacing},
        )

    unpaced = talker_engine_args(
        "/models/higgs", enforce_eager=True, codec_precision="fp32", codec_batch=8
    )
    assert "scheduler_cls" not in unpaced  # vLLM's own scheduler, as it comes
    assert "scheduler_cls" not in engine_args(max_decode_batch=0)
    assert engine_args(max_decode_batch=SUGGESTED_MAX_DECODE_BATCH)["scheduler_cls"] == (
        PACED_SCHEDULER
    )
    with pytest.raises(ValueError, match="pacing"):
        engine_args(max_decode_batch=-4)
