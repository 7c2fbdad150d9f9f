from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from talker_support import FailingTalker

from realtime_engine.codec.decoder import CodecDecoder
from realtime_engine.codec.presets import PRESETS, get_preset
from realtime_engine.codec.streaming import rows_to_frames
from realtime_engine.engines.base import (
    ChunkingParams,
    EngineError,
    SegmentRequest,
    UnsupportedVoiceError,
)
from realtime_engine.engines.higgs import CloneVoice, HiggsEngine, speed_tag
from realtime_engine.model.loader import LoadedTalker
from realtime_engine.model.prompts import build_zero_shot_prompt
from realtime_engine.talker.backends import ReferenceOptions
from realtime_engine.talker.reference_runner import ReferenceRunner
from realtime_engine.talker.types import TalkerError, TalkerRequest, TalkerSampling

GREEDY = TalkerSampling(temperature=0.0)
HOP = 960


@pytest.fixture(scope="module")
def tiny(tiny_talker: LoadedTalker) -> LoadedTalker:
    return tiny_talker


@pytest.fixture
def engine(reference_engine: HiggsEngine) -> HiggsEngine:
    return reference_engine


def _segment(
    request_id: str, text: str = "hello world", frames: int | None = 12, **kw: Any
) -> SegmentRequest:
    return SegmentRequest(request_id, text, sampling=GREEDY, fixed_rows=frames, **kw)


async def _chunks(it: AsyncIterator[np.ndarray], limit: int | None = None) -> list[np.ndarray]:
    out = []
    async for chunk in it:
        out.append(chunk)
        if limit is not None and len(out) == limit:
            break
    return out


@pytest.mark.parametrize("preset", sorted(PRESETS))
async def test_sample_count_is_960_per_frame(engine: HiggsEngine, preset: str) -> None:
    chunking = get_preset(preset)
    chunks = await _chunks(engine.synthesize(_segment("s", frames=23, chunking=chunking)))
    assert all(c.dtype == np.float32 and c.ndim == 1 for c in chunks)
    assert sum(c.size for c in chunks) == 23 * HOP
    assert chunks[0].size == chunking.first_chunk_frames * HOP
    audio = np.concatenate(chunks)
    assert np.isfinite(audio).all() and float(np.abs(audio).max()) > 0
    assert engine.sample_rate == 24_000


async def test_exact_preset_equals_whole_utterance_decode(
    tiny: LoadedTalker, engine: HiggsEngine
) -> None:
    assert tiny.codec is not None
    frames = 30
    streamed = np.concatenate(
        await _chunks(
            engine.synthesize(_segment("e", "quick fox", frames, chunking=get_preset("exact")))
        )
    )
    # the same greedy request straight from a runner, decoded in one piece
    runner = ReferenceRunner(tiny.model)
    prompt = build_zero_shot_prompt(tiny.tokenizer, "quick fox")
    try:
        rows = [
            r
            async for r in runner.submit(TalkerRequest("x", prompt, GREEDY, fixed_rows=frames + 7))
        ]
    finally:
        await runner.close()
    codes = rows_to_frames(np.stack(rows))
    assert codes.shape == (8, frames)
    # the whole decode computed exactly (float64): a float32 one is itself ~1e-5 off
    exact = copy.deepcopy(tiny.codec).double()
    whole = exact.decode(torch.from_numpy(codes[None]))[0, 0].numpy()
    assert float(np.abs(streamed - whole).max()) <= 1e-5 * float(np.abs(whole).max())


async def test_concurrent_segments_match_their_solo_audio(engine: HiggsEngine) -> None:
    solo = np.concatenate(await _chunks(engine.synthesize(_segment("a", "city house", 16))))
    together = await asyncio.gather(
        _chunks(engine.synthesize(_segment("a2", "city house", 16))),
        _chunks(engine.synthesize(_segment("b", "music and laugh", 9))),
    )
    np.testing.assert_allclose(np.concatenate(together[0]), solo, atol=1e-4)
    assert sum(c.size for c in together[1]) == 9 * HOP


async def test_max_new_tokens_caps_the_audio(engine: HiggsEngine) -> None:
    # 12 rows close the delay pattern after 12 - 7 = 5 frames
    request = _segment("cap", frames=None, max_new_tokens=12)
    chunks = await _chunks(engine.synthesize(request))
    assert sum(c.size for c in chunks) == 5 * HOP


async def test_max_audio_seconds_becomes_the_engines_own_row_budget(engine: HiggsEngine) -> None:
    # 0.2 s is 5 frames; the engine adds the rows its delay pattern needs.
    request = _segment("secs", frames=None, max_audio_seconds=0.2)
    chunks = await _chunks(engine.synthesize(request))
    assert sum(c.size for c in chunks) == 5 * HOP
    both = _segment("both", frames=None, max_audio_seconds=10.0, max_new_tokens=10)
    assert sum(c.size for c in await _chunks(engine.synthesize(both))) == 3 * HOP


async def test_duplicate_request_id_does_not_disturb_the_first(engine: HiggsEngine) -> None:
    first = engine.synthesize(_segment("same", frames=3000, chunking=get_preset("latency")))
    await _chunks(first, limit=1)
    with pytest.raises(EngineError, match="already running"):
        await _chunks(engine.synthesize(_segment("same", frames=4)))
    # the first is still known to the engine, so abort reaches it
    await engine.abort("same")
    rest = await asyncio.wait_for(_chunks(first), timeout=10)
    assert sum(c.size for c in rest) < 3000 * HOP


async def test_abort_stops_the_segment(engine: HiggsEngine) -> None:
    it = engine.synthesize(_segment("long", frames=3000, chunking=get_preset("latency")))
    first = await _chunks(it, limit=1)
    assert first[0].size == HOP
    await engine.abort("long")
    rest = await asyncio.wait_for(_chunks(it), timeout=10)
    assert sum(c.size for c in rest) < 3000 * HOP
    await engine.abort("long")  # finished: no-op
    # the engine keeps serving
    assert (
        sum(c.size for c in await _chunks(engine.synthesize(_segment("after", frames=4))))
        == 4 * HOP
    )


async def test_talker_failure_surfaces_as_engine_error(tiny: LoadedTalker) -> None:
    assert tiny.codec is not None
    eng = HiggsEngine(
        ReferenceRunner(
            FailingTalker(tiny.model, message="out of device memory"), codec=tiny.codec
        ),
        tiny.tokenizer,
    )
    try:
        with pytest.raises(EngineError, match="out of device memory") as info:
            await _chunks(eng.synthesize(_segment("f", frames=20)))
        assert isinstance(info.value.__cause__, TalkerError)
    finally:
        await eng.close()


class BrokenCodec(CodecDecoder):
    """The tiny codec, whose kernels crash."""

    def acoustic_input(self, codes: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("codec kernel crashed")


async def test_codec_failure_surfaces_as_engine_error(tiny: LoadedTalker) -> None:
    assert tiny.codec is not None
    broken = BrokenCodec(tiny.codec.dims)
    eng = HiggsEngine(ReferenceRunner(tiny.model, codec=broken), tiny.tokenizer)
    try:
        with pytest.raises(EngineError, match="codec kernel crashed"):
            await _chunks(eng.synthesize(_segment("c", frames=20)))
        # the talker itself is fine: a request without audio still runs
        rows = [
            r
            async for r in eng._runner.submit(
                TalkerRequest("ok", _prompt(tiny), GREEDY, fixed_rows=3)
            )
        ]
        assert len(rows) == 3
    finally:
        await eng.close()


def _prompt(tiny: LoadedTalker) -> Any:
    return build_zero_shot_prompt(tiny.tokenizer, "hello")


async def test_bad_inputs_are_typed_errors(engine: HiggsEngine) -> None:
    with pytest.raises(UnsupportedVoiceError):
        await _chunks(engine.synthesize(_segment("v", voice="nobody")))
    with pytest.raises(EngineError, match="empty"):
        await _chunks(engine.synthesize(_segment("t", text="   ")))
    bad_chunking = ChunkingParams(
        first_chunk_frames=0, chunk_frames=1, left_context_frames=0, right_holdback_frames=0
    )
    with pytest.raises(EngineError, match="chunking"):
        await _chunks(engine.synthesize(_segment("k", chunking=bad_chunking)))
    with pytest.raises(EngineError, match="ras_window"):
        await _chunks(
            engine.synthesize(SegmentRequest("r", "hi", sampling=TalkerSampling(ras_window=500)))
        )


async def test_cloned_voice(engine: HiggsEngine) -> None:
    ref = np.random.default_rng(0).integers(0, 1024, size=(25, 8))
    engine.add_voice("ref", CloneVoice(ref, ref_text="hello there", description="test voice"))
    assert [v.voice_id for v in engine.voices()] == ["default", "ref"]
    chunks = await _chunks(engine.synthesize(_segment("cl", voice="ref", frames=6)))
    assert sum(c.size for c in chunks) == 6 * HOP
    with pytest.raises(UnsupportedVoiceError):
        engine.add_voice("bad", CloneVoice(np.full((4, 8), 1025)))
    with pytest.raises(UnsupportedVoiceError):
        engine.add_voice("default", CloneVoice(ref))


@pytest.mark.parametrize(
    ("speed", "tag"),
    [
        (0.5, "speed_very_slow"),
        (0.8, "speed_slow"),
        (1.0, ""),
        (1.2, "speed_fast"),
        (2.0, "speed_very_fast"),
    ],
)
def test_speed_tags(speed: float, tag: str) -> None:
    assert speed_tag(speed) == (f"<|prosody:{tag}|>" if tag else "")


async def test_speed_reaches_the_prompt(engine: HiggsEngine) -> None:
    fast = await _chunks(engine.synthesize(_segment("fast", frames=8, speed=1.5)))
    normal = await _chunks(engine.synthesize(_segment("norm", frames=8)))
    assert sum(c.size for c in fast) == 8 * HOP
    # a different prompt gives different greedy audio
    assert not np.array_equal(np.concatenate(fast), np.concatenate(normal))


async def test_start_is_idempotent_and_from_pretrained_works(tiny_checkpoint: Path) -> None:
    eng = HiggsEngine.from_pretrained(tiny_checkpoint, device="cpu")
    try:
        await eng.start()
        await eng.start()
        assert eng.model_id == str(tiny_checkpoint)
        chunks = await _chunks(eng.synthesize(_segment("p", frames=5)))
        assert sum(c.size for c in chunks) == 5 * HOP
    finally:
        await eng.close()
    with pytest.raises(EngineError):
        HiggsEngine.from_pretrained(tiny_checkpoint / "missing")


async def test_auto_backend_without_a_gpu_uses_the_reference_runner(tiny_checkpoint: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("with a GPU, auto picks vLLM")
    eng = HiggsEngine.from_pretrained(tiny_checkpoint, "cpu", talker=ReferenceOptions(max_batch=2))
    try:
        chunks = await _chunks(eng.synthesize(_segment("auto", frames=3)))
        assert sum(c.size for c in chunks) == 3 * HOP
    finally:
        await eng.close()
