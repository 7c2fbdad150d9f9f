"""What a worker process does in the voice tests: name voices in a shared
directory, reporting what it made (module level, so ``spawn`` can import it)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from voice_clips_support import tone, wav_s16

from gateway.voices import VoiceConflictError, VoiceLibrary, VoiceStore
from realtime_engine.engines.fake import FakeEngine


class CloningFakeEngine(FakeEngine):
    """The fake engine plus cloning: codes that depend on the clip, encodes counted."""

    supports_voice_cloning = True

    def __init__(self) -> None:
        super().__init__()
        self.encoded = 0

    async def encode_reference(self, pcm: np.ndarray, sample_rate: int) -> np.ndarray:
        self.encoded += 1
        level = int(abs(float(pcm.mean())) * 1e6) % 1024
        return np.full((-(-pcm.size // 960), 8), level, dtype=np.int64)


def clip(hz: float) -> bytes:
    return wav_s16(tone(1.0, hz=hz))


async def create_voices(
    root: str, key_id: str, hzs: list[float], max_voices: int, start: Any
) -> tuple[list[str], int]:
    """Create one voice per tone, all at once, once ``start`` (a barrier) lets every
    process or thread go; the ids made and how many were refused."""
    library = VoiceLibrary(CloningFakeEngine(), max_voices=max_voices, store=VoiceStore(root))
    clips = [clip(hz) for hz in hzs]  # made before the start, so that the creates overlap
    await asyncio.to_thread(start.wait)
    results = await asyncio.gather(
        *(library.create(c, None, f"v{int(hz)}", key_id) for c, hz in zip(clips, hzs, strict=True)),
        return_exceptions=True,
    )
    made = [r.voice_id for r in results if not isinstance(r, BaseException)]
    unexpected = [r for r in results if isinstance(r, BaseException)]
    unexpected = [e for e in unexpected if not isinstance(e, VoiceConflictError)]
    if unexpected:
        raise unexpected[0]
    return made, len(results) - len(made)


def create_voices_in_process(
    root: str, key_id: str, hzs: list[float], max_voices: int, start: Any, results: Any
) -> None:
    """The body of one spawned process: ``create_voices``, its answer put on ``results``."""
    made, refused = asyncio.run(create_voices(root, key_id, hzs, max_voices, start))
    results.put((made, refused))
