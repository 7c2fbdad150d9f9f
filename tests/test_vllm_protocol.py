"""The engine-independent pieces of the vLLM talker: settings, row messages, transport, noise."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("zmq", reason="pyzmq comes with vllm; without it there is no transport")

from realtime_engine.engines.base import ChunkingParams
from realtime_engine.model.config import AUDIO_PLACEHOLDER_ID
from realtime_engine.model.tokenizer import SpecialIds
from realtime_engine.talker.sampling import BatchSampling, sample_codes
from realtime_engine.talker.types import (
    CODEBOOK_VOCAB,
    NUM_CODEBOOKS,
    TalkerError,
    TalkerPrompt,
    TalkerRequest,
)
from realtime_engine.talker.vllm_protocol import (
    EXTRA_ARGS_KEY,
    Event,
    FailureEvent,
    PcmEvent,
    PcmHeader,
    RowEvent,
    RowHeader,
    RowMessageError,
    StatsEvent,
    StepStats,
    TalkerArgs,
    TalkerArgsError,
    decode_message,
    encode_failure,
    encode_pcm,
    encode_rows,
    encode_stats,
    engine_prompt,
)
from realtime_engine.talker.vllm_publish import StepRows, split_by_endpoint
from realtime_engine.talker.vllm_rows import RowPusher, RowReceiver
from realtime_engine.talker.vllm_sampling import counter_noise, uniform_noise

codes = st.integers(0, CODEBOOK_VOCAB - 1)
rows_strategy = st.lists(st.tuples(*[codes] * NUM_CODEBOOKS), max_size=20)


def talker_args(**overrides: object) -> TalkerArgs:
    fields: dict[str, object] = {
        "correlation_id": "c-1",
        "endpoint": "ipc:///tmp/x",
        "audio_token_id": 7,
        "eos_token_id": 3,
        "temperature": 1.0,
        "top_k": 50,
        "top_p": 0.95,
        "ras_window": 7,
        "ras_max_repeat": 2,
        "seed": 5,
        "eoc_not_before": 0,
        "eoc_at": 100,
    }
    fields.update(overrides)
    return TalkerArgs(**fields)  # type: ignore[arg-type]


@given(
    seed=st.integers(-(1 << 63), (1 << 63) - 1),
    temperature=st.floats(0, 5),
    top_p=st.floats(0.01, 1),
    ref=rows_strategy,
    offset=st.integers(0, 1000),
)
def test_talker_args_survive_the_extra_args_round_trip(
    seed: int, temperature: float, top_p: float, ref: list[tuple[int, ...]], offset: int
) -> None:
    args = talker_args(
        seed=seed, temperature=temperature, top_p=top_p, ref_rows=tuple(ref), ref_offset=offset
    )
    extra = args.to_extra_args()
    assert set(extra) == {EXTRA_ARGS_KEY}
    assert TalkerArgs.from_extra_args(extra) == args


def test_requests_without_talker_args_are_recognised() -> None:
    assert TalkerArgs.from_extra_args(None) is None
    assert TalkerArgs.from_extra_args({"other": 1}) is None


@pytest.mark.parametrize(
    "overrides",
    [
        {"ras_window": 33},
        {"top_p": 0.0},
        {"temperature": -1.0},
        {"seed": 1 << 63},
        {"ref_rows": ((1, 2, 3),)},
        {"ref_rows": ((0,) * 7 + (CODEBOOK_VOCAB,),)},
        {"correlation_id": ""},
        {"ref_offset": -1},
    ],
)
def test_out_of_range_talker_args_are_rejected(overrides: dict[str, object]) -> None:
    with pytest.raises(TalkerArgsError):
        talker_args(**overrides)


def test_unknown_talker_arg_fields_are_a_typed_error() -> None:
    extra = talker_args().to_extra_args()
    extra[EXTRA_ARGS_KEY]["surprise"] = 1
    with pytest.raises(TalkerArgsError):
        TalkerArgs.from_extra_args(extra)


@settings(max_examples=50)
@given(rows=rows_strategy, data=st.data())
def test_row_messages_round_trip(rows: list[tuple[int, ...]], data: st.DataObject) -> None:
    headers = [
        RowHeader(data.draw(st.text(max_size=8)), data.draw(st.integers(0, 1 << 40)), last)
        for last in data.draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows)))
    ]
    array = np.array(rows, dtype=np.int64).reshape(len(rows), NUM_CODEBOOKS)
    events = decode_message(encode_rows(headers, array))
    assert [e.header for e in events if isinstance(e, RowEvent)] == headers
    got = [e.row for e in events if isinstance(e, RowEvent)]
    np.testing.assert_array_equal(np.array(got).reshape(-1, NUM_CODEBOOKS), array)


def test_failure_messages_round_trip_and_garbage_is_rejected() -> None:
    assert decode_message(encode_failure("c", "why")) == [FailureEvent("c", "why")]
    frames = encode_rows([RowHeader("c", 0, False)], np.zeros((1, 8), dtype=np.int64))
    with pytest.raises(RowMessageError):
        decode_message(frames[:2])
    with pytest.raises(RowMessageError):
        decode_message([frames[0], frames[1], frames[2][:-2]])
    with pytest.raises(RowMessageError):
        decode_message([b"X", frames[1], frames[2]])
    with pytest.raises(RowMessageError):
        decode_message([frames[0], b"not json", frames[2]])


@settings(max_examples=30)
@given(
    sizes=st.lists(st.integers(0, 3000), max_size=6),
    data=st.data(),
)
def test_pcm_messages_round_trip(sizes: list[int], data: st.DataObject) -> None:
    stamp = st.none() | st.fixed_dictionaries({"first_row": st.floats(0, 1e6)})
    headers = [
        PcmHeader(
            data.draw(st.text(max_size=8)),
            data.draw(st.integers(0, 1 << 40)),
            n,
            data.draw(st.booleans()),
            data.draw(stamp),
            data.draw(st.none() | st.integers(0, 40).map(_rows)),
        )
        for n in sizes
    ]
    rng = np.random.default_rng(len(sizes))
    pcm = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    events = decode_message(encode_pcm(headers, pcm))
    assert all(isinstance(e, PcmEvent) for e in events)
    for header, chunk, event in zip(headers, pcm, events, strict=True):
        assert isinstance(event, PcmEvent)
        assert event.correlation_id == header.correlation_id
        assert event.chunk.start_frame == header.start_frame
        assert event.chunk.final == header.final and event.stamps == header.stamps
        np.testing.assert_array_equal(event.chunk.pcm, chunk)
        if header.rows is None:
            assert event.chunk.rows is None
        else:
            assert event.chunk.rows is not None
            np.testing.assert_array_equal(event.chunk.rows, header.rows)


def _rows(n: int) -> np.ndarray:
    """Delay-patterned rows as the worker returns them: codes and BOC/EOC, int16."""
    return np.random.default_rng(n).integers(0, 1026, size=(n, 8)).astype(np.int16)


def test_malformed_pcm_messages_are_typed_errors() -> None:
    frames = encode_pcm([PcmHeader("c", 0, 4, False)], [np.ones(4, np.float32)])
    with pytest.raises(RowMessageError):
        decode_message([frames[0], frames[1], frames[2][:-4]])  # a sample short
    with pytest.raises(RowMessageError):
        decode_message([frames[0], b'[["c", -1, 4, 0, null]]', frames[2]])
    with pytest.raises(RowMessageError):
        decode_message([frames[0], b'[["c", 0, 4, 0, 7]]', frames[2]])  # stamps not a dict
    with pytest.raises(RowMessageError):
        encode_pcm([PcmHeader("c", 0, 3, False)], [np.ones(4, np.float32)])


def test_chunking_rides_in_the_talker_args() -> None:
    chunking = ChunkingParams(2, 15, 12, 4, None)
    args = talker_args(chunking=TalkerArgs.chunking_fields(chunking))
    back = TalkerArgs.from_extra_args(args.to_extra_args())
    assert back == args and back is not None and back.chunking_params() == chunking
    with pytest.raises(TalkerArgsError, match="chunking"):
        talker_args(chunking=(0, 15, 12, 4, 1.5))
    with pytest.raises(TalkerArgsError, match="rows"):
        talker_args().chunking_params()


def test_step_rows_split_by_destination_keeping_only_valid_rows() -> None:
    a, b = (
        talker_args(correlation_id="a", endpoint="ep1"),
        talker_args(correlation_id="b", endpoint="ep2"),
    )
    c = talker_args(correlation_id="c", endpoint="ep1")
    step = StepRows(
        rows=torch.arange(32).view(4, 8),
        valid=torch.tensor([True, True, False, True]),
        done=torch.tensor([False, True, False, False]),
        index=torch.tensor([3, 9, 4, 0]),
    )
    groups = split_by_endpoint(step.packed().numpy(), [a, b, c, None])
    assert set(groups) == {"ep1", "ep2"}
    headers, rows = groups["ep1"]
    assert headers == [RowHeader("a", 3, False)]  # c's row was not a real step
    np.testing.assert_array_equal(rows, np.arange(8).reshape(1, 8))
    headers, rows = groups["ep2"]
    assert headers == [RowHeader("b", 9, True)]
    np.testing.assert_array_equal(rows, np.arange(8, 16).reshape(1, 8))


def test_rows_cross_processes_sockets_in_order() -> None:
    got: list[Event] = []
    finished = threading.Event()

    def deliver(event: Event) -> None:
        got.append(event)
        if isinstance(event, FailureEvent):
            finished.set()

    receiver = RowReceiver(deliver)
    pusher = RowPusher()
    try:
        for i in range(50):
            row = np.full((1, 8), i, dtype=np.int64)
            pusher.push(receiver.endpoint, [RowHeader("r", i, i == 49)], row)
        pusher.push_failure(receiver.endpoint, "r", "end")
        assert finished.wait(10)
    finally:
        pusher.close()
        receiver.close()
    rows = [e for e in got if isinstance(e, RowEvent)]
    assert [e.header.index for e in rows] == list(range(50))
    assert [int(e.row[0]) for e in rows] == list(range(50))
    assert pusher.dropped_messages == 0


SPECIALS = SpecialIds(tts=1, audio=2, text=3, ref_audio=4, ref_text=5, eos=6, audio_end=7)


def test_engine_prompt_replaces_placeholders_and_locates_the_reference_rows() -> None:
    ref = np.arange(24).reshape(3, 8)
    ids = (1, 4, *[AUDIO_PLACEHOLDER_ID] * 3, 3, 50, 2)
    request = TalkerRequest("x", TalkerPrompt(ids, ref))
    tokens, offset, rows = engine_prompt(request, SPECIALS)
    assert tokens == [1, 4, 2, 2, 2, 3, 50, 2]
    assert offset == 2
    assert rows == tuple(tuple(r) for r in ref.tolist())
    assert engine_prompt(TalkerRequest("z", TalkerPrompt((1, 3, 2))), SPECIALS) == (
        [1, 3, 2],
        0,
        (),
    )


@pytest.mark.parametrize(
    ("ids", "n_ref"),
    [
        ((1, AUDIO_PLACEHOLDER_ID, 3, AUDIO_PLACEHOLDER_ID, 2), 2),  # not one run
        ((1, AUDIO_PLACEHOLDER_ID, 2), 2),  # count mismatch
        ((1, AUDIO_PLACEHOLDER_ID, 2), 0),  # placeholders without rows
    ],
)
def test_engine_prompt_rejects_inconsistent_placeholders(ids: tuple[int, ...], n_ref: int) -> None:
    ref = np.zeros((n_ref, 8), dtype=np.int64) if n_ref else None
    with pytest.raises(TalkerError):
        engine_prompt(TalkerRequest("x", TalkerPrompt(ids, ref)), SPECIALS)


def test_counter_noise_depends_only_on_seed_and_step() -> None:
    seeds = torch.tensor([1, 2, 1, -5])
    steps = torch.tensor([0, 0, 3, 7])
    batch = counter_noise(seeds, steps, 8, 1026)
    assert batch.shape == (4, 2, 8, 1026)
    for i in range(4):
        alone = counter_noise(seeds[i : i + 1], steps[i : i + 1], 8, 1026)
        torch.testing.assert_close(batch[i : i + 1], alone, rtol=0, atol=0)
    assert not torch.equal(batch[0], batch[1])  # other seed
    assert not torch.equal(batch[0], batch[2])  # other step
    assert not torch.equal(batch[0, 0], batch[0, 1])  # the two streams differ


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(-(1 << 62), 1 << 62), step=st.integers(0, 1 << 20))
def test_counter_noise_is_uniform_in_the_open_unit_interval(seed: int, step: int) -> None:
    u = uniform_noise(torch.tensor([seed]), torch.tensor([step]), 8, 1026, 0)
    assert bool((u > 0).all()) and bool((u < 1).all())
    assert abs(float(u.mean()) - 0.5) < 0.02  # 8208 draws: sd of the mean ~0.003
    hist = torch.histc(u, bins=4, min=0, max=1)
    assert bool((hist > 8208 / 4 * 0.85).all())


def test_counter_noise_drives_the_shared_sampler_to_the_right_distribution() -> None:
    """Sampling a fixed 3-way distribution over many steps matches its probabilities."""
    vocab, steps = 16, 4000
    logits = torch.full((steps, 1, vocab), float("-inf"))
    logits[:, 0, :3] = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    allowed = torch.ones(steps, 1, vocab, dtype=torch.bool)
    params = BatchSampling(
        temperature=torch.ones(steps),
        top_k=torch.zeros(steps, dtype=torch.int64),
        top_p=torch.ones(steps),
        ras_window=torch.zeros(steps, dtype=torch.int64),
        ras_max_repeat=torch.zeros(steps, dtype=torch.int64),
    )
    noise = counter_noise(torch.full((steps,), 9), torch.arange(steps), 1, vocab)
    history = torch.full((steps, 1, 4), -1)
    draws = sample_codes(logits, allowed, params, noise, history).codes.view(-1).numpy()
    freq = np.bincount(draws, minlength=3)[:3] / steps
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.2], atol=0.03)


class _IdleEngine:
    """The part of vLLM's ``AsyncLLM`` interface a runner uses without requests."""

    def __init__(self) -> None:
        self.shut_down = False

    async def abort(self, request_id: str) -> None:
        return None

    def shutdown(self) -> None:
        self.shut_down = True


@pytest.mark.parametrize(
    ("max_new", "fixed", "prompt_len", "expected"),
    [
        (2048, None, 10, (90, None)),  # capped to the context left
        (50, None, 10, (50, None)),
        (50, 40, 10, (None, 40)),
        (50, 90, 10, (None, 90)),
    ],
)
async def test_row_budget_fits_the_context_window(
    max_new: int, fixed: int | None, prompt_len: int, expected: tuple[int | None, int | None]
) -> None:
    from realtime_engine.talker.vllm_requests import row_budget
    from realtime_engine.talker.vllm_runner import VllmTalkerRunner

    engine = _IdleEngine()
    runner = VllmTalkerRunner(engine, SPECIALS, max_model_len=100)
    try:
        request = TalkerRequest("b", TalkerPrompt((1,)), max_new_tokens=max_new, fixed_rows=fixed)
        assert row_budget(request, prompt_len, 100) == expected
        too_many = TalkerRequest("c", TalkerPrompt((1,)), fixed_rows=91)
        with pytest.raises(TalkerError, match="exceeds"):
            row_budget(too_many, prompt_len, 100)
        with pytest.raises(TalkerError, match="no room"):
            row_budget(request, 95, 100)
    finally:
        await runner.close()
    assert engine.shut_down
    with pytest.raises(TalkerError, match="closed"):
        runner.submit(request)


def test_recent_codes_reads_each_slots_last_rows_oldest_first() -> None:
    from realtime_engine.talker.vllm_sampling import recent_codes

    codes_by_pos = torch.zeros(3, 20, 8, dtype=torch.int16)
    prompt_len = torch.tensor([5, 2, 0])
    for slot, start in enumerate((5, 2, 0)):
        for k in range(6):
            codes_by_pos[slot, start + k] = 100 * slot + k
    got = recent_codes(codes_by_pos, prompt_len, torch.tensor([1, 0]), torch.tensor([6, 2]), 4)
    assert got.shape == (2, 8, 4)
    assert got[0, 0].tolist() == [102, 103, 104, 105]
    assert got[1, 3].tolist() == [-1, -1, 0, 1]


def test_step_counters_cross_with_the_senders_rank() -> None:
    stats = StepStats(steps=12, rows=300, timed_steps=11, step_s=0.125)
    assert decode_message(encode_stats(stats)) == [StatsEvent(stats)]
    (ranked,) = decode_message(encode_stats(stats, rank=1))
    assert isinstance(ranked, StatsEvent) and ranked.stats.rank == 1
    own = StepStats(1, 2, 0, 0.0, rank=3)  # the counters' own rank wins
    (kept,) = decode_message(encode_stats(own, rank=1))
    assert isinstance(kept, StatsEvent) and kept.stats.rank == 3


@pytest.mark.parametrize(
    "head",
    [
        b"[1, 2, 3]",  # too few fields
        b"[-1, 2, 0, 0.0, null]",  # a negative count
        b"[1, 2, 2, 0.0, null]",  # more timed steps than steps
        b"[1, 2, 1, -0.5, null]",  # negative time
        b"[1, 2, 1, NaN, null]",
        b'[1, 2, 1, "x", null]',
    ],
)
def test_malformed_step_counters_are_refused(head: bytes) -> None:
    with pytest.raises(RowMessageError):
        decode_message([b"S", head, b""])
