"""Launching the codec's fused Triton kernels, and building them all at once first.

Triton builds a kernel the first time it launches with a new set of
compile-time constants, and a codec step launches its fused kernels one after
another, so a first step builds each in turn: on an H200 host, minutes for
the 13 kernels of ``fused_units="narrow"`` (docs/bench/RESULTS.md, section 34).
Inside :func:`deferred_launches`, :func:`launch` records each launch instead
of running it (the caller zeroes its outputs); :func:`build_launches` then
builds the recorded kernels on threads, as Triton's compiler spends most of
its time outside the GIL (in LLVM and ptxas). The step that follows finds
every kernel built.

:func:`dense_aligned` hands the kernels dense, 16-byte aligned tensors: Triton
specializes a kernel on whether each pointer is 16-byte aligned, so an
unaligned view (a batch-1 slice of a mask, say) would build it once more.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

ALIGNMENT = 16  # bytes: Triton's divisibility specialization of a pointer


@dataclass(frozen=True)
class Launch:
    """One kernel launch: the kernel, its grid, its arguments and its
    compile-time constants (``num_warps`` included)."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    constants: dict[str, Any]

    def build_key(self) -> tuple[Any, ...]:
        """What Triton builds this launch's kernel for: the kernel, each
        argument's dtype (tensors) or kind, and the constants."""
        kinds = tuple(a.dtype if isinstance(a, torch.Tensor) else type(a) for a in self.args)
        return (id(self.kernel), kinds, tuple(sorted(self.constants.items())))


_recorded: ContextVar[list[Launch] | None] = ContextVar("recorded_launches", default=None)


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **constants: Any) -> bool:
    """Launch ``kernel`` over ``grid``, or record the launch inside
    :func:`deferred_launches`. Returns whether it ran (when not, the caller
    zeroes what it would have written)."""
    records = _recorded.get()
    if records is None:
        kernel[grid](*args, **constants)
        return True
    records.append(Launch(kernel, grid, args, constants))
    return False


@contextlib.contextmanager
def deferred_launches() -> Iterator[list[Launch]]:
    """Record the fused kernels' launches instead of running them; yields the
    list they land in."""
    records: list[Launch] = []
    token = _recorded.set(records)
    try:
        yield records
    finally:
        _recorded.reset(token)


def build_launches(launches: list[Launch], workers: int | None = None) -> int:
    """Build the kernels of ``launches`` without running them, each distinct one
    once, on up to ``workers`` threads (by default one a CPU); returns how
    many were built. An error in a build propagates: the same launch would
    fail when run."""
    distinct = distinct_launches(launches)
    if not distinct:
        return 0
    workers = max(1, min(len(distinct), workers or os.cpu_count() or 1))
    with ThreadPoolExecutor(workers, thread_name_prefix="triton-build") as pool:
        for _ in pool.map(_build, distinct):
            pass
    return len(distinct)


def distinct_launches(launches: list[Launch]) -> list[Launch]:
    """One launch per kernel build (:meth:`Launch.build_key`), first seen first."""
    return list({launch.build_key(): launch for launch in launches}.values())


def _build(launch: Launch) -> None:
    # on the launch's device, as its thread would run it (a worker thread's
    # current device is the first)
    on = next((a.device for a in launch.args if isinstance(a, torch.Tensor)), None)
    cuda = on is not None and on.type == "cuda"
    with torch.cuda.device(on) if cuda else contextlib.nullcontext():
        launch.kernel.warmup(*launch.args, grid=launch.grid, **launch.constants)


def dense_aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous and 16-byte aligned: itself where it already is, else a
    copy (fresh allocations are aligned)."""
    t = t.contiguous()
    return t if t.data_ptr() % ALIGNMENT == 0 else t.clone()
