"""LiveKit Agents: ``GatewayTTS`` driven through the framework's own stream classes.

A real gateway with the CPU voice on loopback; ``tts.stream()`` and
``tts.synthesize()`` are LiveKit's ``SynthesizeStream`` / ``ChunkedStream``
machinery (retries, ``AudioEmitter`` framing) around our ``_run``; no room is
needed. The audio is checked by the bundled Whisper.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from agent_support import (
    LONG_TURN,
    MAX_WER,
    TURN_ONE,
    TURN_TWO,
    contexts_total,
    cpu_voice_app,
    llm_tokens,
    mint_token,
)
from asr import transcribe, wer
from live_server import live_server
from livekit import rtc
from livekit.agents import APIStatusError, tts

from gateway.integrations.livekit import GatewayTTS

pytestmark = pytest.mark.slow
SAMPLE_RATE = 24_000


def pcm_of(frames: list[rtc.AudioFrame]) -> np.ndarray:
    assert frames, "no audio"
    assert {(f.sample_rate, f.num_channels) for f in frames} == {(SAMPLE_RATE, 1)}
    return np.concatenate([np.frombuffer(f.data, dtype=np.int16) for f in frames]) / 32768.0


async def test_stream_pieces_flush_end_input_is_intelligible_and_synthesize_works() -> None:
    async with live_server(cpu_voice_app(), lifespan="on") as url:
        engine = GatewayTTS(url=url)
        assert isinstance(engine, tts.TTS) and engine.capabilities.streaming
        assert engine.capabilities.aligned_transcript is False  # segment timing only
        frames: list[rtc.AudioFrame] = []
        async with engine.stream() as stream:
            for piece in llm_tokens(TURN_ONE):
                stream.push_text(piece)
            stream.flush()
            stream.end_input()
            async for audio in stream:
                assert isinstance(audio, tts.SynthesizedAudio)
                frames.append(audio.frame)
        heard = transcribe(pcm_of(frames), SAMPLE_RATE)
        assert wer(TURN_ONE, heard) <= MAX_WER, heard

        frame = await engine.synthesize(TURN_TWO).collect()
        heard = transcribe(pcm_of([frame]), SAMPLE_RATE)
        assert wer(TURN_TWO, heard) <= MAX_WER, heard
        assert engine.link.connects == 1  # both on one WebSocket
        await engine.aclose()


async def test_closing_a_stream_mid_utterance_cancels_on_the_server() -> None:
    async with live_server(cpu_voice_app(), lifespan="on") as url:
        engine = GatewayTTS(url=url)
        before = await contexts_total(url, "cancelled")
        stream = engine.stream()
        for piece in llm_tokens(LONG_TURN):
            stream.push_text(piece)
        stream.flush()
        first = await asyncio.wait_for(anext(stream), 60)  # audio is playing
        assert first.frame.duration > 0
        await stream.aclose()  # returns once the server acknowledged the cancel
        assert await contexts_total(url, "cancelled") == before + 1
        assert await contexts_total(url, "completed") == 0
        await engine.aclose()


async def test_reconnects_after_a_server_restart_on_the_next_utterance() -> None:
    async with live_server(cpu_voice_app(), lifespan="on") as url:
        engine = GatewayTTS(url=url)
        frame = await engine.synthesize(TURN_TWO).collect()
        assert frame.duration > 1.0
        port = int(url.rsplit(":", 1)[1])
    async with live_server(cpu_voice_app(), lifespan="on", port=port) as url:
        frame = await engine.synthesize(TURN_ONE).collect()
        heard = transcribe(pcm_of([frame]), SAMPLE_RATE)
        assert wer(TURN_ONE, heard) <= MAX_WER, heard
        assert engine.link.connects == 2
        await engine.aclose()


async def test_wrong_api_key_is_livekits_auth_error_not_a_hang() -> None:
    async with live_server(cpu_voice_app(api_keys=("sk-right",)), lifespan="on") as url:
        engine = GatewayTTS(url=url, api_key="sk-wrong")
        with pytest.raises(APIStatusError) as caught:
            await asyncio.wait_for(engine.synthesize(TURN_TWO).collect(), 30)
        assert caught.value.status_code == 401 and not caught.value.retryable
        await engine.aclose()


async def test_ephemeral_tokens_are_minted_for_every_connection() -> None:
    async with live_server(cpu_voice_app(api_keys=("sk-right",)), lifespan="on") as url:
        minted: list[str] = []

        async def token() -> str:
            minted.append(await mint_token(url, "sk-right"))
            return minted[-1]

        engine = GatewayTTS(url=url, token=token, sample_rate=16_000)
        frame = await engine.synthesize("Hello there.").collect()
        assert frame.sample_rate == 16_000 and frame.duration > 0.3
        assert len(minted) == 1 and minted[0].startswith("ek_")
        await engine.aclose()
