"""Blocking one-call synthesis for scripts: ``wav = speak("Hello", url=...)``."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.client.audio import to_wav
from gateway.client.errors import ClientError
from gateway.client.handshake import connect
from gateway.protocol import NATIVE_SAMPLE_RATE


async def speak_async(
    text: str,
    *,
    url: str = "ws://127.0.0.1:8000",
    voice: str | None = None,
    api_key: str | None = None,
    sample_rate: int = NATIVE_SAMPLE_RATE,
    session: dict[str, Any] | None = None,
    timeout: float = 300.0,
) -> bytes:
    """Synthesize ``text`` over one connection and return it as a 16-bit WAV."""
    patch: dict[str, Any] = {"output": {"format": "pcm16", "sample_rate": sample_rate}}
    if voice is not None:
        patch["voice"] = voice
    patch.update(session or {})
    async with connect(url, api_key=api_key) as conn:
        await conn.session.update(patch)
        ctx = conn.context()
        await ctx.append(text)
        await ctx.end()
        utterance = await asyncio.wait_for(ctx.collect(), timeout)
    return to_wav(utterance.pcm, utterance.sample_rate)


def speak(
    text: str,
    *,
    url: str = "ws://127.0.0.1:8000",
    voice: str | None = None,
    api_key: str | None = None,
    sample_rate: int = NATIVE_SAMPLE_RATE,
    session: dict[str, Any] | None = None,
    timeout: float = 300.0,
) -> bytes:
    """Blocking :func:`speak_async`; call it from code without a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(
            speak_async(
                text,
                url=url,
                voice=voice,
                api_key=api_key,
                sample_rate=sample_rate,
                session=session,
                timeout=timeout,
            )
        )
    raise ClientError("speak() blocks; inside an event loop use `await speak_async(...)`")
