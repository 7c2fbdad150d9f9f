"""Audio out: resampling, Opus/PCM/mu-law frames, the binary frame header, HTTP containers."""

from realtime_engine.audio.containers import (
    CONTAINER_FORMATS,
    ContainerEncoder,
    supported_container_formats,
)
from realtime_engine.audio.encoder import (
    DEFAULT_FRAME_MS,
    MODEL_SAMPLE_RATE,
    OUTPUT_FORMATS,
    OUTPUT_SAMPLE_RATES,
    AudioEncoder,
    EncodedFrame,
    validate_output,
)
from realtime_engine.audio.errors import (
    AudioEncodeError,
    AudioFormatError,
    FrameFormatError,
    UnsupportedFormatError,
)
from realtime_engine.audio.frame_header import HEADER_SIZE, AudioFrame, pack_frame, parse_frame

__all__ = [
    "CONTAINER_FORMATS",
    "DEFAULT_FRAME_MS",
    "HEADER_SIZE",
    "MODEL_SAMPLE_RATE",
    "OUTPUT_FORMATS",
    "OUTPUT_SAMPLE_RATES",
    "AudioEncodeError",
    "AudioEncoder",
    "AudioFormatError",
    "AudioFrame",
    "ContainerEncoder",
    "EncodedFrame",
    "FrameFormatError",
    "UnsupportedFormatError",
    "pack_frame",
    "parse_frame",
    "supported_container_formats",
    "validate_output",
]
