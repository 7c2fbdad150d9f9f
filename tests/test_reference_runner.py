from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from talker_support import FailingTalker

from realtime_engine.codec.delay import apply_delay, revert_delay
from realtime_engine.model.loader import LoadedTalker, load_talker
from realtime_engine.model.prompts import build_zero_shot_prompt
from realtime_engine.talker.reference_runner import ReferenceRunner
from realtime_engine.talker.types import TalkerError, TalkerPrompt, TalkerRequest, TalkerSampling

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


async def _collect(it: AsyncIterator[np.ndarray], limit: int | None = None) -> np.ndarray:
    rows = []
    async for row in it:
        rows.append(row)
        if limit is not None and len(rows) == limit:
            break
    return np.stack(rows) if rows else np.zeros((0, 8), dtype=np.int64)


async def test_rows_are_a_valid_delay_pattern_of_exact_length(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model)
    try:
        rows = await _collect(runner.submit(_request(tiny, "a", rows=20)))
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
        alone = await _collect(
            runner.submit(_request(tiny, "main", "the quick brown fox", rows=40))
        )

        main_it = runner.submit(_request(tiny, "main2", "the quick brown fox", rows=40))
        early = runner.submit(_request(tiny, "early", "music and laugh", rows=12))
        doomed = runner.submit(_request(tiny, "doomed", "question answer", rows=400))
        early_task = asyncio.create_task(_collect(early))
        got = []
        joined: asyncio.Task[np.ndarray] | None = None
        async for row in main_it:
            got.append(row)
            if len(got) == 10:  # one joins mid-way, another leaves mid-way
                joined = asyncio.create_task(
                    _collect(runner.submit(_request(tiny, "late", "city house", rows=15)))
                )
                await _collect(doomed, limit=3)
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
        first = await _collect(long_it, limit=3)
        assert first.shape == (3, 8)
        await runner.abort("long")
        assert runner.stats().active == 0
        # the consumer sees a clean end, not an error
        remaining = await asyncio.wait_for(_collect(long_it), timeout=5)
        assert remaining.shape[0] < 100000
        # the single slot is free again and the same id may be reused
        rows = await asyncio.wait_for(_collect(runner.submit(_request(tiny, "long", rows=9))), 20)
        assert rows.shape == (9, 8)
        await runner.abort("unknown-id")  # no-op
    finally:
        await runner.close()


async def test_abort_of_a_queued_request(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model, max_batch=1)
    try:
        busy = runner.submit(_request(tiny, "busy", rows=100000))
        await _collect(busy, limit=1)
        queued = runner.submit(_request(tiny, "queued", rows=10))
        await runner.abort("queued")
        assert (await asyncio.wait_for(_collect(queued), 5)).shape == (0, 8)
        await runner.abort("busy")
    finally:
        await runner.close()


async def test_seeded_sampling_repeats(tiny: LoadedTalker) -> None:
    def sampled(seed: int) -> TalkerSampling:
        return TalkerSampling(temperature=1.0, seed=seed)

    runner = ReferenceRunner(tiny.model)
    try:
        a = await _collect(runner.submit(_request(tiny, "a", rows=30, sampling=sampled(7))))
        b_it = runner.submit(_request(tiny, "b", rows=30, sampling=sampled(7)))
        other_it = runner.submit(_request(tiny, "c", rows=30, sampling=sampled(8)))
        b, other = await asyncio.gather(_collect(b_it), _collect(other_it))
    finally:
        await runner.close()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, other)


async def test_slow_consumer_only_slows_itself(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model, queue_rows=4)
    try:
        slow = runner.submit(_request(tiny, "slow", rows=50))
        await _collect(slow, limit=1)
        fast = await asyncio.wait_for(_collect(runner.submit(_request(tiny, "fast", rows=30))), 20)
        assert fast.shape == (30, 8)
        stats = runner.stats()
        # the slow request stepped at most one queue (plus the row in hand) ahead
        assert stats.rows <= 30 + 1 + 4 + 1
        rest = await _collect(slow)
        assert rest.shape == (49, 8)
    finally:
        await runner.close()


async def test_max_new_tokens_caps_rows(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model)
    request = TalkerRequest("cap", _prompt(tiny, "hello"), sampling=GREEDY, max_new_tokens=11)
    try:
        rows = await _collect(runner.submit(request))
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
                await asyncio.wait_for(_collect(it), 20)
        # the worker survives and serves the next request once the model works again
        model.fail_after = 10**9
        rows = await asyncio.wait_for(_collect(runner.submit(_request(tiny, "next", rows=8))), 20)
        assert rows.shape == (8, 8)
    finally:
        await runner.close()


async def test_bad_prompt_fails_only_its_request(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model)
    bad = TalkerRequest("bad", TalkerPrompt(token_ids=(1, -100, 2)), fixed_rows=5)
    try:
        good_it = runner.submit(_request(tiny, "good", rows=10))
        with pytest.raises(TalkerError, match="placeholder"):
            await _collect(runner.submit(bad))
        assert (await _collect(good_it)).shape == (10, 8)
    finally:
        await runner.close()


async def test_duplicate_ids_and_closed_runner_are_rejected(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model)
    it = runner.submit(_request(tiny, "dup", rows=1000))
    with pytest.raises(TalkerError, match="already running"):
        runner.submit(_request(tiny, "dup"))
    await runner.close()
    with pytest.raises(TalkerError, match="closed"):
        await _collect(it)
    with pytest.raises(TalkerError, match="closed"):
        runner.submit(_request(tiny, "after"))


async def test_closing_the_iterator_frees_the_slot(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model, max_batch=1)
    try:
        it = runner.submit(_request(tiny, "quitter", rows=100000))
        await _collect(it, limit=2)
        await it.aclose()  # type: ignore[attr-defined]
        rows = await asyncio.wait_for(_collect(runner.submit(_request(tiny, "next", rows=9))), 20)
        assert rows.shape == (9, 8)
    finally:
        await runner.close()


async def test_abort_before_submit_does_not_touch_the_request(tiny: LoadedTalker) -> None:
    runner = ReferenceRunner(tiny.model)
    try:
        await runner.abort("later")
        rows = await _collect(runner.submit(_request(tiny, "later", rows=9)))
        assert rows.shape == (9, 8)
    finally:
        await runner.close()


async def test_position_limit_clamps_and_still_closes_the_pattern(tiny: LoadedTalker) -> None:
    prompt = _prompt(tiny, "hello")
    runner = ReferenceRunner(tiny.model, max_positions=len(prompt.token_ids) + 20)
    try:
        rows = await _collect(runner.submit(TalkerRequest("clamp", prompt, GREEDY, fixed_rows=100)))
        with pytest.raises(TalkerError, match="no room"):
            long_prompt = _prompt(tiny, "hello " * 40)
            await _collect(runner.submit(TalkerRequest("full", long_prompt, GREEDY)))
    finally:
        await runner.close()
    assert rows.shape == (20, 8)
    np.testing.assert_array_equal(apply_delay(revert_delay(rows)), rows)
