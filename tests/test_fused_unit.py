"""The fused residual unit (one Triton kernel for a unit's branch, skip and mask),
run here through Triton's CPU interpreter: it equals the unit computed in
PyTorch for any width, dilation, length, skip lag and start mask, and a
streaming codec that fuses its units still decodes what the whole decode does,
for any arrival pattern of frames and slots at different points of their
utterances."""

from __future__ import annotations

import logging

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime_engine.codec.causal import CausalDac
from realtime_engine.codec.dac import DacDecoder, ResidualUnit
from realtime_engine.codec.decoder import CodecDecoder, load_codec_decoder
from realtime_engine.codec.fused_unit import (
    MAX_FUSED_CHANNELS,
    FusedUnits,
    UnitWeights,
    fast_sine,
    fused_residual,
    padded_channels,
    residual_reference,
    unit_launch,
)
from realtime_engine.codec.kernel_launch import (
    ALIGNMENT,
    Launch,
    build_launches,
    deferred_launches,
)
from realtime_engine.codec.layout import CodecDims, random_codec_state_dict
from realtime_engine.codec.stream_core import StreamingCodec
from realtime_engine.talker import codec_slots
from realtime_engine.talker.codec_slots import CodecSlots
from realtime_engine.talker.codec_slots import logger as codec_slots_logger

pytest.importorskip("triton", reason="the kernel is Triton's (a vLLM dependency)")

# float32 rounding through the codec's 15 layers, the fused ones summed in
# another order than oneDNN's (2.02e-5 seen on one CPU); a wrong tap, lag or
# mask is of the order of the signal
FP32_ROUNDING = 4e-5
HOP = 960

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def random_unit(channels: int, dilation: int, seed: int) -> ResidualUnit:
    torch.manual_seed(seed)
    unit = ResidualUnit(channels, dilation)
    with torch.no_grad():
        for snake in (unit.snake1, unit.snake2):
            snake.alpha.uniform_(0.2, 2.0)
    return unit.eval()


def unit_inputs(
    unit: ResidualUnit, batch: int, n: int, head: int, seed: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    channels, dilation = unit.conv1.in_channels, unit.conv1.dilation[0]
    full = torch.randn(batch, channels, 6 * dilation + n, generator=g).to(dtype)
    skip = torch.randn(batch, channels, 3 * dilation, generator=g).to(dtype)
    x = torch.randn(batch, channels, n, generator=g).to(dtype)
    keep = (torch.rand(batch, head, generator=g) > 0.5).to(dtype)
    return full, skip, x, keep


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    # (a start mask may zero every sample)
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-12))


@settings(max_examples=16, deadline=None)
@given(
    channels=st.sampled_from([4, 8, 16, 24, 32, 64]),
    dilation=st.sampled_from([1, 3, 9]),
    n=st.integers(1, 150),
    batch=st.integers(1, 3),
    head_share=st.floats(0, 1),
    seed=st.integers(0, 2**16),
    activate=st.booleans(),
)
def test_the_kernel_is_the_unit_computed_in_pytorch(
    channels: int, dilation: int, n: int, batch: int, head_share: float, seed: int, activate: bool
) -> None:
    """Given the history and the activated new samples, or (``activate``) the
    history and the raw new samples, the kernel computes the unit."""
    unit = random_unit(channels, dilation, seed)
    weights = UnitWeights.of(unit)
    full, skip, x, keep = unit_inputs(unit, batch, n, round(head_share * n), seed, torch.float32)
    history = full[..., : 6 * dilation]
    with torch.no_grad():
        full = torch.cat([history, unit.snake1(x)], -1)
    source = history if activate else full
    got = fused_residual(weights, source, skip, x, keep, activate=activate)
    assert rel(got, residual_reference(weights, full, skip, x, keep)) < 1e-5


def test_the_reference_is_the_module_with_its_skip_delayed_and_masked() -> None:
    """residual_reference against ResidualUnit.forward itself: the same unit over
    a whole signal, its skip delayed by the branch's right padding."""
    unit = random_unit(8, 3, seed=1)
    weights = UnitWeights.of(unit)
    signal = torch.randn(2, 8, 60)
    act = unit.snake1(signal)
    lag = 3 * 3
    full = torch.cat([torch.zeros(2, 8, 6 * 3), act], -1)  # zero history: the start
    skip = torch.zeros(2, 8, lag)
    keep = torch.ones(2, 0)
    with torch.no_grad():
        whole = unit(signal)
        got = residual_reference(weights, full, skip, signal, keep)
    # output t is the whole unit's sample t - lag (the causal branch's delay)
    assert rel(got[..., lag:], whole[..., : 60 - lag]) < 1e-5


def test_float16_multiplies_in_float16_and_stays_close() -> None:
    unit = random_unit(32, 9, seed=3)
    half = UnitWeights.of(unit.half())
    inputs = unit_inputs(unit, 2, 100, 40, seed=3, dtype=torch.float16)
    got = fused_residual(half, *inputs)
    assert got.dtype == torch.float16
    assert rel(got, residual_reference(half, *inputs)) < 2e-3


def test_widths_pad_to_a_product_size_and_tiles_fit_the_registers() -> None:
    assert [padded_channels(c) for c in (1, 8, 16, 17, 32, 100, 128)] == [
        16, 16, 16, 32, 32, 128, 128,
    ]  # fmt: skip
    launches = [unit_launch(padded_channels(c), True) for c in (8, 32, 64, 128)]
    assert launches == [(64, 4), (64, 4), (32, 4), (64, 8)]
    assert unit_launch(64, False) == (128, 4)
    unit = random_unit(8, 1, seed=0)
    full, skip, x, keep = unit_inputs(unit, 1, 10, 0, 0, torch.float32)
    with pytest.raises(ValueError, match="source must hold 16"):
        fused_residual(UnitWeights.of(unit), full[..., 1:], skip, x, keep)
    with pytest.raises(ValueError, match="source must hold 6"):  # the history alone
        fused_residual(UnitWeights.of(unit), full, skip, x, keep, activate=True)
    with pytest.raises(ValueError, match="fused_units must be one of"):
        CausalDac(DacDecoder(CodecDims.tiny()), fused_units="all")  # type: ignore[arg-type]


def test_the_sine_is_approximate_where_the_products_are(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's approximate sine goes with TF32 or half-precision products; float32
    products keep libdevice's exact sine, and so does Triton's interpreter, which
    has no approximate one."""
    matmul = torch.backends.cuda.matmul
    was = matmul.allow_tf32
    try:
        matmul.allow_tf32 = True
        assert not fast_sine(torch.float16)  # interpreted (this module's fixture)
        monkeypatch.delenv("TRITON_INTERPRET")
        assert fast_sine(torch.float32) and fast_sine(torch.float16)
        matmul.allow_tf32 = False
        assert not fast_sine(torch.float32) and fast_sine(torch.float16)
    finally:
        matmul.allow_tf32 = was


# -- a streaming codec that fuses its units ------------------------------------------


@pytest.fixture(scope="module")
def codec() -> CodecDecoder:
    """The real strides with channels on both sides of the fused widths: the first
    block's 160-channel units stay layer by layer, the other four blocks' (16 and
    8) are fused; so is every block's upsampling but the second's (160 inputs)."""
    dims = CodecDims(decoder_channels=(32, 160, 16, 16, 8, 8))
    sd = random_codec_state_dict(dims, torch.Generator().manual_seed(0), include_encoder=False)
    return load_codec_decoder(sd)


def whole(codec: CodecDecoder, codes: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode(), codec.compute_context():
        return codec.acoustic_decoder(codec.acoustic_input(codes))[:, 0]


# The deep layers' output lies before the utterance's start (masked to zero) for
# about the codec's delay: the steps must go well past it for the fused units'
# arithmetic to reach the audio, rather than the tail's.
MIN_FRAMES = 24


def stepped_past_the_delay(core: StreamingCodec, frames: int) -> int:
    """Samples the steps give after the leading delay (the rest is the tail's)."""
    return frames * HOP - core.delay


def streamed(core: StreamingCodec, codes: torch.Tensor, groups: list[int]) -> torch.Tensor:
    slots = list(range(codes.shape[0]))
    core.reset(slots)
    out, at = [], 0
    for n in groups:
        out.append(core.step(slots, codes[:, :, at : at + n]))
        at += n
    out.append(core.flush(slots))
    return torch.cat(out, -1)[:, core.delay :]


@pytest.mark.usefixtures("few_interpreted_programs")
@settings(max_examples=2, deadline=None)
@given(
    groups=st.lists(st.integers(1, 8), min_size=2, max_size=6),
    seed=st.integers(0, 2**16),
    mode=st.sampled_from([True, "activation", "narrow"]),
)
def test_a_codec_with_fused_units_streams_the_whole_decode(
    codec: CodecDecoder, groups: list[int], seed: int, mode: FusedUnits
) -> None:
    groups = [*groups, max(1, MIN_FRAMES - sum(groups))]
    frames = sum(groups)
    codes = torch.randint(0, 1024, (2, 8, frames), generator=torch.Generator().manual_seed(seed))
    core = StreamingCodec(codec, 2, fused_units=mode)
    got = streamed(core, codes, groups)
    assert len(core.layers._unit_weights) == 12  # three units in each of four blocks
    # (every block's upsampling but the one of 160 input channels)
    assert len(core.layers._upsample_weights) == (4 if mode == "narrow" else 0)
    assert (core.layers._output_weights is not None) == (mode == "narrow")
    assert stepped_past_the_delay(core, frames) >= 10 * HOP
    assert rel(got, whole(codec, codes)) < FP32_ROUNDING


@pytest.mark.parametrize("mode", [True, "activation", "narrow"])
def test_slots_at_different_points_of_their_utterances_are_masked_apart(
    codec: CodecDecoder, mode: FusedUnits, request: pytest.FixtureRequest
) -> None:
    """One slot starts while the other is mid-utterance: the start mask is per slot
    and per sample, so each still streams its own whole decode (with ``True``, the
    units at their real launches: several programs a slot and step)."""
    if mode is not True:
        request.getfixturevalue("few_interpreted_programs")
    g = torch.Generator().manual_seed(7)
    lead, together = 8, MIN_FRAMES
    early = torch.randint(0, 1024, (8, lead + together), generator=g)
    late = torch.randint(0, 1024, (8, together), generator=g)
    core = StreamingCodec(codec, 2, fused_units=mode)
    core.reset([0, 1])
    first = [core.step([0], early[None, :, :lead])[0]]
    second = []
    for at in range(together):  # both slots in every call from here
        frame = torch.stack([early[:, lead + at : lead + at + 1], late[:, at : at + 1]])
        pcm = core.step([0, 1], frame)
        first.append(pcm[0])
        second.append(pcm[1])
    tail = core.flush([0, 1])
    got_early = torch.cat([*first, tail[0]])[core.delay :]
    got_late = torch.cat([*second, tail[1]])[core.delay :]
    assert stepped_past_the_delay(core, together) >= 10 * HOP
    assert rel(got_early, whole(codec, early[None])[0]) < FP32_ROUNDING
    assert rel(got_late, whole(codec, late[None])[0]) < FP32_ROUNDING


def test_without_a_gpu_or_the_interpreter_the_units_run_layer_by_layer(
    codec: CodecDecoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET")
    net = CausalDac(codec.acoustic_decoder, fused_units=True)
    unit = codec.acoustic_decoder.block[2].res_unit1
    assert unit.conv1.in_channels <= MAX_FUSED_CHANNELS
    assert net.unit_weights(unit, torch.zeros(1, unit.conv1.in_channels, 1)) is None
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert net.unit_weights(unit, torch.zeros(1, unit.conv1.in_channels, 1)) is not None
    wide = codec.acoustic_decoder.block[0].res_unit1  # 160 channels
    assert net.unit_weights(wide, torch.zeros(1, 160, 1)) is None
    assert net.unit_weights(unit, torch.zeros(1, 16, 1, dtype=torch.float64)) is None


# -- building the kernels before the first step ---------------------------------------


@pytest.mark.usefixtures("few_interpreted_programs")
def test_a_deferred_step_runs_no_kernel_and_builds_each_once(codec: CodecDecoder) -> None:
    """Inside ``deferred_launches`` a step records one launch per fused layer and
    runs none, so the fused output layer's audio is zeros; the launches build
    11 kernels: the units' two widths x three dilations, four upsamplings, one
    output layer. The kernels get every tensor dense and 16-byte aligned, the
    batch-1 slices of the state and the start mask too."""
    codes = torch.randint(0, 1024, (1, 8, MIN_FRAMES + 2), generator=torch.Generator())
    core = StreamingCodec(codec, 1, fused_units="narrow")
    core.reset([0])
    core.step([0], codes[:, :, :MIN_FRAMES])  # past the delay: a step's audio is not masked
    with deferred_launches() as launches:
        deferred = core.step([0], codes[:, :, MIN_FRAMES : MIN_FRAMES + 1])
    assert len(launches) == 12 + 4 + 1
    assert torch.count_nonzero(deferred) == 0
    tensors = [a for launch in launches for a in launch.args if isinstance(a, torch.Tensor)]
    assert all(t.is_contiguous() and t.data_ptr() % ALIGNMENT == 0 for t in tensors)
    assert build_launches(launches) == 6 + 4 + 1
    assert torch.count_nonzero(core.step([0], codes[:, :, MIN_FRAMES + 1 :])) > 0  # runs again


@pytest.mark.parametrize("mode", [False, "narrow"])
def test_slots_build_their_fused_kernels_before_warming_up(
    codec: CodecDecoder, mode: FusedUnits, caplog: pytest.LogCaptureFixture
) -> None:
    slots = CodecSlots(codec, 2, fused_units=mode)
    with caplog.at_level(logging.INFO, logger=codec_slots_logger.name):
        slots.warm_up()
    built = "built the codec's 11 fused kernels"
    assert (built in caplog.text) == (mode == "narrow")


@pytest.mark.usefixtures("few_interpreted_programs")
def test_a_failed_build_at_once_leaves_the_kernels_to_the_first_step(
    codec: CodecDecoder, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Building on threads is an optimisation: where it fails, the warm-up says
    so and goes on, and the step builds its kernels itself."""

    def failing_build(launches: list[Launch], workers: int | None = None) -> int:
        raise RuntimeError("ptxas died")

    monkeypatch.setattr(codec_slots, "build_launches", failing_build)
    slots = CodecSlots(codec, 2, fused_units="narrow")
    with caplog.at_level(logging.INFO, logger=codec_slots_logger.name):
        slots.warm_up()
    assert "building the codec's fused kernels at once failed: ptxas died" in caplog.text
    assert "built the codec's" not in caplog.text
    core = slots.stream_codec
    codes = torch.randint(0, 1024, (1, 8, MIN_FRAMES), generator=torch.Generator())
    core.reset([0])
    assert torch.count_nonzero(core.step([0], codes)) > 0  # the kernels ran


def test_where_the_kernels_do_not_run_nothing_is_built(
    codec: CodecDecoder, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET")  # a CPU: the narrow layers run layer by layer
    slots = CodecSlots(codec, 2, fused_units="narrow")
    with caplog.at_level(logging.INFO, logger=codec_slots_logger.name):
        slots.warm_up()
    assert "fused kernels" not in caplog.text
