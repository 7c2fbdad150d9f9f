"""Launching the fused kernels (realtime_engine.codec.kernel_launch): a launch
runs, or inside ``deferred_launches`` is recorded and does not; recorded
launches build each distinct kernel once, on threads, and a build's error
propagates; tensors reach the kernels dense and 16-byte aligned. A fake kernel
with Triton's launch interface (``kernel[grid](...)``, ``warmup``) stands in
for a compiled one. The codec recording its step is tested with the fused units
(tests/test_fused_unit.py)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from realtime_engine.codec.kernel_launch import (
    ALIGNMENT,
    Launch,
    build_launches,
    deferred_launches,
    dense_aligned,
    launch,
)


class FakeKernel:
    """Triton's launch interface: ``kernel[grid](*args, **constants)`` runs,
    ``warmup(*args, grid=..., **constants)`` builds (both recorded here)."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.ran: list[tuple[Any, ...]] = []
        self.built: list[tuple[Any, ...]] = []
        self.threads: set[str] = set()
        self.fail_on = fail_on
        self._lock = threading.Lock()

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def run(*args: Any, **constants: Any) -> None:
            self.ran.append((grid, args, constants))

        return run

    def warmup(self, *args: Any, grid: tuple[int, ...], **constants: Any) -> None:
        if constants.get("TILE") == self.fail_on:
            raise RuntimeError("ptxas failed")
        with self._lock:
            self.built.append((grid, args, constants))
            self.threads.add(threading.current_thread().name)


def test_a_launch_runs_outside_a_deferral_and_is_recorded_inside_one() -> None:
    kernel, x = FakeKernel(), torch.zeros(4)
    assert launch(kernel, (2, 1), x, 5, TILE=16, num_warps=4)
    assert kernel.ran == [((2, 1), (x, 5), {"TILE": 16, "num_warps": 4})]
    with deferred_launches() as launches:
        assert not launch(kernel, (3,), x, 7, TILE=32)
    assert len(kernel.ran) == 1  # not run
    assert launches == [Launch(kernel, (3,), (x, 7), {"TILE": 32})]
    assert launch(kernel, (1,), x, 1, TILE=16)  # the deferral ended
    assert len(kernel.ran) == 2


def test_each_distinct_kernel_is_built_once_on_threads() -> None:
    kernel, other = FakeKernel(), FakeKernel()
    f32, f16 = torch.zeros(4), torch.zeros(4, dtype=torch.float16)
    launches = [
        Launch(kernel, (1,), (f32, 3), {"TILE": 16}),
        Launch(kernel, (9,), (f32.clone(), 8), {"TILE": 16}),  # the same build: grid, n differ
        Launch(kernel, (1,), (f32, 3), {"TILE": 32}),  # another constant
        Launch(kernel, (1,), (f16, 3), {"TILE": 16}),  # another dtype
        Launch(other, (1,), (f32, 3), {"TILE": 16}),  # another kernel
    ]
    assert build_launches(launches, workers=3) == 4
    assert sorted(c["TILE"] for _, _, c in kernel.built) == [16, 16, 32]
    assert len(other.built) == 1 and not kernel.ran and not other.ran
    assert all(name.startswith("triton-build") for name in kernel.threads | other.threads)
    assert build_launches([]) == 0


def test_a_failed_build_propagates() -> None:
    kernel = FakeKernel(fail_on=32)
    launches = [Launch(kernel, (1,), (), {"TILE": t}) for t in (16, 32, 64)]
    with pytest.raises(RuntimeError, match="ptxas"):
        build_launches(launches, workers=2)


def test_tensors_reach_the_kernels_dense_and_aligned() -> None:
    base = torch.arange(64, dtype=torch.float32)
    aligned = base[:16]
    assert dense_aligned(aligned).data_ptr() == aligned.data_ptr()  # no copy
    shifted = base[1:17]  # contiguous, 4 bytes past an aligned start
    assert shifted.data_ptr() % ALIGNMENT != 0
    moved = dense_aligned(shifted)
    assert moved.data_ptr() % ALIGNMENT == 0 and torch.equal(moved, shifted)
    strided = base.view(8, 8)[:, 1:3]
    dense = dense_aligned(strided)
    assert dense.is_contiguous() and dense.data_ptr() % ALIGNMENT == 0
    assert torch.equal(dense, strided)
