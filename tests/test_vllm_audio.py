"""The engine core's audio side without vLLM: step statuses in, PCM messages out.

``VllmAudio`` is driven the way the model state drives it (a sampled step's
packed status, vLLM removing requests) over a CPU slot table, and its
messages are read back by a real ``RowReceiver``.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("zmq", reason="pyzmq comes with vllm; without it there is no transport")

from streaming_support import whole

from realtime_engine.codec.decoder import CodecDecoder, load_codec_decoder
from realtime_engine.codec.delay import apply_delay
from realtime_engine.codec.layout import CodecDims, random_codec_state_dict
from realtime_engine.codec.presets import get_preset
from realtime_engine.engines.base import ChunkingParams
from realtime_engine.format import NUM_CODEBOOKS
from realtime_engine.talker.vllm_audio import WATCH_MAX_BATCH, VllmAudio
from realtime_engine.talker.vllm_protocol import (
    Event,
    FailureEvent,
    PcmEvent,
    RowEvent,
    StatsEvent,
    StepStats,
    TalkerArgs,
)
from realtime_engine.talker.vllm_publish import StepRows
from realtime_engine.talker.vllm_rows import RowReceiver

SLOTS, POSITIONS = 3, 128


@pytest.fixture(scope="module")
def codec() -> CodecDecoder:
    dims = CodecDims.tiny()
    sd = random_codec_state_dict(dims, torch.Generator().manual_seed(1), include_encoder=False)
    return load_codec_decoder(sd)


class Inbox:
    def __init__(self) -> None:
        self.events: list[PcmEvent | FailureEvent] = []
        self.stats: list[StepStats] = []
        self._lock = threading.Condition()
        self.receiver = RowReceiver(self._deliver)

    def _deliver(self, event: Event) -> None:
        assert not isinstance(event, RowEvent)
        with self._lock:
            if isinstance(event, StatsEvent):
                self.stats.append(event.stats)
            else:
                self.events.append(event)
            self._lock.notify_all()

    def wait_for(self, done: int) -> None:
        """Until ``done`` requests have ended (final chunk or failure)."""

        def ended() -> int:
            return sum(
                isinstance(e, FailureEvent) or (isinstance(e, PcmEvent) and e.chunk.final)
                for e in self.events
            )

        with self._lock:
            assert self._lock.wait_for(lambda: ended() >= done, timeout=10)

    def audio(self, key: str) -> np.ndarray:
        chunks = [
            e.chunk for e in self.events if isinstance(e, PcmEvent) and e.correlation_id == key
        ]
        assert [c.final for c in chunks].count(True) == 1 and chunks[-1].final
        return np.concatenate([c.pcm for c in chunks])


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    box = Inbox()
    yield box
    box.receiver.close()


def args(key: str, endpoint: str, chunking: ChunkingParams | None) -> TalkerArgs:
    return TalkerArgs(
        correlation_id=key,
        endpoint=endpoint,
        audio_token_id=1,
        eos_token_id=2,
        temperature=0.0,
        top_k=0,
        top_p=1.0,
        ras_window=0,
        ras_max_repeat=1,
        seed=0,
        eoc_not_before=0,
        eoc_at=100,
        chunking=None if chunking is None else TalkerArgs.chunking_fields(chunking),
    )


def step(
    audio: VllmAudio, table: torch.Tensor, batch: list[tuple[str, int, int, np.ndarray, bool]]
) -> None:
    """One sampling step: row ``index`` of each ``(key, slot, base, rows, done)`` entry."""
    indices = [index for _, _, index, _, _ in batch]
    rows = torch.zeros(len(batch), 8, dtype=torch.int64)
    for i, (_, slot, index, utterance, _) in enumerate(batch):
        rows[i] = torch.from_numpy(utterance[index])
        table[slot, PROMPT + index] = rows[i].to(torch.int16)
    packed = StepRows(
        rows=rows,
        valid=torch.ones(len(batch), dtype=torch.bool),
        done=torch.tensor([done for *_, done in batch]),
        index=torch.tensor(indices),
    ).packed()
    audio.after_step(packed, [key for key, *_ in batch])


PROMPT = 5


def offline(codec: CodecDecoder, rows: np.ndarray) -> np.ndarray:
    """The whole-utterance decode, computed exactly (float64)."""
    return whole(copy.deepcopy(codec).double(), rows).astype(np.float64)


def close_to_peak(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and bool(np.abs(got - want).max() <= 1e-5 * np.abs(want).max())


# gemm_channels 1: every convolution wider than a tap as one matrix product
@pytest.mark.parametrize("gemm_channels", [None, 1])
def test_finished_preempted_and_reused_slots_give_whole_utterance_audio(
    codec: CodecDecoder, inbox: Inbox, gemm_channels: int | None
) -> None:
    table = torch.randint(0, 1026, (SLOTS, POSITIONS, 8), dtype=torch.int16)  # stale garbage
    audio = VllmAudio(codec, table, max_batch=2, gemm_channels=gemm_channels)
    assert audio.codec.device_codec.stream_codec.layers.gemm_channels == gemm_channels
    endpoint = inbox.receiver.endpoint
    exact = get_preset("exact")
    rng = np.random.default_rng(0)
    a, b, c = (apply_delay(rng.integers(0, 1024, size=(n, 8))) for n in (40, 25, 30))
    audio.open(args("a", endpoint, exact), 0, PROMPT)
    audio.open(args("b", endpoint, exact), 1, PROMPT)
    for i in range(20):
        step(audio, table, [("a", 0, i, a, False), ("b", 1, i, b, False)])
    # "a" is preempted: vLLM removes it, keeps nothing but what the state saved
    saved_rows = table[0].clone()
    assert audio.remove("a")  # unfinished: it may come back
    # "c" takes slot 0 while "b" runs to its end
    audio.open(args("c", endpoint, exact), 0, PROMPT)
    for i in range(20, len(b)):
        step(audio, table, [("b", 1, i, b, i == len(b) - 1), ("c", 0, i - 20, c, False)])
    assert not audio.remove("b")  # finished: its final chunk goes out now
    assert not audio.resume(args("b", endpoint, exact), 1)  # and nothing of it is kept
    for i in range(len(b) - 20, len(c)):
        step(audio, table, [("c", 0, i, c, i == len(c) - 1)])
    audio.remove("c")
    # "a" comes back in slot 2 with its restored rows
    table[2] = saved_rows
    assert audio.resume(args("a", endpoint, exact), 2)
    for i in range(20, len(a)):
        step(audio, table, [("a", 2, i, a, i == len(a) - 1)])
    audio.remove("a")
    inbox.wait_for(3)
    for key, rows in (("a", a), ("b", b), ("c", c)):
        assert close_to_peak(inbox.audio(key), offline(codec, rows)), key
    first = next(e for e in inbox.events if isinstance(e, PcmEvent) and e.correlation_id == "b")
    assert first.chunk.start_frame == 0 and first.stamps is not None
    assert set(first.stamps) == {"first_row", "first_frame_row"}
    assert first.stamps["first_row"] < first.stamps["first_frame_row"]


class BrokenCodec(CodecDecoder):
    def acoustic_input(self, codes: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("codec kernel crashed")


def test_a_codec_failure_fails_its_requests_only(inbox: Inbox) -> None:
    table = torch.zeros(SLOTS, POSITIONS, 8, dtype=torch.int16)
    audio = VllmAudio(BrokenCodec(CodecDims.tiny()), table)
    rows = apply_delay(np.zeros((5, 8), dtype=np.int64))
    audio.open(args("x", inbox.receiver.endpoint, ChunkingParams(1, 1, 0, 0)), 0, PROMPT)
    for i in range(8):
        step(audio, table, [("x", 0, i, rows, False)])
    inbox.wait_for(1)
    assert isinstance(inbox.events[-1], FailureEvent)
    assert "codec kernel crashed" in inbox.events[-1].reason
    audio.remove("x")
    assert not audio.resume(args("x", inbox.receiver.endpoint, None), 1)  # nothing left of it


def test_a_status_landing_after_removal_reaches_the_resumed_request(
    codec: CodecDecoder, inbox: Inbox
) -> None:
    """On CUDA a step's status can reach the host after vLLM removed the request
    (preempted right at its last row): the kept state takes it, and the request
    ends once it is back."""
    table = torch.zeros(SLOTS, POSITIONS, 8, dtype=torch.int16)
    audio = VllmAudio(codec, table)
    endpoint = inbox.receiver.endpoint
    rows = apply_delay(np.random.default_rng(5).integers(0, 1024, size=(12, 8)))
    audio.open(args("d", endpoint, get_preset("balanced")), 0, PROMPT)
    for i in range(len(rows) - 1):
        step(audio, table, [("d", 0, i, rows, False)])
    table[0, PROMPT + len(rows) - 1] = torch.from_numpy(rows[-1])  # the in-flight step's row
    audio.remove("d")
    step(audio, table, [("d", 0, len(rows) - 1, rows, True)])  # its status lands late
    table[1] = table[0]
    table[0].zero_()  # the old slot is someone else's now
    assert audio.resume(args("d", endpoint, get_preset("balanced")), 1)
    audio.poll()
    step(audio, table, [])  # the next step decodes what became due
    inbox.wait_for(1)
    assert inbox.audio("d").size == 12 * 960


class StepDone:
    """A step's completion event that the test completes (the host-side interface
    of ``torch.cuda.Event``): statuses reach the host late, as on a GPU."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        raise AssertionError("the engine core never waits for a step")


def test_new_streams_clear_their_codec_state_in_one_batch(
    codec: CodecDecoder, inbox: Inbox
) -> None:
    table = torch.zeros(SLOTS, POSITIONS, 8, dtype=torch.int16)
    audio = VllmAudio(codec, table)
    device_codec = audio.codec.device_codec
    resets: list[list[int]] = []
    reset = device_codec.reset

    def recording(slots: Sequence[int]) -> None:
        resets.append(list(slots))
        reset(slots)

    device_codec.reset = recording  # type: ignore[method-assign]
    endpoint = inbox.receiver.endpoint
    rows = [apply_delay(np.random.default_rng(s).integers(0, 1024, size=(9, 8))) for s in range(3)]
    for slot in range(SLOTS):
        audio.open(args(f"s{slot}", endpoint, get_preset("exact")), slot, PROMPT)
    assert resets == []
    last = len(rows[0]) - 1
    for i in range(last + 1):
        step(audio, table, [(f"s{s}", s, i, rows[s], i == last) for s in range(SLOTS)])
    assert resets == [[0, 1, 2]]
    inbox.wait_for(3)
    for s in range(SLOTS):
        assert close_to_peak(inbox.audio(f"s{s}"), offline(codec, rows[s]))


def test_the_last_request_removed_sends_its_final_chunk_without_another_step(
    codec: CodecDecoder, inbox: Inbox
) -> None:
    """On a GPU the final step's status lands after the host went on; when vLLM
    then removes the request and has nothing else to run, no later step comes
    to send the final chunk: removal must send it."""
    events: list[StepDone] = []

    def late() -> StepDone:
        events.append(StepDone())
        return events[-1]

    table = torch.zeros(SLOTS, POSITIONS, 8, dtype=torch.int16)
    audio = VllmAudio(codec, table, step_event=late)
    rows = apply_delay(np.random.default_rng(8).integers(0, 1024, size=(12, 8)))
    audio.open(args("z", inbox.receiver.endpoint, get_preset("exact")), 0, PROMPT)
    for i in range(len(rows)):
        step(audio, table, [("z", 0, i, rows, i == len(rows) - 1)])
        events[-1].done = True
    audio.remove("z")  # the engine is idle from here on
    inbox.wait_for(1)
    assert close_to_peak(inbox.audio("z"), offline(codec, rows))


class GatedStep:
    """A step's completion event that the test completes from its own thread and
    that can be waited for, as ``torch.cuda.Event.synchronize`` does."""

    def __init__(self) -> None:
        self._done = threading.Event()

    def complete(self) -> None:
        self._done.set()

    def query(self) -> bool:
        return self._done.is_set()

    def synchronize(self) -> None:
        assert self._done.wait(timeout=10)


def test_a_first_chunk_goes_out_when_its_row_lands_without_another_step(
    codec: CodecDecoder, inbox: Inbox
) -> None:
    """The host of a small batch runs ahead of the device: when the row that
    makes a first chunk due lands, the engine's thread is already elsewhere.
    The watcher cuts the chunk then, with no later step or poll; the rest of
    the audio is unchanged."""
    events: list[GatedStep] = []

    def gated() -> GatedStep:
        events.append(GatedStep())
        return events[-1]

    table = torch.zeros(SLOTS, POSITIONS, 8, dtype=torch.int16)
    audio = VllmAudio(codec, table, step_event=gated, watch_first_chunks=True)
    # exact: its chunks equal the whole decode, so nothing done early may differ
    rows = apply_delay(np.random.default_rng(11).integers(0, 1024, size=(30, 8)))
    audio.open(args("w", inbox.receiver.endpoint, get_preset("exact")), 0, PROMPT)
    stream = audio.codec.get("w")
    assert stream is not None
    due = stream.next_rows  # rows that make the first chunk due
    for i in range(due):
        step(audio, table, [("w", 0, i, rows, False)])
    assert not inbox.events
    for event in events:  # the device catches up; the engine's thread does nothing
        event.complete()
    with inbox._lock:
        assert inbox._lock.wait_for(lambda: bool(inbox.events), timeout=10)
    first = inbox.events[0]
    assert isinstance(first, PcmEvent) and first.chunk.start_frame == 0
    for i in range(due, len(rows)):
        step(audio, table, [("w", 0, i, rows, i == len(rows) - 1)])
        events[-1].complete()
    audio.remove("w")
    inbox.wait_for(1)
    assert close_to_peak(inbox.audio("w"), offline(codec, rows))


def step_status(
    audio: VllmAudio,
    table: torch.Tensor,
    key: str,
    slot: int,
    index: int,
    utterance: np.ndarray,
    *,
    valid: bool = True,
    done: bool = False,
) -> None:
    """One sampling step of one request; a step that is not valid (vLLM ran the
    request once more before it saw the end) writes nothing into the table."""
    row = torch.from_numpy(utterance[min(index, len(utterance) - 1)]).long()
    if valid:
        table[slot, PROMPT + index] = row.to(torch.int16)
    packed = StepRows(
        rows=row[None],
        valid=torch.tensor([valid]),
        done=torch.tensor([done]),
        index=torch.tensor([index]),
    ).packed()
    audio.after_step(packed, [key])


def gated_audio(codec: CodecDecoder, table: torch.Tensor) -> tuple[VllmAudio, list[GatedStep]]:
    """Audio whose steps' statuses land when the test completes them, cutting
    first chunks ahead of them (as on a GPU) and without a watcher."""
    events: list[GatedStep] = []

    def gated() -> GatedStep:
        events.append(GatedStep())
        return events[-1]

    audio = VllmAudio(
        codec, table, step_event=gated, watch_first_chunks=False, first_chunks_ahead=True
    )
    return audio, events


def cut_first_chunk_ahead(
    audio: VllmAudio,
    events: list[GatedStep],
    table: torch.Tensor,
    key: str,
    rows: np.ndarray,
    inbox: Inbox,
) -> int:
    """Open ``key`` in slot 0 with `exact` and step it up to its first chunk's due
    row, only the first status landed (so the chunk is cut ahead); the due row
    count."""
    audio.open(args(key, inbox.receiver.endpoint, get_preset("exact")), 0, PROMPT)
    stream = audio.codec.get(key)
    assert stream is not None
    due = stream.next_rows
    step_status(audio, table, key, 0, 0, rows)
    events[0].complete()
    for i in range(1, due):
        step_status(audio, table, key, 0, i, rows)
    return due


def finish_and_compare(
    audio: VllmAudio,
    events: list[GatedStep],
    table: torch.Tensor,
    key: str,
    start: int,
    rows: np.ndarray,
    inbox: Inbox,
    codec: CodecDecoder,
) -> None:
    """Land every status so far, step the rest of ``rows`` from ``start`` with
    their statuses landing at once, and check the request's audio is the whole
    decode of its rows."""
    for event in events:
        event.complete()
    for i in range(start, len(rows)):
        step_status(audio, table, key, 0, i, rows, done=i == len(rows) - 1)
        events[-1].complete()
    audio.remove(key)
    inbox.wait_for(1)
    assert close_to_peak(inbox.audio(key), offline(codec, rows))


def test_a_first_chunk_is_cut_right_behind_its_step_before_the_statuses_land(
    codec: CodecDecoder, inbox: Inbox
) -> None:
    """The host runs ahead of the device at a small batch: the statuses that make
    the first chunk due are still on their way when the step that completes it
    is launched. Counting their rows as written, the chunk is cut then, and
    the audio is still exactly the whole decode."""
    table = torch.randint(0, 1026, (SLOTS, POSITIONS, 8), dtype=torch.int16)  # stale garbage
    audio, events = gated_audio(codec, table)
    rows = apply_delay(np.random.default_rng(21).integers(0, 1024, size=(30, 8)))
    audio.open(args("f", inbox.receiver.endpoint, get_preset("exact")), 0, PROMPT)
    stream = audio.codec.get("f")
    assert stream is not None
    due = stream.next_rows
    step_status(audio, table, "f", 0, 0, rows)
    events[0].complete()  # the prefill's row is confirmed; later statuses lag
    for i in range(1, due - 1):
        step_status(audio, table, "f", 0, i, rows)
    assert not inbox.events and stream.rows == 1
    step_status(audio, table, "f", 0, due - 1, rows)
    with inbox._lock:  # sent with no status after row 0's landed
        assert inbox._lock.wait_for(lambda: bool(inbox.events), timeout=10)
    first = inbox.events[0]
    assert isinstance(first, PcmEvent) and first.chunk.start_frame == 0
    assert not any(event.query() for event in events[1:])
    assert first.stamps is not None and {"first_row", "first_frame_row"} <= set(first.stamps)
    finish_and_compare(audio, events, table, "f", due, rows, inbox, codec)


class WaitsRecorded:
    """The codec's steps as they are (``CodecSlots.step``), with what each one's
    gather was told to wait for: ``None`` when the rows are written, else the
    step event that writes them, or ``"current"`` (every step so far)."""

    def __init__(self, audio: VllmAudio) -> None:
        self.waits: list[tuple[int, object]] = []  # (frame's first row, wait)
        device_codec = audio.codec.device_codec
        step = device_codec.step

        def recorded(
            slots: Any,
            rows: Any,
            table: Any,
            *,
            rows_written: bool = False,
            written_by: Any = None,
            frames: int = 1,
        ) -> None:
            wait = None if rows_written else (written_by or "current")
            self.waits.extend((row - PROMPT + t, wait) for row in rows for t in range(frames))
            step(
                slots, rows, table, rows_written=rows_written, written_by=written_by, frames=frames
            )

        device_codec.step = recorded  # type: ignore[method-assign]


def test_frames_of_earlier_steps_wait_for_those_steps_only_when_cut_ahead(
    codec: CodecDecoder, inbox: Inbox
) -> None:
    """Cutting a first chunk ahead, the frames that the earlier statuses still on
    their way complete wait for the newest of those steps, not for the step just
    launched: only the last frame waits for that one."""
    table = torch.zeros((SLOTS, POSITIONS, 8), dtype=torch.int16)
    audio, events = gated_audio(codec, table)
    recorded = WaitsRecorded(audio)
    rows = apply_delay(np.random.default_rng(5).integers(0, 1024, size=(30, 8)))
    due = cut_first_chunk_ahead(audio, events, table, "w", rows, inbox)
    frames = due - (NUM_CODEBOOKS - 1)  # the frames the first chunk's rows complete
    assert [frame for frame, _ in recorded.waits] == list(range(frames))
    assert all(wait is events[-2] for _, wait in recorded.waits[:-1])
    assert recorded.waits[-1][1] == "current"
    with inbox._lock:
        assert inbox._lock.wait_for(lambda: bool(inbox.events), timeout=10)
    finish_and_compare(audio, events, table, "w", due, rows, inbox, codec)


def test_a_first_chunk_cut_from_rows_that_never_came_is_dropped_and_cut_again(
    codec: CodecDecoder, inbox: Inbox
) -> None:
    """The audio ended one row short of the first chunk, and vLLM ran the request
    once more before it saw the end: the chunk cut ahead read a row that was
    never written. The deciding status drops it, the request's decoding is
    rewound, and the audio is the whole decode of the rows that exist."""
    table = torch.randint(0, 1026, (SLOTS, POSITIONS, 8), dtype=torch.int16)  # stale garbage
    audio, events = gated_audio(codec, table)
    exact = get_preset("exact")
    audio.open(args("g", inbox.receiver.endpoint, exact), 0, PROMPT)
    stream = audio.codec.get("g")
    assert stream is not None
    rows = apply_delay(np.random.default_rng(22).integers(0, 1024, size=(stream.next_rows - 8, 8)))
    assert len(rows) == stream.next_rows - 1  # the delay adds 7 rows
    step_status(audio, table, "g", 0, 0, rows)
    events[0].complete()
    for i in range(1, len(rows)):
        step_status(audio, table, "g", 0, i, rows, done=i == len(rows) - 1)
    step_status(audio, table, "g", 0, len(rows), rows, valid=False)  # the extra step
    assert "g" in audio._assumed  # cut ahead (and dropped: the audio below has it once)
    for event in events:
        event.complete()
    audio.poll()
    assert "g" not in audio._assumed
    audio.remove("g")
    inbox.wait_for(1)
    assert close_to_peak(inbox.audio("g"), offline(codec, rows))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    # often around `exact`'s first chunk (due at 14 frames' rows), where ends refute
    frames=st.one_of(st.integers(12, 15), st.integers(1, 24)),
    lags=st.lists(st.integers(0, 4), min_size=40, max_size=40),
    extra_steps=st.integers(0, 2),
)
def test_first_chunks_ahead_give_the_whole_decode_for_any_lag_of_the_statuses(
    codec: CodecDecoder, frames: int, lags: list[int], extra_steps: int
) -> None:
    """Any utterance length, any lag of each status behind the host, steps run
    after the end: with first chunks cut ahead (and dropped and cut again where
    the rows they counted never came), `exact` still gives the whole decode."""
    rows = apply_delay(np.random.default_rng(frames).integers(0, 1024, size=(frames, 8)))
    table = torch.randint(0, 1026, (SLOTS, POSITIONS, 8), dtype=torch.int16)  # stale garbage
    box = Inbox()
    try:
        audio, events = gated_audio(codec, table)
        audio.open(args("p", box.receiver.endpoint, get_preset("exact")), 0, PROMPT)
        for i in range(len(rows) + extra_steps):
            valid = i < len(rows)
            step_status(audio, table, "p", 0, i, rows, valid=valid, done=i == len(rows) - 1)
            # status ``j`` lands ``lags[j]`` steps after its own (the first at once)
            for j, event in enumerate(events):
                if j == 0 or j + lags[j] <= i:
                    event.complete()
        for event in events:
            event.complete()
        audio.poll()
        audio.remove("p")
        box.wait_for(1)
        assert not audio._assumed
        assert close_to_peak(box.audio("p"), offline(codec, rows))
    finally:
        box.receiver.close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 64.0  # and steps of 1/64 and 1/32 s: exact in binary

    def __call__(self) -> float:
        return self.now


def test_step_counters_time_close_steps_and_go_out_twice_a_second(
    codec: CodecDecoder, inbox: Inbox
) -> None:
    clock = FakeClock()
    table = torch.zeros(SLOTS, POSITIONS, 8, dtype=torch.int16)
    audio = VllmAudio(codec, table, clock=clock)
    rows = apply_delay(np.zeros((80, 8), dtype=np.int64))
    endpoint = inbox.receiver.endpoint
    audio.open(args("x", endpoint, get_preset("exact")), 0, PROMPT)
    audio.open(args("y", endpoint, get_preset("exact")), 1, PROMPT)
    for i in range(10):  # two requests, a step every 1/64 s
        step(audio, table, [("x", 0, i, rows, False), ("y", 1, i, rows, False)])
        clock.now += 1 / 64
    clock.now += 5.0  # idle: the next step is counted, not timed
    for i in range(10, 70):  # one request, a step every 1/32 s
        step(audio, table, [("x", 0, i, rows, False)])
        clock.now += 1 / 32
    assert (audio.steps.steps, audio.steps.rows) == (70, 80)
    assert audio.steps.timed_steps == 68
    assert audio.steps.step_s == pytest.approx(9 / 64 + 59 / 32)
    # sent at the first step, then once STATS_INTERVAL_S passed: after the gap,
    # then every 16 steps of 1/32 s
    with inbox._lock:
        assert inbox._lock.wait_for(lambda: len(inbox.stats) >= 5, timeout=10)
    assert [s.steps for s in inbox.stats] == [1, 11, 27, 43, 59]
    assert [s.rows for s in inbox.stats][:2] == [2, 21]
    assert all(s.timed_steps <= s.steps and s.rank is None for s in inbox.stats)


def test_steps_without_audio_requests_are_not_counted(codec: CodecDecoder) -> None:
    table = torch.zeros(SLOTS, POSITIONS, 8, dtype=torch.int16)
    audio = VllmAudio(codec, table)
    packed = StepRows(
        rows=torch.zeros(2, 8, dtype=torch.int64),
        valid=torch.ones(2, dtype=torch.bool),
        done=torch.zeros(2, dtype=torch.bool),
        index=torch.zeros(2, dtype=torch.int64),
    ).packed()
    audio.after_step(packed, [None, None])
    assert audio.steps.steps == 0


def test_statuses_reuse_their_host_buffers_except_those_read_later(
    codec: CodecDecoder, inbox: Inbox
) -> None:
    """Each step's status lands in a host buffer used again once the status is
    applied, so a long run makes a buffer or two. A status that a chunk cut ahead
    depends on is read again by the sender: its buffer is never reused, and its
    values survive every later step."""
    table = torch.randint(0, 1026, (SLOTS, POSITIONS, 8), dtype=torch.int16)  # stale garbage
    audio, events = gated_audio(codec, table)
    rows = apply_delay(np.random.default_rng(23).integers(0, 1024, size=(60, 8)))
    due = cut_first_chunk_ahead(audio, events, table, "k", rows, inbox)
    assumed = audio._assumed["k"]  # the first chunk was cut ahead of these statuses
    deciding = assumed.host.clone()
    for event in events:
        event.complete()
    made = audio._buffers.made
    for i in range(due, len(rows)):  # statuses of the same size, landing at once
        step_status(audio, table, "k", 0, i, rows, done=i == len(rows) - 1)
        events[-1].complete()
    assert torch.equal(assumed.host, deciding)
    assert audio._buffers.made <= made + 2  # reused: not a buffer a step
    audio.remove("k")
    inbox.wait_for(1)
    assert close_to_peak(inbox.audio("k"), offline(codec, rows))


def decode_thread_session(
    codec: CodecDecoder, inbox: Inbox, decode_thread: bool
) -> tuple[dict[str, np.ndarray], list[GatedStep]]:
    """``WATCH_MAX_BATCH + 2`` requests of different lengths (so the batch falls
    below it near the end) over gated statuses; with ``decode_thread``, checks
    that the engine's thread decodes nothing of the large steps. The audio of
    each request, and the step events."""
    events: list[GatedStep] = []

    def gated() -> GatedStep:
        events.append(GatedStep())
        if not decode_thread:  # the engine's thread decodes: statuses land at once
            events[-1].complete()
        return events[-1]

    n = WATCH_MAX_BATCH + 2
    table = torch.zeros((n, POSITIONS, 8), dtype=torch.int16)
    audio = VllmAudio(
        codec,
        table,
        step_event=gated,
        watch_first_chunks=False,
        first_chunks_ahead=False,
        decode_thread=decode_thread,
    )
    rng = np.random.default_rng(31)
    utterances = {f"d{i}": apply_delay(rng.integers(0, 1024, size=(24 + i, 8))) for i in range(n)}
    keys = list(utterances)
    for slot, key in enumerate(keys):
        audio.open(args(key, inbox.receiver.endpoint, get_preset("exact")), slot, PROMPT)
    first = min(len(rows) for rows in utterances.values())
    for i in range(first):
        ends = [i == len(utterances[k]) - 1 for k in keys]
        step(audio, table, [(k, s, i, utterances[k], ends[s]) for s, k in enumerate(keys)])
        audio.poll()
    if decode_thread:
        assert all(s.rows == 0 for k in keys if (s := audio.codec.get(k)) is not None)
        assert not inbox.events
        for event in events:  # the device catches up; the engine's thread does nothing
            event.complete()
        with inbox._lock:  # every request's first chunk, sent by the watcher alone
            assert inbox._lock.wait_for(
                lambda: {e.correlation_id for e in inbox.events} == set(keys), timeout=10
            )
    for i in range(first, max(len(rows) for rows in utterances.values())):
        live = [(k, s) for s, k in enumerate(keys) if i < len(utterances[k])]
        step(audio, table, [(k, s, i, utterances[k], i == len(utterances[k]) - 1) for k, s in live])
        events[-1].complete()
    for key in keys:
        audio.remove(key)
    inbox.wait_for(n)
    return {key: inbox.audio(key) for key in keys}, events


def test_a_decode_thread_applies_large_batches_statuses_off_the_engines_thread(
    codec: CodecDecoder, inbox: Inbox
) -> None:
    """With ``decode_thread``, a step of more than ``WATCH_MAX_BATCH`` requests
    leaves its status to the watcher: the engine's thread neither applies it nor
    decodes (not even when it polls), and the watcher sends the audio once the
    statuses land, with no call from the engine's thread. Removing the requests
    still sends their final chunks at once, and every request's audio is the
    same, sample for sample, as when the engine's thread decodes it."""
    threaded, _ = decode_thread_session(codec, inbox, decode_thread=True)
    other = Inbox()
    try:
        inline, _ = decode_thread_session(codec, other, decode_thread=False)
    finally:
        other.receiver.close()
    assert threaded.keys() == inline.keys()
    for key, pcm in threaded.items():
        assert np.array_equal(pcm, inline[key]), key
