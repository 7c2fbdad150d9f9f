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


def _lanes(streams: int, num_codebooks: int, vocab: int, device: torch.device) -> torch.Tensor:
    """Per-cell counter offsets ``[streams, N, V]`` (one kernel-sized constant per shape)."""
    key = (streams, num_codebooks, vocab, device)
    lanes = _LANES.get(key)
    if lanes is None:
        lanes = torch.arange(streams * num_codebooks * vocab, device=device, dtype=torch.int64)
        lanes = (lanes + _GOLDEN).view(streams, num_codebooks, vocab)
        _LANES[key] = lanes
    return lanes


_LANES: dict[tuple[int, int, int, torch.device], torch.Tensor] = {}


def _uniform(
    seed: torch.Tensor, step: torch.Tensor, streams: int, num_codebooks: int, vocab: int
) -> torch.Tensor:
    """Uniform floats in (0, 1), ``[B, streams, N, V]``; cell ``(s, q, c)`` uses counter
    ``(s * N + q) * V + c`` under the key of ``(seed, step)``."""
    base = _mix(seed * _GOLDEN + step).view(-1, 1, 1, 1)
    key = _mix(base + _lanes(streams, num_codebooks, vocab, seed.device))
    bits = _shr(key, 40)  # top 24 bits
    return (bits.to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def uniform_noise(
    seed: torch.Tensor, step: torch.Tensor, num_codebooks: int, vocab: int, stream: int
) -> torch.Tensor:
    """Stream ``stream`` of the noise alone, ``[B, N, V]`` (``seed``, ``step``: int64 ``[B]``)."""
    return _uniform(seed, step, stream + 1, num_codebooks, vocab)[:, stream]


def counter_noise(
    seed: torch.Tensor, step: torch.Tensor, num_codebooks: int, vocab: int
) -> torch.Tensor:
    """Uniform noise ``[B, 2, N, V]`` for one step (main draw and RAS redraw) of each row.

    The layout :func:`realtime_engine.talker.sampling.sample_codes` takes;
    both streams come out of one pass.
    """
    return _uniform(seed, step, 2, num_codebooks, vocab)


def recent_codes(
    codes_by_pos: torch.Tensor,
    prompt_len: torch.Tensor,
    slots: torch.Tensor,
    step: torch.Tensor,
    width: int,
) -> torch.Tensor:
    """The last ``width`` emitted rows of each slot as ``[B, N, width]``, oldest first.

    ``codes_by_pos`` ``[S, L, N]`` holds row ``k`` of slot ``s`` at position
    ``prompt_len[s] + k``; ``step`` ``[B]`` is the number of rows emitted so
    far. Positions before the first row read as ``-1``.
    """
    back = torch.arange(width, 0, -1, device=codes_by_pos.device)
    index = step.unsqueeze(1) - back
    max_pos = codes_by_pos.shape[1] - 1
    pos = (prompt_len[slots].unsqueeze(1) + index).clamp(0, max_pos)
    codes = codes_by_pos[slots.unsqueeze(1), pos].long()  # [B, width, N]
    codes = torch.where((index >= 0).unsqueeze(-1), codes, -1)
    return codes.transpose(1, 2)
