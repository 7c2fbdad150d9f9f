from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime_engine.codec.delay import apply_delay, revert_delay
from realtime_engine.talker.termination import (
    NEVER,
    BatchTermination,
    CodebookMode,
    TerminationState,
    allowed_for_modes,
    eoc_bounds,
)
from realtime_engine.talker.types import BOC, EOC

C, E, B_, X = (
    CodebookMode.CODE,
    CodebookMode.CODE_OR_EOC,
    CodebookMode.BOC_ONLY,
    CodebookMode.EOC_ONLY,
)


def _fake_model_codes(step: int, modes: list[CodebookMode], end_at: int | None) -> list[int]:
    """What a model might sample: EOC on codebook 0 at ``end_at`` if allowed, else a code."""
    out = []
    for c, mode in enumerate(modes):
        if c == 0 and step == end_at and mode is CodebookMode.CODE_OR_EOC:
            out.append(EOC)
        elif mode is CodebookMode.BOC_ONLY:
            out.append(BOC)
        elif mode is CodebookMode.EOC_ONLY:
            out.append(EOC)
        else:
            out.append((step * 31 + c * 7) % 1024)
    return out


def _run(state: TerminationState, end_at: int | None, limit: int = 500) -> np.ndarray:
    rows: list[np.ndarray] = []
    while not state.done and len(rows) < limit:
        modes = state.modes()
        rows.append(state.observe(_fake_model_codes(state.step, modes, end_at)))
    return np.stack(rows)


def test_explicit_table_three_codebooks_one_frame() -> None:
    # N=3, codebook 0 ends at step 1 (one real frame): rows = T + N - 1 = 3
    state = TerminationState(3)
    expected = [
        [E, B_, B_],  # step 0: only codebook 0 is live, it may already end
        [E, C, B_],  # step 1: codebook 1 starts; codebook 0 samples EOC here
        [X, X, C],  # step 2: codebooks 0 and 1 are finished, codebook 2 has its last frame
    ]
    sampled = [[5, 0, 0], [EOC, 6, 0], [0, 0, 7]]
    rows = []
    for modes, codes in zip(expected, sampled, strict=True):
        assert not state.done
        assert state.modes() == modes
        rows.append(state.observe(codes))
    assert state.done
    np.testing.assert_array_equal(np.stack(rows), [[5, BOC, BOC], [EOC, 6, BOC], [EOC, EOC, 7]])
    np.testing.assert_array_equal(revert_delay(np.stack(rows)), [[5, 6, 7]])


@pytest.mark.parametrize("num_codebooks", [2, 3, 8])
@pytest.mark.parametrize("frames", list(range(0, 14)))
def test_modes_follow_the_delay_layout(num_codebooks: int, frames: int) -> None:
    state = TerminationState(num_codebooks)
    rows = []
    while not state.done:
        k = state.step
        modes = state.modes()
        for c, mode in enumerate(modes):
            if c > k:
                assert mode is CodebookMode.BOC_ONLY
            elif k - c >= frames and not (c == 0 and k == frames):
                # apply_delay puts EOC at row >= frames + c; codebook 0 samples its own
                assert mode is CodebookMode.EOC_ONLY
            elif c == 0:
                assert mode is CodebookMode.CODE_OR_EOC
            else:
                assert mode is CodebookMode.CODE
        rows.append(state.observe(_fake_model_codes(k, modes, frames)))
    assert len(rows) == frames + num_codebooks - 1
    got = np.stack(rows)
    np.testing.assert_array_equal(apply_delay(revert_delay(got)), got)
    assert (revert_delay(got) < 1024).all()


def test_observe_overwrites_forced_cells() -> None:
    state = TerminationState(8)
    row = state.observe([3] * 8)
    np.testing.assert_array_equal(row, [3] + [BOC] * 7)


def test_observe_after_done_raises() -> None:
    state = TerminationState(2)
    state.observe([EOC, BOC])
    assert state.done
    with pytest.raises(RuntimeError):
        state.observe([EOC, EOC])


@pytest.mark.parametrize("fixed_rows", [7, 8, 9, 20, 64])
@pytest.mark.parametrize("wants_to_end_at", [0, 3, None])
def test_fixed_rows_exact_length(fixed_rows: int, wants_to_end_at: int | None) -> None:
    lo, at = eoc_bounds(max_new_tokens=2048, fixed_rows=fixed_rows)
    rows = _run(TerminationState(eoc_not_before=lo, eoc_at=at), wants_to_end_at)
    assert rows.shape == (fixed_rows, 8)
    np.testing.assert_array_equal(apply_delay(revert_delay(rows)), rows)


@pytest.mark.parametrize("cap", [7, 10, 40])
def test_max_new_tokens_caps_and_closes_the_pattern(cap: int) -> None:
    lo, at = eoc_bounds(max_new_tokens=cap, fixed_rows=None)
    rows = _run(TerminationState(eoc_not_before=lo, eoc_at=at), None)
    assert rows.shape == (cap, 8)
    np.testing.assert_array_equal(apply_delay(revert_delay(rows)), rows)
    # an earlier natural end is kept
    early = _run(TerminationState(eoc_not_before=lo, eoc_at=at), 1)
    assert early.shape[0] == min(cap, 1 + 7)


def test_eoc_bounds_without_limits() -> None:
    assert eoc_bounds(None, None) == (0, NEVER)


@pytest.mark.parametrize("mode", list(CodebookMode))
def test_allowed_masks(mode: CodebookMode) -> None:
    mask = allowed_for_modes(torch.tensor([int(mode)]))[0]
    assert mask.shape == (1026,)
    allowed = set(torch.nonzero(mask).flatten().tolist())
    expected = {
        CodebookMode.CODE: set(range(1024)),
        CodebookMode.CODE_OR_EOC: set(range(1024)) | {EOC},
        CodebookMode.BOC_ONLY: {BOC},
        CodebookMode.EOC_ONLY: {EOC},
    }[mode]
    assert allowed == expected


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(0, 25)),  # step where the model wants EOC
            st.integers(0, 12),  # eoc_not_before
            st.one_of(st.just(NEVER), st.integers(0, 30)),  # eoc_at
            st.integers(0, 6),  # step at which the request joins
        ),
        min_size=1,
        max_size=6,
    ),
    st.randoms(use_true_random=False),
)
def test_batch_equals_scalar(requests: list[tuple[int | None, int, int, int]], rnd) -> None:
    max_slots = 8
    batch = BatchTermination(max_slots)
    slot_of = rnd.sample(range(max_slots), len(requests))
    scalars: dict[int, TerminationState] = {}
    finished: set[int] = set()
    for tick in range(60):
        for i, (_, lo, at, join) in enumerate(requests):
            if join == tick:
                lo_eff = min(lo, at)
                scalars[i] = TerminationState(eoc_not_before=lo_eff, eoc_at=at)
                batch.reset(torch.tensor([slot_of[i]]), torch.tensor([lo_eff]), torch.tensor([at]))
        live = [i for i in scalars if i not in finished]
        if not live:
            continue
        rnd.shuffle(live)  # batch rows in arbitrary slot order
        slots = torch.tensor([slot_of[i] for i in live])
        modes = batch.modes(slots)
        sampled = []
        for row, i in enumerate(live):
            scalar_modes = scalars[i].modes()
            assert modes[row].tolist() == [int(m) for m in scalar_modes]
            sampled.append(_fake_model_codes(scalars[i].step, scalar_modes, requests[i][0]))
        rows, done = batch.advance(slots, torch.tensor(sampled))
        for row, i in enumerate(live):
            expected = scalars[i].observe(sampled[row])
            assert rows[row].tolist() == expected.tolist()
            assert bool(done[row]) == scalars[i].done
            if scalars[i].done:
                finished.add(i)


def test_invalid_rows_leave_their_slot_untouched() -> None:
    batch = BatchTermination(3)
    slots = torch.tensor([2, 0])
    batch.reset(slots, torch.tensor([0, 0]), torch.tensor([NEVER, NEVER]))
    reference = TerminationState()
    sampled = torch.tensor([[EOC] + [BOC] * 7, [EOC] + [BOC] * 7])
    while not reference.done:
        # slot 2 is real every step; slot 0 only pads the batch and must not move
        rows, done = batch.advance(slots, sampled, valid=torch.tensor([True, False]))
        expected = reference.observe(sampled[0].tolist())
        assert rows[0].tolist() == expected.tolist()
        assert bool(done[0]) == reference.done
        assert not bool(done[1])
    assert int(batch.step[0]) == 0 and int(batch.eoc_step[0]) == -1
    assert (
        batch.modes(torch.tensor([0]))[0].tolist()
        == [int(CodebookMode.CODE_OR_EOC)] + [int(CodebookMode.BOC_ONLY)] * 7
    )
