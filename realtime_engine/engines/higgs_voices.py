"""The Higgs engine's reference encoder: voice-clone clips to codec codes.

The codec encoder is loaded from the checkpoint's bundled layout when it is
there. A bundled encoder that does not load (a missing, unknown or misshapen
tensor) disables cloning, with the tensor named in every refusal, instead of
keeping the whole engine down: speech with built-in voices still works.
Encoding runs on its own thread so that a clip never delays codec chunks.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from realtime_engine.codec.encoder import CodecEncoder
from realtime_engine.codec.errors import CodecInputError
from realtime_engine.engines.base import UnsupportedVoiceError
from realtime_engine.errors import CheckpointError

log = logging.getLogger("realtime_engine.higgs")


class ReferenceEncoder:
    def __init__(self, encoder: CodecEncoder | None, unavailable: str | None = None) -> None:
        self._encoder = encoder
        self._unavailable = unavailable or "the checkpoint has no codec encoder"
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="voice-encoder")
        self.encodes = 0

    @classmethod
    def from_checkpoint(cls, model_dir: Path, device: torch.device) -> ReferenceEncoder:
        try:
            return cls(load_reference_encoder(model_dir, device))
        except CheckpointError as e:
            log.error("voice cloning is off: the bundled codec encoder does not load: %s", e)
            return cls(None, f"the bundled codec encoder does not load ({e})")

    @property
    def available(self) -> bool:
        return self._encoder is not None

    async def encode(self, pcm: np.ndarray, sample_rate: int, engine: str) -> np.ndarray:
        """Codes ``[frames, 8]``; ``ValueError`` for a clip the encoder refuses."""
        encoder = self._encoder
        if encoder is None:
            raise UnsupportedVoiceError(f"the {engine} cannot clone voices: {self._unavailable}")
        self.encodes += 1
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, encoder.encode_clip, pcm, sample_rate)
        except CodecInputError as e:
            raise ValueError(str(e)) from e

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


def load_reference_encoder(model_dir: Path, device: torch.device) -> CodecEncoder | None:
    """The bundled codec encoder, when the checkpoint carries one (``semantic_model.*``)."""
    from realtime_engine.codec.encoder import load_codec_encoder
    from realtime_engine.codec.hubert import SEMANTIC_PREFIX
    from realtime_engine.model.checkpoint import CodecView, SafetensorsCheckpoint

    view = CodecView(SafetensorsCheckpoint(model_dir))
    if not any(key.startswith(SEMANTIC_PREFIX) for key in view):
        return None
    return load_codec_encoder(dict(view), device=device)
