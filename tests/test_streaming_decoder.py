"""StreamingDecoder: chunked output equals whole-utterance decoding when the
context covers the receptive field, it is causal, ends cleanly, batches
across streams, and refuses misuse."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime_engine.codec.decoder import CodecDecoder, load_codec_decoder
from realtime_engine.codec.delay import apply_delay
from realtime_engine.codec.errors import CodecInputError, InvalidChunkingError, StreamStateError
from realtime_engine.codec.layout import CodecDims, random_codec_state_dict
from realtime_engine.codec.presets import (
    PRESETS,
    chunk_schedule,
    first_chunk_rows,
    get_preset,
    is_exact,
)
from realtime_engine.codec.streaming import (
    DecodeJob,
    StreamingDecoder,
    clean_codes,
    decode_jobs_batched,
    rows_to_frames,
    run_jobs,
)
from realtime_engine.engines.base import ChunkingParams
from realtime_engine.talker.types import BOC, EOC

HOP = 960


class LocalFakeCodec:
    """A cheap codec with a known receptive field of +-``radius`` frames:
    frame t's samples mix a hash of frames t-radius..t+radius (zero padded),
    so any missing context changes the output."""

    def __init__(self, radius: int = 10) -> None:
        self.radius = radius
        rng = np.random.default_rng(0)
        self.weights = rng.standard_normal((2 * radius + 1, HOP))
        self.mix = rng.integers(1, 97, size=8)
        self.calls: list[tuple[int, ...]] = []

    def __call__(self, codes: np.ndarray) -> np.ndarray:
        self.calls.append(tuple(codes.shape))
        batch, _, frames = codes.shape
        feature = ((codes * self.mix[None, :, None]).sum(axis=1) % 1009) / 1009.0 + 0.1
        padded = np.pad(feature, ((0, 0), (self.radius, self.radius)))
        out = np.zeros((batch, frames, HOP))
        for d in range(2 * self.radius + 1):
            out += padded[:, d : d + frames, None] * self.weights[d]
        return out.reshape(batch, 1, frames * HOP).astype(np.float32)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def tiny_codec() -> CodecDecoder:
    dims = CodecDims.tiny()
    sd = random_codec_state_dict(dims, torch.Generator().manual_seed(0), include_encoder=False)
    return load_codec_decoder(sd)


def stream(decoder: StreamingDecoder, rows: np.ndarray, finish: bool = True) -> np.ndarray:
    chunks = [c for row in rows for c in decoder.feed(row)]
    if finish:
        chunks += decoder.finish()
    return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


def whole(decode_fn: object, rows: np.ndarray) -> np.ndarray:
    frames = rows_to_frames(rows)
    if frames.shape[1] == 0:
        return np.zeros(0, np.float32)
    return np.asarray(decode_fn(frames[None]), dtype=np.float32).reshape(-1)  # type: ignore[operator]


def peak_error(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape
    if a.size == 0:
        return 0.0
    return float(np.abs(a - b).max()) / max(float(np.abs(b).max()), 1e-12)


def utterance_rows(frames: int, seed: int, padding: float = 0.0) -> np.ndarray:
    """Rows the talker would emit for ``frames`` raw frames; ``padding`` is
    the share of cells (codebooks 1-7) replaced by stray BOC/EOC."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 1024, size=(frames, 8))
    if padding:
        stray = rng.random((frames, 8)) < padding
        stray[:, 0] = False
        raw[stray] = rng.choice([BOC, EOC, -1], size=int(stray.sum()))
    return apply_delay(raw)


# None (no ramp), exactly 1 (constant first-size chunks), or a random ratio.
chunk_growth = st.one_of(st.none(), st.just(1.0), st.floats(1.0, 4.0))
exact_chunking = st.builds(
    ChunkingParams,
    first_chunk_frames=st.integers(1, 6),
    chunk_frames=st.integers(1, 12),
    left_context_frames=st.integers(10, 14),
    right_holdback_frames=st.integers(10, 13),
    chunk_growth=chunk_growth,
)
any_chunking = st.builds(
    ChunkingParams,
    first_chunk_frames=st.integers(1, 6),
    chunk_frames=st.integers(1, 12),
    left_context_frames=st.integers(0, 14),
    right_holdback_frames=st.integers(0, 13),
    chunk_growth=chunk_growth,
)


@settings(max_examples=150, deadline=None)
@given(
    frames=st.integers(0, 60),
    seed=st.integers(0, 2**16),
    padding=st.sampled_from([0.0, 0.1]),
    params=exact_chunking,
)
def test_exact_context_equals_whole_decode_fake_codec(
    frames: int, seed: int, padding: float, params: ChunkingParams
) -> None:
    codec = LocalFakeCodec()
    rows = utterance_rows(frames, seed, padding)
    out = stream(StreamingDecoder(codec, params), rows)
    assert out.size == HOP * frames
    assert peak_error(out, whole(codec, rows)) < 1e-5


@settings(max_examples=12, deadline=None)
@given(frames=st.integers(1, 45), seed=st.integers(0, 2**16), params=exact_chunking)
def test_exact_context_equals_whole_decode_tiny_codec(
    tiny_codec: CodecDecoder, frames: int, seed: int, params: ChunkingParams
) -> None:
    rows = utterance_rows(frames, seed, padding=0.05)
    out = stream(StreamingDecoder(tiny_codec.decode_numpy, params), rows)
    assert out.size == HOP * frames
    assert peak_error(out, whole(tiny_codec.decode_numpy, rows)) < 1e-5


@pytest.mark.parametrize("frames", [1, 2, 9, 10, 11, 21, 37])
def test_chunk_size_one_crossing_both_utterance_edges(
    tiny_codec: CodecDecoder, frames: int
) -> None:
    params = ChunkingParams(1, 1, 10, 10)
    rows = utterance_rows(frames, seed=frames)
    out = stream(StreamingDecoder(tiny_codec.decode_numpy, params), rows)
    assert peak_error(out, whole(tiny_codec.decode_numpy, rows)) < 1e-5


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_exact_only_where_they_claim(tiny_codec: CodecDecoder, name: str) -> None:
    params = get_preset(name)
    rows = utterance_rows(70, seed=1)
    out = stream(StreamingDecoder(tiny_codec.decode_numpy, params), rows)
    err = peak_error(out, whole(tiny_codec.decode_numpy, rows))
    assert out.size == 70 * HOP
    if is_exact(params):
        assert err < 1e-5
    else:
        assert err > 1e-4  # short holdback is measurably inexact


@settings(max_examples=80, deadline=None)
@given(frames=st.integers(0, 50), cut=st.integers(0, 70), params=any_chunking)
def test_chunks_depend_only_on_rows_seen(frames: int, cut: int, params: ChunkingParams) -> None:
    """Output so far never changes when more rows arrive: a decoder fed only
    a prefix (not finished) emits exactly the chunks the full run had
    emitted at that point."""
    codec = LocalFakeCodec()
    rows = utterance_rows(frames, seed=frames)
    cut = min(cut, len(rows))
    full = StreamingDecoder(codec, params)
    chunks: list[np.ndarray] = []
    for row in rows[:cut]:
        chunks += full.feed(row)
    snapshot = [c.copy() for c in chunks]
    for row in rows[cut:]:
        chunks += full.feed(row)
    chunks += full.finish()
    prefix = StreamingDecoder(codec, params)
    prefix_chunks = [c for row in rows[:cut] for c in prefix.feed(row)]
    assert len(prefix_chunks) == len(snapshot)
    for a, b, c in zip(prefix_chunks, snapshot, chunks, strict=False):
        assert np.array_equal(a, b) and np.array_equal(b, c)
    assert sum(c.size for c in chunks) == HOP * frames


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_first_chunk_arrives_after_delay_first_chunk_and_holdback(name: str) -> None:
    params = get_preset(name)
    decoder = StreamingDecoder(LocalFakeCodec(), params)
    rows = utterance_rows(40, seed=2)
    first = next(i + 1 for i, row in enumerate(rows) if decoder.feed(row))
    assert (
        first
        == first_chunk_rows(params)
        == 7 + params.first_chunk_frames + (params.right_holdback_frames)
    )
    assert decoder.emitted_frames == params.first_chunk_frames


def test_steady_chunks_have_equal_windows() -> None:
    params = get_preset("balanced")
    decoder = StreamingDecoder(LocalFakeCodec(), params)
    jobs: list[DecodeJob] = []
    for row in utterance_rows(100, seed=3):
        jobs += decoder.plan_feed(row)
    jobs += decoder.plan_finish()
    assert jobs[0].window_frames == params.first_chunk_frames + params.right_holdback_frames
    assert jobs[-1].final and not any(j.final for j in jobs[:-1])
    ramp = len(chunk_schedule(params)) - 1  # chunks before the first steady-size one
    steady = jobs[ramp:-1]
    assert steady and {j.emit_frames for j in steady} == {params.chunk_frames}
    assert {j.window_frames for j in steady} == {
        params.left_context_frames + params.chunk_frames + params.right_holdback_frames
    }
    assert sum(j.emit_frames for j in jobs) == 100


def test_batched_streams_equal_one_by_one(tiny_codec: CodecDecoder) -> None:
    params = get_preset("latency")
    lengths = [30, 30, 18, 41]
    all_rows = [utterance_rows(n, seed=10 + i) for i, n in enumerate(lengths)]
    singles = [stream(StreamingDecoder(tiny_codec.decode_numpy, params), r) for r in all_rows]

    calls: list[int] = []

    def counting_decode(codes: np.ndarray) -> np.ndarray:
        calls.append(codes.shape[0])
        return tiny_codec.decode_numpy(codes)

    decoders = [StreamingDecoder(counting_decode, params) for _ in lengths]
    outputs: list[list[np.ndarray]] = [[] for _ in lengths]
    for step in range(max(len(r) for r in all_rows) + 1):
        work = []
        for i, (decoder, rows) in enumerate(zip(decoders, all_rows, strict=True)):
            jobs = decoder.plan_feed(rows[step]) if step < len(rows) else decoder.plan_finish()
            work += [(i, decoder, job) for job in jobs]
        chunks = run_jobs(counting_decode, [(d, j) for _, d, j in work])
        for (i, _, _), chunk in zip(work, chunks, strict=True):
            outputs[i].append(chunk)
    for single, parts in zip(singles, outputs, strict=True):
        assert peak_error(np.concatenate(parts), single) < 1e-5
    assert max(calls) > 1  # equal windows of different streams shared a call


def test_stream_ends_at_codebook0_eoc_without_finish() -> None:
    codec = LocalFakeCodec(radius=2)  # latency preset (H = 2) is exact for it
    params = get_preset("latency")
    rows = utterance_rows(20, seed=4)
    garbage = np.random.default_rng(0).integers(0, 1024, size=(5, 8))
    decoder = StreamingDecoder(codec, params)
    out = [c for row in rows for c in decoder.feed(row)]
    assert decoder.done and sum(c.size for c in out) == 20 * HOP
    assert all(decoder.feed(row) == [] for row in garbage)  # ramp-down rows ignored
    assert decoder.finish() == []
    assert peak_error(np.concatenate(out), whole(codec, rows)) < 1e-5
    with pytest.raises(StreamStateError):
        decoder.feed(garbage[0])  # finish() was called


def test_without_stop_at_eoc_every_complete_frame_is_decoded() -> None:
    rows = np.concatenate([utterance_rows(6, seed=5), np.zeros((4, 8), np.int64)])
    decoder = StreamingDecoder(LocalFakeCodec(), get_preset("exact"), stop_at_eoc=False)
    assert stream(decoder, rows).size == (len(rows) - 7) * HOP


@pytest.mark.parametrize("rows", [0, 1, 7])
def test_fewer_than_eight_rows_give_no_audio(rows: int) -> None:
    decoder = StreamingDecoder(LocalFakeCodec(), get_preset("latency"))
    assert stream(decoder, np.full((rows, 8), BOC, np.int64)).size == 0


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


def test_incremental_de_delay_matches_whole_revert() -> None:
    rows = utterance_rows(33, seed=6, padding=0.2)
    decoder = StreamingDecoder(LocalFakeCodec(), ChunkingParams(4, 5, 0, 0))
    jobs = [j for row in rows for j in decoder.plan_feed(row)] + decoder.plan_finish()
    streamed = np.concatenate([j.codes for j in jobs], axis=1)  # L = H = 0: windows tile
    assert np.array_equal(streamed, rows_to_frames(rows))


@pytest.mark.parametrize(
    "row", [np.zeros(7, np.int64), np.zeros((1, 8), np.int64), np.zeros(8), "abcdefgh"]
)
def test_bad_rows_are_rejected(row: object) -> None:
    with pytest.raises(CodecInputError):
        StreamingDecoder(LocalFakeCodec(), get_preset("latency")).feed(row)


def test_misuse_is_refused() -> None:
    params = get_preset("latency")
    a = StreamingDecoder(LocalFakeCodec(), params)
    b = StreamingDecoder(LocalFakeCodec(), params)
    jobs = [j for row in utterance_rows(30, seed=7) for j in a.plan_feed(row)]
    assert len(jobs) >= 2
    pcm = np.zeros(jobs[1].window_frames * HOP, np.float32)
    with pytest.raises(StreamStateError):
        a.complete(jobs[1], pcm)  # out of order
    with pytest.raises(StreamStateError):
        b.complete(jobs[0], pcm)  # another stream's job
    with pytest.raises(CodecInputError):
        a.complete(jobs[0], np.zeros(5, np.float32))  # wrong length
    finished = StreamingDecoder(LocalFakeCodec(), params)
    finished.finish()
    with pytest.raises(StreamStateError):
        finished.feed(np.zeros(8, np.int64))


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
def test_invalid_chunking_is_refused(params: ChunkingParams) -> None:
    with pytest.raises(InvalidChunkingError):
        StreamingDecoder(LocalFakeCodec(), params)


def test_unknown_preset_is_refused() -> None:
    with pytest.raises(InvalidChunkingError):
        get_preset("fastest")


def _jobs_of_one_stream(rows: np.ndarray, params: ChunkingParams) -> list[DecodeJob]:
    decoder = StreamingDecoder(LocalFakeCodec(), params)
    jobs = [job for row in rows for job in decoder.plan_feed(row)]
    return jobs + decoder.plan_finish()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_windows_of_different_lengths_share_one_left_padded_call(name: str) -> None:
    params = get_preset(name)
    # streams at different points of their chunk-size ramp
    jobs = [
        job
        for seed, frames in enumerate((40, 55, 70))
        for job in _jobs_of_one_stream(utterance_rows(frames, seed=seed), params)
    ]
    deep = [job for job in jobs if job.trim_frames >= 10]
    assert len({job.window_frames for job in deep}) > 1
    codec = LocalFakeCodec()
    batched = decode_jobs_batched(codec, deep)
    assert len(codec.calls) == 1
    context_changed = False
    for job, pcm in zip(deep, batched, strict=True):
        alone = LocalFakeCodec()(job.codes[None])[0, 0]
        keep = slice(job.trim_frames * HOP, (job.trim_frames + job.emit_frames) * HOP)
        assert np.array_equal(pcm[keep], alone[keep])
        context_changed |= not np.array_equal(pcm[: keep.start], alone[: keep.start])
    # the padding did reach the shorter windows' left context, which is trimmed away
    assert context_changed


def test_left_padding_keeps_the_tiny_codec_exact(tiny_codec: CodecDecoder) -> None:
    params = get_preset("balanced")
    jobs = [
        job
        for seed, frames in enumerate((45, 60))
        for job in _jobs_of_one_stream(utterance_rows(frames, seed=20 + seed), params)
    ]
    calls: list[tuple[int, ...]] = []

    def counting(codes: np.ndarray) -> np.ndarray:
        calls.append(codes.shape)
        return tiny_codec.decode_numpy(codes)

    batched = decode_jobs_batched(counting, jobs)
    alone = [tiny_codec.decode_numpy(job.codes[None])[0] for job in jobs]
    for job, got, want in zip(jobs, batched, alone, strict=True):
        keep = slice(job.trim_frames * HOP, (job.trim_frames + job.emit_frames) * HOP)
        assert peak_error(got[keep], want[keep]) < 1e-5
    # utterance starts (less than 10 frames of context) are never padded
    starts = {job.window_frames for job in jobs if job.trim_frames < 10}
    assert len(calls) == len(starts) + 1
