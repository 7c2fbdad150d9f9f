from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from talker_support import FailingTalker, collect

from realtime_engine.codec.delay import apply_delay, revert_delay
from realtime_engine.codec.streaming import rows_to_frames
from realtime_engine.engines.base import ChunkingParams
from realtime_engine.model.loader import LoadedTalker, load_talker
from realtime_engine.model.prompts import build_zero_shot_prompt
from realtime_engine.talker.reference_runner import ReferenceRunner
from realtime_engine.talker.types import (
    PcmChunk,
    TalkerError,
    TalkerPrompt,
    TalkerRequest,
    TalkerSampling,
)

GREEDY = TalkerSampling(temperature=0.0)


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint: Path) -> LoadedTalker:
    return load_talker(tiny_checkpoint, with_codec=False)


def _prompt(tiny: LoadedTalker, text: str) -> TalkerPrompt:
    return build_zero_shot_prompt(tiny.tokenizer, text)


def _request(
    tiny: LoadedTalker,
    request_id: str,
    text: str = "hello world",
    *,
    rows: int = 24,
    sampling: TalkerSampling = GREEDY,
) -> TalkerRequest:
    return TalkerRequest(request_id, _prompt(tiny, text), sampling=sampling, fixed_rows=rows)


async def test_rows_are_a_valid_delay_pattern_of_exact_length(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model)
    try:
        rows = await collect(runner.submit(_request(tiny, "a", rows=20)))
    finally:
        await runner.close()
    assert rows.shape == (20, 8)
    assert rows.dtype == np.int64
    np.testing.assert_array_equal(apply_delay(revert_delay(rows)), rows)
    codes = revert_delay(rows)
    assert codes.shape == (13, 8) and (codes < 1024).all()
    # the model is not stuck on one code: greedy decoding of the tiny model varies
    assert len(np.unique(codes[:, 0])) > 1


async def test_greedy_rows_identical_alone_and_batched(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model, max_batch=4)
    try:
        alone = await collect(runner.submit(_request(tiny, "main", "the quick brown fox", rows=40)))

        main_it = runner.submit(_request(tiny, "main2", "the quick brown fox", rows=40))
        early = runner.submit(_request(tiny, "early", "music and laugh", rows=12))
        doomed = runner.submit(_request(tiny, "doomed", "question answer", rows=400))
        early_task = asyncio.create_task(collect(early))
        got = []
        joined: asyncio.Task[np.ndarray] | None = None
        async for row in main_it:
            got.append(row)
            if len(got) == 10:  # one joins mid-way, another leaves mid-way
                joined = asyncio.create_task(
                    collect(runner.submit(_request(tiny, "late", "city house", rows=15)))
                )
                await collect(doomed, limit=3)
                await runner.abort("doomed")
        assert joined is not None
        late_rows, early_rows = await joined, await early_task
    finally:
        await runner.close()
    np.testing.assert_array_equal(np.stack(got), alone)
    assert late_rows.shape == (15, 8) and early_rows.shape == (12, 8)


async def test_abort_frees_the_slot(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model, max_batch=1)
    try:
        long_it = runner.submit(_request(tiny, "long", rows=100000))
        first = await collect(long_it, limit=3)
        assert first.shape == (3, 8)
        await runner.abort("long")
        assert runner.stats().active == 0
        # the consumer sees a clean end, not an error
        remaining = await asyncio.wait_for(collect(long_it), timeout=5)
        assert remaining.shape[0] < 100000
        # the single slot is free again and the same id may be reused
        rows = await asyncio.wait_for(collect(runner.submit(_request(tiny, "long", rows=9))), 20)
        assert rows.shape == (9, 8)
        await runner.abort("unknown-id")  # no-op
    finally:
        await runner.close()


async def test_abort_of_a_queued_request(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model, max_batch=1)
    try:
        busy = runner.submit(_request(tiny, "busy", rows=100000))
        await collect(busy, limit=1)
        queued = runner.submit(_request(tiny, "queued", rows=10))
        await runner.abort("queued")
        assert (await asyncio.wait_for(collect(queued), 5)).shape == (0, 8)
        await runner.abort("busy")
    finally:
        await runner.close()


async def test_seeded_sampling_repeats(tiny: LoadedTalker) -> None:
    def sampled(seed: int) -> TalkerSampling:
        return TalkerSampling(temperature=1.0, seed=seed)

    runner = ReferenceRunner(tiny.model)
    try:
        a = await collect(runner.submit(_request(tiny, "a", rows=30, sampling=sampled(7))))
        b_it = runner.submit(_request(tiny, "b", rows=30, sampling=sampled(7)))
        other_it = runner.submit(_request(tiny, "c", rows=30, sampling=sampled(8)))
        b, other = await asyncio.gather(collect(b_it), collect(other_it))
    finally:
        await runner.close()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, other)


async def test_slow_consumer_only_slows_itself(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model, queue_rows=4)
    try:
        slow = runner.submit(_request(tiny, "slow", rows=50))
        await collect(slow, limit=1)
        fast = await asyncio.wait_for(collect(runner.submit(_request(tiny, "fast", rows=30))), 20)
        assert fast.shape == (30, 8)
        stats = runner.stats()
        # the slow request stepped at most one queue (plus the row in hand) ahead
        assert stats.rows <= 30 + 1 + 4 + 1
        rest = await collect(slow)
        assert rest.shape == (49, 8)
    finally:
        await runner.close()


async def test_max_new_tokens_caps_rows(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model)
    request = TalkerRequest("cap", _prompt(tiny, "hello"), sampling=GREEDY, max_new_tokens=11)
    try:
        rows = await collect(runner.submit(request))
    finally:
        await runner.close()
    assert rows.shape[0] <= 11
    np.testing.assert_array_equal(apply_delay(revert_delay(rows)), rows)


async def test_worker_failure_fails_every_stream(tiny: LoadedTalker) -> None:
    model = FailingTalker(tiny.model, fail_after=5)
    runner = ReferenceRunner(model, max_batch=2)
    try:
        streams = [runner.submit(_request(tiny, f"r{i}", rows=1000)) for i in range(3)]
        for it in streams:
            with pytest.raises(TalkerError, match="device fell over"):
                await asyncio.wait_for(collect(it), 20)
        # the worker survives and serves the next request once the model works again
        model.fail_after = 10**9
        rows = await asyncio.wait_for(collect(runner.submit(_request(tiny, "next", rows=8))), 20)
        assert rows.shape == (8, 8)
    finally:
        await runner.close()


async def test_bad_prompt_fails_only_its_request(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model)
    bad = TalkerRequest("bad", TalkerPrompt(token_ids=(1, -100, 2)), fixed_rows=5)
    try:
        good_it = runner.submit(_request(tiny, "good", rows=10))
        with pytest.raises(TalkerError, match="placeholder"):
            await collect(runner.submit(bad))
        assert (await collect(good_it)).shape == (10, 8)
    finally:
        await runner.close()


async def test_duplicate_ids_and_closed_runner_are_rejected(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model)
    it = runner.submit(_request(tiny, "dup", rows=1000))
    with pytest.raises(TalkerError, match="already running"):
        runner.submit(_request(tiny, "dup"))
    await runner.close()
    with pytest.raises(TalkerError, match="closed"):
        await collect(it)
    with pytest.raises(TalkerError, match="closed"):
        runner.submit(_request(tiny, "after"))


async def test_closing_the_iterator_frees_the_slot(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model, max_batch=1)
    try:
        it = runner.submit(_request(tiny, "quitter", rows=100000))
        await collect(it, limit=2)
        await it.aclose()  # type: ignore[attr-defined]
        rows = await asyncio.wait_for(collect(runner.submit(_request(tiny, "next", rows=9))), 20)
        assert rows.shape == (9, 8)
    finally:
        await runner.close()


async def test_abort_before_submit_does_not_touch_the_request(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model)
    try:
        await runner.abort("later")
        rows = await collect(runner.submit(_request(tiny, "later", rows=9)))
        assert rows.shape == (9, 8)
    finally:
        await runner.close()


async def test_position_limit_clamps_and_still_closes_the_pattern(tiny: LoadedTalker) -> None:
    prompt = _prompt(tiny, "hello")
    runner = ReferenceRunner(tiny.model, max_positions=len(prompt.token_ids) + 20)
    try:
        rows = await collect(runner.submit(TalkerRequest("clamp", prompt, GREEDY, fixed_rows=100)))
        with pytest.raises(TalkerError, match="no room"):
            long_prompt = _prompt(tiny, "hello " * 40)
            await collect(runner.submit(TalkerRequest("full", long_prompt, GREEDY)))
    finally:
        await runner.close()
    assert rows.shape == (20, 8)
    np.testing.assert_array_equal(apply_delay(revert_delay(rows)), rows)


# ------------------------------------------------------------------- audio beside the talker


EXACT = ChunkingParams(4, 25, 12, 10)


async def _audio(it: AsyncIterator[PcmChunk], limit: int | None = None) -> list[PcmChunk]:
    chunks = []
    async for chunk in it:
        chunks.append(chunk)
        if limit is not None and len(chunks) == limit:
            break
    return chunks


async def test_audio_equals_the_offline_decode_of_the_same_rows_beside_row_requests(
    tiny: LoadedTalker, checkpoint_codec: Any
) -> None:
    runner = ReferenceRunner(tiny.model, codec=checkpoint_codec, codec_batch=2)
    try:
        texts = ("hello world", "city house", "music and laugh")
        rows_and_audio = await asyncio.gather(
            *(
                collect(runner.submit(_request(tiny, f"rows{i}", t, rows=40)))
                for i, t in enumerate(texts)
            ),
            *(
                _audio(runner.speak(_request(tiny, f"pcm{i}", t, rows=40), EXACT))
                for i, t in enumerate(texts)
            ),
        )
    finally:
        await runner.close()
    for rows, chunks in zip(rows_and_audio[:3], rows_and_audio[3:], strict=True):
        assert isinstance(rows, np.ndarray) and isinstance(chunks, list)
        assert [c.start_frame for c in chunks] == list(
            np.cumsum([0] + [c.pcm.size // 960 for c in chunks[:-1]])
        )
        assert chunks[-1].final and not any(c.final for c in chunks[:-1])
        got = np.concatenate([c.pcm for c in chunks])
        frames = torch.from_numpy(rows_to_frames(rows)[None])
        whole = checkpoint_codec.decode(frames)[0, 0].numpy()
        assert got.shape == whole.shape == (33 * 960,)
        assert float(np.abs(got - whole).max()) <= 1e-5 * float(np.abs(whole).max())


async def test_a_slow_audio_consumer_only_slows_itself(
    tiny: LoadedTalker, checkpoint_codec: Any
) -> None:
    runner = ReferenceRunner(tiny.model, queue_rows=4, codec=checkpoint_codec)
    one_frame = ChunkingParams(1, 1, 0, 0)
    try:
        slow = runner.speak(_request(tiny, "slow", rows=60), one_frame)
        await _audio(slow, limit=1)
        fast = runner.speak(_request(tiny, "fast", rows=30), one_frame)
        chunks = await asyncio.wait_for(_audio(fast), 20)
        assert sum(c.pcm.size for c in chunks) == 23 * 960
        # the slow request stepped at most its queue of frames (plus the delay rows) ahead
        assert runner.stats().rows <= 30 + 1 + 7 + 4 + 1
        rest = await _audio(slow)
        assert sum(c.pcm.size for c in rest) == 52 * 960
    finally:
        await runner.close()


async def test_a_runner_without_a_codec_refuses_audio(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model)
    try:
        with pytest.raises(TalkerError, match="no codec"):
            runner.speak(_request(tiny, "x"), EXACT)
    finally:
        await runner.close()
