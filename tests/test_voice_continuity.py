"""One voice per context: later segments are prompted with the context's voice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime_engine.codec.delay import apply_delay, revert_delay, sanitize_codes
from realtime_engine.engines.base import SegmentRequest, VoiceReference
from realtime_engine.engines.continuity import VoiceContinuity
from realtime_engine.engines.higgs import HiggsEngine
from realtime_engine.model.config import AUDIO_PLACEHOLDER_ID
from realtime_engine.model.loader import LoadedTalker
from realtime_engine.model.prompts import build_clone_prompt, build_zero_shot_prompt
from realtime_engine.talker.backends import ReferenceOptions
from realtime_engine.talker.reference_runner import ReferenceRunner
from realtime_engine.talker.types import TalkerRequest, TalkerSampling

GREEDY = TalkerSampling(temperature=0.0)
TEXTS = ("hello world.", "the quick brown fox.", "thank you for the music.", "good morning.")


@pytest.fixture(scope="module")
def tiny(tiny_talker: LoadedTalker) -> LoadedTalker:
    return tiny_talker


@pytest.fixture
def engine(reference_engine: HiggsEngine) -> HiggsEngine:
    return reference_engine


def _segment(index: int, continuity: VoiceContinuity | None, **kw: object) -> SegmentRequest:
    return SegmentRequest(
        f"ctx:{index}",
        TEXTS[index % len(TEXTS)],
        sampling=GREEDY,
        fixed_rows=10,
        continuity=continuity,
        **kw,  # type: ignore[arg-type]
    )


async def _speak(engine: HiggsEngine, request: SegmentRequest) -> int:
    return sum([chunk.size async for chunk in engine.synthesize(request)])


async def _solo_codes(tiny: LoadedTalker, text: str, rows: int) -> np.ndarray:
    """The codes a zero-shot request makes, straight from a fresh runner."""
    runner = ReferenceRunner(tiny.model)
    try:
        prompt = build_zero_shot_prompt(tiny.tokenizer, text)
        request = TalkerRequest("solo", prompt, sampling=GREEDY, fixed_rows=rows)
        got = [row async for row in runner.submit(request)]
    finally:
        await runner.close()
    return sanitize_codes(revert_delay(np.stack(got).astype(np.int64)))


async def test_segment_two_is_prompted_with_the_first_segments_codes_and_text(
    engine: HiggsEngine, tiny: LoadedTalker
) -> None:
    continuity = VoiceContinuity(min_frames=5, max_frames=200)
    first = _segment(0, continuity)
    assert engine.prompt_for(first) == build_zero_shot_prompt(tiny.tokenizer, TEXTS[0])
    await _speak(engine, first)
    expected_codes = await _solo_codes(tiny, TEXTS[0], rows=10 + 7)
    assert expected_codes.shape == (10, 8)
    for index in (1, 2, 3):
        prompt = engine.prompt_for(_segment(index, continuity))
        expected = build_clone_prompt(
            tiny.tokenizer, TEXTS[index], expected_codes, ref_text=TEXTS[0]
        )
        assert prompt.token_ids == expected.token_ids
        assert prompt.ref_rows is not None
        assert np.array_equal(prompt.ref_rows, apply_delay(expected_codes))
        await _speak(engine, _segment(index, continuity))
    # settled after the first segment: later segments did not move the anchor
    anchor = continuity.anchor()
    assert anchor is not None and np.array_equal(anchor.codes, expected_codes)


async def test_a_context_voice_reference_prompts_every_segment(
    engine: HiggsEngine, tiny: LoadedTalker
) -> None:
    ref = VoiceReference(np.random.default_rng(5).integers(0, 1024, (30, 8)), "a reference.")
    continuity = VoiceContinuity()
    for index in range(3):
        request = _segment(index, continuity, reference=ref)
        prompt = engine.prompt_for(request)
        expected = build_clone_prompt(tiny.tokenizer, TEXTS[index], ref.codes, ref.text)
        assert prompt.token_ids == expected.token_ids
        assert prompt.ref_rows is not None
        assert np.array_equal(prompt.ref_rows, apply_delay(ref.codes))
        assert prompt.token_ids.count(AUDIO_PLACEHOLDER_ID) == 30 + 7
        await _speak(engine, request)
    assert continuity.anchor() is None  # the reference is the voice; nothing recorded


async def test_prefill_stays_flat_over_a_long_reply(engine: HiggsEngine) -> None:
    continuity = VoiceContinuity(min_frames=15, max_frames=18)
    lengths = []
    for index in range(6):
        request = _segment(index, continuity)
        prompt = engine.prompt_for(request)
        lengths.append(
            len(prompt.token_ids) - len(engine.prompt_for(_segment(index, None)).token_ids)
        )
        await _speak(engine, request)
    # segment 1: zero-shot; 2: one segment of anchor (10 frames, under min);
    # 3 on: 18 frames (trimmed from 20, transcript dropped), whatever the reply length
    assert lengths[0] == 0
    assert lengths[1] > 0
    assert len(set(lengths[2:])) == 1
    anchor = continuity.anchor()
    assert anchor is not None and anchor.frames == 18 and anchor.text is None


async def test_an_aborted_segment_is_not_an_anchor(engine: HiggsEngine) -> None:
    continuity = VoiceContinuity(min_frames=5)
    request = _segment(0, continuity)
    stream = engine.synthesize(request)
    await anext(stream)
    await engine.abort(request.request_id)
    async for _ in stream:
        pass
    assert continuity.anchor() is None


def test_continuity_grows_to_its_minimum_then_freezes() -> None:
    c = VoiceContinuity(min_frames=6, max_frames=9)
    assert c.anchor() is None and not c.settled
    c.record(np.ones((4, 8), np.int64), "one.")
    c.record(np.full((3, 8), 2), " two. ")
    anchor = c.anchor()
    assert anchor is not None and anchor.text == "one. two." and anchor.frames == 7
    assert c.settled
    c.record(np.full((5, 8), 3), "three.")
    assert c.anchor().codes.tolist() == anchor.codes.tolist()  # type: ignore[union-attr]


def test_continuity_keeps_the_last_frames_without_the_transcript() -> None:
    c = VoiceContinuity(min_frames=2, max_frames=4)
    codes = np.arange(6 * 8).reshape(6, 8)
    c.record(codes, "six frames.")
    anchor = c.anchor()
    assert anchor is not None and anchor.text is None
    assert np.array_equal(anchor.codes, codes[-4:])
    with pytest.raises(ValueError):
        VoiceContinuity(min_frames=5, max_frames=4)


async def test_a_broken_bundled_encoder_turns_cloning_off_naming_the_tensor(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    from realtime_engine.codec.layout import CODEC_PREFIX
    from realtime_engine.engines.base import UnsupportedVoiceError

    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tiny_checkpoint / name, tmp_path / name)
    state = load_file(str(tiny_checkpoint / "model.safetensors"))
    missing = CODEC_PREFIX + "acoustic_encoder.conv2.weight"
    del state[missing]
    save_file(state, str(tmp_path / "model.safetensors"))
    engine = HiggsEngine.from_pretrained(str(tmp_path), "cpu", talker=ReferenceOptions())
    try:
        assert not engine.supports_voice_cloning
        with pytest.raises(UnsupportedVoiceError, match=r"acoustic_encoder\.conv2\.weight"):
            await engine.encode_reference(np.zeros(24_000, np.float32), 24_000)
        # speech with the built-in voice still works
        assert await _speak(engine, _segment(0, None)) == 10 * 960
    finally:
        await engine.close()


async def test_the_tiny_engine_encodes_references(tiny_checkpoint: Path) -> None:
    engine = HiggsEngine.from_pretrained(str(tiny_checkpoint), "cpu", talker=ReferenceOptions())
    try:
        assert engine.supports_voice_cloning
        t = np.arange(36_000) / 24_000
        codes = await engine.encode_reference(
            np.sin(2 * np.pi * 200 * t).astype(np.float32), 24_000
        )
        assert codes.shape == (38, 8) and engine.reference_encodes == 1
        with pytest.raises(ValueError, match="at least 1 s"):
            await engine.encode_reference(np.zeros(100, np.float32), 24_000)
    finally:
        await engine.close()


@settings(max_examples=60, deadline=None)
@given(
    bounds=st.tuples(st.integers(1, 40), st.integers(0, 40)),
    segments=st.lists(st.integers(0, 30), max_size=8),
)
def test_the_anchor_is_bounded_and_frozen_once_settled(
    bounds: tuple[int, int], segments: list[int]
) -> None:
    min_frames, extra = bounds
    c = VoiceContinuity(min_frames=min_frames, max_frames=min_frames + extra)
    frozen: np.ndarray | None = None
    recorded: list[np.ndarray] = []
    for i, frames in enumerate(segments):
        codes = np.full((frames, 8), i, dtype=np.int64)
        if not c.settled:
            recorded.append(codes)
        c.record(codes, f"segment {i}.")
        anchor = c.anchor()
        assert c.frames <= c.max_frames
        if anchor is None:
            assert c.frames == 0
            continue
        if frozen is not None:
            assert np.array_equal(anchor.codes, frozen)
        if c.settled:
            frozen = anchor.codes
        joined = np.concatenate(recorded)
        # the anchor is the most recent frames of what was recorded, whole
        assert np.array_equal(anchor.codes, joined[-c.max_frames :])
        assert (anchor.text is None) == (joined.shape[0] > c.max_frames)
