"""Higgs Audio v3 speech engine: text → talker code rows → streaming codec → PCM.

The engine works with any :class:`~realtime_engine.talker.types.TalkerRunner`
(the in-process reference runner or a vLLM-backed one). Codec windows of all
running segments are decoded together on one codec thread, so the event loop
never runs model math.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from realtime_engine.codec.decoder import CodecDecoder
from realtime_engine.codec.errors import CodecInputError, InvalidChunkingError, StreamStateError
from realtime_engine.codec.presets import DEFAULT_PRESET, get_preset
from realtime_engine.codec.streaming import (
    DecodeFn,
    DecodeJob,
    StreamingDecoder,
    decode_jobs_batched,
)
from realtime_engine.engines.base import (
    EngineError,
    SegmentRequest,
    SegmentTimings,
    UnsupportedVoiceError,
    VoiceInfo,
)
from realtime_engine.format import DELAY_ROWS, SAMPLE_RATE, ChunkingParams, rows_for_seconds
from realtime_engine.model.prompts import PromptError, build_clone_prompt, build_zero_shot_prompt
from realtime_engine.model.tokenizer import HiggsTokenizer
from realtime_engine.talker.backends import (
    ReferenceOptions,
    TalkerOptions,
    parse_talker_options,
    resolve_backend,
)
from realtime_engine.talker.types import (
    TalkerError,
    TalkerPrompt,
    TalkerRequest,
    TalkerRunner,
    TalkerTimings,
)

DEFAULT_VOICE = "default"
# speaking-rate thresholds → the model's prosody tags (a sentence-level tag)
_SPEED_TAGS = (
    (0.75, "<|prosody:speed_very_slow|>"),
    (0.9, "<|prosody:speed_slow|>"),
    (1.1, ""),
    (1.35, "<|prosody:speed_fast|>"),
    (float("inf"), "<|prosody:speed_very_fast|>"),
)


class _StageClock:
    """Stamps a segment's :class:`SegmentTimings` from the rows and chunks it sees."""

    def __init__(self, timings: SegmentTimings | None) -> None:
        self.timings = timings
        self.talker = None if timings is None else TalkerTimings()
        self._rows = 0

    def submitted(self) -> None:
        if self.timings is not None:
            self.timings.mark("submitted")

    def row(self) -> None:
        if self.timings is None or self._rows > DELAY_ROWS:
            return
        if self._rows == 0:
            if self.talker is not None and self.talker.prefilled is not None:
                self.timings.mark("prefilled", self.talker.prefilled)
            self.timings.mark("first_row")
        if self._rows == DELAY_ROWS:  # the last codebook of frame 0 arrives here
            self.timings.mark("first_frame_row")
        self._rows += 1

    def chunk(self, pcm: np.ndarray) -> np.ndarray:
        if self.timings is not None and pcm.size:
            self.timings.mark("first_chunk")
        return pcm


@dataclass(frozen=True)
class CloneVoice:
    """A voice given by reference codec codes ``[T, 8]`` (and their transcript)."""

    ref_codes: np.ndarray
    ref_text: str | None = None
    description: str = ""


def speed_tag(speed: float) -> str:
    """The prosody tag for a speaking rate (1.0: none)."""
    for upper, tag in _SPEED_TAGS:
        if speed < upper:
            return tag
    return ""


def codec_decode_fn(codec: nn.Module) -> DecodeFn:
    """Wrap a codec module (codes ``[B, 8, W]`` → PCM ``[B, 1, 960·W]``) as a numpy function."""

    def decode(codes: np.ndarray) -> np.ndarray:
        param = next(codec.parameters())
        with torch.inference_mode():
            batch = torch.from_numpy(np.ascontiguousarray(codes, dtype=np.int64))
            pcm = codec(batch.to(param.device))
        return pcm.float().reshape(codes.shape[0], -1).cpu().numpy()

    return decode


def _require_codec(codec: CodecDecoder | None, model: str | Path) -> CodecDecoder:
    if codec is None:
        raise EngineError(f"{model!s} has no bundled codec")
    return codec


class _CodecBatcher:
    """Decode jobs from many segments on one thread, batching whatever is waiting."""

    def __init__(self, decode_fn: DecodeFn, max_batch: int) -> None:
        self._decode_fn = decode_fn
        self._max_batch = max_batch
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="codec")
        self._pending: list[tuple[DecodeJob, asyncio.Future[np.ndarray]]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def decode(self, job: DecodeJob) -> np.ndarray:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[np.ndarray] = loop.create_future()
        self._pending.append((job, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch = self._pending[: self._max_batch]
            del self._pending[: len(batch)]
            jobs = [job for job, _ in batch]
            try:
                pcms = await loop.run_in_executor(
                    self._executor, decode_jobs_batched, self._decode_fn, jobs
                )
            except Exception as e:
                for _, future in batch:
                    if not future.done():
                        error = EngineError(f"codec decode failed: {e}")
                        error.__cause__ = e
                        future.set_exception(error)
                continue
            for (_, future), pcm in zip(batch, pcms, strict=True):
                if not future.done():
                    future.set_result(pcm)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class HiggsEngine:
    """:class:`~realtime_engine.engines.base.SpeechEngine` on a Higgs Audio v3 talker."""

    name = "higgs"

    def __init__(
        self,
        runner: TalkerRunner,
        tokenizer: HiggsTokenizer,
        decode_fn: DecodeFn,
        *,
        model_id: str = "higgs-audio-v3",
        sample_rate: int = SAMPLE_RATE,
        chunking: ChunkingParams | None = None,
        codec_batch: int = 16,
    ) -> None:
        self.model_id = model_id
        self.sample_rate = sample_rate
        self._runner = runner
        self._tokenizer = tokenizer
        self._decode_fn = decode_fn
        self._chunking = chunking or get_preset(DEFAULT_PRESET)
        self._codec = _CodecBatcher(decode_fn, codec_batch)
        self._clone_voices: dict[str, CloneVoice] = {}
        self._running: set[str] = set()
        self._aborted: set[str] = set()
        self._started = False

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path = "tiny",
        device: str | torch.device | None = None,
        *,
        dtype: torch.dtype | None = None,
        chunking: ChunkingParams | None = None,
        talker: TalkerOptions | None = None,
        codec_precision: str = "fp32",
        codec_batch: int = 16,
    ) -> HiggsEngine:
        """Load ``model`` (``tiny``, a directory or a cached HF id).

        ``talker`` picks the runner by its type: :class:`ReferenceOptions` runs
        the talker in-process on PyTorch, :class:`VllmOptions` hands it to
        vLLM; ``None`` resolves ``auto`` (vLLM when importable with a CUDA
        device) with that backend's defaults. The codec always runs here, on
        ``device``, in ``codec_precision`` (``fp32``: chunked output equals
        whole decoding; ``tf32``/``bf16``: faster on CUDA), up to
        ``codec_batch`` chunk windows per call.
        """
        from realtime_engine.model.checkpoint import SafetensorsCheckpoint
        from realtime_engine.model.hub import resolve_model
        from realtime_engine.model.loader import load_codec, load_talker

        if talker is None:
            talker = parse_talker_options(resolve_backend("auto"))
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dtype is None:
            dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        runner: TalkerRunner
        try:
            if isinstance(talker, ReferenceOptions):
                from realtime_engine.talker.reference_runner import ReferenceRunner

                loaded = load_talker(model, device=dev, dtype=dtype)
                tokenizer, codec = loaded.tokenizer, _require_codec(loaded.codec, model)
                runner = ReferenceRunner(
                    loaded.model,
                    dev,
                    max_batch=talker.max_batch,
                    queue_rows=talker.queue_rows,
                    max_positions=loaded.config.max_position_embeddings,
                )
            else:
                from realtime_engine.talker.vllm_runner import VllmTalkerRunner

                path = resolve_model(model)
                tokenizer = HiggsTokenizer.from_dir(path)
                codec = _require_codec(load_codec(SafetensorsCheckpoint(path), device=dev), model)
                runner = VllmTalkerRunner.from_model_dir(
                    path,
                    max_num_seqs=talker.max_num_seqs,
                    max_model_len=talker.max_model_len,
                    dtype=talker.dtype,
                    enforce_eager=talker.enforce_eager,
                    gpu_memory_utilization=talker.gpu_memory_utilization,
                    **talker.engine_args,
                )
            codec.set_precision(codec_precision)
        except (OSError, ValueError) as e:
            raise EngineError(f"cannot load {model!s}: {e}") from e
        return cls(
            runner,
            tokenizer,
            codec_decode_fn(codec),
            model_id=str(model),
            chunking=chunking,
            codec_batch=codec_batch,
        )

    # ------------------------------------------------------------ voices
    def voices(self) -> list[VoiceInfo]:
        builtin = VoiceInfo(DEFAULT_VOICE, "the model's own voice (zero-shot)", builtin=True)
        cloned = [
            VoiceInfo(voice_id, v.description, builtin=False)
            for voice_id, v in sorted(self._clone_voices.items())
        ]
        return [builtin, *cloned]

    def add_voice(self, voice_id: str, voice: CloneVoice) -> None:
        """Register a cloned voice; its reference codes are checked now."""
        if voice_id == DEFAULT_VOICE:
            raise UnsupportedVoiceError(f"{DEFAULT_VOICE!r} is reserved")
        try:
            build_clone_prompt(self._tokenizer, "check", voice.ref_codes, voice.ref_text)
        except PromptError as e:
            raise UnsupportedVoiceError(f"voice {voice_id!r}: {e}") from e
        self._clone_voices[voice_id] = voice

    def _prompt(self, request: SegmentRequest) -> TalkerPrompt:
        text = speed_tag(request.speed) + request.text
        try:
            if request.voice == DEFAULT_VOICE:
                return build_zero_shot_prompt(self._tokenizer, text)
            voice = self._clone_voices.get(request.voice)
            if voice is None:
                raise UnsupportedVoiceError(f"unknown voice {request.voice!r}")
            return build_clone_prompt(self._tokenizer, text, voice.ref_codes, voice.ref_text)
        except PromptError as e:
            raise EngineError(f"cannot build a prompt: {e}") from e

    # ------------------------------------------------------------ synthesis
    def _talker_request(
        self, request: SegmentRequest, timings: TalkerTimings | None = None
    ) -> TalkerRequest:
        fixed_rows = None
        if request.fixed_rows is not None:
            fixed_rows = request.fixed_rows + DELAY_ROWS
        talker_request = TalkerRequest(
            request.request_id,
            self._prompt(request),
            sampling=request.sampling,
            fixed_rows=fixed_rows,
            timings=timings,
        )
        caps = [talker_request.max_new_tokens]
        if request.max_new_tokens is not None:
            caps.append(request.max_new_tokens)
        if request.max_audio_seconds is not None:
            caps.append(rows_for_seconds(request.max_audio_seconds))
        return replace(talker_request, max_new_tokens=min(caps))

    async def synthesize(self, request: SegmentRequest) -> AsyncIterator[np.ndarray]:
        clock = _StageClock(request.timings)
        talker_request = self._talker_request(request, clock.talker)
        try:
            decoder = StreamingDecoder(self._decode_fn, request.chunking or self._chunking)
        except InvalidChunkingError as e:
            raise EngineError(f"invalid chunking: {e}") from e
        request_id = request.request_id
        if request_id in self._running:
            raise EngineError(f"request id {request_id!r} is already running")
        clock.submitted()
        try:
            rows = self._runner.submit(talker_request)
        except TalkerError as e:
            raise EngineError(f"talker rejected {request_id!r}: {e}") from e
        self._running.add(request_id)
        try:
            async for row in rows:
                clock.row()
                for job in decoder.plan_feed(row):
                    yield clock.chunk(await self._complete(decoder, job))
            if request_id in self._aborted:
                return
            for job in decoder.plan_finish():
                yield clock.chunk(await self._complete(decoder, job))
        except TalkerError as e:
            raise EngineError(f"talker failed on {request_id!r}: {e}") from e
        except (CodecInputError, StreamStateError) as e:
            raise EngineError(f"codec stream failed on {request_id!r}: {e}") from e
        finally:
            self._running.discard(request_id)
            self._aborted.discard(request_id)
            aclose = getattr(rows, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _complete(self, decoder: StreamingDecoder, job: DecodeJob) -> np.ndarray:
        pcm = await self._codec.decode(job)
        return decoder.complete(job, pcm)

    def stats(self) -> Any:
        """The runner's cumulative step counters (for /metrics), if it keeps any."""
        runner_stats = getattr(self._runner, "stats", None)
        return runner_stats() if callable(runner_stats) else None

    async def abort(self, request_id: str) -> None:
        if request_id not in self._running:
            return
        self._aborted.add(request_id)
        await self._runner.abort(request_id)

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Warm up the talker and codec once with a short fixed-length segment."""
        if self._started:
            return
        self._started = True
        warm = SegmentRequest(
            request_id="__warmup__",
            text="Hello.",
            fixed_rows=2,
        )
        async for _ in self.synthesize(warm):
            pass

    async def close(self) -> None:
        await self._runner.close()
        self._codec.close()
