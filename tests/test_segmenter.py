"""TextSegmenter: one table row per rule, the timing rule with a fake clock, API edges."""

from __future__ import annotations

import pytest

from realtime_engine.text import Segment, SegmenterConfig, SegmenterError, TextSegmenter
from realtime_engine.text.boundaries import Strength, find_cuts, spoken_weight


def run(chunks: list[str] | str, **config: object) -> list[str]:
    """Feed ``chunks`` (a string is fed one character at a time), then end()."""
    seg = TextSegmenter(SegmenterConfig(**config))  # type: ignore[arg-type]
    out: list[Segment] = []
    for chunk in chunks:
        out += seg.feed(chunk, 0)
    out += seg.end()
    return [s.text for s in out]


CASES: list[tuple[str, str, list[str]]] = [
    (
        "short first sentence, later short sentences joined",
        "Hello. This is a longer second sentence here. Short one. And another long one follows.",
        [
            "Hello.",
            " This is a longer second sentence here.",
            " Short one. And another long one follows.",
        ],
    ),
    (
        "first segment cut at a clause once a few words long",
        "Well, I think that is right, but let me check it again for you.",
        ["Well, I think that is right,", " but let me check it again for you."],
    ),
    (
        "numbers stay whole",
        "It is 3.14 today. We saw 1,000 people at 10:30 in -5 degrees, a 2.5% drop.",
        ["It is 3.14 today.", " We saw 1,000 people at 10:30 in -5 degrees, a 2.5% drop."],
    ),
    (
        "abbreviations are not sentence ends",
        "Dr. Smith met Mr. Jones in the U.S. today. They talked, e.g. about work, etc. and more.",
        [
            "Dr. Smith met Mr. Jones in the U.S. today.",
            " They talked, e.g. about work, etc. and more.",
        ],
    ),
    (
        "URLs and e-mail addresses stay whole",
        "Visit https://example.com/a.b?x=1,2 or mail bob@example.org. Thanks a lot for that!",
        ["Visit https://example.com/a.b?x=1,2 or mail bob@example.org.", " Thanks a lot for that!"],
    ),
    (
        "an ellipsis is a pause, never split",
        "Well... I guess so, yes. Maybe we can try it again later tonight.",
        ["Well... I guess so,", " yes. Maybe we can try it again later tonight."],
    ),
    (
        "a control tag opens the next sentence",
        "Hello there.<|emotion:anger|>I am really angry about this. Okay.",
        ["Hello there.", "<|emotion:anger|>I am really angry about this.", " Okay."],
    ),
    (
        "a control tag stays with the word after it",
        "<|sfx:laughter|> Haha, that is so funny to me.",
        ["<|sfx:laughter|> Haha, that is so funny to me."],
    ),
    (
        "Chinese: sentence and clause punctuation without spaces",
        "你好，我是小明。很高兴认识你！今天天气很好，我们去公园散步吧。",
        ["你好，我是小明。", "很高兴认识你！今天天气很好，我们去公园散步吧。"],
    ),
    (
        "Japanese with closing quotes",
        "こんにちは。「今日はいい天気ですね。」と彼は言いました。",
        ["こんにちは。", "「今日はいい天気ですね。」", "と彼は言いました。"],
    ),
    (
        "a list number opening a segment is not a sentence",
        "1. Buy milk and eggs. 2. Call mom today please.",
        ["1. Buy milk and eggs.", " 2. Call mom today please."],
    ),
    (
        "whitespace between segments opens the later one",
        "Hi.  \n And now a sentence long enough to stand.",
        ["Hi.", "  \n And now a sentence long enough to stand."],
    ),
    (
        "closing quote stays with its sentence",
        '"Stop!" she said loudly to everyone in the room. Then she left.',
        ['"Stop!"', " she said loudly to everyone in the room.", " Then she left."],
    ),
]


@pytest.mark.parametrize(("name", "text", "expected"), CASES, ids=[c[0] for c in CASES])
def test_rules_fed_whole_and_char_by_char(name: str, text: str, expected: list[str]) -> None:
    assert run([text]) == expected
    assert run(text) == expected


def test_control_tags_weigh_nothing() -> None:
    # 21 spoken characters: under sentence_min_chars (24) once the tag is not counted.
    text = "Hello there.<|emotion:anger|>I am angry about it. Okay then."
    expected = ["Hello there.", "<|emotion:anger|>I am angry about it. Okay then."]
    assert run([text]) == expected
    assert run(text) == expected
    assert spoken_weight("  <|sfx:laughter|>Ha 好") == 6


def test_first_short_sentence_is_cut_at_once() -> None:
    seg = TextSegmenter()
    assert seg.feed("Hi!", 0) == []  # a closing quote or more "!" may follow
    assert [s.text for s in seg.feed(" How", 0)] == ["Hi!"]


def test_trailing_decimal_waits_for_the_next_character() -> None:
    seg = TextSegmenter()
    assert seg.feed("It costs 3.", 0) == []
    assert seg.feed("14", 0) == []
    assert [s.text for s in seg.feed(" dollars. And", 0)] == ["It costs 3.14 dollars."]
    # ... but a flush speaks what is there.
    seg = TextSegmenter()
    seg.feed("It costs 3.", 0)
    assert [s.text for s in seg.flush()] == ["It costs 3."]


def test_trailing_abbreviation_waits() -> None:
    seg = TextSegmenter()
    assert seg.feed("Call Dr.", 0) == []
    assert seg.feed(" Smith", 0) == []
    assert [s.text for s in seg.feed(" now. Then", 0)] == ["Call Dr. Smith now."]


def test_control_tag_split_across_fragments() -> None:
    seg = TextSegmenter()
    assert seg.feed("Hello there.<|emo", 0) == []
    assert [s.text for s in seg.feed("tion:anger|>I am angry", 0)] == ["Hello there."]
    assert seg.pending_text == "<|emotion:anger|>I am angry"


def test_length_limit_cuts_at_the_best_boundary_within() -> None:
    text = "word " * 100
    segments = run([text], max_chars=60, clause_min_chars=50, sentence_min_chars=20)
    assert "".join(segments) == text
    assert all(spoken_weight(s) <= 60 for s in segments)
    assert all(s.strip().startswith("word") and s.rstrip().endswith("word") for s in segments)
    text = "Hi. one two three, four five six seven eight nine ten eleven twelve"
    clauses = run([text], max_chars=30, clause_min_chars=30)
    assert clauses[:2] == ["Hi.", " one two three,"]


def test_a_word_longer_than_the_limit_is_kept_whole() -> None:
    long_word = "x" * 300
    assert run([long_word + " end of it"], max_chars=240) == [long_word, " end of it"]


def test_cjk_without_punctuation_falls_back_to_character_boundaries() -> None:
    text = "我们" * 100
    segments = run([text], max_chars=60, clause_min_chars=30, sentence_min_chars=20)
    assert "".join(segments) == text
    assert all(spoken_weight(s) <= 60 for s in segments)
    assert len(segments) > 1


def test_grapheme_clusters_are_never_split() -> None:
    # Decomposed "が" (か + combining voiced mark) and a ZWJ family emoji.
    text = "か\u3099" * 60 + " 👨\u200d👩\u200d👧 " * 20
    segments = run([text], max_chars=30, clause_min_chars=20, sentence_min_chars=20)
    assert "".join(segments) == text
    for s in segments[1:]:
        assert not s.startswith(("\u3099", "\u200d"))
    for s in segments:
        assert not s.endswith("\u200d")


def test_no_break_space_is_not_a_cut() -> None:
    text = "10\u00a0km " * 40
    segments = run([text], max_chars=30, clause_min_chars=20, sentence_min_chars=20)
    assert "".join(segments) == text
    assert all(not s.lstrip(" ").startswith("\u00a0") and "10" in s for s in segments)


def test_whitespace_only_tail_is_kept_by_flush_and_dropped_by_end() -> None:
    seg = TextSegmenter()
    assert [s.text for s in seg.feed("Hello there my friend. ", 0)] == ["Hello there my friend."]
    assert seg.flush() == []
    assert seg.pending_text == " "
    assert [s.text for s in seg.feed("Next one.", 0)] == []
    assert [s.text for s in seg.end()] == [" Next one."]
    assert TextSegmenter().end() == []


def test_segment_metadata() -> None:
    seg = TextSegmenter()
    text = "Hello. This is a longer second sentence here. And the end of it all."
    out = seg.feed(text, 0) + seg.end()
    assert [s.index for s in out] == list(range(len(out)))
    assert all(text[s.start : s.end] == s.text for s in out)
    assert [s.reason for s in out] == ["sentence", "sentence", "end"]
    assert out[1].speech_text == "This is a longer second sentence here."


def test_manual_mode_only_cuts_on_flush() -> None:
    seg = TextSegmenter(SegmenterConfig(mode="manual"))
    text = "Hello. This is a longer second sentence here. And the end"
    assert seg.feed(text, 0) == []
    assert seg.poll(10_000) == []
    assert seg.next_deadline_ms() is None
    assert [s.text for s in seg.flush()] == [
        "Hello.",
        " This is a longer second sentence here.",
        " And the end",
    ]
    assert seg.pending_text == ""


# ------------------------------------------------------------------ timing rule


def test_time_cut_speaks_up_to_the_last_word_boundary() -> None:
    seg = TextSegmenter(SegmenterConfig(max_buffer_delay_ms=250))
    assert seg.next_deadline_ms() is None
    assert seg.feed("Hello there my", 1000) == []
    assert seg.next_deadline_ms() == 1250
    assert seg.poll(1249) == []
    cut = seg.poll(1250)
    assert [(s.text, s.reason) for s in cut] == [("Hello there", "timeout")]
    # " my" arrived at 1000 too: it is overdue but has no decided end yet, so there is
    # no deadline to wait for until more text comes.
    assert seg.next_deadline_ms() is None
    assert seg.poll(1300) == []
    assert [s.text for s in seg.feed(" friend", 1400)] == [" my"]
    assert seg.next_deadline_ms() is None
    seg.feed(" is", 1500)
    assert seg.next_deadline_ms() == 1650


def test_time_cut_takes_a_finished_looking_end() -> None:
    for text in ("Sure!", "Let me check that.", "好的。", 'He said "yes?"'):
        seg = TextSegmenter()
        assert seg.feed(text, 0) == []
        assert [s.text for s in seg.poll(250)] == [text]


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("It costs 3.", "It costs"),
        ("Call Dr.", "Call"),
        ("We went to the U.S.", "We went to the"),
        ("Hi there <|emo", "Hi there"),
        ("Wait...", None),
        ("Go to https://example.", "Go to"),
    ],
)
def test_time_cut_does_not_guess_at_ambiguous_ends(text: str, spoken: str | None) -> None:
    seg = TextSegmenter()
    seg.feed(text, 0)
    assert [s.text for s in seg.poll(10_000)] == ([] if spoken is None else [spoken])


def test_time_is_measured_from_the_first_unspoken_character() -> None:
    seg = TextSegmenter(SegmenterConfig(max_buffer_delay_ms=100))
    seg.feed("   ", 0)  # whitespace alone is nothing to speak
    assert seg.next_deadline_ms() is None
    seg.feed("one", 50)
    assert seg.next_deadline_ms() is None  # "one" may still grow
    seg.feed(" two", 120)
    assert seg.next_deadline_ms() == 150
    assert [s.text for s in seg.poll(150)] == ["   one"]
    seg.feed("!", 130)
    assert seg.next_deadline_ms() == 220


# ------------------------------------------------------------------ API edges


@pytest.mark.parametrize(
    "config",
    [
        {"mode": "sometimes"},
        {"max_buffer_delay_ms": -1},
        {"first_clause_min_chars": 0},
        {"max_chars": 10, "clause_min_chars": 80},
    ],
)
def test_invalid_config(config: dict) -> None:
    with pytest.raises(SegmenterError):
        SegmenterConfig(**config)


def test_feed_after_end_and_non_text() -> None:
    seg = TextSegmenter()
    with pytest.raises(SegmenterError):
        seg.feed(b"bytes", 0)  # type: ignore[arg-type]
    seg.end()
    assert seg.ended and seg.end() == [] and seg.flush() == [] and seg.poll(1e9) == []
    with pytest.raises(SegmenterError):
        seg.feed("more", 0)


def test_cut_strengths_table() -> None:
    cuts = find_cuts("Yes, sir. Dr. No: 3.5 - ok… 你好。好 <|a:b|> x")
    text = "Yes, sir. Dr. No: 3.5 - ok… 你好。好 <|a:b|> x"
    got = [(text[: c.pos].split()[-1] if text[: c.pos].split() else "", c.strength) for c in cuts]
    assert got == [
        ("Yes,", Strength.CLAUSE),
        ("sir.", Strength.SENTENCE),
        ("Dr.", Strength.WORD),
        ("No:", Strength.CLAUSE),
        ("3.5", Strength.WORD),
        ("-", Strength.CLAUSE),
        ("ok…", Strength.CLAUSE),
        ("你", Strength.WORD),
        ("你好。", Strength.SENTENCE),
        ("你好。好", Strength.WORD),
    ]
