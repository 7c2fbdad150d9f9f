"""Reused host buffers for the engine core's device-to-host copies."""

from __future__ import annotations

import threading

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime_engine.talker.pinned_buffers import PinnedBuffers


def test_a_buffer_holds_what_was_asked_and_views_its_start() -> None:
    buffers = PinnedBuffers(cuda=False)
    buffer = buffers.take(3000, torch.int64)
    assert buffer.memory.numel() >= 3000 and buffer.memory.dtype == torch.int64
    view = buffer.view((1000, 3))
    assert view.shape == (1000, 3)
    view.fill_(7)
    assert view.data_ptr() == buffer.memory.data_ptr()
    assert buffer.event is None  # off CUDA


def test_a_buffer_given_back_is_taken_again_for_its_size_and_dtype_only() -> None:
    buffers = PinnedBuffers(cuda=False)
    first = buffers.take(5000, torch.float32)
    buffers.give_back(first)
    assert buffers.take(10, torch.float32) is not first  # another size class
    assert buffers.take(5000, torch.int64) is not first  # another dtype
    assert buffers.take(4097, torch.float32) is first  # same class (8192)
    assert buffers.made == 3


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 20_000)), max_size=60))
def test_no_buffer_is_handed_out_twice_while_taken(ops: list[tuple[bool, int]]) -> None:
    """Random takes and gives back: a buffer out is never handed out again until it
    comes back, and every buffer made is either out or free (none lost)."""
    buffers = PinnedBuffers(cuda=False)
    out: list = []
    free = 0
    for give, elements in ops:
        if give and out:
            buffers.give_back(out.pop(elements % len(out)))
            free += 1
            continue
        buffer = buffers.take(elements, torch.float32)
        assert all(buffer is not held for held in out)
        assert buffer.memory.numel() >= elements
        if buffers.made == len(out) + free:  # reused: one fewer free
            free -= 1
        out.append(buffer)
        assert buffers.made == len(out) + free


def test_buffers_given_back_from_another_thread_are_reused() -> None:
    """The sender gives chunks' buffers back while the engine's thread takes."""
    buffers = PinnedBuffers(cuda=False)
    taken = [buffers.take(2048, torch.float32) for _ in range(64)]
    giver = threading.Thread(target=lambda: [buffers.give_back(b) for b in taken])
    giver.start()
    giver.join()
    again = [buffers.take(2048, torch.float32) for _ in range(64)]
    assert {id(b) for b in again} == {id(b) for b in taken}
    assert buffers.made == 64
