"""Per-codebook sampling of talker logits, batched with per-request settings.

Every row of a batch carries its own temperature, top-k, top-p, RAS window
and random stream. Randomness enters only as uniform noise the caller
passes in (one tensor per step), drawn from each request's own generator:
a request's codes then depend on its seed alone, not on who else shares
the batch. Sampling uses the exponential race (``argmax p / E`` with
``E ~ Exp(1)``), which equals multinomial sampling but needs no per-row
loop and no host synchronisation.

Repetition-aware sampling (RAS): when the code drawn for a codebook already
occurs ``ras_max_repeat`` times or more among that codebook's last
``ras_window`` codes, it is drawn again from the temperature-scaled softmax
of the masked logits without the top-k / top-p filters, which breaks the
loops an audio LM falls into. Greedy rows never resample.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from realtime_engine.talker.types import BOC, CODEBOOK_VOCAB, NUM_CODEBOOKS, TalkerSampling

GREEDY_TEMPERATURE = 1e-5
# noise draws per cell and step: the main draw and the RAS redraw
NOISE_DRAWS = 2
# smallest uniform value, so -log(u) stays finite
_MIN_UNIFORM = 1e-20


@dataclass(frozen=True)
class BatchSampling:
    """Per-row sampling settings as tensors ``[B]``."""

    temperature: torch.Tensor  # float32
    top_k: torch.Tensor  # int64, <= 0 disables
    top_p: torch.Tensor  # float32, outside (0, 1) disables
    ras_window: torch.Tensor  # int64, <= 0 disables
    ras_max_repeat: torch.Tensor  # int64, <= 0 disables

    @classmethod
    def from_requests(
        cls, params: Sequence[TalkerSampling], device: torch.device | str = "cpu"
    ) -> BatchSampling:
        def col(values: list[float] | list[int], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        return cls(
            temperature=col([p.temperature for p in params], torch.float32),
            top_k=col([p.top_k for p in params], torch.int64),
            top_p=col([p.top_p for p in params], torch.float32),
            ras_window=col([p.ras_window for p in params], torch.int64),
            ras_max_repeat=col([p.ras_max_repeat for p in params], torch.int64),
        )


class SampledCodes(NamedTuple):
    codes: torch.Tensor  # int64 [B, N]
    resampled: torch.Tensor  # bool [B, N]: RAS drew this cell again


class RequestNoise:
    """A request's own random stream: uniform noise for one step at a time."""

    def __init__(
        self,
        seed: int | None,
        device: torch.device | str = "cpu",
        num_codebooks: int = NUM_CODEBOOKS,
        vocab: int = CODEBOOK_VOCAB,
    ) -> None:
        self.seed = seed if seed is not None else secrets.randbits(63)
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(self.seed)
        self.shape = (NOISE_DRAWS, num_codebooks, vocab)

    def draw(self) -> torch.Tensor:
        """Uniform noise ``[2, N, V]`` for one step."""
        return torch.rand(self.shape, generator=self.generator, device=self.device)


def stack_noise(sources: Sequence[RequestNoise]) -> torch.Tensor:
    """One step of noise ``[B, 2, N, V]`` from each row's own stream."""
    return torch.stack([s.draw() for s in sources])


def _race(log_weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Index of the winner of an exponential race (a multinomial draw).

    ``argmax(w / E)`` with ``E = -log u`` picks index i with probability
    ``w_i / sum(w)``; in log space ``log w - log E``. Entries at -inf never win
    while any finite entry exists.
    """
    exp_noise = -torch.log(uniform.clamp_min(_MIN_UNIFORM))
    return torch.argmax(log_weights - torch.log(exp_noise), dim=-1)


def _filter_top_k_top_p(
    scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Keep-mask ``[B, N, V]`` of top-k then top-p (the top token always stays)."""
    vocab = scaled.shape[-1]
    sorted_vals, sorted_idx = torch.sort(scaled, dim=-1, descending=True)
    rank = torch.arange(vocab, device=scaled.device)
    k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab).view(-1, 1, 1)
    keep_sorted = rank < k
    sorted_vals = sorted_vals.masked_fill(~keep_sorted, float("-inf"))
    probs = torch.softmax(sorted_vals, dim=-1)
    # probability mass strictly before each token; drop a token once the
    # mass before it already exceeds top_p
    before = torch.cumsum(probs, dim=-1) - probs
    p = top_p.view(-1, 1, 1)
    nucleus_on = (p > 0) & (p < 1)
    keep_sorted = keep_sorted & (~nucleus_on | (before <= p) | (rank == 0))
    return torch.zeros_like(keep_sorted).scatter(-1, sorted_idx, keep_sorted)


def _window_counts(
    history: torch.Tensor, codes: torch.Tensor, window: torch.Tensor
) -> torch.Tensor:
    """How often each code occurs among its codebook's last ``window`` codes."""
    width = history.shape[-1]
    pos = torch.arange(width, device=history.device)
    in_window = pos >= (width - window).view(-1, 1, 1)
    hits = (history == codes.unsqueeze(-1)) & in_window
    return hits.sum(dim=-1)


def sample_codes(
    logits: torch.Tensor,
    allowed: torch.Tensor,
    params: BatchSampling,
    noise: torch.Tensor,
    history: torch.Tensor,
) -> SampledCodes:
    """Draw one code per codebook.

    ``logits`` ``[B, N, V]`` (any float dtype), ``allowed`` bool ``[B, N, V]``
    (every cell needs at least one allowed code), ``noise`` uniform
    ``[B, 2, N, V]``, ``history`` int64 ``[B, N, W]`` of the last emitted
    codes, oldest first (``-1`` where empty; ``W`` >= every RAS window).
    """
    x = logits.float().masked_fill(~allowed, float("-inf"))
    greedy_codes = torch.argmax(x, dim=-1)

    temperature = params.temperature.view(-1, 1, 1).clamp_min(GREEDY_TEMPERATURE)
    scaled = x / temperature
    keep = _filter_top_k_top_p(scaled, params.top_k, params.top_p) & allowed
    filtered = scaled.masked_fill(~keep, float("-inf"))
    drawn = _race(torch.log_softmax(filtered, dim=-1), noise[:, 0])

    is_greedy = (params.temperature <= GREEDY_TEMPERATURE).view(-1, 1)
    codes = torch.where(is_greedy, greedy_codes, drawn)

    counts = _window_counts(history, codes, params.ras_window)
    ras_on = ((params.ras_window > 0) & (params.ras_max_repeat > 0)).view(-1, 1) & ~is_greedy
    repeat = counts >= params.ras_max_repeat.view(-1, 1)
    resampled = ras_on & repeat & (codes < BOC)
    redrawn = _race(torch.log_softmax(scaled, dim=-1), noise[:, 1])
    codes = torch.where(resampled, redrawn, codes)
    return SampledCodes(codes=codes, resampled=resampled)


def push_history(history: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Shift the emitted ``rows`` ``[B, N]`` into ``history`` ``[B, N, W]``."""
    return torch.cat([history[..., 1:], rows.unsqueeze(-1).to(history.dtype)], dim=-1)
