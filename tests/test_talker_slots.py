"""The talker's per-slot step (vLLM's sampler body) and its padded-batch runner, on CPU.

The CUDA-graph runner pads each batch up to a bucket with rows of the trash
slot. These tests run the same padded buffers eagerly and check that padding
changes nothing a real request can see: tokens, rows and every slot's state
equal the unpadded step's, whatever the batch order, sampling settings or
partial prefills.
"""

from __future__ import annotations

import copy
import itertools
import logging
import re
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
from capture_support import DeviceOnlyOps, HostToDeviceWrites
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime_engine.codec.delay import revert_delay
from realtime_engine.talker.termination import eoc_bounds
from realtime_engine.talker.types import BOC, CODEBOOK_VOCAB, EOC, NUM_CODEBOOKS
from realtime_engine.talker.vllm_protocol import TalkerArgs
from realtime_engine.talker.vllm_sampler_graphs import (
    PaddedStepGraphs,
    SamplerCaptureError,
    bucket_sizes,
    graphs_wanted,
)
from realtime_engine.talker.vllm_slots import SavedSlot, TalkerSlots

CPU = torch.device("cpu")
MAX_SLOTS = 6
MAX_LEN = 96
AUDIO_TOKEN, EOS_TOKEN = 7, 3
WIDTH = NUM_CODEBOOKS * CODEBOOK_VOCAB


@pytest.fixture
def start_up_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """The sampler's start-up lines (its logger is under vLLM's, which may not
    propagate to the root logger that ``caplog`` watches)."""
    log = logging.getLogger("vllm.plugins.higgs_talker.sampler_graphs")
    log.addHandler(caplog.handler)
    level = log.level
    log.setLevel(logging.INFO)
    try:
        yield caplog
    finally:
        log.removeHandler(caplog.handler)
        log.setLevel(level)


def make_args(
    name: str, *, temperature: float, top_k: int = 0, top_p: float = 1.0, rows: int = 20, **kw: int
) -> TalkerArgs:
    not_before, at = eoc_bounds(None, rows)
    return TalkerArgs(
        correlation_id=name,
        endpoint="ipc:///nowhere",
        audio_token_id=AUDIO_TOKEN,
        eos_token_id=EOS_TOKEN,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        ras_window=kw.get("ras_window", 0),
        ras_max_repeat=kw.get("ras_max_repeat", 0),
        seed=kw.get("seed", 0),
        eoc_not_before=not_before,
        eoc_at=at,
    )


REQUESTS = {
    0: make_args("greedy", temperature=0.0, rows=12),
    2: make_args("sampled", temperature=1.0, top_k=50, top_p=0.95, seed=11),
    3: make_args("ras", temperature=0.8, ras_window=7, ras_max_repeat=2, seed=5, rows=16),
    5: make_args("plain", temperature=1.2, seed=99, rows=9),
}
PROMPT_LEN = {0: 10, 2: 14, 3: 9, 5: 20}


def fresh_slots() -> TalkerSlots:
    slots = TalkerSlots(MAX_SLOTS, MAX_LEN, NUM_CODEBOOKS, CODEBOOK_VOCAB, CPU)
    for slot, args in REQUESTS.items():
        slots.admit(slot, args, PROMPT_LEN[slot], PROMPT_LEN[slot])
    return slots


def state_of(slots: TalkerSlots, slot: int) -> list[torch.Tensor]:
    t = slots.termination
    return [
        slots.codes_by_pos[slot],
        slots.audio_at_pos[slot],
        slots.live[slot],
        t.step[slot],
        t.eoc_step[slot],
    ]


def assert_same_state(a: TalkerSlots, b: TalkerSlots) -> None:
    for slot in range(MAX_SLOTS):  # every slot but the trash slot
        for x, y in zip(state_of(a, slot), state_of(b, slot), strict=True):
            assert torch.equal(x, y), f"slot {slot} differs"


def run_steps(
    order_per_step: list[list[int]], seed: int, padded: bool
) -> tuple[TalkerSlots, list[tuple[torch.Tensor, ...]]]:
    slots = fresh_slots()
    runner = PaddedStepGraphs(
        slots.step, max_batch=MAX_SLOTS, pad_slot=slots.trash_slot, device=CPU, capture=False
    )
    gen = torch.Generator().manual_seed(seed)
    outs = []
    for order in order_per_step:
        logits = torch.randn(len(order), WIDTH, generator=gen)
        idx = torch.tensor(order, dtype=torch.int64)
        seq_lens = slots.prefill_len[idx] + slots.termination.step[idx]
        if padded:
            got = runner(logits, idx.to(torch.int32), seq_lens.to(torch.int32))
            assert got is not None
        else:
            got = slots.step(logits, idx, seq_lens)
        outs.append(got)
    return slots, outs


@settings(max_examples=25, deadline=None)
@given(
    orders=st.lists(st.permutations(sorted(REQUESTS)), min_size=1, max_size=24),
    sizes=st.lists(st.integers(1, len(REQUESTS)), min_size=24, max_size=24),
    seed=st.integers(0, 2**31 - 1),
)
def test_padded_steps_equal_unpadded_steps(
    orders: list[list[int]], sizes: list[int], seed: int
) -> None:
    batches = [order[: sizes[i]] for i, order in enumerate(orders)]
    plain, plain_out = run_steps(batches, seed, padded=False)
    padded, padded_out = run_steps(batches, seed, padded=True)
    for a, b in zip(plain_out, padded_out, strict=True):
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)
    assert_same_state(plain, padded)


def test_a_request_runs_to_a_closed_delay_pattern_and_then_answers_eos() -> None:
    slots, outs = run_steps([[0, 2, 3, 5]] * 24, seed=1, padded=True)
    rows: dict[int, list[np.ndarray]] = {s: [] for s in REQUESTS}
    tokens_after_done: dict[int, list[int]] = {s: [] for s in REQUESTS}
    for tokens, real, packed in outs:
        assert bool(real.all())
        for i, slot in enumerate([0, 2, 3, 5]):
            valid, done = bool(packed[i, NUM_CODEBOOKS]), bool(packed[i, NUM_CODEBOOKS + 1])
            if valid:
                rows[slot].append(packed[i, :NUM_CODEBOOKS].numpy())
            else:
                tokens_after_done[slot].append(int(tokens[i]))
            if done:
                assert int(tokens[i]) == EOS_TOKEN
    expected_rows = {0: 12, 2: 20, 3: 16, 5: 9}
    for slot, got in rows.items():
        grid = np.stack(got)
        assert len(grid) == expected_rows[slot]
        assert grid[0, 1] == BOC and grid[-1, 0] == EOC
        frames = revert_delay(grid)
        assert frames.shape == (expected_rows[slot] - (NUM_CODEBOOKS - 1), NUM_CODEBOOKS)
        assert (frames < BOC).all()
        assert set(tokens_after_done[slot]) <= {EOS_TOKEN}
    assert not bool(slots.live[:MAX_SLOTS].any())


def test_partial_prefill_rows_change_nothing() -> None:
    slots = fresh_slots()
    slots.prefill_len[2] = PROMPT_LEN[2] + 30  # still prefilling in chunks
    before = [t.clone() for t in state_of(slots, 2)]
    runner = PaddedStepGraphs(
        slots.step, max_batch=MAX_SLOTS, pad_slot=slots.trash_slot, device=CPU, capture=False
    )
    idx = torch.tensor([2, 0])
    out = runner(torch.randn(2, WIDTH), idx, torch.tensor([PROMPT_LEN[2] + 16, PROMPT_LEN[0]]))
    assert out is not None
    _tokens, real, packed = out
    assert real.tolist() == [False, True]
    assert packed[:, NUM_CODEBOOKS].tolist() == [0, 1]
    for x, y in zip(before, state_of(slots, 2), strict=True):
        assert torch.equal(x, y)
    assert int(slots.termination.step[0]) == 1


def test_saved_slot_restores_history_into_another_slot() -> None:
    slots, _ = run_steps([[2, 5]] * 5, seed=3, padded=False)
    saved = SavedSlot.take(slots, 2)
    other = copy.deepcopy(slots)
    other.begin(1, PROMPT_LEN[2], PROMPT_LEN[2] + 5)
    other.apply_params(1, REQUESTS[2])
    saved.restore(other, 1)
    for x, y in zip(state_of(slots, 2), state_of(other, 1), strict=True):
        assert torch.equal(x, y)


def test_batches_beyond_the_largest_bucket_fall_back_to_the_caller() -> None:
    slots = fresh_slots()
    runner = PaddedStepGraphs(
        slots.step, max_batch=4, pad_slot=slots.trash_slot, device=CPU, capture=False
    )
    assert runner(torch.zeros(5, WIDTH), torch.zeros(5), torch.zeros(5)) is None
    assert runner(torch.zeros(0, WIDTH), torch.zeros(0), torch.zeros(0)) is None


@given(st.integers(1, 2048))
def test_bucket_sizes_cover_every_batch(max_batch: int) -> None:
    sizes = bucket_sizes(max_batch)
    assert sizes == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == max_batch
    # padding never more than doubles a batch, and at most 32 rows beyond 128
    for lo, hi in itertools.pairwise(sizes):
        assert hi <= 2 * lo and (lo < 128 or hi - lo <= 32)


def test_bucket_sizes_reject_empty() -> None:
    with pytest.raises(ValueError):
        bucket_sizes(0)


def test_graphs_are_on_for_cuda_unless_vllm_runs_eagerly() -> None:
    cuda = torch.device("cuda")
    assert graphs_wanted(cuda, enforce_eager=False)
    assert not graphs_wanted(cuda, enforce_eager=True)
    assert not graphs_wanted(CPU, enforce_eager=False)


def test_a_failed_capture_stops_the_engine_with_the_cause() -> None:
    slots = fresh_slots()
    runner = PaddedStepGraphs(
        slots.step, max_batch=MAX_SLOTS, pad_slot=slots.trash_slot, device=CPU, capture=True
    )
    idx = torch.tensor([0, 2])
    seq_lens = slots.prefill_len[idx]
    before = [t.clone() for t in state_of(slots, 0) + state_of(slots, 2)]
    # CPU has no CUDA graphs: the capture raises, and so does every later attempt
    for _ in range(2):
        with pytest.raises(SamplerCaptureError, match="capturing the code sampler"):
            runner(torch.randn(2, WIDTH), idx, seq_lens)
    # the warm-up before the capture touched only the trash slot
    for x, y in zip(before, state_of(slots, 0) + state_of(slots, 2), strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("batch", [1, 3, MAX_SLOTS + 1])
def test_the_step_is_capturable_no_host_tensors_reads_or_data_dependent_shapes(
    batch: int,
) -> None:
    """What a CUDA graph needs, checked on the meta device (no data at all): a host
    read (``.item()``, ``.tolist()``) or a data-dependent shape (``nonzero``,
    boolean-mask indexing) raises there, and every op must take device tensors
    only (a host tensor would be a copy that capture refuses)."""
    meta = torch.device("meta")
    slots = TalkerSlots(MAX_SLOTS, MAX_LEN, NUM_CODEBOOKS, CODEBOOK_VOCAB, meta)
    logits = torch.empty(batch, WIDTH, device=meta)
    idx = torch.empty(batch, dtype=torch.int64, device=meta)
    seq_lens = torch.empty(batch, dtype=torch.int64, device=meta)
    watch = DeviceOnlyOps(meta)
    with watch:
        tokens, real, packed = slots.step(logits, idx, seq_lens)
    assert watch.offenders == []
    assert tokens.shape == real.shape == (batch,)
    assert packed.shape == (batch, NUM_CODEBOOKS + 3)


def compiled_cpu_runner(
    step: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]],
    slots: TalkerSlots,
) -> PaddedStepGraphs:
    """The padded runner with ``compiled=True``, without graphs (Inductor's CPU code)."""
    return PaddedStepGraphs(
        step,
        max_batch=MAX_SLOTS,
        pad_slot=slots.trash_slot,
        device=CPU,
        capture=False,
        compiled=True,
    )


def test_the_compiled_sampler_draws_the_eager_rows_from_one_trace() -> None:
    """``compiled=True``: the step through torch.compile (Inductor's CPU code here,
    Triton's on CUDA) gives the eager step's tokens, rows and slot state exactly,
    greedy, seeded, top-k/top-p and RAS alike, for every batch size and order
    (a batch of 1 runs padded to 2), from a single trace."""
    from torch._dynamo.utils import counters

    eager = fresh_slots()
    compiled = copy.deepcopy(eager)
    runner = compiled_cpu_runner(compiled.step, compiled)
    assert 1 not in runner.sizes
    traced = counters["stats"]["unique_graphs"]
    rng = np.random.default_rng(7)
    gen = torch.Generator().manual_seed(7)
    requests = sorted(REQUESTS)
    for _ in range(26):  # past every request's end: EOC, ramp-down, eos
        order = [int(s) for s in rng.permutation(requests)[: rng.integers(1, len(requests) + 1)]]
        logits = torch.randn(len(order), WIDTH, generator=gen)
        idx = torch.tensor(order)
        seq_lens = eager.prefill_len[idx] + eager.termination.step[idx]
        want = eager.step(logits, idx, seq_lens)
        got = runner(logits, idx, seq_lens)
        assert got is not None
        for x, y in zip(want, got, strict=True):
            assert torch.equal(x, y)
    assert_same_state(eager, compiled)
    assert counters["stats"]["unique_graphs"] - traced == 1


def test_a_sampler_the_compiler_cannot_trace_runs_eagerly(
    start_up_log: pytest.LogCaptureFixture,
) -> None:
    """A compiler failure costs speed, not the engine: the runner falls back to the
    eager step (and its full set of buckets) and still gives the eager rows; the
    start-up log does not claim a compiled sampler."""
    eager = fresh_slots()
    fallback = copy.deepcopy(eager)

    def untraceable(
        logits: torch.Tensor, slots: torch.Tensor, seq_lens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if int(seq_lens.sum()) < 0:  # a host read: fullgraph tracing refuses it
            raise AssertionError
        return fallback.step(logits, slots, seq_lens)

    runner = compiled_cpu_runner(untraceable, fallback)
    idx = torch.tensor([5, 2])
    logits = torch.randn(2, WIDTH, generator=torch.Generator().manual_seed(3))
    seq_lens = eager.prefill_len[idx]
    got = runner(logits, idx, seq_lens)
    assert not runner.compiled and 1 in runner.sizes
    assert not any(
        "compiled" in r.getMessage() for r in start_up_log.records if r.levelno == logging.INFO
    )
    assert got is not None
    for x, y in zip(eager.step(logits, idx, seq_lens), got, strict=True):
        assert torch.equal(x, y)
    assert_same_state(eager, fallback)


def test_the_compiled_sampler_is_traced_after_one_eager_step(
    start_up_log: pytest.LogCaptureFixture,
) -> None:
    """The step's cached constants (the noise lanes) exist before the trace, so the
    trace reads them as tensors (traced from scratch, their ``arange + 64-bit
    constant`` fails Triton's compiler, whose arange is 32-bit). The start-up log
    says what was done and how long it took."""
    from realtime_engine.talker import vllm_sampling

    vllm_sampling._LANES.clear()
    slots = fresh_slots()
    seen: list[int] = []

    def step(
        logits: torch.Tensor, idx: torch.Tensor, seq_lens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not torch.compiler.is_compiling():
            seen.append(len(vllm_sampling._LANES))
        return slots.step(logits, idx, seq_lens)

    runner = compiled_cpu_runner(step, slots)
    assert runner(torch.randn(1, WIDTH), torch.tensor([0]), slots.prefill_len[:1]) is not None
    assert runner.compiled
    assert seen[0] == 0 and len(vllm_sampling._LANES) == 1  # eager ran first, built the lanes
    lines = [r.getMessage() for r in start_up_log.records]
    assert any(
        re.fullmatch(r"compiled the code sampler for batch sizes \[.*\] in \d+\.\d s", line)
        for line in lines
    ), lines


def test_admitting_stopping_and_releasing_a_slot_copy_nothing_from_the_host() -> None:
    """Per-request writes are scalar fills: ``x[slot] = value`` would copy a host
    scalar to the device, which makes the host wait for all the device work
    queued before it (under vLLM's async scheduling, a step's worth). Checked on
    the meta device, at the level of the calls that would copy."""
    meta = torch.device("meta")
    slots = TalkerSlots(MAX_SLOTS, MAX_LEN, NUM_CODEBOOKS, CODEBOOK_VOCAB, meta)
    watch = HostToDeviceWrites()
    with watch:
        for slot, args in REQUESTS.items():
            slots.admit(slot, args, PROMPT_LEN[slot], PROMPT_LEN[slot])
        slots.stop(2, EOS_TOKEN)
        slots.release(3)
        SavedSlot.take(slots, 5).restore(slots, 1)
    assert watch.offenders == []


def test_a_slot_admitted_by_fills_holds_its_settings() -> None:
    slots = fresh_slots()
    args = REQUESTS[3]
    assert [int(slots.seed[3]), int(slots.ras_window[3]), int(slots.ras_max_repeat[3])] == [
        args.seed,
        args.ras_window,
        args.ras_max_repeat,
    ]
    assert float(slots.temperature[3]) == pytest.approx(args.temperature)
    assert int(slots.prompt_len[3]) == PROMPT_LEN[3] and bool(slots.live[3])
    assert int(slots.termination.eoc_at[3]) == args.eoc_at
    assert int(slots.termination.eoc_step[3]) == -1
    slots.stop(3, EOS_TOKEN)
    assert not bool(slots.live[3]) and int(slots.eos_token[3]) == EOS_TOKEN
    slots.release(0)
    assert not bool(slots.live[0])
