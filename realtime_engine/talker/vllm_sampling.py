"""Counter-based sampling noise for a sampler inside the engine.

Inside vLLM the sampler sees a batch of slots, not request objects with
their own ``torch.Generator``. Noise is therefore a hash of
``(seed, step, codebook, code, stream)``: a request's draws depend only on
its own seed and step, never on who shares the batch, and no per-request
generator state lives on the host. Fixed-shape integer tensor math only
(no ``.item()``), so it runs on the device without synchronisation.
"""

from __future__ import annotations

import torch

# splitmix64 / murmur3 finaliser constants, as signed int64 (torch has no uint64 math).
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)

STREAM_SAMPLE = 0
STREAM_RAS = 1


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (``>>`` on a negative int64 is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = x ^ _shr(x, 30)
    x = x * _MIX1
    x = x ^ _shr(x, 27)
    x = x * _MIX2
    return x ^ _shr(x, 31)


def uniform_noise(
    seed: torch.Tensor, step: torch.Tensor, num_codebooks: int, vocab: int, stream: int
) -> torch.Tensor:
    """Uniform floats in (0, 1), ``[B, num_codebooks, vocab]``, a pure function of the inputs.

    ``seed`` and ``step`` are int64 ``[B]``.
    """
    device = seed.device
    q = torch.arange(num_codebooks, device=device, dtype=torch.int64).view(1, -1, 1)
    v = torch.arange(vocab, device=device, dtype=torch.int64).view(1, 1, -1)
    key = _mix(seed.view(-1, 1, 1) * _GOLDEN + step.view(-1, 1, 1))
    key = _mix(key + (stream * num_codebooks + q) * vocab + v + _GOLDEN)
    bits = _shr(key, 40)  # top 24 bits
    return (bits.to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def counter_noise(
    seed: torch.Tensor, step: torch.Tensor, num_codebooks: int, vocab: int
) -> torch.Tensor:
    """Uniform noise ``[B, 2, N, V]`` for one step (main draw and RAS redraw) of each row.

    The layout :func:`realtime_engine.talker.sampling.sample_codes` takes.
    """
    return torch.stack(
        [
            uniform_noise(seed, step, num_codebooks, vocab, STREAM_SAMPLE),
            uniform_noise(seed, step, num_codebooks, vocab, STREAM_RAS),
        ],
        dim=1,
    )
