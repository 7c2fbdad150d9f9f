from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime_engine.talker.sampling import (
    BatchSampling,
    RequestNoise,
    push_history,
    sample_codes,
    stack_noise,
)
from realtime_engine.talker.types import TalkerSampling

V = 1026
N = 8


def _params(batch: int, **kw: float | int) -> BatchSampling:
    return BatchSampling.from_requests([TalkerSampling(**kw)] * batch)  # type: ignore[arg-type]


def _empty_history(batch: int, num_codebooks: int = N, width: int = 8) -> torch.Tensor:
    return torch.full((batch, num_codebooks, width), -1, dtype=torch.int64)


def _noise(batch: int, seed: int = 0, num_codebooks: int = N, vocab: int = V) -> torch.Tensor:
    return stack_noise(
        [RequestNoise(seed + i, num_codebooks=num_codebooks, vocab=vocab) for i in range(batch)]
    )


@st.composite
def sampling_cases(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, BatchSampling, int]:
    batch = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31))
    gen = torch.Generator().manual_seed(seed)
    scale = draw(st.sampled_from([0.1, 3.0, 40.0, 400.0]))
    logits = torch.randn((batch, N, V), generator=gen) * scale
    density = draw(st.sampled_from([0.0, 0.01, 0.5, 1.0]))
    allowed = torch.rand((batch, N, V), generator=gen) < density
    # every cell keeps at least one allowed code, like the termination masks
    forced = torch.randint(0, V, (batch, N, 1), generator=gen)
    allowed.scatter_(-1, forced, True)
    params = BatchSampling.from_requests(
        [
            TalkerSampling(
                temperature=draw(st.sampled_from([0.0, 1e-6, 0.3, 1.0, 2.5])),
                top_k=draw(st.sampled_from([-1, 0, 1, 5, 50, 2000])),
                top_p=draw(st.sampled_from([0.0, 0.1, 0.95, 1.0])),
                ras_window=draw(st.sampled_from([0, 3, 7])),
                ras_max_repeat=draw(st.sampled_from([0, 1, 2])),
            )
            for _ in range(batch)
        ]
    )
    return logits, allowed, params, seed


@settings(max_examples=60, deadline=None)
@given(sampling_cases())
def test_masked_codes_are_never_sampled(
    case: tuple[torch.Tensor, torch.Tensor, BatchSampling, int],
) -> None:
    logits, allowed, params, seed = case
    batch = logits.shape[0]
    gen = torch.Generator().manual_seed(seed + 1)
    # a history full of plausible codes so RAS fires often
    history = torch.randint(0, 4, (batch, N, 8), generator=gen)
    out = sample_codes(logits, allowed, params, _noise(batch, seed), history)
    assert out.codes.shape == (batch, N)
    picked = allowed.gather(-1, out.codes.unsqueeze(-1)).squeeze(-1)
    assert bool(picked.all())


def test_greedy_is_argmax_whatever_the_noise() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn((3, N, V), generator=gen)
    allowed = torch.rand((3, N, V), generator=gen) < 0.3
    allowed[..., 0] = True
    expected = logits.masked_fill(~allowed, float("-inf")).argmax(-1)
    # a history full of the argmax would trigger RAS if greedy rows used it
    history = expected.unsqueeze(-1).repeat(1, 1, 8)
    for temperature in (0.0, 1e-5):
        params = _params(3, temperature=temperature, ras_window=7, ras_max_repeat=1)
        for seed in (0, 1):
            out = sample_codes(logits, allowed, params, _noise(3, seed), history)
            assert torch.equal(out.codes, expected)
            assert not bool(out.resampled.any())


def _frequencies(probs: list[float], draws: int, **kw: float | int) -> list[float]:
    vocab = len(probs)
    logits = torch.log(torch.tensor(probs)).view(1, 1, vocab).expand(draws, 1, vocab)
    allowed = torch.ones((draws, 1, vocab), dtype=torch.bool)
    noise = torch.rand((draws, 2, 1, vocab), generator=torch.Generator().manual_seed(11))
    out = sample_codes(logits, allowed, _params(draws, **kw), noise, _empty_history(draws, 1))
    counts = torch.bincount(out.codes.flatten(), minlength=vocab).float()
    return (counts / draws).tolist()


def _close(got: list[float], want: list[float], draws: int) -> None:
    for g, w in zip(got, want, strict=True):
        # 5 standard deviations of a binomial proportion
        assert abs(g - w) <= 5 * math.sqrt(max(w * (1 - w), 1e-9) / draws) + 1e-9, (got, want)


def test_multinomial_frequencies_match_the_softmax() -> None:
    probs = [0.5, 0.3, 0.15, 0.05]
    got = _frequencies(probs, 20000, temperature=1.0, top_k=0, top_p=1.0)
    _close(got, probs, 20000)


def test_temperature_sharpens() -> None:
    probs = [0.5, 0.3, 0.15, 0.05]
    # p^(1/T) renormalised, T = 0.5 → squares
    squared = [p * p for p in probs]
    want = [s / sum(squared) for s in squared]
    _close(_frequencies(probs, 20000, temperature=0.5, top_k=0, top_p=1.0), want, 20000)


def test_top_p_keeps_the_nucleus_and_the_top_token() -> None:
    probs = [0.5, 0.3, 0.15, 0.05]
    # mass before token 2 is 0.8 > 0.7: only tokens 0 and 1 survive
    _close(_frequencies(probs, 20000, top_k=0, top_p=0.7), [0.625, 0.375, 0.0, 0.0], 20000)
    # a nucleus smaller than the top token still keeps the top token
    assert _frequencies(probs, 2000, top_k=0, top_p=0.1) == [1.0, 0.0, 0.0, 0.0]


def test_top_k_then_top_p() -> None:
    probs = [0.4, 0.3, 0.2, 0.1]
    # top-3 renormalises to 4/9, 3/9, 2/9; mass before token 2 is 7/9 > 0.75 → drop it
    _close(_frequencies(probs, 20000, top_k=3, top_p=0.75), [4 / 7, 3 / 7, 0.0, 0.0], 20000)
    assert _frequencies(probs, 2000, top_k=1, top_p=1.0) == [1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("max_repeat", [1, 2, 3])
@pytest.mark.parametrize("occurrences_in_window", [0, 1, 2, 3])
@pytest.mark.parametrize("window", [3, 7])
def test_ras_triggers_exactly_when_the_code_repeats(
    max_repeat: int, occurrences_in_window: int, window: int
) -> None:
    vocab = 4
    # top-k 1 always draws token 0
    logits = torch.tensor([9.0, 8.0, -50.0, -50.0]).view(1, 1, vocab)
    allowed = torch.ones((1, 1, vocab), dtype=torch.bool)
    width = 10
    history = torch.full((1, 1, width), 3, dtype=torch.int64)
    # occurrences inside the window (newest end) and one decoy just outside it
    for j in range(occurrences_in_window):
        history[0, 0, width - 1 - j] = 0
    history[0, 0, width - 1 - window] = 0
    params = _params(1, top_k=1, ras_window=window, ras_max_repeat=max_repeat)
    expect = occurrences_in_window >= max_repeat
    noise = torch.rand((1, 2, 1, vocab), generator=torch.Generator().manual_seed(5))
    out = sample_codes(logits, allowed, params, noise, history)
    assert bool(out.resampled[0, 0]) == expect
    if not expect:
        assert int(out.codes[0, 0]) == 0


def test_ras_redraws_from_the_unfiltered_softmax() -> None:
    vocab = 4
    draws = 20000
    probs = torch.tensor([0.6, 0.3, 0.1, 0.0])
    logits = torch.log(probs).view(1, 1, vocab).expand(draws, 1, vocab)
    allowed = torch.ones((draws, 1, vocab), dtype=torch.bool)
    history = torch.zeros((draws, 1, 7), dtype=torch.int64)  # token 0 everywhere
    noise = torch.rand((draws, 2, 1, vocab), generator=torch.Generator().manual_seed(2))
    out = sample_codes(logits, allowed, _params(draws, top_k=1), noise, history)
    assert bool(out.resampled.all())
    freq = (torch.bincount(out.codes.flatten(), minlength=vocab).float() / draws).tolist()
    _close(freq, probs.tolist(), draws)


def test_ras_ignores_padding_cells() -> None:
    # a BOC-only cell repeats BOC forever: never a RAS redraw
    logits = torch.zeros((1, 1, V))
    allowed = torch.zeros((1, 1, V), dtype=torch.bool)
    allowed[..., 1024] = True
    history = torch.full((1, 1, 7), 1024, dtype=torch.int64)
    out = sample_codes(logits, allowed, _params(1), _noise(1, num_codebooks=1), history)
    assert int(out.codes[0, 0]) == 1024
    assert not bool(out.resampled.any())


def test_same_seed_same_codes_independent_of_batch_mates() -> None:
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn((3, N, V), generator=gen) * 2
    allowed = torch.ones((3, N, V), dtype=torch.bool)
    params = _params(3)

    def run(seeds: list[int]) -> torch.Tensor:
        sources = [RequestNoise(s) for s in seeds]
        history = _empty_history(3)
        rows = []
        for _ in range(4):
            out = sample_codes(logits, allowed, params, stack_noise(sources), history)
            history = push_history(history, out.codes)
            rows.append(out.codes)
        return torch.stack(rows, dim=1)

    a = run([7, 100, 200])
    b = run([7, 300, 400])
    assert torch.equal(a[0], b[0])  # row 0 has the same seed in both runs
    assert not torch.equal(a[1], b[1])


def test_unseeded_requests_differ() -> None:
    assert RequestNoise(None).seed != RequestNoise(None).seed


def test_push_history_keeps_the_newest() -> None:
    history = torch.tensor([[[1, 2, 3]]])
    out = push_history(history, torch.tensor([[9]]))
    assert out.tolist() == [[[2, 3, 9]]]
