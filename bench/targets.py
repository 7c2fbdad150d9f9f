"""Stream functions: one benchmark stream against the gateway (through the SDK)
or against an OpenAI-style streaming ``/v1/audio/speech`` endpoint (the peer)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.records import ChunkArrival, StreamRecord
from bench.textfeed import schedule
from gateway.client import AudioChunk, ClientError, Context, connect
from gateway.protocol import ContextCancelled, ContextDone, SegmentStarted
from realtime_engine.format import SAMPLE_RATE, rows_for_seconds

PCM16_BYTES_PER_S = SAMPLE_RATE * 2


def steps_for_audio(seconds: float) -> int:
    """Talker steps (``max_new_tokens``) for ``seconds`` of audio, e.g. 10 s -> 257."""
    return rows_for_seconds(seconds)


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:300]


@dataclass
class GatewayTarget:
    """One WebSocket session per stream: connect, configure, stream text, read audio."""

    url: str
    api_key: str | None = None
    tokens_per_s: float | None = None  # None: the whole text in one append
    output_format: str = "opus"
    sample_rate: int = SAMPLE_RATE
    voice: str | None = None
    session: dict[str, Any] = field(default_factory=dict)  # extra session.update fields
    decode: bool = True
    timeout_s: float = 120.0
    # A fixed output length per stream (random weights never stop on their
    # own): every segment is capped at this many seconds (max_audio_seconds)
    # and the stream is cancelled once this much audio has arrived.
    audio_seconds: float | None = None
    # With ``audio_seconds``: cancel the stream once that much audio arrived (the
    # fixed length), or let it end on its own (False: each segment still capped,
    # and nothing generated past a cut goes unheard).
    cut_at_cap: bool = True

    def session_patch(self) -> dict[str, Any]:
        patch: dict[str, Any] = {
            "output": {"format": self.output_format, "sample_rate": self.sample_rate}
        }
        if self.voice:
            patch["voice"] = self.voice
        if self.audio_seconds is not None:
            patch["max_audio_seconds"] = self.audio_seconds
        patch.update(self.session)
        return patch

    async def __call__(self, stream_id: int, text: str) -> StreamRecord:
        record = StreamRecord(stream_id, "gateway", len(text), t_start=time.perf_counter())
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._run(record, text)
        except (ClientError, TimeoutError, OSError) as e:
            record.error = _describe(e)
        return record

    async def _run(self, record: StreamRecord, text: str) -> None:
        async with connect(self.url, api_key=self.api_key) as conn:
            record.t_connected = time.perf_counter()
            await conn.session.update(self.session_patch())
            ctx = conn.context(f"bench-{record.stream_id}")
            pieces = schedule(text, self.tokens_per_s)

            async def feed() -> None:
                for piece in pieces:
                    if record.t_first_text is not None:
                        delay = record.t_first_text + piece.offset_s - time.perf_counter()
                        if delay > 0:
                            await asyncio.sleep(delay)
                    else:
                        record.t_first_text = time.perf_counter()
                    await ctx.append(piece.text)
                await ctx.end()
                record.t_last_text = time.perf_counter()

            feeder = asyncio.create_task(feed())
            try:
                await self._read(record, ctx)
            finally:
                if not feeder.done():
                    feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)

    async def _read(self, record: StreamRecord, ctx: Context) -> None:
        failed = None
        cap_ms = None if self.audio_seconds is None else self.audio_seconds * 1000.0
        received_ms = 0.0
        capped = False
        async for item in ctx.events():
            if isinstance(item, SegmentStarted):
                record.segments.append((item.start_ms, item.text))
            elif isinstance(item, ContextDone):
                if record.t_done is None:
                    record.t_done = time.perf_counter()
                record.server_metrics = item.metrics.model_dump()
                if item.status != "completed":
                    failed = f"context {item.status}: " + "; ".join(e.message for e in ctx.errors)
            elif isinstance(item, ContextCancelled):
                if not capped:
                    failed = "context cancelled by the server"
            elif isinstance(item, AudioChunk):
                if capped:
                    continue  # in flight when the cap was reached: not counted
                if record.t_first_audio_byte is None:
                    record.t_first_audio_byte = item.received_at
                if self.decode:
                    pcm = ctx.decode(item)
                    if record.t_first_sample is None and len(pcm):
                        record.t_first_sample = item.decoded_at
                record.chunks.append(
                    ChunkArrival(item.received_at, item.pts_ms, item.duration_ms, len(item.payload))
                )
                received_ms += item.duration_ms
                # within half a 20 ms frame of the cap counts as reaching it
                if self.cut_at_cap and cap_ms is not None and received_ms >= cap_ms - 10.0:
                    capped = True
                    record.t_done = item.received_at
                    record.tags["capped"] = True
                    await ctx.cancel(wait=False)
        if failed:
            record.error = failed


@dataclass
class SpeechHttpTarget:
    """Streaming PCM from ``POST /v1/audio/speech`` (vllm-omni's and this gateway's)."""

    base_url: str
    api_key: str | None = None
    max_new_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 180.0
    label: str = "peer"
    _client: httpx.AsyncClient | None = None

    def body(self, text: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "input": text,
            "response_format": "pcm",
            "stream": True,
            "stream_format": "audio",
        }
        if self.max_new_tokens is not None:
            body["max_new_tokens"] = self.max_new_tokens
        body.update(self.extra)
        return body

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s, connect=30.0),
                headers=headers,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=1024),
            )
        return self._client

    async def __call__(self, stream_id: int, text: str) -> StreamRecord:
        record = StreamRecord(stream_id, self.label, len(text), t_start=time.perf_counter())
        url = self.base_url.rstrip("/") + "/v1/audio/speech"
        received = 0
        odd = b""
        try:
            async with asyncio.timeout(self.timeout_s):
                record.t_first_text = record.t_last_text = time.perf_counter()
                async with self._http().stream("POST", url, json=self.body(text)) as resp:
                    record.t_connected = time.perf_counter()
                    if resp.status_code != 200:
                        detail = (await resp.aread())[:300].decode("utf-8", "replace")
                        record.error = f"HTTP {resp.status_code}: {detail}"
                        return record
                    async for data in resp.aiter_raw():
                        now = time.perf_counter()
                        data = odd + data
                        usable = len(data) - len(data) % 2  # whole 16-bit samples only
                        odd = data[usable:]
                        if not usable:
                            continue
                        if record.t_first_audio_byte is None:
                            record.t_first_audio_byte = record.t_first_sample = now
                        record.chunks.append(
                            ChunkArrival(
                                now,
                                received * 1000.0 / PCM16_BYTES_PER_S,
                                usable * 1000.0 / PCM16_BYTES_PER_S,
                                usable,
                            )
                        )
                        received += usable
                record.t_done = time.perf_counter()
        except (httpx.HTTPError, TimeoutError, OSError) as e:
            record.error = _describe(e)
        return record
