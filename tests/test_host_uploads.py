"""The pinned upload ring's bookkeeping, on the CPU (plain memory, same walk)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime_engine.talker.host_uploads import HostUploads


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=60))
def test_every_upload_keeps_its_values_after_the_ring_wraps(sizes: list[int]) -> None:
    # a ring of 4 parts of 16 elements: most sequences wrap it several times
    uploads = HostUploads(torch.device("cpu"), elements=64, parts=4, ring=True)
    rng = np.random.default_rng(len(sizes))
    sent, got = [], []
    for n in sizes:
        values = rng.integers(-(1 << 40), 1 << 40, size=n)
        sent.append(values)
        got.append(uploads.upload(values))
    for values, tensor in zip(sent, got, strict=True):
        assert tensor.dtype == torch.int64
        assert tensor.tolist() == values.tolist()


def test_shapes_are_kept_and_the_writer_laps() -> None:
    uploads = HostUploads(torch.device("cpu"), elements=32, parts=2, ring=True)
    first = uploads.upload([[1, 2, 3], [4, 5, 6]])
    assert first.shape == (2, 3) and first.tolist() == [[1, 2, 3], [4, 5, 6]]
    # uploads of 10 into parts of 16: the first fits beside the 6, then a part each
    for i in range(10):
        assert uploads.upload(np.full(10, i)).tolist() == [i] * 10
    assert uploads.laps == 4  # parts 0, 1, 0, 1, ...: back at part 0 four times
    assert first.tolist() == [[1, 2, 3], [4, 5, 6]]  # not a view of the ring


def test_an_upload_larger_than_a_part_bypasses_the_ring() -> None:
    uploads = HostUploads(torch.device("cpu"), elements=16, parts=2, ring=True)
    big = np.arange(100)
    assert uploads.upload(big).tolist() == big.tolist()
    assert uploads.laps == 0


def test_a_ring_needs_two_parts() -> None:
    with pytest.raises(ValueError):
        HostUploads(torch.device("cpu"), elements=16, parts=1)
