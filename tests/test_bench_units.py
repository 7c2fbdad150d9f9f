"""Bench building blocks: text pacing, arrivals, per-stream derivation, windows, load loops."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.load import closed_loop, open_loop, poisson_arrivals
from bench.overhead import (
    ContextTrace,
    audio_seconds_in,
    frame_lateness,
    unique_text,
    unique_word,
)
from bench.records import ChunkArrival, StreamRecord, audio_in_window, derive
from bench.report import server_metric_summaries, summarize_level
from bench.stamping import ChunkStamp, emit_time_of, text_key
from bench.textfeed import TEXTS, schedule, tokenize


@given(st.text(max_size=300))
def test_tokens_concatenate_to_the_text(text: str) -> None:
    pieces = tokenize(text)
    assert "".join(pieces) == text
    assert all(pieces)


def test_tokenize_looks_like_llm_pieces() -> None:
    assert tokenize("Hello world, it's 1,000 km.") == [
        "Hello",
        " world",
        ",",
        " it",
        "'",
        "s",
        " 1",
        ",",
        "000",
        " km",
        ".",
    ]
    assert tokenize("extraordinary") == ["extrao", "rdinar", "y"]


@given(st.text(min_size=1, max_size=200), st.floats(1, 100))
def test_schedule_paces_tokens(text: str, rate: float) -> None:
    pieces = schedule(text, rate)
    assert "".join(p.text for p in pieces) == text
    assert [p.offset_s for p in pieces] == [i / rate for i in range(len(pieces))]


def test_schedule_all_at_once() -> None:
    assert [(p.offset_s, p.text) for p in schedule("Hi there.", None)] == [(0.0, "Hi there.")]
    assert schedule("", 30.0) == []
    with pytest.raises(ValueError):
        schedule("x", 0.0)


def test_poisson_arrivals_are_seeded_sorted_and_bounded() -> None:
    a = poisson_arrivals(5.0, 200.0, random.Random(1))
    assert a == poisson_arrivals(5.0, 200.0, random.Random(1))
    assert a == sorted(a) and a[0] > 0 and a[-1] < 200.0
    # 1000 expected arrivals: within 5 standard deviations (sqrt(1000) ~ 32)
    assert abs(len(a) - 1000) < 160
    with pytest.raises(ValueError):
        poisson_arrivals(0.0, 1.0, random.Random(0))


def _record(chunks: list[tuple[float, float]], **times: float) -> StreamRecord:
    r = StreamRecord(0, "gateway", 10, t_start=times.pop("t_start", 0.0))
    pts = 0.0
    for t, dur_ms in chunks:
        r.chunks.append(ChunkArrival(t, pts, dur_ms, 100))
        pts += dur_ms
    for k, v in times.items():
        setattr(r, k, v)
    return r


def test_derive_exact() -> None:
    r = _record(
        [(1.5, 500.0), (1.75, 500.0), (2.5, 250.0)],
        t_start=0.25,
        t_connected=0.5,
        t_first_text=1.0,
        t_first_audio_byte=1.5,
        t_first_sample=1.625,
        t_done=3.0,
    )
    r.server_metrics = {"ttfa_ms": 120.0}
    m = derive(r)
    assert m.ok
    assert (m.connect_s, m.ttfa_s, m.ttfa_decoded_s, m.server_ttfa_ms) == (0.25, 0.5, 0.625, 120.0)
    assert m.audio_s == 1.25 and m.total_s == 2.0 and m.rtf == 1.6
    assert m.gaps_s == (0.25, 0.75) and m.max_gap_s == 0.75
    # play: 1.5-2.0, 2.0-2.5 (arrived 1.75), 2.5-2.75 (arrived 2.5, just in time): no stall
    assert (m.stalls, m.underruns, m.min_lead_s) == (0, 0, 0.0)


def test_derive_places_the_first_underrun_in_the_audio() -> None:
    # 160 ms played, then the next chunk lands 340 ms after the buffer ran dry;
    # a second, shorter stall later does not move the first one.
    r = _record(
        [(1.0, 160.0), (1.5, 240.0), (1.74, 500.0), (2.3, 100.0)],
        t_first_text=0.5,
        t_done=3.0,
    )
    m = derive(r)
    assert m.underruns == 1 and m.stalls == 2
    assert m.first_underrun_audio_s == pytest.approx(0.16)
    smooth = _record([(1.0, 500.0), (1.25, 500.0)], t_first_text=0.5, t_done=2.0)
    assert derive(smooth).first_underrun_audio_s is None


def test_derive_failed_stream() -> None:
    r = _record([], t_first_text=1.0)
    r.error = "ConnectionClosedError: boom"
    m = derive(r)
    assert not m.ok and m.ttfa_s is None and m.rtf is None and m.audio_s == 0.0


def test_audio_in_window_counts_arrivals_only() -> None:
    a = _record([(0.5, 100.0), (1.0, 200.0), (2.0, 400.0)])
    b = _record([(1.5, 1000.0), (3.0, 1000.0)])
    assert audio_in_window([a, b], 1.0, 3.0) == 1.6
    assert audio_in_window([a, b], 0.0, 10.0) == 2.7


def _synthetic_stream(gen_s: float, chunk_ms: float, chunks: int):
    """A stream function that 'generates' ``chunks`` chunks, one every ``gen_s``."""

    async def stream(stream_id: int, text: str) -> StreamRecord:
        r = StreamRecord(stream_id, "gateway", len(text), t_start=time.perf_counter())
        r.t_connected = r.t_first_text = time.perf_counter()
        for i in range(chunks):
            await asyncio.sleep(gen_s)
            now = time.perf_counter()
            if r.t_first_audio_byte is None:
                r.t_first_audio_byte = r.t_first_sample = now
            r.chunks.append(ChunkArrival(now, i * chunk_ms, chunk_ms, 10))
        r.t_done = time.perf_counter()
        return r

    return stream


async def test_closed_loop_window_and_throughput() -> None:
    # each stream: 2 chunks of 200 ms audio, 50 ms apart -> 4 audio-s per s per worker
    result = await closed_loop(_synthetic_stream(0.05, 200.0, 2), 3, 0.2, 0.8, TEXTS, seed=1)
    assert result.t_window_end - result.t_window_start == pytest.approx(0.8)
    assert all(r.t_start < result.t_window_end for r in result.records)
    assert result.t_end >= result.t_window_end
    summary = summarize_level(result)
    assert summary["errors"] == 0 and summary["ok"] == summary["streams_measured"] > 0
    # The throughput is the audio that arrived inside the window, per second of
    # window; 3 workers x 4 audio-s/s = 12 at most (a busy machine only lowers it).
    in_window = audio_in_window(result.records, result.t_window_start, result.t_window_end)
    assert in_window > 0
    assert summary["throughput_audio_s_per_s"] == pytest.approx(in_window / 0.8, abs=1e-3)
    assert summary["throughput_audio_s_per_s"] <= 12.0 * 1.05
    assert summary["ttfa_ms"]["p50"] >= 50.0
    assert summary["underruns_total"] == 0


async def test_open_loop_starts_at_poisson_times() -> None:
    result = await open_loop(_synthetic_stream(0.01, 100.0, 1), 20.0, 0.1, 0.5, TEXTS, seed=3)
    expected = poisson_arrivals(20.0, 0.6, random.Random(3))
    assert len(result.records) == len(expected)
    starts = sorted(r.t_start - result.t_begin for r in result.records)
    for got, want in zip(starts, expected, strict=True):
        assert got >= want - 1e-3


def test_unique_words_are_unique_letters() -> None:
    words = [unique_word(n) for n in range(5000)]
    assert len(set(words)) == 5000
    assert all(w.isalpha() and w.islower() and len(w) >= 3 for w in words)
    assert text_key(unique_text(7, 3)) == " ".join(unique_word(21 + k) for k in range(3))


def test_frame_lateness_matches_frames_to_engine_chunks() -> None:
    # one context, two segments; 20 ms frames at 24 kHz, engine chunks of 40 ms (960 samples)
    seg_a, seg_b = "Alpha bravo.", "charlie delta"
    trace = ContextTrace(segments=[(0, seg_a), (80, seg_b)])
    trace.frames = [(10.0, 0), (10.25, 20), (10.5, 40), (10.5, 60), (11.0, 80), (11.0, 100)]
    stamps = {
        text_key(seg_a): [ChunkStamp(0, 960, 9.75), ChunkStamp(960, 960, 10.0)],
        # segment b only has one 20 ms chunk: its second frame is unmatched (silence)
        text_key(seg_b): [ChunkStamp(0, 480, 10.875)],
    }
    late, first, unmatched = frame_lateness([trace], stamps, 24000, 0.0, 100.0)
    assert late == [0.25, 0.5, 0.5, 0.5, 0.125]
    assert first == [0.25, 0.5, 0.125]
    assert unmatched == 1
    # the window excludes frames arriving outside it
    late, _, _ = frame_lateness([trace], stamps, 24000, 10.25, 10.75)
    assert late == [0.5, 0.5, 0.5]


def test_stamp_lookup() -> None:
    stamps = [ChunkStamp(0, 100, 1.0), ChunkStamp(100, 50, 2.0)]
    assert [emit_time_of(stamps, s) for s in (0, 99, 100, 149, 150)] == [1.0, 1.0, 2.0, 2.0, None]


def test_server_metric_summaries_cover_numeric_fields() -> None:
    rows: list[dict[str, Any]] = [
        {"ttfa_ms": 100.0, "queue_ms": 5.0, "segments": 2, "note": "x", "flag": True},
        {"ttfa_ms": 300.0, "queue_ms": None, "segments": 4},
    ]
    out = server_metric_summaries(rows)
    assert set(out) == {"ttfa_ms", "queue_ms", "segments"}
    assert out["ttfa_ms"]["p50"] == 200.0 and out["ttfa_ms"]["n"] == 2
    assert out["queue_ms"]["n"] == 1 and out["segments"]["max"] == 4


def test_audio_seconds_in_window() -> None:
    a = ContextTrace(frames=[(1.0, 0), (2.0, 20), (3.0, 40)], audio_ms=[20.0, 20.0, 40.0])
    b = ContextTrace(frames=[(2.5, 0)], audio_ms=[100.0])
    assert audio_seconds_in([a, b], 2.0, 3.0) == pytest.approx(0.12)
    assert audio_seconds_in([a, b], 0.0, 10.0) == pytest.approx(0.18)
