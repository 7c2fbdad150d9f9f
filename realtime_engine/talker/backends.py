"""Talker backends: their names, one typed options class each, and which one runs.

``--talker auto`` is resolved once, here, to ``vllm`` (importable, with a CUDA
device) or ``reference``; the options are then checked against that backend,
so a key that the chosen backend does not know is an error naming the key,
never silently dropped. Importing this module pulls in neither vLLM nor torch.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

TalkerBackend = Literal["auto", "vllm", "reference"]
TALKER_BACKENDS: tuple[str, ...] = get_args(TalkerBackend)
ResolvedBackend = Literal["vllm", "reference"]


# Keys of VllmOptions that are vLLM parallel layouts (never also in engine_args).
PARALLEL_KEYS = ("data_parallel_size", "tensor_parallel_size")
# A sanity bound: one host has at most this many GPUs.
MAX_PARALLEL = 64


class TalkerOptionsError(ValueError):
    """An unknown backend, or options that the chosen backend does not take."""


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    backend: ClassVar[ResolvedBackend]


class ReferenceOptions(_Options):
    """The in-process PyTorch runner (``reference_runner.ReferenceRunner``)."""

    backend: ClassVar[ResolvedBackend] = "reference"
    max_batch: int = Field(default=32, ge=1, le=4096)  # concurrent requests (batch rows)
    queue_rows: int = Field(default=64, ge=1)  # undelivered rows a request may hold


class VllmOptions(_Options):
    """vLLM's ``AsyncLLM`` engine (``vllm_runner.VllmTalkerRunner``)."""

    backend: ClassVar[ResolvedBackend] = "vllm"
    max_num_seqs: int = Field(default=256, ge=1)
    max_model_len: int = Field(default=4096, ge=16)
    dtype: str = "auto"
    enforce_eager: bool = False
    gpu_memory_utilization: float = Field(default=0.85, gt=0.0, le=1.0)
    # Engine cores, one GPU (or tensor_parallel_size GPUs) each; vLLM balances
    # requests across them and each decodes and sends its own audio.
    data_parallel_size: int = Field(default=1, ge=1, le=MAX_PARALLEL)
    # GPUs that split every step of one engine core (only rank 0 sends audio).
    tensor_parallel_size: int = Field(default=1, ge=1, le=MAX_PARALLEL)
    # Further ``vllm.engine.arg_utils.AsyncEngineArgs`` fields, passed as given.
    engine_args: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _parallelism_is_said_once(self) -> VllmOptions:
        typed = sorted(set(PARALLEL_KEYS) & set(self.engine_args))
        if typed:
            raise ValueError(f"set {typed[0]} as a talker option, not inside engine_args")
        if self.engine_args.get("pipeline_parallel_size", 1) != 1:
            raise ValueError("the Higgs talker does not support pipeline parallelism")
        return self

    def parallel_args(self) -> dict[str, int]:
        """The parallel layout as ``AsyncEngineArgs`` fields (only what differs from one GPU)."""
        return {
            key: value
            for key, value in (
                ("data_parallel_size", self.data_parallel_size),
                ("tensor_parallel_size", self.tensor_parallel_size),
            )
            if value != 1
        }


TalkerOptions = ReferenceOptions | VllmOptions
_OPTIONS: dict[ResolvedBackend, type[ReferenceOptions] | type[VllmOptions]] = {
    "reference": ReferenceOptions,
    "vllm": VllmOptions,
}


def vllm_usable() -> bool:
    """vLLM is importable and a CUDA device is present (finds vLLM without importing it)."""
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def resolve_backend(backend: str) -> ResolvedBackend:
    """``auto`` → ``vllm`` when usable, else ``reference``; other names as given."""
    if backend not in TALKER_BACKENDS:
        raise TalkerOptionsError(
            f"unknown talker backend {backend!r}; choose one of {', '.join(TALKER_BACKENDS)}"
        )
    if backend == "auto":
        return "vllm" if vllm_usable() else "reference"
    return "vllm" if backend == "vllm" else "reference"


def parse_talker_options(
    backend: ResolvedBackend, raw: Mapping[str, Any] | None = None
) -> TalkerOptions:
    """Typed options for ``backend``; an unknown key or a bad value is a ``TalkerOptionsError``."""
    cls = _OPTIONS[backend]
    given = dict(raw or {})
    valid = sorted(cls.model_fields)
    unknown = sorted(set(given) - set(valid))
    if unknown:
        raise TalkerOptionsError(
            f"unknown option {unknown[0]!r} for the {backend} talker; "
            f"valid options: {', '.join(valid)}"
        )
    try:
        return cls.model_validate(given)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()
        )
        raise TalkerOptionsError(f"invalid {backend} talker options: {problems}") from e


def talker_options(backend: str, raw: Mapping[str, Any] | None = None) -> TalkerOptions:
    """Resolve ``backend`` once and check ``raw`` against the backend that will run."""
    resolved = resolve_backend(backend)
    try:
        return parse_talker_options(resolved, raw)
    except TalkerOptionsError as e:
        if backend == "auto":
            raise TalkerOptionsError(f"{e} (--talker auto chose {resolved} here)") from e
        raise
