"""Seeded hostile client input: every category the boundary must answer with an error.

Each generated message must get exactly one ``error`` event and nothing else
(sessions stay open), except the ``closing`` ones (oversize, binary), which
get an error and, the second time in a session, the close code named.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gateway.protocol import CLOSE_POLICY, CLOSE_TOO_BIG


@dataclass(frozen=True)
class Hostile:
    category: str
    data: str | bytes
    close_code: int | None = None  # set: repeated, this closes the session


SURROGATES = ("\\ud800", "\\udfff", "\\udbff", "\\ud83d", "\\ude00x")
EVENT_TYPES = ("text.append", "text.flush", "context.end", "context.cancel", "session.update",
               "voice.create", "ping")  # fmt: skip


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice('abc xyz.,!?éß漢🙂"\\') for _ in range(n))


def invalid_json(rng: random.Random) -> str:
    good = json.dumps({"type": "text.append", "context_id": "c", "text": _text(rng, 20)})
    return rng.choice(
        [
            good[: rng.randrange(1, len(good) - 1)],  # truncated
            good.replace(":", "=", 1),
            "{" + _text(rng, rng.randrange(1, 40)),
            "\\x00\\x01garbage",
            '{"type": "ping", "event_id": "\\x"}',  # a bad escape
            '{"type": "ping",}',
            "",
            "   ",
            "{'type': 'ping'}",
        ]
    )


def deep_nesting(rng: random.Random) -> str:
    depth = rng.choice([33, 64, 200, 990, 1000, 5000, 20000])
    shape = rng.randrange(4)
    if shape == 0:
        return "[" * depth
    if shape == 1:
        return "[" * depth + "]" * depth
    if shape == 2:
        return '{"a":' * depth + "1" + "}" * depth
    inner = "[" * depth + "]" * depth
    return '{"type": "session.update", "session": {"x": ' + inner + "}}"


def lone_surrogate(rng: random.Random) -> str:
    bad = rng.choice(SURROGATES)
    where = rng.randrange(8)
    if where == 0:
        return f'{{"type": "text.append", "context_id": "s", "text": "hi {bad} there"}}'
    if where == 1:
        return f'{{"type": "ping", "event_id": "{bad}"}}'
    if where == 2:
        return f'{{"type": "text.append", "context_id": "{bad}", "text": "x"}}'
    if where == 3:
        return f'{{"type": "session.update", "session": {{"voice": "{bad}"}}}}'
    if where == 4:
        return f'{{"type": "voice.create", "audio": "AAAA", "text": "{bad}"}}'
    if where == 5:
        return f'{{"type": "ping", "{bad}": 1}}'
    if where == 6:
        return f'{{"type": "text.flush", "context_id": "c", "flush_id": "{bad}"}}'
    return f'{{"type": "{bad}"}}'


def huge_field(rng: random.Random, max_chars: int) -> str:
    n = rng.choice([200, 5_000, 100_000, max_chars])
    field = rng.choice(["event_id", "context_id", "type", "unknown", "flush_id", "voice"])
    blob = "x" * n
    if field == "event_id":
        return json.dumps({"type": "ping", "event_id": blob})
    if field == "context_id":
        return json.dumps({"type": "text.append", "context_id": blob, "event_id": blob})
    if field == "type":
        return json.dumps({"type": blob, "event_id": blob})
    if field == "unknown":
        return json.dumps({"type": "ping", blob: 1})
    if field == "flush_id":
        return json.dumps({"type": "text.flush", "context_id": "c", "flush_id": blob})
    return json.dumps({"type": "session.update", "session": {"voice": blob}, "event_id": blob})


def wrong_shape(rng: random.Random) -> str:
    choices: list[object] = [
        [],
        [1, 2],
        "ping",
        42,
        None,
        True,
        {},
        {"type": None},
        {"type": 7},
        {"type": ["ping"]},
        {"type": "nope"},
        {"type": "ping", "extra": 1},
        {"type": "ping", "event_id": 5},
        {"type": "text.append", "context_id": "c"},
        {"type": "text.append", "context_id": "c", "text": 5},
        {"type": "text.append", "context_id": "", "text": "x"},
        {"type": "text.append", "text": "x"},
        {"type": "session.update", "session": "x"},
        {"type": "session.update", "session": {"output": {"format": "wav9"}}},
        {"type": "session.update", "session": {"output": {"sample_rate": -1}}},
        {"type": "session.update", "session": {"sampling": {"temperature": "hot"}}},
        {"type": "session.update", "session": {"id": "other"}},
        {"type": "session.update", "session": {"nope": 1}},
        {"type": "session.update", "session": {"voice": "not-a-voice"}},
        {"type": "voice.create", "audio": "!!! not base64 !!!"},
        {"type": "voice.create", "audio": base64.b64encode(b"RIFFjunk").decode()},
        {"type": "voice.create", "audio": ""},
        {"type": "text.flush", "context_id": "never-opened"},
        {"type": "context.end", "context_id": "never-opened"},
        {"type": "context.cancel", "context_id": "never-opened"},
        {"type": rng.choice(EVENT_TYPES), "context_id": 1.5},
    ]
    value = rng.choice(choices)
    return json.dumps(value) if rng.random() < 0.8 else json.dumps(value, indent=rng.randrange(4))


def generate(seed: int, count: int, max_message_bytes: int) -> Iterator[Hostile]:
    """``count`` hostile messages (the closing kinds about one in fifty).

    Fields grow up to a third of ``max_message_bytes`` (a field may appear
    twice in one message); oversize messages are just over it.
    """
    max_chars = max_message_bytes // 3
    rng = random.Random(seed)
    kinds: list[tuple[str, Callable[[random.Random], str]]] = [
        ("invalid_json", invalid_json),
        ("deep_nesting", deep_nesting),
        ("lone_surrogate", lone_surrogate),
        ("huge_field", lambda r: huge_field(r, max_chars)),
        ("wrong_shape", wrong_shape),
    ]
    for i in range(count):
        roll = rng.random()
        if roll < 0.01:
            yield Hostile("binary", bytes(rng.randrange(256) for _ in range(16)), CLOSE_POLICY)
        elif roll < 0.02:
            size = max_message_bytes + 1 + rng.randrange(100)
            yield Hostile("oversize", "x" * size, CLOSE_TOO_BIG)
        else:
            name, make = kinds[i % len(kinds)]
            yield Hostile(name, make(rng))
