"""Index arrays staged through the ring keep their values and shapes, and a
block is never handed out while an earlier array still needs it."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime_engine.talker.host_staging import HostToDevice

shapes = st.one_of(
    st.tuples(st.integers(0, 40)),
    st.tuples(st.integers(1, 4), st.integers(0, 12)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(shapes, min_size=1, max_size=30), st.integers(0, 2**31))
def test_every_array_arrives_whole_however_the_ring_wraps(
    sizes: list[tuple[int, ...]], seed: int
) -> None:
    # 3 blocks of 16: arrays wrap the ring within a few calls, and some are too big
    staging = HostToDevice(torch.device("cpu"), block_ints=16, blocks=3, ring=True)
    rng = np.random.default_rng(seed)
    sent, received = [], []
    for shape in sizes:
        values = rng.integers(-(2**40), 2**40, size=shape, dtype=np.int64)
        sent.append(values)
        received.append(staging.send(values.tolist() if values.ndim == 1 else values))
    for values, tensor in zip(sent, received, strict=True):
        assert tensor.dtype == torch.int64
        assert tuple(tensor.shape) == values.shape
        np.testing.assert_array_equal(tensor.numpy(), values)


def test_rows_of_lists_keep_their_rows() -> None:
    staging = HostToDevice(torch.device("cpu"), ring=True)
    meta = staging.send([[3, 4], [10, 20], [-1, 7]])
    assert meta[1].tolist() == [10, 20]
