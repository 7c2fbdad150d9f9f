"""Random event sequences against the session: invariants that must always hold."""

from __future__ import annotations

import json
from typing import Any

from gateway_support import sentence_segmenter
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocol import ContextCreated, ErrorEvent, Limits, SessionConfig
from gateway.realtime.session import (
    Action,
    CancelContext,
    Close,
    EndContext,
    Flush,
    OpenContext,
    Send,
    Session,
    Speak,
)

IDS = ["a", "b", "c", "d"]
ops = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(IDS), st.sampled_from(["Hi. ", "word ", "", "x"])),
    st.tuples(st.just("flush"), st.sampled_from(IDS), st.none()),
    st.tuples(st.just("end"), st.sampled_from(IDS), st.none()),
    st.tuples(st.just("cancel"), st.sampled_from(IDS), st.none()),
    st.tuples(st.just("finish"), st.sampled_from(IDS), st.none()),  # the pipeline completes one
    st.tuples(st.just("poll"), st.none(), st.none()),
    st.tuples(st.just("garbage"), st.none(), st.sampled_from(["{", "[]", '{"type": 1}'])),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(ops, max_size=40), st.booleans())
def test_invariants_hold_for_any_sequence(
    sequence: list[tuple[str, str | None, str | None]], manual: bool
) -> None:
    session = Session(
        SessionConfig(id="s", model="m"),
        Limits(max_contexts=3, max_text_chars_per_context=12),
        sentence_segmenter,
        voice_exists=lambda v: v == "default",
    )
    if manual:
        session.receive_text(
            json.dumps(
                {"type": "session.update", "session": {"text_buffering": {"mode": "manual"}}}
            ),
            0,
        )
    open_keys: dict[str, int] = {}  # context id -> key, as the pipeline sees them
    ending: set[int] = set()
    closed_keys: set[int] = set()
    next_index: dict[int, int] = {}
    streams: dict[int, int] = {}
    now = 0.0
    for op, cid, arg in sequence:
        now += 0.1
        event: dict[str, Any] | None = None
        actions: list[Action]
        if op == "append":
            event = {"type": "text.append", "context_id": cid, "text": arg}
        elif op in ("flush", "end", "cancel"):
            kind = {"flush": "text.flush", "end": "context.end", "cancel": "context.cancel"}[op]
            event = {"type": kind, "context_id": cid}
        if event is not None:
            actions = session.receive_text(json.dumps(event), now)
        elif op == "garbage":
            assert arg is not None
            actions = session.receive_text(arg, now)
            assert len(actions) == 1 and isinstance(actions[0], Send)
            assert isinstance(actions[0].event, ErrorEvent)
        elif op == "poll":
            actions = session.poll(now)
        else:
            assert cid is not None
            key = open_keys.get(cid)
            if key is not None and key in ending:
                session.context_closed(key, "completed")
                del open_keys[cid]
                closed_keys.add(key)
            actions = []

        for i, action in enumerate(actions):
            assert not isinstance(action, Close)
            if isinstance(action, OpenContext):
                assert action.context_id not in open_keys
                assert action.stream not in {streams[k] for k in open_keys.values()}
                nxt = actions[i + 1]
                assert isinstance(nxt, Send) and isinstance(nxt.event, ContextCreated)
                assert nxt.event.stream == action.stream
                open_keys[action.context_id] = action.key
                streams[action.key] = action.stream
            elif isinstance(action, Speak):
                assert action.key in open_keys.values() and action.key not in closed_keys
                assert action.key not in ending  # nothing is spoken after the end marker
                assert action.index == next_index.get(action.key, 0)
                next_index[action.key] = action.index + 1
                assert action.text.strip()
            elif isinstance(action, Flush | EndContext):
                assert action.key in open_keys.values() and action.key not in ending
                if isinstance(action, EndContext):
                    ending.add(action.key)
            elif isinstance(action, CancelContext):
                assert action.key in open_keys.values()
                cancelled = [c for c, k in open_keys.items() if k == action.key]
                del open_keys[cancelled[0]]
                closed_keys.add(action.key)
        assert len(open_keys) <= 3
        assert sorted(session.open_contexts) == sorted(open_keys)
