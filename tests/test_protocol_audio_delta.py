"""``audio.delta`` written from its fixed layout is byte for byte the typed model's JSON."""

from __future__ import annotations

import base64
import json

from hypothesis import given
from hypothesis import strategies as st

from gateway.protocol import AudioDelta
from gateway.protocol.audio_delta import AudioDeltaWriter


@given(
    context_id=st.text(max_size=40),
    seq=st.integers(0, 2**32 - 1),
    pts_ms=st.integers(0, 2**32 - 1),
    payload=st.binary(max_size=200),
)
def test_fast_audio_delta_equals_the_model_dump(
    context_id: str, seq: int, pts_ms: int, payload: bytes
) -> None:
    fast = AudioDeltaWriter(context_id).event(seq, pts_ms, payload)
    event_id = json.loads(fast)["event_id"]
    typed = AudioDelta(
        event_id=event_id,
        context_id=context_id,
        seq=seq,
        pts_ms=pts_ms,
        audio=base64.b64encode(payload).decode(),
    )
    assert fast == typed.model_dump_json()


def test_every_delta_gets_a_fresh_event_id() -> None:
    writer = AudioDeltaWriter("c")
    ids = {json.loads(writer.event(i, i * 20, b"x"))["event_id"] for i in range(50)}
    assert len(ids) == 50
