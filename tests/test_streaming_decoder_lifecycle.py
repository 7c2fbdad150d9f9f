"""StreamingDecoder lifecycle: the end marker, aborts mid-chunk and slot
reuse, with no state leaking between streams that share a codec."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from streaming_support import (
    EXACT,
    HOP,
    any_chunking,
    peak_error,
    stream,
    utterance_rows,
    whole,
)

from realtime_engine.codec.decoder import CodecDecoder
from realtime_engine.codec.errors import StreamStateError
from realtime_engine.codec.presets import get_preset, is_exact
from realtime_engine.codec.stream_core import StreamingCodec
from realtime_engine.codec.streaming import DecodeJob, StreamingDecoder, decode_jobs, run_jobs
from realtime_engine.format import EOC, ChunkingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@settings(max_examples=15, deadline=None)
@given(abort_row=st.integers(8, 40), seed=st.integers(0, 999))
def test_abort_mid_chunk_leaks_nothing_into_the_slot_s_next_stream(
    core: StreamingCodec, codec64: CodecDecoder, abort_row: int, seed: int
) -> None:
    """A stream aborted with a job planned but not yet decoded gives its slot
    back; the job still runs (it was queued), then the next stream in that
    slot decodes as if the slot were new."""
    params = get_preset("exact")
    old_rows, new_rows = utterance_rows(40, seed), utterance_rows(25, seed + 1)
    old = StreamingDecoder(core, params)
    stale: list[DecodeJob] = []  # planned, not yet decoded
    for row in old_rows[:abort_row]:
        jobs = old.plan_feed(row)
        if jobs:
            run_jobs([(old, job) for job in stale])
            stale = jobs
    old.close()  # abort
    new = StreamingDecoder(core, params)
    assert new.slot == old.slot
    work: list[tuple[StreamingDecoder, DecodeJob]] = []
    chunks: list[np.ndarray] = []
    for row in new_rows:
        work += [(new, job) for job in new.plan_feed(row)]
        if work and stale:  # the stale job runs in the same batch, before
            decoded = decode_jobs([*stale, *(job for _, job in work)])[len(stale) :]
            chunks += [new.complete(job, d) for (_, job), d in zip(work, decoded, strict=True)]
            work, stale = [], []
        elif work:
            chunks += run_jobs(work)
            work = []
    chunks += run_jobs([(new, job) for job in new.plan_finish()])
    assert peak_error(np.concatenate(chunks), whole(codec64, new_rows)) < EXACT


def test_stream_ends_at_codebook0_eoc_without_finish(
    core: StreamingCodec, codec64: CodecDecoder
) -> None:
    params = get_preset("exact")
    rows = utterance_rows(20, seed=4)
    garbage = np.random.default_rng(0).integers(0, 1024, size=(5, 8))
    decoder = StreamingDecoder(core, params)
    out = [c for row in rows for c in decoder.feed(row)]
    assert decoder.done and sum(c.size for c in out) == 20 * HOP
    assert all(decoder.feed(row) == [] for row in garbage)  # ramp-down rows ignored
    assert decoder.finish() == []
    assert peak_error(np.concatenate(out), whole(codec64, rows)) < EXACT
    with pytest.raises(StreamStateError):
        decoder.feed(garbage[0])  # finish() was called


@settings(max_examples=20, deadline=None)
@given(
    frames=st.integers(0, 30),
    tail=st.integers(0, 12),
    call_finish=st.booleans(),
    params=any_chunking,
    seed=st.integers(0, 999),
)
def test_eoc_in_codebook0_ends_the_stream_wherever_it_falls(
    core: StreamingCodec,
    codec64: CodecDecoder,
    frames: int,
    tail: int,
    call_finish: bool,
    params: ChunkingParams,
    seed: int,
) -> None:
    """The talker's stop marker (EOC in codebook 0 of row T) ends a T-frame
    utterance: its T frames play, ramp-down rows after it are ignored, and
    finish() afterwards adds nothing; the slot is given back."""
    rows = utterance_rows(frames, seed)
    assert rows[frames, 0] == EOC  # the marker sits in row T
    ramp_down = np.random.default_rng(seed).integers(0, 1024, size=(tail, 8))
    rows = np.concatenate([rows, ramp_down])
    before = core.slots.in_use
    decoder = StreamingDecoder(core, params)
    chunks = [c for row in rows for c in decoder.feed(row)]
    assert decoder.done and core.slots.in_use == before
    if call_finish:
        assert decoder.finish() == []
    out = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    assert out.size == frames * HOP
    if is_exact(params):
        assert peak_error(out, whole(codec64, rows)) < EXACT


def test_slots_are_given_back(core: StreamingCodec) -> None:
    before = core.slots.in_use
    decoders = [StreamingDecoder(core, get_preset("exact")) for _ in range(3)]
    assert core.slots.in_use == before + 3
    stream(decoders[0], utterance_rows(12, seed=8))  # finishing gives it back
    decoders[1].close()
    decoders[1].close()  # idempotent
    assert core.slots.in_use == before + 1
    decoders[2].close()
