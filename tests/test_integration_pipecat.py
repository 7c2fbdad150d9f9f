"""Pipecat: ``GatewayTTSService`` inside a real Pipecat pipeline.

A real gateway with the CPU voice on loopback; Pipecat's own ``Pipeline``,
``PipelineWorker`` and ``WorkerRunner`` run the service between two recording
processors. LLM text goes in as tokens at 30 per second; the audio frames
that come out are checked by the bundled Whisper.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np
import pytest
from agent_support import (
    LONG_TURN,
    MAX_WER,
    TOKENS_PER_SECOND,
    TURN_ONE,
    TURN_TWO,
    contexts_total,
    cpu_voice_app,
    llm_tokens,
    pcm16_to_float,
)
from asr import transcribe, wer
from gateway_support import fake_app
from live_server import live_server
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.utils.errors import ErrorCategory
from pipecat.workers.runner import WorkerRunner

from gateway.integrations.pipecat import GatewayTTSService
from gateway.protocol import ContextCancelled

pytestmark = pytest.mark.slow
SAMPLE_RATE = 24_000
WAIT_S = 90.0


@dataclass
class Seen:
    frame: Frame
    at: float  # time.perf_counter() when it reached the recorder


class Recorder(FrameProcessor):
    """Passes every frame on and keeps those going ``direction``."""

    def __init__(self, direction: FrameDirection) -> None:
        super().__init__()
        self.direction = direction
        self.seen: list[Seen] = []
        self._arrived = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == self.direction:
            self.seen.append(Seen(frame, time.perf_counter()))
            self._arrived.set()
        await self.push_frame(frame, direction)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = WAIT_S) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self._arrived.clear()
                await self._arrived.wait()

    def audio(self, context_id: str) -> list[Seen]:
        return [
            s
            for s in self.seen
            if isinstance(s.frame, TTSAudioRawFrame) and s.frame.context_id == context_id
        ]

    def context_ids(self) -> list[str]:
        """Contexts in the order their first audio arrived."""
        ids: list[str] = []
        for s in self.seen:
            if isinstance(s.frame, TTSAudioRawFrame) and s.frame.context_id not in ids:
                ids.append(str(s.frame.context_id))
        return ids

    def stopped(self, context_id: str) -> bool:
        return any(
            isinstance(s.frame, TTSStoppedFrame) and s.frame.context_id == context_id
            for s in self.seen
        )


@dataclass
class Bot:
    worker: PipelineWorker
    tts: GatewayTTSService
    up: Recorder  # frames that reach the start of the pipeline (errors)
    down: Recorder  # frames that leave the TTS service (audio)

    async def say(self, text: str) -> None:
        """An LLM reply, one token frame every 1/30 s."""
        await self.worker.queue_frame(LLMFullResponseStartFrame())
        for token in llm_tokens(text):
            await self.worker.queue_frame(LLMTextFrame(token))
            await asyncio.sleep(1 / TOKENS_PER_SECOND)  # the producer's pace, not a wait
        await self.worker.queue_frame(LLMFullResponseEndFrame())

    async def turn(self, text: str) -> tuple[str, np.ndarray]:
        """Say ``text``; wait for its context's stop; its context id and PCM."""
        already = len(self.down.context_ids())
        await self.say(text)
        await self.down.wait_for(lambda: len(self.down.context_ids()) > already)
        context_id = self.down.context_ids()[already]
        await self.down.wait_for(lambda: self.down.stopped(context_id))
        frames = [s.frame for s in self.down.audio(context_id)]
        assert {(f.sample_rate, f.num_channels) for f in frames} == {(SAMPLE_RATE, 1)}
        return context_id, pcm16_to_float(b"".join(f.audio for f in frames))


@contextlib.asynccontextmanager
async def running_bot(tts: GatewayTTSService, rate: int = SAMPLE_RATE) -> AsyncIterator[Bot]:
    up, down = Recorder(FrameDirection.UPSTREAM), Recorder(FrameDirection.DOWNSTREAM)
    worker = PipelineWorker(
        Pipeline([up, tts, down]),
        cancel_on_idle_timeout=False,
        params=PipelineParams(audio_out_sample_rate=rate),
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker: PipelineWorker, frame: Frame) -> None:
        started.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    try:
        await asyncio.wait_for(started.wait(), WAIT_S)
        yield Bot(worker, tts, up, down)
        await worker.queue_frame(EndFrame())
        await asyncio.wait_for(asyncio.shield(running), WAIT_S)
    finally:
        if not running.done():
            await worker.cancel()
            await asyncio.wait_for(running, WAIT_S)


def assert_intelligible(text: str, pcm: np.ndarray) -> None:
    heard = transcribe(pcm, SAMPLE_RATE)
    assert wer(text, heard) <= MAX_WER, heard


async def test_token_stream_barge_in_and_back_to_back_turns_on_one_connection() -> None:
    async with live_server(cpu_voice_app(), lifespan="on") as url:
        tts = GatewayTTSService(url=url)
        acks: list[tuple[ContextCancelled, float]] = []

        @tts.event_handler("on_context_cancelled")
        async def _acked(service: GatewayTTSService, ack: ContextCancelled) -> None:
            acks.append((ack, time.perf_counter()))

        async with running_bot(tts) as bot:
            _, pcm = await bot.turn(TURN_ONE)
            assert_intelligible(TURN_ONE, pcm)

            # Barge in while the long reply is speaking.
            already = len(bot.down.context_ids())
            await bot.say(LONG_TURN)
            await bot.down.wait_for(lambda: len(bot.down.context_ids()) > already)
            interrupted = bot.down.context_ids()[already]
            await bot.worker.queue_frame(InterruptionFrame())
            await bot.down.wait_for(lambda: bool(acks))
            ack, acked_at = acks[0]
            assert ack.context_id == interrupted
            assert ack.text_unspoken.strip(), "the cut came after the whole reply was spoken"
            assert ack.audio_ms_sent > 0

            # The next turn runs on the same connection; nothing of the cut one follows the ack.
            _, pcm = await bot.turn(TURN_TWO)
            assert_intelligible(TURN_TWO, pcm)
            late = [s for s in bot.down.audio(interrupted) if s.at > acked_at]
            assert late == []
            assert tts.gateway_link.connects == 1
        assert await contexts_total(url, "cancelled") == 1
        assert await contexts_total(url, "completed") == 2


async def test_reconnects_after_a_server_restart_on_the_next_utterance() -> None:
    async with contextlib.AsyncExitStack() as servers:
        url = await servers.enter_async_context(live_server(cpu_voice_app(), lifespan="on"))
        port = int(url.rsplit(":", 1)[1])
        tts = GatewayTTSService(url=url)
        async with running_bot(tts) as bot:
            _, pcm = await bot.turn(TURN_TWO)
            assert pcm.size > SAMPLE_RATE
            # The server goes away mid-session and comes back on the same port.
            await servers.aclose()
            await servers.enter_async_context(
                live_server(cpu_voice_app(), lifespan="on", port=port)
            )
            _, pcm = await bot.turn(TURN_ONE)
            assert_intelligible(TURN_ONE, pcm)
            assert tts.gateway_link.connects == 2


async def test_wrong_api_key_is_pipecats_auth_error_not_a_hang() -> None:
    async with live_server(cpu_voice_app(api_keys=("sk-right",)), lifespan="on") as url:
        tts = GatewayTTSService(url=url, api_key="sk-wrong")

        def auth_errors() -> list[ErrorFrame]:
            return [
                s.frame
                for s in bot.up.seen
                if isinstance(s.frame, ErrorFrame)
                and s.frame.category is ErrorCategory.AUTHENTICATION
            ]

        async with running_bot(tts) as bot:
            await bot.up.wait_for(lambda: bool(auth_errors()), timeout=30)
            assert "auth_invalid" in auth_errors()[0].error


async def test_a_pipeline_rate_the_gateway_does_not_send_gets_24khz_frames() -> None:
    async with live_server(fake_app(), lifespan="on") as url:
        tts = GatewayTTSService(url=url)
        async with running_bot(tts, rate=44_100) as bot:
            _, pcm = await bot.turn(TURN_TWO)  # checks every frame says 24 kHz mono
            assert pcm.size > 0
            assert tts.gateway_link.options.sample_rate == SAMPLE_RATE
