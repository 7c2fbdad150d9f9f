"""Session configuration of protocol v1: output, buffering, sampling, chunking, limits.

Re-exported by ``gateway.protocol``; import from there.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from realtime_engine.format import (
    DEFAULT_PRESET,
    MAX_CHUNK_FRAMES,
    MAX_CONTEXT_FRAMES,
    MAX_FIRST_CHUNK_FRAMES,
    MAX_HOLDBACK_FRAMES,
    SAMPLE_RATE,
    PresetName,
)
from realtime_engine.format import PRESETS as ENGINE_PRESETS

NATIVE_SAMPLE_RATE: Final = SAMPLE_RATE

AudioFormat = Literal["opus", "pcm16", "pcm_f32", "mulaw"]
SampleRate = Literal[8000, 16000, 24000, 48000]
FrameMs = Literal[10, 20, 40, 60]
LatencyPreset = Literal[PresetName, "custom"]
ContextId = Annotated[str, Field(min_length=1, max_length=64)]
VoiceId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


# --------------------------------------------------------------------------- session config


class OutputConfig(_Strict):
    format: AudioFormat = "opus"
    sample_rate: SampleRate = NATIVE_SAMPLE_RATE
    frame_ms: FrameMs = 20

    @model_validator(mode="after")
    def _rate_fits_format(self) -> OutputConfig:
        if self.format == "mulaw" and self.sample_rate != 8000:
            raise ValueError("mulaw (G.711) is 8000 Hz only")
        return self


class TextBuffering(_Strict):
    mode: Literal["auto", "manual"] = "auto"
    max_buffer_delay_ms: int = Field(default=250, ge=0, le=10_000)


class Sampling(_Strict):
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_k: int = Field(default=50, ge=0, le=1024)  # 0 disables top-k
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)


class Chunking(_Strict):
    """Streaming-codec chunking in codec frames (40 ms each at 24 kHz)."""

    first_chunk_frames: int = Field(ge=1, le=MAX_FIRST_CHUNK_FRAMES)
    chunk_frames: int = Field(ge=1, le=MAX_CHUNK_FRAMES)
    left_context_frames: int = Field(ge=0, le=MAX_CONTEXT_FRAMES)
    right_holdback_frames: int = Field(ge=0, le=MAX_HOLDBACK_FRAMES)
    # Geometric ramp of chunk sizes after the first chunk (null: none); the
    # playback buffer never drains while the talker runs >= this x real time.
    chunk_growth: float | None = Field(default=1.5, ge=1.0, le=8.0)


# The engine's preset table, in protocol form.
PRESETS: dict[str, Chunking] = {
    name: Chunking(**dataclasses.asdict(params)) for name, params in ENGINE_PRESETS.items()
}


class SessionConfig(_Strict):
    """The effective settings of a session (applied to contexts created afterwards)."""

    id: str = ""
    model: str = ""
    voice: VoiceId = "default"
    output: OutputConfig = Field(default_factory=OutputConfig)
    audio_transport: Literal["binary", "base64"] = "binary"
    text_buffering: TextBuffering = Field(default_factory=TextBuffering)
    latency_preset: LatencyPreset = DEFAULT_PRESET
    # Always the effective chunking: the preset's values unless latency_preset is "custom".
    chunking: Chunking | None = None
    sampling: Sampling = Field(default_factory=Sampling)
    max_audio_seconds: float = Field(default=120.0, gt=0.0, le=3600.0)

    @model_validator(mode="after")
    def _chunking_matches_preset(self) -> SessionConfig:
        if self.latency_preset == "custom":
            if self.chunking is None:
                raise ValueError("latency_preset 'custom' needs explicit chunking")
        elif self.chunking is None:
            self.chunking = PRESETS[self.latency_preset].model_copy()
        elif self.chunking != PRESETS[self.latency_preset]:
            raise ValueError("give either a named latency_preset or explicit chunking, not both")
        return self


READ_ONLY_SESSION_FIELDS = ("id", "model")


def apply_session_update(current: SessionConfig, patch: dict[str, Any]) -> SessionConfig:
    """Merge a partial ``session.update`` into ``current``; raise ``ValidationError``.

    Nested objects merge field by field. Two conveniences keep partial updates
    natural: changing ``output.format`` without a ``sample_rate`` picks that
    format's default rate (8000 for mulaw, else 24000), and a ``chunking``
    without a preset (or a preset without chunking) replaces the other.
    """
    merged = current.model_dump()
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    out = patch.get("output")
    if isinstance(out, dict) and "format" in out and "sample_rate" not in out:
        merged["output"]["sample_rate"] = 8000 if out["format"] == "mulaw" else NATIVE_SAMPLE_RATE
    if "chunking" in patch and "latency_preset" not in patch:
        merged["latency_preset"] = "custom"
    elif "latency_preset" in patch and "chunking" not in patch:
        merged["chunking"] = None
    return SessionConfig.model_validate(merged)


class Limits(_Lenient):
    max_sessions: int = 1000
    max_contexts: int = 8
    max_text_chars_per_context: int = 20_000
    max_message_bytes: int = 16 * 1024 * 1024
    idle_timeout_s: float = 120.0
    max_reference_seconds: float = 30.0
    max_lead_s: float = 10.0
