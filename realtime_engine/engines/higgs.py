"""Higgs Audio v3 speech engine: text → talker → PCM chunks.

The codec runs beside the talker, in its process and on its device (the
vLLM engine core, or the reference runner's thread): code rows never reach
this process, which only receives PCM chunks (``TalkerRunner.speak``) and
does no model math.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from realtime_engine.codec.delay import revert_delay, sanitize_codes
from realtime_engine.codec.errors import InvalidChunkingError
from realtime_engine.codec.half_check import set_checked_precision
from realtime_engine.codec.presets import DEFAULT_PRESET, get_preset, validate_chunking
from realtime_engine.engines.base import (
    EngineError,
    SegmentRequest,
    SegmentTimings,
    UnsupportedVoiceError,
    VoiceInfo,
    VoiceReference,
)
from realtime_engine.engines.higgs_voices import ReferenceEncoder
from realtime_engine.format import (
    CODEC_KERNELS,
    DEFAULT_CODEC_KERNELS,
    DEFAULT_CODEC_PRECISION,
    DELAY_ROWS,
    NUM_CODEBOOKS,
    SAMPLE_RATE,
    ChunkingParams,
    rows_for_seconds,
)
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
    """Fills a segment's :class:`SegmentTimings` from the talker's stamps and the chunks."""

    def __init__(self, timings: SegmentTimings | None) -> None:
        self.timings = timings
        self.talker = None if timings is None else TalkerTimings()

    def submitted(self) -> None:
        if self.timings is not None:
            self.timings.mark("submitted")

    def chunk(self, pcm: np.ndarray) -> np.ndarray:
        timings, talker = self.timings, self.talker
        if timings is None or talker is None or not pcm.size or timings.first_chunk is not None:
            return pcm
        # The runner stamped these where the rows were made, before sending the chunk.
        if talker.prefilled is not None:
            timings.mark("prefilled", talker.prefilled)
        if talker.first_row is not None:
            timings.mark("first_row", talker.first_row)
        if talker.first_frame_row is not None:
            timings.mark("first_frame_row", talker.first_frame_row)
        timings.mark("first_chunk")
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


class HiggsEngine:
    """:class:`~realtime_engine.engines.base.SpeechEngine` on a Higgs Audio v3 talker."""

    name = "higgs"
    # Its talker makes audio at its own pace (engines/base.py: self_paced).
    self_paced = True

    def __init__(
        self,
        runner: TalkerRunner,
        tokenizer: HiggsTokenizer,
        *,
        model_id: str = "higgs-audio-v3",
        sample_rate: int = SAMPLE_RATE,
        chunking: ChunkingParams | None = None,
        voice_encoder: ReferenceEncoder | None = None,
    ) -> None:
        self.model_id = model_id
        self.sample_rate = sample_rate
        self._runner = runner
        self._tokenizer = tokenizer
        self._chunking = chunking or get_preset(DEFAULT_PRESET)
        self._clone_voices: dict[str, CloneVoice] = {}
        self._voice_encoder = voice_encoder or ReferenceEncoder(None)
        self._running: set[str] = set()
        # Running requests the caller aborted: chunks already on their way are
        # dropped, and their rows never become a context's voice anchor.
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
        codec_precision: str = DEFAULT_CODEC_PRECISION,
        codec_batch: int = 64,
        codec_kernels: str = DEFAULT_CODEC_KERNELS,
        talker_host: str | None = None,
    ) -> HiggsEngine:
        """Load ``model`` (``tiny``, a directory or a cached HF id).

        ``talker`` picks the runner by its type: :class:`ReferenceOptions` runs
        the talker in-process on PyTorch, :class:`VllmOptions` hands it to
        vLLM; ``None`` resolves ``auto`` (vLLM when importable with a CUDA
        device) with that backend's defaults. The codec runs beside the talker
        (vLLM's engine core, or the reference runner's thread), in
        ``codec_precision`` (``fp32``: chunked output equals whole decoding;
        ``tf32``/``bf16``: faster on CUDA), up to ``codec_batch`` chunk windows
        per call, its step run by ``codec_kernels`` (:data:`CODEC_KERNELS`).

        ``talker_host``: with the vLLM talker, use the engine another process
        serves at this endpoint (:mod:`realtime_engine.talker.talker_host`)
        instead of starting one; the codec options are that process's then.
        """
        from realtime_engine.codec.decoder import CODEC_PRECISIONS
        from realtime_engine.model.checkpoint import CodecView, SafetensorsCheckpoint
        from realtime_engine.model.hub import resolve_model
        from realtime_engine.model.loader import load_talker

        if talker is None:
            talker = parse_talker_options(resolve_backend("auto"))
        if codec_precision not in CODEC_PRECISIONS:
            raise EngineError(f"codec precision must be one of {CODEC_PRECISIONS}")
        if codec_kernels not in CODEC_KERNELS:
            raise EngineError(f"codec kernels must be one of {CODEC_KERNELS}")
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dtype is None:
            dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        runner: TalkerRunner
        try:
            if isinstance(talker, ReferenceOptions):
                from realtime_engine.talker.reference_runner import ReferenceRunner

                loaded = load_talker(model, device=dev, dtype=dtype)
                tokenizer, codec = loaded.tokenizer, loaded.codec
                if codec is None:
                    raise EngineError(f"{model!s} has no bundled codec")
                # float16 only if it holds on these weights
                set_checked_precision(codec, codec_precision)
                path = loaded.path
                runner = ReferenceRunner(
                    loaded.model,
                    dev,
                    max_batch=talker.max_batch,
                    queue_rows=talker.queue_rows,
                    max_positions=loaded.config.max_position_embeddings,
                    codec=codec,
                    codec_batch=codec_batch,
                    codec_kernels=codec_kernels,
                )
            else:
                from realtime_engine.talker.vllm_runner import VllmTalkerRunner

                path = resolve_model(model)
                tokenizer = HiggsTokenizer.from_dir(path)
                if not len(CodecView(SafetensorsCheckpoint(path))):
                    raise EngineError(f"{model!s} has no bundled codec")
                runner = (
                    _remote_runner(talker_host, tokenizer, talker)
                    if talker_host is not None
                    else VllmTalkerRunner.from_model_dir(
                        path,
                        **vllm_talker_kwargs(talker, codec_precision, codec_batch, codec_kernels),
                    )
                )
            voice_encoder = ReferenceEncoder.from_checkpoint(path, dev)
        except (OSError, ValueError) as e:
            raise EngineError(f"cannot load {model!s}: {e}") from e
        return cls(
            runner,
            tokenizer,
            model_id=str(model),
            chunking=chunking,
            voice_encoder=voice_encoder,
        )

    # ------------------------------------------------------------ voices
    @property
    def supports_voice_cloning(self) -> bool:
        return self._voice_encoder.available

    @property
    def reference_encodes(self) -> int:
        """Clips run through the codec encoder (the voice cache's misses)."""
        return self._voice_encoder.encodes

    async def encode_reference(self, pcm: np.ndarray, sample_rate: int) -> np.ndarray:
        """Codec codes ``[frames, 8]`` of a reference clip (mono float32), off the loop."""
        return await self._voice_encoder.encode(pcm, sample_rate, f"{self.name} engine")

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

    def _reference(self, request: SegmentRequest) -> VoiceReference | None:
        """The voice to clone: the request's own, a registered one, or the context's anchor."""
        if request.reference is not None:
            return request.reference
        if request.voice != DEFAULT_VOICE:
            voice = self._clone_voices.get(request.voice)
            if voice is None:
                raise UnsupportedVoiceError(f"unknown voice {request.voice!r}")
            return VoiceReference(voice.ref_codes, voice.ref_text)
        if request.continuity is not None:
            return request.continuity.anchor()
        return None

    def _prompt(self, request: SegmentRequest) -> TalkerPrompt:
        text = speed_tag(request.speed) + request.text
        reference = self._reference(request)
        try:
            if reference is None:
                return build_zero_shot_prompt(self._tokenizer, text)
            return build_clone_prompt(self._tokenizer, text, reference.codes, reference.text)
        except PromptError as e:
            raise EngineError(f"cannot build a prompt: {e}") from e

    def prompt_for(self, request: SegmentRequest) -> TalkerPrompt:
        """The talker prompt ``request`` gets now (tests, tools)."""
        return self._prompt(request)

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
        # The segment's rows come back (on its final chunk) only while they may
        # still become the context's voice anchor.
        continuity = request.continuity
        keep = (
            continuity is not None
            and not continuity.settled
            and request.reference is None
            and request.voice == DEFAULT_VOICE
        )
        talker_request = replace(self._talker_request(request, clock.talker), return_rows=keep)
        chunking = request.chunking or self._chunking
        try:
            validate_chunking(chunking)
        except InvalidChunkingError as e:
            raise EngineError(f"invalid chunking: {e}") from e
        request_id = request.request_id
        if request_id in self._running:
            raise EngineError(f"request id {request_id!r} is already running")
        clock.submitted()
        try:
            chunks = self._runner.speak(talker_request, chunking)
        except TalkerError as e:
            raise EngineError(f"talker rejected {request_id!r}: {e}") from e
        self._running.add(request_id)
        try:
            async for chunk in chunks:
                if request_id in self._aborted:
                    return
                if chunk.pcm.size:
                    yield clock.chunk(chunk.pcm)
                # Only a segment that ran to its end may anchor the context's voice.
                rows = chunk.rows if chunk.final and request_id not in self._aborted else None
                if continuity is not None and rows is not None and len(rows) >= NUM_CODEBOOKS:
                    codes = sanitize_codes(revert_delay(rows.astype(np.int64)))
                    continuity.record(codes, request.text)
        except TalkerError as e:
            raise EngineError(f"talker failed on {request_id!r}: {e}") from e
        finally:
            self._running.discard(request_id)
            self._aborted.discard(request_id)
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()

    def stats(self) -> Any:
        """The runner's cumulative step counters (for /metrics), if it keeps any."""
        runner_stats = getattr(self._runner, "stats", None)
        return runner_stats() if callable(runner_stats) else None

    def rank_stats(self) -> Any:
        """What each data-parallel engine core served (vLLM talker), else None."""
        rank_stats = getattr(self._runner, "rank_stats", None)
        return rank_stats() if callable(rank_stats) else None

    def failure(self) -> str | None:
        """Why the talker is dead (vLLM engine core process, reference thread), else None."""
        failure = getattr(self._runner, "failure", None)
        return failure() if callable(failure) else None

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

    async def toggle_device_trace(self) -> str:
        """Start or stop vLLM's torch profiler in the engine core (the talker started
        with ``engine_args.profiler_config``; traces land in its directory)."""
        toggle = getattr(self._runner, "toggle_device_trace", None)
        if toggle is None:
            raise EngineError(f"the {type(self._runner).__name__} records no device traces")
        try:
            return str(await toggle())
        except TalkerError as e:
            raise EngineError(str(e)) from e

    async def close(self) -> None:
        await self._runner.close()
        self._voice_encoder.close()


def vllm_talker_kwargs(
    options: Any, codec_precision: str, codec_batch: int, codec_kernels: str
) -> dict[str, Any]:
    """The keywords of ``VllmTalkerRunner.from_model_dir`` / ``start_vllm_engine``
    for these :class:`VllmOptions` and codec settings."""
    return {
        "max_num_seqs": options.max_num_seqs,
        "max_model_len": options.max_model_len,
        "dtype": options.dtype,
        "enforce_eager": options.enforce_eager,
        "gpu_memory_utilization": options.gpu_memory_utilization,
        "codec_precision": codec_precision,
        "codec_batch": codec_batch,
        "codec_kernels": codec_kernels,
        **options.parallel_args(),
        **options.engine_args,
    }


def _remote_runner(endpoint: str, tokenizer: HiggsTokenizer, options: Any) -> TalkerRunner:
    """A vLLM runner on the engine of the talker host at ``endpoint`` (this
    process's parent: the host is gone when the parent is)."""
    import os

    from realtime_engine.talker.talker_host import RemoteEngineLink
    from realtime_engine.talker.vllm_runner import VllmTalkerRunner

    parent = os.getppid()
    link = RemoteEngineLink(endpoint, host_alive=lambda: os.getppid() == parent)
    return VllmTalkerRunner(
        link,
        tokenizer.specials,
        options.max_model_len,
        profiler=bool(options.engine_args.get("profiler_config")),
    )
