"""What a worker process does in the voice tests: name voices in a shared
directory, reporting what it made (module level, so ``spawn`` can import it)."""

from __future__ import annotations

import asyncio
from typing import Any

from voice_clips_support import CloningFakeEngine, clip

from gateway.voices import VoiceConflictError, VoiceLibrary, VoiceStore


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
