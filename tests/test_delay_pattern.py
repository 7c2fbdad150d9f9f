from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from realtime_engine.codec.delay import (
    DelayPatternError,
    StreamingReverter,
    apply_delay,
    revert_delay,
    sanitize_codes,
)
from realtime_engine.talker.types import BOC, EOC

SMALL_SHAPES = list(itertools.product(range(7), range(1, 9)))


def _distinct_codes(frames: int, num_codebooks: int) -> np.ndarray:
    # every cell distinct so a misplaced cell cannot go unnoticed
    return np.arange(frames * num_codebooks, dtype=np.int64).reshape(frames, num_codebooks)


@pytest.mark.parametrize(("frames", "num_codebooks"), SMALL_SHAPES)
def test_apply_places_every_cell_exactly(frames: int, num_codebooks: int) -> None:
    codes = _distinct_codes(frames, num_codebooks)
    rows = apply_delay(codes)
    assert rows.shape == (frames + num_codebooks - 1, num_codebooks)
    for r, c in itertools.product(range(rows.shape[0]), range(num_codebooks)):
        t = r - c
        if t < 0:
            expected = BOC
        elif t >= frames:
            expected = EOC
        else:
            expected = int(codes[t, c])
        assert rows[r, c] == expected, (r, c)


@pytest.mark.parametrize(("frames", "num_codebooks"), SMALL_SHAPES)
def test_revert_inverts_apply_small(frames: int, num_codebooks: int) -> None:
    codes = _distinct_codes(frames, num_codebooks)
    np.testing.assert_array_equal(revert_delay(apply_delay(codes)), codes)


@pytest.mark.parametrize(("frames", "num_codebooks"), SMALL_SHAPES)
def test_streaming_reverter_equals_offline(frames: int, num_codebooks: int) -> None:
    rows = apply_delay(_distinct_codes(frames, num_codebooks))
    reverter = StreamingReverter(num_codebooks)
    got = [f for f in (reverter.feed(row) for row in rows) if f is not None]
    expected = revert_delay(rows)
    assert len(got) == expected.shape[0]
    if got:
        np.testing.assert_array_equal(np.stack(got), expected)


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        np.int64,
        st.tuples(st.integers(0, 40), st.integers(1, 12)),
        elements=st.integers(0, 1023),
    )
)
def test_apply_revert_identity_random(codes: np.ndarray) -> None:
    rows = apply_delay(codes)
    np.testing.assert_array_equal(revert_delay(rows), codes)
    # the torch path agrees with the numpy path
    rows_t = apply_delay(torch.from_numpy(codes))
    assert isinstance(rows_t, torch.Tensor)
    np.testing.assert_array_equal(rows_t.numpy(), rows)
    np.testing.assert_array_equal(revert_delay(rows_t).numpy(), codes)


def test_eight_codebook_corners() -> None:
    codes = np.full((3, 8), 7, dtype=np.int64)
    rows = apply_delay(codes)
    assert rows.shape == (10, 8)
    assert (rows[0, 1:] == BOC).all() and rows[0, 0] == 7
    assert (rows[-1, :7] == EOC).all() and rows[-1, 7] == 7
    # zero frames still gives the 7-row BOC/EOC staircase
    empty = apply_delay(np.zeros((0, 8), dtype=np.int64))
    assert empty.shape == (7, 8)
    for r in range(7):
        assert (empty[r, : r + 1] == EOC).all()
        assert (empty[r, r + 1 :] == BOC).all()


@pytest.mark.parametrize("bad", [np.zeros((5,), np.int64), np.zeros((2, 3, 4), np.int64)])
def test_wrong_rank_is_rejected(bad: np.ndarray) -> None:
    with pytest.raises(DelayPatternError):
        apply_delay(bad)
    with pytest.raises(DelayPatternError):
        revert_delay(bad)


def test_too_few_rows_is_rejected() -> None:
    with pytest.raises(DelayPatternError, match="at least 7"):
        revert_delay(np.zeros((6, 8), dtype=np.int64))


def test_sanitize_replaces_never_clamps() -> None:
    codes = np.array([[0, 1023, 1024, 1025, -1, 5000, 17, -100]], dtype=np.int64)
    expected = np.array([[0, 1023, 0, 0, 0, 0, 17, 0]], dtype=np.int64)
    np.testing.assert_array_equal(sanitize_codes(codes), expected)
    got_t = sanitize_codes(torch.from_numpy(codes))
    assert isinstance(got_t, torch.Tensor)
    np.testing.assert_array_equal(got_t.numpy(), expected)


@settings(max_examples=50, deadline=None)
@given(
    hnp.arrays(
        np.int64, st.tuples(st.integers(0, 8), st.integers(1, 8)), elements=st.integers(-2000, 3000)
    )
)
def test_sanitize_keeps_valid_codes(codes: np.ndarray) -> None:
    out = sanitize_codes(codes)
    valid = (codes >= 0) & (codes < 1024)
    np.testing.assert_array_equal(out[valid], codes[valid])
    assert (out[~valid] == 0).all()
    assert out.dtype == codes.dtype


def test_streaming_reverter_rejects_wrong_row_shape() -> None:
    with pytest.raises(DelayPatternError):
        StreamingReverter(8).feed(np.zeros(7, dtype=np.int64))
