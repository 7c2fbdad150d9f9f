"""StreamingCodec: per-slot cached layer state equals whole-utterance decoding
for any arrival pattern, batches slots, and keeps slots apart (reset, reuse,
save/restore for preemption, peek without side effects).

Exactness is checked in float64, where the streamed and the whole decode
agree to ~1e-12 of the peak whatever the grouping, so any error in the
state logic shows. In float32 both are rounding: on the tiny random codec a
whole fp32 decode is itself up to ~1.1e-5 of the peak away from the exact
(fp64) result, and the streamed one rounds differently (short convolutions
take other kernels), so the fp32 check allows 2e-5.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from realtime_engine.codec.causal import (
    GEMM_CHANNELS,
    conv1d_as_gemm,
    conv1d_as_shifted_gemms,
    resolve_gemm_channels,
)
from realtime_engine.codec.dac import ResidualUnit, Snake1d
from realtime_engine.codec.decoder import CodecDecoder, load_codec_decoder
from realtime_engine.codec.delay import apply_delay
from realtime_engine.codec.errors import CodecInputError
from realtime_engine.codec.fused_unit import FUSED_UNITS_VALUES, resolve_fused_units
from realtime_engine.codec.layout import CodecDims, random_codec_state_dict
from realtime_engine.codec.stream_core import StreamingCodec, frames_from_rows
from realtime_engine.codec.streaming import rows_to_frames
from realtime_engine.format import BOC, EOC

HOP = 960
EXACT_F64 = 1e-9
FP32_ROUNDING = 2e-5


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def codec32() -> CodecDecoder:
    sd = random_codec_state_dict(
        CodecDims.tiny(), torch.Generator().manual_seed(0), include_encoder=False
    )
    return load_codec_decoder(sd)


@pytest.fixture(scope="module")
def codec64(codec32: CodecDecoder) -> CodecDecoder:
    return copy.deepcopy(codec32).double()


def whole(codec: CodecDecoder, codes: torch.Tensor) -> torch.Tensor:
    """Whole-utterance decode [Q, T] -> [T * hop], in the codec's dtype."""
    with torch.inference_mode(), codec.compute_context():
        return codec.acoustic_decoder(codec.acoustic_input(codes[None]))[0, 0]


def streamed(
    core: StreamingCodec, slot: int, codes: torch.Tensor, groups: list[int]
) -> torch.Tensor:
    core.reset([slot])
    out, at = [], 0
    for n in groups:
        out.append(core.step([slot], codes[None, :, at : at + n])[0])
        at += n
    out.append(core.flush([slot])[0])
    return torch.cat(out)[core.delay :]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-12))


def random_codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 1024, (8, frames), generator=torch.Generator().manual_seed(seed))


@st.composite
def groupings(draw: st.DrawFn, max_frames: int = 40) -> tuple[int, list[int]]:
    """A frame count and a random split of it into arrival groups."""
    frames = draw(st.integers(1, max_frames))
    groups: list[int] = []
    while sum(groups) < frames:
        groups.append(draw(st.integers(1, frames - sum(groups))))
    return frames, groups


def test_delay_is_the_right_paddings_summed_through_the_upsampling(
    codec32: CodecDecoder,
) -> None:
    core = StreamingCodec(codec32, 1)
    # conv1 3 frames; each block: x stride + ceil(stride / 2), + 3 * (1 + 3 + 9); conv2 3
    delay = 3
    for stride in CodecDims.tiny().strides:
        delay = delay * stride + (stride + 1) // 2 + 39
    assert core.delay == delay + 3 == 9458
    assert 9 * HOP < core.delay <= 10 * HOP  # the +-10 frame receptive field


# the convolutions' forms (CausalDac): conv1d; conv2d over channels-last tensors;
# every convolution wider than one tap as one matrix product over gathered taps;
# as products over shifted views of the input where its history is short
LAYOUTS = {
    "conv1d": {},
    "channels_last": {"channels_last": True},
    "gemm": {"gemm_channels": 1, "gemm_taps": "gathered"},
    "shifted": {"gemm_channels": 1, "gemm_taps": "shifted"},
}


@pytest.mark.parametrize("layout", LAYOUTS)
@settings(max_examples=40, deadline=None)
@given(grouping=groupings(), seed=st.integers(0, 2**16))
def test_any_arrival_pattern_equals_whole_decode_f64(
    codec64: CodecDecoder, layout: str, grouping: tuple[int, list[int]], seed: int
) -> None:
    frames, groups = grouping
    codes = random_codes(frames, seed)
    core = StreamingCodec(codec64, 2, **LAYOUTS[layout])
    out = streamed(core, 1, codes, groups)
    assert out.shape == (frames * HOP,)
    assert rel(out, whole(codec64, codes)) < EXACT_F64


@pytest.mark.parametrize("layout", LAYOUTS)
@settings(max_examples=25, deadline=None)
@given(grouping=groupings(), seed=st.integers(0, 2**16))
def test_any_arrival_pattern_equals_whole_decode_fp32(
    codec32: CodecDecoder, layout: str, grouping: tuple[int, list[int]], seed: int
) -> None:
    frames, groups = grouping
    codes = random_codes(frames, seed)
    out = streamed(StreamingCodec(codec32, 1, **LAYOUTS[layout]), 0, codes, groups)
    assert out.dtype == torch.float32
    assert rel(out, codec32.decode(codes[None])[0, 0]) < FP32_ROUNDING


@settings(max_examples=15, deadline=None)
@given(lengths=st.lists(st.integers(1, 25), min_size=2, max_size=5), seed=st.integers(0, 999))
def test_slots_stepped_together_equal_each_alone(
    codec64: CodecDecoder, lengths: list[int], seed: int
) -> None:
    """Streams of different lengths share every call while they have frames;
    one frame per call per slot, the shape the talker's steps produce."""
    core = StreamingCodec(codec64, 2 * len(lengths))
    slots = [2 * i + 1 for i in range(len(lengths))][::-1]  # not 0..B-1, not sorted
    core.reset(slots)
    codes = [random_codes(n, seed + i) for i, n in enumerate(lengths)]
    out: list[list[torch.Tensor]] = [[] for _ in lengths]
    for t in range(max(lengths)):
        live = [i for i, n in enumerate(lengths) if t < n]
        pcm = core.step(
            [slots[i] for i in live], torch.stack([codes[i][:, t : t + 1] for i in live])
        )
        for row, i in enumerate(live):
            out[i].append(pcm[row])
        ended = [i for i, n in enumerate(lengths) if n == t + 1]
        if ended:
            for row, pcm_tail in zip(ended, core.flush([slots[i] for i in ended]), strict=True):
                out[row].append(pcm_tail)
    for i, parts in enumerate(out):
        got = torch.cat(parts)[core.delay :]
        assert rel(got, whole(codec64, codes[i])) < EXACT_F64


def test_peek_is_the_prefix_decode_and_changes_nothing(codec64: CodecDecoder) -> None:
    core = StreamingCodec(codec64, 1)
    codes = random_codes(30, seed=3)
    core.reset([0])
    parts = [core.step([0], codes[None, :, :12])[0]]
    edge = core.peek([0])[0]
    prefix = torch.cat([parts[0], edge])[core.delay :]
    assert rel(prefix, whole(codec64, codes[:, :12])) < EXACT_F64
    assert torch.equal(core.peek([0])[0], edge)  # peeking twice: same state
    parts += [core.step([0], codes[None, :, 12:])[0], core.flush([0])[0]]
    assert rel(torch.cat(parts)[core.delay :], whole(codec64, codes)) < EXACT_F64
    # the speculative edge is not the committed audio: it lacks right context
    assert rel(prefix[-5 * HOP :], whole(codec64, codes)[7 * HOP : 12 * HOP]) > 1e-4


@settings(max_examples=15, deadline=None)
@given(frames=st.integers(1, 20), samples=st.integers(1, 9458), seed=st.integers(0, 999))
def test_a_short_peek_is_the_start_of_the_full_one(
    codec64: CodecDecoder, frames: int, samples: int, seed: int
) -> None:
    """peek(slots, samples) computes only what its samples depend on."""
    core = StreamingCodec(codec64, 1)
    core.reset([0])
    core.step([0], random_codes(frames, seed)[None])
    full = core.peek([0])[0]
    part = core.peek([0], samples)[0]
    assert part.shape == (samples,)
    scale = max(float(full.abs().max()), 1e-3)  # the edge starts with zeros for short streams
    assert float((part - full[:samples]).abs().max()) < EXACT_F64 * scale
    with pytest.raises(ValueError):
        core.peek([0], core.delay + 1)


@settings(max_examples=15, deadline=None)
@given(cut=st.integers(1, 24), seed=st.integers(0, 999))
def test_reused_slot_keeps_nothing_of_an_aborted_stream(
    codec64: CodecDecoder, cut: int, seed: int
) -> None:
    core = StreamingCodec(codec64, 3)
    old, new = random_codes(25, seed), random_codes(17, seed + 1)
    core.reset([2])
    core.step([2], old[None, :, :cut])  # aborted mid-stream, never flushed
    assert rel(streamed(core, 2, new, [5, 1, 11]), whole(codec64, new)) < EXACT_F64


def test_stepping_a_slot_leaves_the_others_alone(codec64: CodecDecoder) -> None:
    core = StreamingCodec(codec64, 3)
    codes = random_codes(20, seed=4)
    core.reset([0, 1, 2])
    first = core.step([0], codes[None, :, :8])[0]
    before = core.save([1, 2])
    core.step([1], random_codes(9, seed=5)[None])
    core.reset([2])
    rest = [core.step([0], codes[None, :, 8:])[0], core.flush([0])[0]]
    assert rel(torch.cat([first, *rest])[core.delay :], whole(codec64, codes)) < EXACT_F64
    core.restore([1, 2], before)
    assert all(torch.count_nonzero(b[1:3]) == 0 for b in core.state)


@settings(max_examples=15, deadline=None)
@given(cut=st.integers(1, 29), seed=st.integers(0, 999))
def test_preempted_stream_resumes_in_another_slot(
    codec64: CodecDecoder, cut: int, seed: int
) -> None:
    """Save a slot mid-stream, give the slot to another stream, restore the
    saved state into a different slot and finish there: same audio."""
    core = StreamingCodec(codec64, 4)
    codes, intruder = random_codes(30, seed), random_codes(12, seed + 7)
    core.reset([0])
    parts = [core.step([0], codes[None, :, :cut])[0]]
    saved = core.save([0])
    assert rel(streamed(core, 0, intruder, [12]), whole(codec64, intruder)) < EXACT_F64
    core.restore([3], saved)
    if cut < 30:
        parts.append(core.step([3], codes[None, :, cut:])[0])
    parts.append(core.flush([3])[0])
    assert rel(torch.cat(parts)[core.delay :], whole(codec64, codes)) < EXACT_F64


def test_a_preempted_stream_can_also_be_recomputed(codec64: CodecDecoder) -> None:
    """Without a saved state, replaying the frames fed so far rebuilds it."""
    core = StreamingCodec(codec64, 2)
    codes = random_codes(26, seed=9)
    core.reset([0, 1])
    core.step([0], codes[None, :, :15])
    for t in range(15):  # the replay may group frames differently
        core.step([1], codes[None, :, t : t + 1])
    for a, b in zip(core.save([0]).buffers, core.save([1]).buffers, strict=True):
        assert float((a - b).abs().max()) <= 1e-9 * max(float(a.abs().max()), 1.0)
    assert torch.equal(core.frames_fed[0], core.frames_fed[1])


def test_growing_keeps_existing_slots(codec64: CodecDecoder) -> None:
    core = StreamingCodec(codec64, 1)
    codes = random_codes(14, seed=11)
    core.reset([0])
    first = core.step([0], codes[None, :, :6])[0]
    core.ensure_slots(5)
    assert core.max_slots >= 5 and all(b.shape[0] == core.max_slots for b in core.state)
    rest = [core.step([0], codes[None, :, 6:])[0], core.flush([0])[0]]
    assert rel(torch.cat([first, *rest])[core.delay :], whole(codec64, codes)) < EXACT_F64


@pytest.mark.parametrize(
    "codes",
    [
        torch.zeros(1, 7, 2, dtype=torch.int64),
        torch.zeros(1, 8, 2),
        torch.zeros(1, 8, 0, dtype=torch.int64),
        torch.full((1, 8, 2), 1024),
        torch.full((1, 8, 2), -1),
    ],
)
def test_untrusted_codes_are_checked_on_request(codec32: CodecDecoder, codes: torch.Tensor) -> None:
    core = StreamingCodec(codec32, 1)
    with pytest.raises(CodecInputError):
        core.check_codes(codes)
    core.check_codes(torch.full((2, 8, 3), 1023))


def test_bad_sizes_are_refused(codec32: CodecDecoder) -> None:
    with pytest.raises(ValueError):
        StreamingCodec(codec32, 0)
    core = StreamingCodec(codec32, 2)
    with pytest.raises(ValueError):
        core.restore([0, 1], core.save([0]))


def test_numpy_whole_decode_matches(codec32: CodecDecoder) -> None:
    codes = random_codes(9, seed=1)
    a = codec32.decode_numpy(codes[None].numpy())[0]
    b = whole(codec32, codes).numpy()
    assert np.array_equal(a, b)


@settings(max_examples=20, deadline=None)
@given(lengths=st.lists(st.integers(1, 12), min_size=1, max_size=4), seed=st.integers(0, 999))
def test_device_de_delay_equals_the_host_one(lengths: list[int], seed: int) -> None:
    """frames_from_rows, one frame per stream per call from padded row
    buffers, gives the frames rows_to_frames gives (stray BOC/EOC -> 0)."""
    rng = np.random.default_rng(seed)
    raws = [rng.integers(0, 1024, size=(n, 8)) for n in lengths]
    for raw in raws:
        stray = rng.random(raw.shape) < 0.1
        stray[:, 0] = False
        raw[stray] = rng.choice([BOC, EOC, -1], size=int(stray.sum()))
    rows = [apply_delay(raw) for raw in raws]
    buffer = torch.full((len(rows), max(len(r) for r in rows), 8), -7, dtype=torch.int64)
    for i, r in enumerate(rows):
        buffer[i, : len(r)] = torch.from_numpy(r)
    for t in range(min(lengths)):
        got = frames_from_rows(buffer, torch.full((len(rows),), t))
        for i, r in enumerate(rows):
            assert got[i, :, 0].tolist() == rows_to_frames(r)[:, t].tolist()


class _ScalarReads(TorchDispatchMode):
    """Records every read of a tensor value into Python (.item(), int(),
    bool(), a data-dependent shape): on a GPU each one is a host sync."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default):
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_hot_path_never_reads_device_values(codec32: CodecDecoder) -> None:
    core = StreamingCodec(codec32, 4)
    slots = torch.tensor([3, 1])
    rows = torch.randint(0, 1024, (2, 20, 8))
    with _ScalarReads() as mode:
        core.reset(slots)
        for t in range(3):
            core.step(slots, frames_from_rows(rows, torch.full((2,), t)))
        core.step(slots, torch.randint(0, 1024, (2, 8, 4)))
        core.peek(slots, 5000)
        saved = core.save(slots)
        core.restore(slots, saved)
        core.flush(slots)
    assert mode.reads == []
    with _ScalarReads() as mode:
        core.check_codes(torch.zeros(2, 8, 1, dtype=torch.int64))  # the explicit check does
    assert mode.reads


_FUSED_CHECK = """
import torch
from streaming_support import random_tiny_codec
from realtime_engine.codec.stream_core import StreamingCodec

codec = random_tiny_codec()
codes = torch.randint(0, 1024, (2, 8, 12), generator=torch.Generator().manual_seed(7))
out = {}
for fused in (False, True):
    sc = StreamingCodec(codec, 2, fused=fused)
    pcm = [sc.step([0, 1], codes[:, :, t : t + 1]) for t in range(12)]
    pcm += [sc.peek([0, 1], 5000), sc.flush([0, 1])]
    out[fused] = torch.cat(pcm, dim=-1).double()
error = (out[True] - out[False]).abs().max() / out[False].abs().max()
print(float(error))
"""


def test_fused_activations_give_the_eager_stream() -> None:
    """The Triton activation kernel (the CUDA path's), run by Triton's interpreter
    on the CPU, changes only float32 rounding: steps, a peek and the flush."""
    pytest.importorskip("triton", reason="the activation kernel is Triton's (a vLLM dependency)")
    from vllm_support.cpu_env import SUPPORT_DIR, cpu_vllm_env

    env = {**os.environ, **cpu_vllm_env()}
    env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT_DIR.parent), env["PYTHONPATH"]])
    done = subprocess.run(
        [sys.executable, "-c", _FUSED_CHECK], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip().splitlines()[-1]) < 1e-5


def _codec_with_alphas(codec32: CodecDecoder, seed: int) -> CodecDecoder:
    """``codec32`` with every activation's ``alpha`` drawn from ±[0.2, 3] (signs
    mixed), and one residual unit's second activation with a channel near zero."""
    codec = copy.deepcopy(codec32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in codec.modules():
            if isinstance(module, Snake1d):
                size = module.alpha.shape
                sign = torch.where(torch.rand(size, generator=g) < 0.3, -1.0, 1.0)
                module.alpha.copy_(sign * (0.2 + 2.8 * torch.rand(size, generator=g)))
        first_unit = codec.acoustic_decoder.block[0].res_unit1
        first_unit.snake2.alpha[0, 0, 0] = 1e-5
    return codec


@settings(max_examples=8, deadline=None)
@given(grouping=groupings(), seed=st.integers(0, 2**16))
def test_folded_activations_keep_the_stream_the_whole_decode(
    codec32: CodecDecoder, grouping: tuple[int, list[int]], seed: int
) -> None:
    """Each residual unit's second Snake folded into its convolutions (float32):
    still the whole decode, computed without folding in float64, to float32
    rounding; a unit whose ``alpha`` comes near zero keeps its activation."""
    codec = _codec_with_alphas(codec32, seed)
    frames, groups = grouping
    codes = random_codes(frames, seed)
    core = StreamingCodec(codec, 2)
    units = [m for m in codec.modules() if isinstance(m, ResidualUnit)]
    folded = [core.layers.folded_unit(unit) is not None for unit in units]
    assert folded == [False] + [True] * (len(units) - 1)
    exact = copy.deepcopy(codec).double()
    exact_layers = StreamingCodec(exact, 1).layers
    assert all(
        exact_layers.folded_unit(m) is None for m in exact.modules() if isinstance(m, ResidualUnit)
    )
    out = streamed(core, 1, codes, groups)
    assert rel(out, whole(exact, codes)) < FP32_ROUNDING


@pytest.fixture(scope="module")
def codec16(codec32: CodecDecoder) -> CodecDecoder:
    """The codec as ``set_precision("fp16")`` leaves it on CUDA: float16 weights."""
    return copy.deepcopy(codec32).half()


# The tiny random codec in float16 is ~1-2e-2 of its peak from the exact decode of
# the same (rounded) weights, whole or streamed: activation rounding, amplified by
# its random gains (the real-size random codec: ~2e-3). A state carried wrongly
# between steps is off by the order of the peak.
FP16_ROUNDING = 4e-2


@settings(max_examples=10, deadline=None)
@given(grouping=groupings(), seed=st.integers(0, 2**16))
def test_a_float16_codec_streams_in_float16_state_to_its_whole_decode(
    codec16: CodecDecoder, grouping: tuple[int, list[int]], seed: int
) -> None:
    frames, groups = grouping
    codes = random_codes(frames, seed)
    core = StreamingCodec(codec16, 2)
    out = streamed(core, 1, codes, groups)
    assert core.flat.dtype == torch.float16 and out.dtype == torch.float16
    exact = copy.deepcopy(codec16).double()
    assert rel(out, whole(exact, codes)) < FP16_ROUNDING


def test_float16_folded_weights_are_float32_products_rounded_once(
    codec16: CodecDecoder,
) -> None:
    """Folding ``alpha`` into float16 weights multiplies in float32 and rounds
    once; in float16, ``1 / alpha`` would be rounded before the product."""
    core = StreamingCodec(codec16, 1)
    unit = codec16.acoustic_decoder.block[1].res_unit2
    folded = core.layers.folded_unit(unit)
    assert folded is not None and folded.weight1.dtype == torch.float16
    alpha = unit.snake2.alpha.detach().float().reshape(-1)
    assert torch.equal(folded.weight1, (unit.conv1.weight.float() * alpha[:, None, None]).half())
    inverse = torch.reciprocal(alpha)[None, :, None]
    assert torch.equal(folded.weight2, (unit.conv2.weight.float() * inverse).half())


# in inference mode the convolutions reach the dispatcher as these (not decomposed)
_CONVOLUTIONS = (
    torch.ops.aten.conv1d.default,
    torch.ops.aten.conv2d.default,
    torch.ops.aten.convolution.default,
)


class _ConvolutionInputs(TorchDispatchMode):
    """Records each convolution's input: its rank and whether it is channels-last."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[tuple[int, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _CONVOLUTIONS:
            x = args[0]
            self.inputs.append((x.dim(), x.is_contiguous(memory_format=torch.channels_last)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("channels_last", [False, True])
def test_channels_last_runs_every_convolution_on_channels_last_input(
    codec32: CodecDecoder, channels_last: bool
) -> None:
    # the layout is what the option buys (cuDNN transposes anything else): check
    # it is what the convolutions get, in a step and in a tail
    core = StreamingCodec(codec32, 2, channels_last=channels_last)
    core.reset([0, 1])
    with _ConvolutionInputs() as mode:
        core.step([0, 1], torch.randint(0, 1024, (2, 8, 2)))
        core.peek([0, 1])
    assert mode.inputs
    if channels_last:
        assert set(mode.inputs) == {(4, True)}
    else:
        assert {rank for rank, _ in mode.inputs} == {3}


# a convolution's product forms, given x, the weight [O, I, K], the bias, the dilation
PRODUCT_FORMS = {
    "gathered": conv1d_as_gemm,
    "shifted": lambda x, weight, b, dilation: conv1d_as_shifted_gemms(
        x, weight.permute(2, 1, 0).contiguous(), b, dilation
    ),
}


@pytest.mark.parametrize("form", PRODUCT_FORMS)
@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 3),
    in_channels=st.integers(1, 6),
    out_channels=st.integers(1, 5),
    taps=st.integers(1, 7),
    dilation=st.integers(1, 9),
    length=st.integers(1, 12),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_a_convolution_as_matrix_products_equals_conv1d(
    form: str,
    batch: int,
    in_channels: int,
    out_channels: int,
    taps: int,
    dilation: int,
    length: int,
    bias: bool,
    seed: int,
) -> None:
    # shifted: no slot's outputs may take a neighbour's samples or the trailing zero rows
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, in_channels, length + dilation * (taps - 1), generator=g).double()
    weight = torch.randn(out_channels, in_channels, taps, generator=g).double()
    b = torch.randn(out_channels, generator=g).double() if bias else None
    got = PRODUCT_FORMS[form](x, weight, b, dilation)
    assert got.shape == (batch, out_channels, length)
    torch.testing.assert_close(got, F.conv1d(x, weight, b, dilation=dilation), rtol=0, atol=1e-12)


class _Products(TorchDispatchMode):
    """Records each matrix product's inner dimension."""

    def __init__(self) -> None:
        super().__init__()
        self.inner: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.matmul.default, torch.ops.aten.mm.default):
            self.inner.append(int(args[0].shape[-1]))
        elif func is torch.ops.aten.addmm.default:
            self.inner.append(int(args[1].shape[-1]))
        return func(*args, **(kwargs or {}))


def test_shifted_taps_take_only_the_products_with_a_short_history(codec32: CodecDecoder) -> None:
    # gathered, a product's inner dimension is I * K; shifted, it is I, once per
    # tap. A step of 2 frames: the first convolution (6 samples of history for 2
    # outputs) and the first block's last unit (54 for 16) stay gathered; every
    # later convolution wider than a tap is shifted.
    gathered = StreamingCodec(codec32, 2, gemm_channels=1, gemm_taps="gathered")
    shifted = StreamingCodec(codec32, 2, gemm_channels=1, gemm_taps="shifted")
    codes = torch.randint(0, 1024, (2, 8, 2))
    counts, audio = [], []
    for core in (gathered, shifted):
        core.reset([0, 1])
        with _Products() as mode:
            audio.append(core.step([0, 1], codes))
        counts.append(mode.inner)
    # the one-tap convolutions' products (inner I, not a multiple of the tiny
    # codec's channels times 7) are no taps' and stay as they are
    wide = [n for n in counts[0] if n % 7 == 0]
    assert len(wide) > 4
    expected, seen = [], 0
    for n in counts[0]:
        if n % 7:
            expected.append(n)
            continue
        # in order: the first convolution, the first block's three units, the rest
        expected += [n] if seen in (0, 3) else [n // 7] * 7
        seen += 1
    assert counts[1] == expected
    torch.testing.assert_close(audio[1], audio[0], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="gemm_taps"):
        StreamingCodec(codec32, 1, gemm_taps="shift")  # type: ignore[arg-type]


def test_gemm_channels_takes_the_wide_convolutions_from_cudnn(codec32: CodecDecoder) -> None:
    # what the option buys is that those convolutions are no convolution calls:
    # count them in a step and a tail, with every wide one (16 channels or more) taken
    core = StreamingCodec(codec32, 2, gemm_channels=16)
    plain = StreamingCodec(codec32, 2)
    codes = torch.randint(0, 1024, (2, 8, 2))
    counts = []
    for c in (plain, core):
        c.reset([0, 1])
        with _ConvolutionWeights() as mode:
            c.step([0, 1], codes)
            c.peek([0, 1])
        counts.append(mode.shapes)
    wide = [s for s in counts[0] if s[2] > 1 and s[1] >= 16]
    assert wide, "the tiny codec has convolutions of 16 channels or more"
    assert counts[1] == [s for s in counts[0] if s not in wide]
    with pytest.raises(ValueError, match="gemm_channels"):
        StreamingCodec(codec32, 1, gemm_channels=0)


def test_a_float16_codec_takes_the_matrix_products_by_default(
    codec32: CodecDecoder, codec16: CodecDecoder
) -> None:
    # float16: cuDNN's kernels for the wide dilated convolutions are slow fallbacks,
    # so "auto" (the default) takes the products; float32 and TF32 keep cuDNN
    assert StreamingCodec(codec16, 1).layers.gemm_channels == GEMM_CHANNELS
    assert StreamingCodec(codec32, 1).layers.gemm_channels is None
    # an explicit choice wins either way
    assert StreamingCodec(codec16, 1, gemm_channels=None).layers.gemm_channels is None
    assert StreamingCodec(codec32, 1, gemm_channels=64).layers.gemm_channels == 64
    assert resolve_gemm_channels("auto", half_weights=True) == GEMM_CHANNELS
    assert resolve_gemm_channels("auto", half_weights=False) is None


def test_the_narrow_layers_are_fused_by_default_on_cuda_only(
    codec32: CodecDecoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Triton's interpreter runs the kernels on the CPU, but only for tests that
    # ask: the default stays layer by layer off CUDA, interpreter or not
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert StreamingCodec(codec32, 1).layers.fused_units is False
    assert StreamingCodec(codec32, 1, fused_units="narrow").layers.fused_units == "narrow"
    assert resolve_fused_units("auto", torch.device("cuda")) == "narrow"
    assert resolve_fused_units("auto", torch.device("cpu")) is False
    for explicit in FUSED_UNITS_VALUES:
        assert resolve_fused_units(explicit, torch.device("cuda")) == explicit


def test_the_products_shift_their_taps_by_default(codec32: CodecDecoder) -> None:
    assert StreamingCodec(codec32, 1, gemm_channels=16).layers.gemm_taps == "shifted"
    assert StreamingCodec(codec32, 1, gemm_taps="gathered").layers.gemm_taps == "gathered"


class _ConvolutionWeights(TorchDispatchMode):
    """Records each convolution's weight shape ``(O, I, K)``."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _CONVOLUTIONS:
            self.shapes.append(tuple(args[1].shape))
        return func(*args, **(kwargs or {}))
