"""``audio.delta`` events (audio over JSON) serialised without a model per frame.

One event goes out per audio frame of every JSON-transport stream, so it is
written from a fixed layout instead of validating and dumping an
``AudioDelta`` each time. ``AudioDelta`` stays the definition of the event:
the layout follows its fields in order, the context id is encoded by the
same serialiser, and the tests check the output against ``model_dump_json``.
"""

from __future__ import annotations

import base64

from pydantic_core import to_json

from gateway.protocol import new_event_id


class AudioDeltaWriter:
    """The ``audio.delta`` events of one context."""

    def __init__(self, context_id: str) -> None:
        self._context_json = to_json(context_id).decode()

    def event(self, seq: int, pts_ms: int, payload: bytes) -> str:
        return (
            f'{{"event_id":"{new_event_id()}","reply_to":null,"type":"audio.delta",'
            f'"context_id":{self._context_json},"seq":{int(seq)},"pts_ms":{int(pts_ms)},'
            f'"audio":"{base64.b64encode(payload).decode()}"}}'
        )
