"""StreamingDecoder: chunked output equals whole-utterance decoding when the
holdback covers the receptive field, it is causal, ends cleanly, batches
across streams, and refuses misuse.

Exactness is checked with the tiny codec in float64, where it holds to
float32 output rounding; tests/test_stream_core.py covers the float32
rounding of the stateful codec itself.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from streaming_support import (
    EXACT,
    HOP,
    any_chunking,
    exact_chunking,
    peak_error,
    stream,
    utterance_rows,
    whole,
)

from realtime_engine.codec.decoder import CodecDecoder
from realtime_engine.codec.delay import apply_delay
from realtime_engine.codec.errors import CodecInputError, InvalidChunkingError, StreamStateError
from realtime_engine.codec.presets import (
    PRESETS,
    chunk_schedule,
    first_chunk_rows,
    get_preset,
    is_exact,
)
from realtime_engine.codec.stream_core import StreamingCodec
from realtime_engine.codec.streaming import (
    DecodedJob,
    DecodeJob,
    StreamingDecoder,
    clean_codes,
    rows_to_frames,
    run_jobs,
)
from realtime_engine.format import BOC, EOC, ChunkingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@settings(max_examples=40, deadline=None)
@given(
    frames=st.integers(0, 60),
    seed=st.integers(0, 2**16),
    padding=st.sampled_from([0.0, 0.1]),
    params=exact_chunking,
)
def test_exact_holdback_equals_whole_decode(
    core: StreamingCodec,
    codec64: CodecDecoder,
    frames: int,
    seed: int,
    padding: float,
    params: ChunkingParams,
) -> None:
    rows = utterance_rows(frames, seed, padding)
    out = stream(StreamingDecoder(core, params), rows)
    assert out.size == HOP * frames
    assert peak_error(out, whole(codec64, rows)) < EXACT


@settings(max_examples=10, deadline=None)
@given(frames=st.integers(1, 45), seed=st.integers(0, 2**16), params=exact_chunking)
def test_exact_holdback_equals_whole_decode_fp32(
    tiny_codec: CodecDecoder, frames: int, seed: int, params: ChunkingParams
) -> None:
    rows = utterance_rows(frames, seed, padding=0.05)
    out = stream(StreamingDecoder(tiny_codec, params), rows)
    assert out.size == HOP * frames
    # float32 rounding of two different kernels (see tests/test_stream_core.py)
    assert peak_error(out, whole(tiny_codec, rows)) < 2e-5


@pytest.mark.parametrize("frames", [1, 2, 9, 10, 11, 21, 37])
def test_chunk_size_one_crossing_both_utterance_edges(
    core: StreamingCodec, codec64: CodecDecoder, frames: int
) -> None:
    params = ChunkingParams(1, 1, 10, 10)
    rows = utterance_rows(frames, seed=frames)
    out = stream(StreamingDecoder(core, params), rows)
    assert peak_error(out, whole(codec64, rows)) < EXACT


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_exact_only_where_they_claim(
    core: StreamingCodec, codec64: CodecDecoder, name: str
) -> None:
    params = get_preset(name)
    rows = utterance_rows(70, seed=1)
    out = stream(StreamingDecoder(core, params), rows)
    err = peak_error(out, whole(codec64, rows))
    assert out.size == 70 * HOP
    if is_exact(params):
        assert err < EXACT
    else:
        assert err > 1e-4  # short holdback is measurably inexact


@pytest.mark.parametrize("holdback", [0, 2, 4, 9])
def test_short_holdback_edges_are_the_decode_of_the_frames_so_far(
    core: StreamingCodec, codec64: CodecDecoder, holdback: int
) -> None:
    """A chunk's speculative right edge is what a whole decode of the frames
    available at that moment gives; committed audio is the full decode."""
    params = ChunkingParams(3, 5, 0, holdback, chunk_growth=None)
    rows = utterance_rows(40, seed=holdback)
    decoder = StreamingDecoder(core, params)
    reference = whole(codec64, rows)
    for r, row in enumerate(rows):
        for chunk in decoder.feed(row):
            end = decoder.emitted_frames
            start = end - chunk.size // HOP
            so_far = whole(codec64, rows[: r + 1], stop_at_eoc=False)  # frames available now
            assert peak_error(chunk, so_far[start * HOP : end * HOP]) < EXACT
            # a chunk's first 10 - H frames are committed: the full decode
            safe = min(end, max(start, end - 10 + holdback))
            committed = reference[start * HOP : safe * HOP]
            assert peak_error(chunk[: committed.size], committed) < EXACT * 10
    decoder.finish()


@settings(max_examples=30, deadline=None)
@given(frames=st.integers(0, 50), cut=st.integers(0, 70), params=any_chunking)
def test_chunks_depend_only_on_rows_seen(
    core: StreamingCodec, frames: int, cut: int, params: ChunkingParams
) -> None:
    """Output so far never changes when more rows arrive: a decoder fed only
    a prefix (not finished) emits exactly the chunks the full run had
    emitted at that point."""
    rows = utterance_rows(frames, seed=frames)
    cut = min(cut, len(rows))
    full = StreamingDecoder(core, params)
    chunks: list[np.ndarray] = []
    for row in rows[:cut]:
        chunks += full.feed(row)
    snapshot = [c.copy() for c in chunks]
    for row in rows[cut:]:
        chunks += full.feed(row)
    chunks += full.finish()
    prefix = StreamingDecoder(core, params)
    prefix_chunks = [c for row in rows[:cut] for c in prefix.feed(row)]
    prefix.close()
    assert len(prefix_chunks) == len(snapshot)
    for a, b, c in zip(prefix_chunks, snapshot, chunks, strict=False):
        assert np.array_equal(a, b) and np.array_equal(b, c)
    assert sum(c.size for c in chunks) == HOP * frames


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_first_chunk_arrives_after_delay_first_chunk_and_holdback(
    core: StreamingCodec, name: str
) -> None:
    params = get_preset(name)
    decoder = StreamingDecoder(core, params)
    rows = utterance_rows(40, seed=2)
    first = next(i + 1 for i, row in enumerate(rows) if decoder.feed(row))
    assert (
        first
        == first_chunk_rows(params)
        == 7 + params.first_chunk_frames + (params.right_holdback_frames)
    )
    assert decoder.emitted_frames == params.first_chunk_frames
    decoder.close()


def test_every_frame_is_stepped_once_and_steady_steps_are_equal(core: StreamingCodec) -> None:
    params = get_preset("balanced")
    decoder = StreamingDecoder(core, params)
    jobs: list[DecodeJob] = []
    for row in utterance_rows(100, seed=3):
        jobs += decoder.plan_feed(row)
    jobs += decoder.plan_finish()
    assert jobs[0].new_frames == params.first_chunk_frames + params.right_holdback_frames
    assert jobs[-1].final and not any(j.final for j in jobs[:-1])
    assert [j.first_frame for j in jobs] == [0, *np.cumsum([j.new_frames for j in jobs[:-1]])]
    assert sum(j.new_frames for j in jobs) == 100  # each frame once: no window overlap
    ramp = len(chunk_schedule(params)) - 1  # chunks before the first steady-size one
    steady = jobs[ramp:-1]
    assert steady and {j.emit_frames for j in steady} == {params.chunk_frames}
    assert {j.new_frames for j in steady} == {params.chunk_frames}
    assert all(j.speculative for j in jobs[:-1])  # H = 4 < the receptive field
    assert sum(j.emit_frames for j in jobs) == 100
    decoder.close()


def test_batched_streams_equal_one_by_one(codec64: CodecDecoder) -> None:
    params = get_preset("latency")
    lengths = [30, 30, 18, 41]
    all_rows = [utterance_rows(n, seed=10 + i) for i, n in enumerate(lengths)]
    alone = StreamingCodec(codec64, 1)
    singles = [stream(StreamingDecoder(alone, params), r) for r in all_rows]

    calls: list[int] = []

    class CountingCodec(StreamingCodec):
        def step(self, slots: object, codes: torch.Tensor) -> torch.Tensor:
            calls.append(codes.shape[0])
            return super().step(slots, codes)  # type: ignore[arg-type]

    shared = CountingCodec(codec64, 1)  # grows to 4 slots
    decoders = [StreamingDecoder(shared, params) for _ in lengths]
    assert len({d.slot for d in decoders}) == len(lengths)
    outputs: list[list[np.ndarray]] = [[] for _ in lengths]
    for step in range(max(len(r) for r in all_rows) + 1):
        work = []
        for i, (decoder, rows) in enumerate(zip(decoders, all_rows, strict=True)):
            jobs = decoder.plan_feed(rows[step]) if step < len(rows) else decoder.plan_finish()
            work += [(i, decoder, job) for job in jobs]
        chunks = run_jobs([(d, j) for _, d, j in work])
        for (i, _, _), chunk in zip(work, chunks, strict=True):
            outputs[i].append(chunk)
    for single, parts in zip(singles, outputs, strict=True):
        assert peak_error(np.concatenate(parts), single) < EXACT
    assert max(calls) > 1  # steps of different streams shared a call
    assert shared.max_slots >= len(lengths) and shared.slots.in_use == 0


def test_without_stop_at_eoc_every_complete_frame_is_decoded(core: StreamingCodec) -> None:
    rows = np.concatenate([utterance_rows(6, seed=5), np.zeros((4, 8), np.int64)])
    decoder = StreamingDecoder(core, get_preset("exact"), stop_at_eoc=False)
    assert stream(decoder, rows).size == (len(rows) - 7) * HOP


@pytest.mark.parametrize("rows", [0, 1, 7])
def test_fewer_than_eight_rows_give_no_audio(core: StreamingCodec, rows: int) -> None:
    decoder = StreamingDecoder(core, get_preset("latency"))
    assert stream(decoder, np.full((rows, 8), BOC, np.int64)).size == 0
    assert core.slots.in_use == 0


def test_padding_codes_become_zero_never_clamped() -> None:
    codes = np.array([[0, 1023, 1024, 1025, -1, 5]])
    assert clean_codes(codes).tolist() == [[0, 1023, 0, 0, 0, 5]]
    raw = np.full((3, 8), 7)
    raw[1, 3] = EOC
    raw[2, 5] = BOC
    frames = rows_to_frames(apply_delay(raw))
    expected = raw.copy()
    expected[1, 3] = expected[2, 5] = 0
    assert frames.T.tolist() == expected.tolist()


@settings(max_examples=30, deadline=None)
@given(params=any_chunking)
def test_incremental_de_delay_matches_whole_revert(
    core: StreamingCodec, params: ChunkingParams
) -> None:
    rows = utterance_rows(33, seed=6, padding=0.2)
    decoder = StreamingDecoder(core, params)
    jobs = [j for row in rows for j in decoder.plan_feed(row)] + decoder.plan_finish()
    streamed = np.concatenate([j.codes for j in jobs], axis=1)  # each frame in one job
    assert np.array_equal(streamed, rows_to_frames(rows))
    decoder.close()


@pytest.mark.parametrize(
    "row", [np.zeros(7, np.int64), np.zeros((1, 8), np.int64), np.zeros(8), "abcdefgh"]
)
def test_bad_rows_are_rejected(core: StreamingCodec, row: object) -> None:
    decoder = StreamingDecoder(core, get_preset("latency"))
    with pytest.raises(CodecInputError):
        decoder.feed(row)
    decoder.close()


def test_misuse_is_refused(core: StreamingCodec) -> None:
    params = get_preset("latency")
    a = StreamingDecoder(core, params)
    b = StreamingDecoder(core, params)
    jobs = [j for row in utterance_rows(30, seed=7) for j in a.plan_feed(row)]
    assert len(jobs) >= 2
    edge = np.zeros(jobs[0].edge_samples, np.float32)
    assert jobs[0].edge_samples == core.delay - 2 * HOP  # up to the chunk's end
    good = DecodedJob(np.zeros(jobs[1].new_frames * HOP, np.float32), edge)
    with pytest.raises(StreamStateError):
        a.complete(jobs[1], good)  # out of order
    with pytest.raises(StreamStateError):
        b.complete(jobs[0], good)  # another stream's job
    with pytest.raises(CodecInputError):
        a.complete(jobs[0], DecodedJob(np.zeros(5, np.float32), edge))  # wrong length
    with pytest.raises(CodecInputError):  # a speculative job without its edge
        a.complete(jobs[0], DecodedJob(np.zeros(jobs[0].new_frames * HOP, np.float32), None))
    a.close()
    b.close()
    finished = StreamingDecoder(core, params)
    finished.finish()
    with pytest.raises(StreamStateError):
        finished.feed(np.zeros(8, np.int64))
    closed = StreamingDecoder(core, params)
    closed.close()
    with pytest.raises(StreamStateError):
        closed.feed(np.zeros(8, np.int64))


@pytest.mark.parametrize(
    "params",
    [
        ChunkingParams(0, 10, 10, 2),
        ChunkingParams(1, 0, 10, 2),
        ChunkingParams(1, 1, -1, 0),
        ChunkingParams(1, 10, 10, 2, chunk_growth=0.9),
        ChunkingParams(1, 10, 10, 2, chunk_growth=float("nan")),
        ChunkingParams(1, 10, 10, 2, chunk_growth=float("inf")),
    ],
)
def test_invalid_chunking_is_refused(core: StreamingCodec, params: ChunkingParams) -> None:
    with pytest.raises(InvalidChunkingError):
        StreamingDecoder(core, params)


def test_unknown_preset_is_refused() -> None:
    with pytest.raises(InvalidChunkingError):
        get_preset("fastest")
