"""The embedded CPU voice: text rules, the espeak-ng pipe, and the engine itself."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st

from gateway.voices import VoiceLibrary
from realtime_engine.engines.base import (
    EngineError,
    SegmentRequest,
    UnsupportedVoiceError,
    VoiceReference,
)
from realtime_engine.engines.cpu_voice import (
    CpuVoiceConfig,
    CpuVoiceEngine,
    group_units,
    phoneme_ids,
    strip_control_tags,
)
from realtime_engine.engines.espeak import (
    Clause,
    EspeakNotFoundError,
    EspeakPhonemizer,
    chunk_utf8,
    clean_ipa,
    join_clauses,
    split_clauses,
)

MARKS = set(".!?,:;")
words = st.text(alphabet="abcdefghijklmnopqrstuvwxyzé'", min_size=1, max_size=12)
separators = st.sampled_from([" ", ", ", ". ", "? ", "! ", "; ", ": ", "... ", " - "])


@st.composite
def sentences(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.tuples(words, separators), min_size=1, max_size=20))
    return "".join(word + sep for word, sep in parts)


# -- clause splitting ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello, world.", [Clause("Hello", ","), Clause("world", ".")]),
        ("It is 3.14 or 1,000 now", [Clause("It is 3.14 or 1,000 now", "")]),
        ("Dr. Smith met Mr. Jones.", [Clause("Dr. Smith met Mr. Jones", ".")]),
        ("Really?! Yes...", [Clause("Really", "?"), Clause("Yes", ".")]),
        ('"Why?" she asked', [Clause('"Why', "?"), Clause("she asked", "")]),
        ("Wait… what", [Clause("Wait", "."), Clause("what", "")]),
        ("one;two: three", [Clause("one;two", ":"), Clause("three", "")]),
        ("  , . ", []),
        ("", []),
        ("e.g. this", [Clause("e.g. this", "")]),
        ("line\none\ttwo", [Clause("line one two", "")]),
    ],
)
def test_split_clauses_cases(text: str, expected: list[Clause]) -> None:
    assert split_clauses(text) == expected


@given(sentences())
def test_split_clauses_keeps_every_word_in_order(text: str) -> None:
    clauses = split_clauses(text)
    rebuilt = " ".join(c.text for c in clauses)
    strip = re.compile(r"[.!?,:;…]")
    assert strip.sub("", rebuilt).split() == strip.sub("", text).split()
    for clause in clauses:
        assert clause.text.strip() == clause.text and clause.text
        assert clause.punctuation == "" or clause.punctuation in MARKS


def test_split_clauses_normalizes_to_nfc() -> None:
    (clause,) = split_clauses("cafe\u0301")
    assert clause.text == "caf\u00e9"


# -- chunking for espeak's line limit ----------------------------------------


@given(
    st.lists(st.text(alphabet="aé漢x", min_size=1, max_size=40), max_size=60), st.integers(8, 64)
)
def test_chunk_utf8_respects_limit_and_keeps_text(word_list: list[str], limit: int) -> None:
    text = " ".join(word_list)
    chunks = chunk_utf8(text, limit)
    assert all(0 < len(c.encode()) <= limit for c in chunks)
    assert "".join(chunks).replace(" ", "") == text.replace(" ", "")
    if all(len(w.encode()) <= limit for w in word_list):
        assert " ".join(chunks).split() == text.split()


def test_chunk_utf8_rejects_a_limit_below_one_character() -> None:
    with pytest.raises(ValueError):
        chunk_utf8("abc", 3)


# -- IPA clean-up, joining, ids ------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("(fr)bɔ̃ʒuːʁ(en) wˈɜːld", "bɔ̃ʒuːʁ wˈɜːld"),
        ("  həlˈoʊ  ", "həlˈoʊ"),
        ("(en-us)", ""),
    ],
)
def test_clean_ipa(line: str, expected: str) -> None:
    assert clean_ipa(line) == expected


def test_join_clauses_reattaches_marks_and_skips_silent_clauses() -> None:
    joined = join_clauses([("həlˈoʊ", ","), ("", "!"), ("wˈɜːld", "."), ("hˈaʊ", "")])
    assert joined == "həlˈoʊ, wˈɜːld. hˈaʊ"


def test_phoneme_ids_follow_the_voice_layout() -> None:
    id_map = {"^": [1], "_": [0], "$": [2], "a": [14], "ˈ": [120], " ": [3]}
    # "ä" (a + combining diaeresis under NFD) keeps its known base symbol only.
    assert phoneme_ids("ˈa ä", id_map) == [1, 0, 120, 0, 14, 0, 3, 0, 14, 0, 2]


def test_strip_control_tags() -> None:
    text = "<|emotion:amusement|><|prosody:expressive_high|>Wait, <|prosody:pause|> what?"
    assert strip_control_tags(text).split() == ["Wait,", "what?"]
    assert strip_control_tags("a < b | c > d") == "a < b | c > d"


@given(st.lists(st.tuples(words, st.sampled_from(["", ",", ".", "?", ";"])), max_size=30))
def test_group_units_breaks_at_sentences_and_keeps_order(pairs: list[tuple[str, str]]) -> None:
    clauses = [Clause(text, mark) for text, mark in pairs]
    units = group_units(clauses, first_unit_chars=10, unit_chars=30)
    assert [c for unit in units for c in unit] == clauses
    for unit in units:
        assert unit
        assert not any(c.ends_sentence for c in unit[:-1])
    for unit in units[:-1]:
        assert unit[-1].ends_sentence or sum(len(c.text) + 1 for c in unit) >= 10


# -- the espeak-ng process -------------------------------------------------------


@pytest.fixture(scope="module")
def phonemizer() -> Iterator[EspeakPhonemizer]:
    p = EspeakPhonemizer()
    p.start()
    yield p
    p.close()


def test_phonemizer_matches_the_voice_training_format(phonemizer: EspeakPhonemizer) -> None:
    assert phonemizer.phonemize("Hello, world.") == "həlˈoʊ, wˈɜːld."


def test_phonemizer_reads_text_that_looks_like_an_option(phonemizer: EspeakPhonemizer) -> None:
    assert phonemizer.phonemize_clause("-5 degrees").startswith("mˈaɪnəs fˈaɪv")


def test_phonemizer_stays_in_step_after_odd_input(phonemizer: EspeakPhonemizer) -> None:
    for odd in ["qqzmarkerqq", "😀", "", "...", "a\nb\n\nc", "word " * 400]:
        phonemizer.phonemize(odd)
    assert phonemizer.phonemize("world") == "wˈɜːld"


def test_phonemizer_long_line_is_not_cut(phonemizer: EspeakPhonemizer) -> None:
    ipa = phonemizer.phonemize_clause("world " * 300)
    assert ipa.split() == ["wˈɜːld"] * 300


def test_phonemizer_restarts_after_the_process_dies() -> None:
    p = EspeakPhonemizer()
    p.start()
    assert p._process is not None
    p._process.kill()
    p._process.wait()
    assert p.phonemize("world") == "wˈɜːld"
    p.close()


def test_missing_espeak_is_a_clear_error() -> None:
    p = EspeakPhonemizer(executable="espeak-ng-not-installed")
    with pytest.raises(EspeakNotFoundError, match="apt-get install espeak-ng"):
        p.start()


# -- the engine -------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[CpuVoiceEngine]:
    voice = CpuVoiceEngine()
    await voice.start()
    yield voice
    await voice.close()


async def collect(engine: CpuVoiceEngine, text: str, **kwargs: object) -> list[np.ndarray]:
    request = SegmentRequest(request_id=f"r{id(text)}-{len(kwargs)}", text=text, **kwargs)  # type: ignore[arg-type]
    return [chunk async for chunk in engine.synthesize(request)]


pytestmark_engine = pytest.mark.asyncio(loop_scope="module")


@pytestmark_engine
async def test_speech_is_24khz_float32_of_plausible_length(engine: CpuVoiceEngine) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    chunks = await collect(engine, text)
    audio = np.concatenate(chunks)
    assert engine.sample_rate == 24_000
    assert all(c.dtype == np.float32 and c.ndim == 1 for c in chunks)
    seconds = audio.size / 24_000
    assert 1.5 < seconds < 5.0  # nine words at a normal speaking rate
    assert float(np.sqrt(np.mean(audio**2))) > 0.02 and float(np.max(np.abs(audio))) <= 1.0


@pytestmark_engine
async def test_long_segment_streams_clause_units(engine: CpuVoiceEngine) -> None:
    chunks = await collect(engine, "Yes, of course. I will be there at noon. See you then!")
    assert len(chunks) == 3


@pytestmark_engine
async def test_speed_changes_duration(engine: CpuVoiceEngine) -> None:
    text = "Numbers are read at the requested speed."
    slow = np.concatenate(await collect(engine, text, speed=0.5)).size
    fast = np.concatenate(await collect(engine, text, speed=2.0)).size
    assert 2.5 < slow / fast < 6.0


@pytestmark_engine
async def test_control_tags_are_not_spoken(engine: CpuVoiceEngine) -> None:
    assert await collect(engine, "<|sfx:laughter|> <|prosody:pause|>") == []
    assert await collect(engine, "") == []


@pytestmark_engine
async def test_unknown_voice_is_refused(engine: CpuVoiceEngine) -> None:
    with pytest.raises(UnsupportedVoiceError, match="nobody"):
        await collect(engine, "Hello.", voice="nobody")


@pytestmark_engine
async def test_a_cloned_voice_is_refused_naming_the_engine(engine: CpuVoiceEngine) -> None:
    reference = VoiceReference(np.zeros((25, 8), dtype=np.int64), "a clip.")
    with pytest.raises(UnsupportedVoiceError, match="cpu-voice engine cannot speak cloned"):
        await collect(engine, "Hello.", voice="mine", reference=reference)
    library = VoiceLibrary(engine)
    with pytest.raises(UnsupportedVoiceError, match="cpu-voice engine cannot clone"):
        await library.create(_one_second_wav(), None, "mine")


def _one_second_wav() -> bytes:
    import io
    import wave

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(24_000)
        t = np.arange(24_000) / 24_000
        out.writeframes((8000 * np.sin(2 * np.pi * 220 * t)).astype("<i2").tobytes())
    return buffer.getvalue()


@pytestmark_engine
async def test_abort_stops_further_units(engine: CpuVoiceEngine) -> None:
    text = " ".join(f"This is sentence number {n}." for n in range(12))
    stream = engine.synthesize(SegmentRequest(request_id="long", text=text))
    first = await anext(stream)
    assert first.size
    await engine.abort("long")
    rest = [chunk async for chunk in stream]
    assert rest == []
    # The id is free again once the stream ended.
    again = [c async for c in engine.synthesize(SegmentRequest(request_id="long", text="Done."))]
    assert again


@pytestmark_engine
async def test_abort_before_first_pull_yields_nothing(engine: CpuVoiceEngine) -> None:
    stream = engine.synthesize(SegmentRequest(request_id="early", text="Never spoken."))
    await engine.abort("early")
    assert [c async for c in stream] == []
    await engine.abort("unknown-request")  # no-op


@pytestmark_engine
async def test_duplicate_running_request_id_is_refused(engine: CpuVoiceEngine) -> None:
    stream = engine.synthesize(SegmentRequest(request_id="dup", text="One."))
    with pytest.raises(EngineError, match="already running"):
        engine.synthesize(SegmentRequest(request_id="dup", text="Two."))
    assert [c async for c in stream]


@pytestmark_engine
async def test_concurrent_segments_both_complete(engine: CpuVoiceEngine) -> None:
    a, b = await asyncio.gather(
        collect(engine, "First voice line."), collect(engine, "Second, slightly longer voice line.")
    )
    assert a and b


def test_voices_list_the_builtin_voice() -> None:
    ids = [v.voice_id for v in CpuVoiceEngine().voices()]
    assert "default" in ids and all(v.builtin for v in CpuVoiceEngine().voices())


async def test_start_without_espeak_fails_clearly() -> None:
    engine = CpuVoiceEngine(CpuVoiceConfig(espeak_executable="espeak-ng-not-installed"))
    with pytest.raises(EspeakNotFoundError):
        await engine.start()
    await engine.close()


async def test_broken_voice_config_is_an_engine_error(tmp_path: object) -> None:
    from pathlib import Path

    bad = Path(str(tmp_path)) / "voice.onnx.json"
    bad.write_text(json.dumps({"audio": {}}))
    engine = CpuVoiceEngine(CpuVoiceConfig(config_path=bad))
    with pytest.raises(EngineError, match="voice config"):
        await engine.start()
    await engine.close()


@pytestmark_engine
async def test_closing_the_stream_early_stops_the_request(engine: CpuVoiceEngine) -> None:
    text = " ".join(f"Closing early, part {n}." for n in range(6))
    stream = engine.synthesize(SegmentRequest(request_id="closed", text=text))
    assert (await anext(stream)).size
    active = engine._active["closed"]
    await stream.aclose()  # type: ignore[attr-defined]
    assert "closed" not in engine._active
    assert active.cancelled.is_set() and active.run_options.terminate
    # Work queued behind a cancelled request is skipped, later requests still run.
    assert await collect(engine, "Still here.")
