"""CUDA graphs of the talker's code-sampling step, one per padded batch size.

The sampler is a few hundred small kernels (delay masks, counter noise,
top-k/top-p, the race, RAS, the machine advance, the row write-back); issued
one by one from Python they cost ~3 ms a step whatever the batch size. All
of its state already lives in fixed per-slot device buffers, so the whole
step can be captured once per batch-size bucket and replayed with one
launch.

Captured as they are, the step's ~240 kernels still cost ~0.5 ms of GPU time
at batch 1 (a graph node costs ~2 µs however small its kernel), 13% of a
decode step. ``compiled`` runs the step through ``torch.compile`` first
(once, for a dynamic batch size), which fuses the elementwise work into a
few dozen kernels, and captures that.

A batch of ``b`` rows runs in the graph of the smallest bucket ``>= b``: the
inputs are copied into static buffers and the extra rows address the trash
slot (never live, so they write nothing that is read back). Outputs are
cloned out of the graph's static buffers, since vLLM may still be copying
the previous step's tokens on another stream when the next replay runs.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator

import torch

# Runs in vLLM's engine process: a child of vLLM's logger shows up in the engine's log.
logger = logging.getLogger("vllm.plugins.higgs_talker.sampler_graphs")

StepFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]


def bucket_sizes(max_batch: int) -> list[int]:
    """Padded batch sizes: 1, 2, 4, 8, then steps of 8 to 64, 16 to 128, 32 beyond,
    always ending at ``max_batch``."""
    if max_batch < 1:
        raise ValueError("max_batch must be at least 1")
    sizes = {1, 2, 4, 8}
    size = 8
    while size < max_batch:
        size += 8 if size < 64 else 16 if size < 128 else 32
        sizes.add(size)
    return [*sorted(s for s in sizes if s < max_batch), max_batch]


def graphs_wanted(device: torch.device, enforce_eager: bool) -> bool:
    """Graphs on every CUDA engine; ``enforce_eager`` (vLLM's own switch) turns them off."""
    return device.type == "cuda" and not enforce_eager


class SamplerCaptureError(RuntimeError):
    """Capturing the code sampler failed: the engine must not start.

    A capture that fails half-way can leave the stream and the graph memory
    pool in a state that later kernels trip over, so the engine stops at
    start-up (where capture happens, in vLLM's profiling run) with the cause,
    instead of serving on in an unknown state. ``enforce_eager`` runs the
    sampler without graphs.
    """


class PaddedStepGraphs:
    """Runs ``step(logits [B, W], slots [B], seq_lens [B])`` through captured graphs.

    ``step`` must use fixed shapes and device ops only (no host reads), and
    must treat rows with ``slots == pad_slot`` and ``seq_lens == 0`` as
    padding. Graphs are captured for every bucket at the first call (one
    startup cost instead of a stall whenever a new batch size appears).
    ``compiled`` traces ``step`` with ``torch.compile`` for a dynamic batch
    before capturing it (a batch of 1 runs padded to 2: one trace).
    """

    def __init__(
        self,
        step: StepFn,
        *,
        max_batch: int,
        pad_slot: int,
        device: torch.device,
        capture: bool = True,
        compiled: bool = False,
    ) -> None:
        self._step = self._eager_step = step
        # capture=False runs the same padded buffers without graphs (CPU tests).
        self._capture_graphs = capture
        self._max_batch = max_batch
        self._sizes = bucket_sizes(max_batch)
        self.compiled = compiled
        if compiled:
            # torch.compile always specialises a size of 1: pad it to 2 instead
            self._sizes = [s for s in self._sizes if s > 1] or self._sizes
            self._step = torch.compile(step, fullgraph=True, dynamic=None)
        self._pad_slot = pad_slot
        self._device = device
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = {}
        self._logits: torch.Tensor | None = None
        self._slots = torch.full((max_batch,), pad_slot, dtype=torch.int64, device=device)
        self._seq_lens = torch.zeros(max_batch, dtype=torch.int64, device=device)

    @property
    def sizes(self) -> list[int]:
        return list(self._sizes)

    def bucket(self, batch: int) -> int | None:
        for size in self._sizes:
            if size >= batch:
                return size
        return None

    def __call__(
        self, logits: torch.Tensor, slots: torch.Tensor, seq_lens: torch.Tensor
    ) -> tuple[torch.Tensor, ...] | None:
        """The step's outputs for the ``b`` real rows, or None when ``b`` is empty or
        beyond the largest bucket: the caller then runs the step eagerly.
        :class:`SamplerCaptureError` when capturing fails."""
        b = logits.shape[0]
        size = self.bucket(b)
        if size is None or b == 0:
            return None
        if (
            self._logits is None
            or tuple(self._logits.shape[1:]) != tuple(logits.shape[1:])
            or (self._logits.dtype != logits.dtype)
        ):
            try:
                self._prepare(logits.shape[1], logits.dtype)
            except RuntimeError as e:
                self._graphs.clear()
                self._logits = None
                raise SamplerCaptureError(
                    f"capturing the code sampler as CUDA graphs failed: {e}"
                ) from e
        assert self._logits is not None
        self._logits[:b].copy_(logits)
        self._slots[:b].copy_(slots)
        self._seq_lens[:b].copy_(seq_lens)
        if size > b:
            self._slots[b:size].fill_(self._pad_slot)
            self._seq_lens[b:size].zero_()
        if self._capture_graphs:
            graph, outputs = self._graphs[size]
            graph.replay()
        else:
            outputs = self._run(size)
        return tuple(out[:b].clone() for out in outputs)

    def _prepare(self, width: int, dtype: torch.dtype) -> None:
        self._graphs.clear()
        self._logits = torch.zeros(self._sizes[-1], width, dtype=dtype, device=self._device)
        self._slots.fill_(self._pad_slot)
        self._seq_lens.zero_()
        started = time.perf_counter()
        if self.compiled:
            self._trace()
        if self._capture_graphs:
            self._capture()
        done = " and ".join(
            word
            for word, did in (("compiled", self.compiled), ("captured", self._capture_graphs))
            if did
        )
        if done:  # start-up time: a cold start's log says where it went
            logger.info(
                "%s the code sampler for batch sizes %s in %.1f s",
                done,
                self._sizes,
                time.perf_counter() - started,
            )

    def _warm_up(self, *, eager_first: bool = False) -> None:
        """Run the largest and smallest bucket once (on CUDA on a side stream, as
        capture wants): every row is padding, so this touches only the trash slot.
        ``eager_first``: the eager step once before (it builds the step's cached
        constants, such as the noise lanes, so that a trace reads them as tensors:
        traced, ``arange + 64-bit constant`` is beyond Triton's 32-bit arange)."""
        with self._side_stream():
            if eager_first:
                assert self._logits is not None
                self._eager_step(self._logits[:1], self._slots[:1], self._seq_lens[:1])
            for size in (self._sizes[-1], self._sizes[0]):
                self._run(size)

    @contextlib.contextmanager
    def _side_stream(self) -> Iterator[None]:
        if self._device.type != "cuda":
            yield
            return
        side = torch.cuda.Stream(self._device)
        side.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(side):
            yield
        torch.cuda.current_stream(self._device).wait_stream(side)

    def _trace(self) -> None:
        """Compile the step now; if the compiler fails, go on with the eager step
        (slower by the kernels it would have fused, never wrong)."""
        try:
            self._warm_up(eager_first=True)
        except Exception as e:  # any compiler failure: the eager step still works
            logger.warning(
                "torch.compile of the code sampler failed; capturing the eager step (%s)", e
            )
            self.compiled = False
            self._step = self._eager_step
            self._sizes = bucket_sizes(self._max_batch)

    def _capture(self) -> None:
        # Warm up first (lazy library handles, cached constants).
        self._warm_up()
        pool = torch.cuda.graph_pool_handle()
        # Largest first, so the smaller graphs reuse its pool memory.
        for size in reversed(self._sizes):
            graph = torch.cuda.CUDAGraph()
            # thread_local: the row publisher's thread synchronises events meanwhile.
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                outputs = self._run(size)
            self._graphs[size] = (graph, outputs)

    def _run(self, size: int) -> tuple[torch.Tensor, ...]:
        assert self._logits is not None
        inputs = (self._logits[:size], self._slots[:size], self._seq_lens[:size])
        if self.compiled and size > 1:
            for x in inputs:  # one trace serves every batch size above 1
                torch._dynamo.mark_dynamic(x, 0)
        return self._step(*inputs)
