"""The DAC decoder as causal layers with cached state (pure functions).

Every "same"-padded convolution of :mod:`realtime_engine.codec.dac` becomes
a causal convolution over ``[cached input, new input]`` plus a fixed delay
(its right padding); a transposed convolution keeps the partial sums its
last input left in the next ``stride`` samples; a residual skip is delayed
to match its branch. So each output sample is computed once, and the
stream is the whole-utterance decode delayed by :attr:`CausalDac.delay`
samples (the right paddings, summed through the upsampling: 9458 samples,
9.85 frames, for the Higgs codec's strides).

A signal between layers is described by its rate ``R`` (samples per frame)
and cumulative delay ``D``: after ``F`` frames, the next sample a layer
emits is the whole decode's sample ``F * R - D`` at that layer. Samples at
negative positions are zeroed (``_mask``) so the next layer sees the zero
padding the whole decode sees there.

``advance(state, frames_fed, x)`` consumes new frames; ``tail(state,
frames_fed)`` is the right end a whole decode would produce if the
utterance ended now (every layer zero-padded on the right), without
changing ``state``. Both keep fixed shapes for a given batch size and
frame count and never synchronise with the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

from realtime_engine.codec.dac import DacDecoder, DecoderBlock, ResidualUnit, Snake1d
from realtime_engine.codec.fused import fused_snake
from realtime_engine.codec.fused_output import (
    MAX_FUSED_OUTPUT_CHANNELS,
    OutputWeights,
    fused_output,
)
from realtime_engine.codec.fused_unit import (
    FUSED_CHANNELS,
    FUSED_UNITS_VALUES,
    FusedUnits,
    UnitWeights,
    fused_residual,
    interpreting,
)
from realtime_engine.codec.fused_upsample import (
    FUSED_IN_CHANNELS,
    UpsampleWeights,
    fused_upsample,
)

State = list[torch.Tensor]  # one [B, C, L] tensor per cached buffer, in layer order

# Below this |alpha|, a residual unit keeps its second activation as it is:
# folding divides by alpha, and Snake's own 1e-9 guard would then differ.
_MIN_FOLDED_ALPHA = 1e-3


@dataclass(frozen=True)
class _FoldedUnit:
    """A residual unit's ``conv1`` scaled by its second activation's ``alpha``
    and ``conv2`` by ``1 / alpha`` (:meth:`CausalDac.folded_unit`)."""

    device: torch.device
    dtype: torch.dtype
    weight1: torch.Tensor
    bias1: torch.Tensor | None
    weight2: torch.Tensor

    @classmethod
    def of(cls, unit: ResidualUnit) -> _FoldedUnit:
        with torch.no_grad():
            alpha = unit.snake2.alpha.detach()
            dtype = alpha.dtype
            # products formed in at least float32, then rounded once (float16 weights)
            a = _widened(alpha).reshape(-1)
            conv1, conv2 = unit.conv1, unit.conv2
            bias1 = None if conv1.bias is None else (_widened(conv1.bias) * a).to(dtype)
            return cls(
                device=alpha.device,
                dtype=dtype,
                weight1=(_widened(conv1.weight) * a[:, None, None]).to(dtype),
                bias1=bias1,
                weight2=(_widened(conv2.weight) * torch.reciprocal(a)[None, :, None]).to(dtype),
            )

    def matches(self, alpha: torch.Tensor) -> bool:
        return self.device == alpha.device and self.dtype == alpha.dtype


@dataclass(frozen=True)
class BufferSpec:
    channels: int
    length: int


def _blocks(dac: DacDecoder) -> list[DecoderBlock]:
    return [cast(DecoderBlock, block) for block in dac.block]


def _units(block: DecoderBlock) -> tuple[ResidualUnit, ...]:
    return (block.res_unit1, block.res_unit2, block.res_unit3)


def _conv_history(conv: nn.Conv1d) -> int:
    return (conv.kernel_size[0] - 1) * conv.dilation[0]


def _conv_delay(conv: nn.Conv1d) -> int:
    pad = conv.padding
    assert isinstance(pad, tuple) and 2 * pad[0] == _conv_history(conv), "needs 'same' padding"
    return int(pad[0])


# How the products take their taps (CausalDac's ``gemm_taps``).
GemmTaps = Literal["gathered", "shifted"]
GEMM_TAPS_VALUES: Final = ("gathered", "shifted")
DEFAULT_GEMM_TAPS: Final[GemmTaps] = "shifted"


class CausalDac:
    """Streaming view of a :class:`DacDecoder` (shares its parameters).
    ``fused``: the activations run as one compiled kernel each (CUDA).
    ``channels_last``: the convolutions run as ``conv2d`` over channels-last
    inputs and weights (cuDNN's TF32 kernels read that layout; given
    ``[B, C, T]`` they transpose every input and output); an experiment until
    measured, off by default.
    ``gemm_channels``: convolutions of a kernel wider than 1 over at least this
    many input channels run as one matrix product over their gathered taps
    (:func:`conv1d_as_gemm`) instead of through cuDNN, whose float16 kernels
    for the first block's dilated convolutions, at a step's few samples per
    slot, are a slow generic fallback; None (the default): none do.
    ``gemm_taps``: how those products take their taps: ``"shifted"`` (the
    default; :func:`conv1d_as_shifted_gemms`, one product per tap over
    shifted views of the input, with no gathered copy, wherever that computes
    at most :data:`SHIFTED_MAX_HISTORY` times the outputs' rows again; the
    rest stay gathered) or ``"gathered"`` (:func:`conv1d_as_gemm`, one product
    over a copy of every tap everywhere).
    ``fused_units``: a step runs each residual unit of up to
    :data:`~realtime_engine.codec.fused_unit.FUSED_CHANNELS` channels as one
    Triton kernel (:func:`~realtime_engine.codec.fused_unit.fused_residual`; CUDA,
    or Triton's interpreter), after the unit's first activation (True) or taking
    it too (``"activation"``); ``"narrow"``: as ``"activation"``, and each
    block of up to :data:`~realtime_engine.codec.fused_upsample.FUSED_IN_CHANNELS`
    input channels starts with its activation and transposed convolution as one
    kernel (:func:`~realtime_engine.codec.fused_upsample.fused_upsample`), and
    the output layer is one too (:func:`~realtime_engine.codec.fused_output.fused_output`);
    off here; :class:`~realtime_engine.codec.stream_core.StreamingCodec` fuses
    every narrow layer on CUDA by default."""

    def __init__(
        self,
        dac: DacDecoder,
        fused: bool = False,
        channels_last: bool = False,
        gemm_channels: int | None = None,
        fused_units: FusedUnits = False,
        gemm_taps: GemmTaps = DEFAULT_GEMM_TAPS,
    ) -> None:
        if gemm_taps not in GEMM_TAPS_VALUES:
            raise ValueError(f"gemm_taps must be one of {GEMM_TAPS_VALUES}; got {gemm_taps!r}")
        if fused_units not in FUSED_UNITS_VALUES:
            raise ValueError(
                f"fused_units must be one of {FUSED_UNITS_VALUES}; got {fused_units!r}"
            )
        if gemm_channels is not None and gemm_channels < 1:
            raise ValueError(f"gemm_channels must be at least 1 or None; got {gemm_channels}")
        self.dac = dac
        self.fused = fused
        self.channels_last = channels_last
        self.gemm_channels = gemm_channels
        self.gemm_taps = gemm_taps
        self.fused_units = fused_units
        # The caches below are keyed by each module's name in ``dac``, not its id():
        # a compiled step reads them by key, the key names the compiled graph's
        # inputs, and torch.compile's cache misses on an id, new in every process.
        self._names = {id(module): name for name, module in dac.named_modules()}
        # each fused residual unit's and block's weights in its kernel's layout, by module
        self._unit_weights: dict[str, UnitWeights] = {}
        self._upsample_weights: dict[str, UpsampleWeights] = {}
        self._output_weights: OutputWeights | None = None
        # per (module, side): a convolution's (side 0) or a folded unit's conv1 and
        # conv2 (sides 1, 2) channels-last weight; modules live as long as this view
        self._nhwc: dict[tuple[str, int], torch.Tensor] = {}
        # the same keys: a product's weight as [K, I, O], one matrix per tap
        self._tap_weights: dict[tuple[str, int], torch.Tensor] = {}
        # 1 / alpha per activation, by module
        self._inverses: dict[str, torch.Tensor] = {}
        # Each foldable residual unit's convolutions with its second activation
        # folded in, made now: made first inside a CUDA graph's capture, they
        # would hold nothing until the graph's first replay.
        self._folded: dict[str, _FoldedUnit] = {
            self._key(unit): _FoldedUnit.of(unit)
            for block in _blocks(dac)
            for unit in _units(block)
            if self._may_fold(unit)
        }
        specs: list[BufferSpec] = []
        # per layer output, in order: (stride, lead) of an upsampling layer
        # or (1, -reach) of a conv, for cutting the tail short (see tail()).
        steps: list[tuple[int, int]] = [(1, -_conv_delay(dac.conv1))]
        delay = _conv_delay(dac.conv1)
        specs.append(BufferSpec(dac.conv1.in_channels, _conv_history(dac.conv1)))
        for block in _blocks(dac):
            conv_t = block.conv_t1
            stride = conv_t.stride[0]
            assert conv_t.kernel_size[0] == 2 * stride, "needs kernel = 2 * stride"
            specs.append(BufferSpec(conv_t.out_channels, stride))  # partial sums
            delay = delay * stride + int(conv_t.padding[0])
            steps.append((stride, int(conv_t.padding[0])))
            for unit in _units(block):
                specs.append(BufferSpec(unit.conv1.in_channels, _conv_history(unit.conv1)))
                specs.append(BufferSpec(unit.conv1.in_channels, _conv_delay(unit.conv1)))
                delay += _conv_delay(unit.conv1)
                steps.append((1, -_conv_delay(unit.conv1)))
        specs.append(BufferSpec(dac.conv2.in_channels, _conv_history(dac.conv2)))
        steps.append((1, -_conv_delay(dac.conv2)))
        self.delay = delay + _conv_delay(dac.conv2)
        self.buffers = tuple(specs)
        self._steps = tuple(steps)
        # (rate, delay) of each masked layer output, in the order a pass masks them
        self._layer_timing = _layer_timing(self._steps)
        self._step_masks: dict[tuple[int, torch.device], _StepMask] = {}

    def tail_lengths(self, samples: int) -> list[int]:
        """Per layer output, how much of its tail the first ``samples``
        samples of the output's tail depend on (counted from the tail's
        start, which every layer anchors at the same place)."""
        short = self.delay - samples  # samples at the end nobody needs
        shorts = [short]
        for stride, lead in reversed(self._steps[1:]):
            if stride == 1:  # a conv reaching ``-lead`` samples to the right
                short = max(0, short + lead)
            else:  # output j needs inputs up to (j + lead) // stride
                short = max(0, -((lead - 1 - short) // stride) - 1)
            shorts.append(short)
        full, lengths = 0, []
        for (stride, lead), short in zip(self._steps, reversed(shorts), strict=True):
            full = full * stride + lead if stride > 1 else full - lead
            lengths.append(max(0, full - short))
        return lengths

    def activation(self, snake: Snake1d, x: torch.Tensor) -> torch.Tensor:
        """Snake: ``x + sin(alpha x)^2 / alpha``, in four full passes (``alpha x``,
        ``sin``, times ``sin / alpha``, add) with ``1 / alpha`` computed once,
        against six kernels a call for the module's own expression."""
        if self.fused:
            return fused_snake(x, snake.alpha)
        s = torch.sin(snake.alpha * x)
        return torch.addcmul(x, s, s * self._inverse(snake))

    def folded_unit(self, unit: ResidualUnit) -> _FoldedUnit | None:
        """The unit's convolutions with its second activation's ``alpha`` folded
        in, or None where that is not exact enough: the fused activations, an
        ``alpha`` within ``_MIN_FOLDED_ALPHA`` of zero, and float64 (folding
        drops Snake's ``1e-9`` guard, a relative change of ``1e-9 / alpha``:
        under float32's resolution, not under float64's, which checks the
        streaming arithmetic itself).

        The second Snake's input is ``conv1``'s output ``c`` and its output
        feeds only the 1×1 ``conv2``, so with ``z = alpha c`` (``conv1``'s
        weights and bias times ``alpha``) the pair is ``conv2`` with its input
        channels times ``1 / alpha`` applied to ``z + sin(z)^2``: no
        broadcast multiply left, which on CUDA runs at a fraction of a
        contiguous pass's speed (RESULTS.md section 14). Nothing cached
        changes: ``conv1``'s output is never part of the state. Never reads
        a device value (the step is captured as a CUDA graph)."""
        alpha = unit.snake2.alpha
        cached = self._folded.get(self._key(unit))
        if cached is None or alpha.dtype == torch.float64:
            return None
        if not cached.matches(alpha):  # the codec moved or changed dtype since
            cached = self._folded[self._key(unit)] = _FoldedUnit.of(unit)
        return cached

    def unit_weights(self, unit: ResidualUnit, x: torch.Tensor) -> UnitWeights | None:
        """The unit's weights for :func:`fused_residual`, or None where the unit is
        not fused: :attr:`fused_units` off, wider than ``FUSED_CHANNELS``,
        float64, or ``x`` on the CPU without Triton's interpreter. Made on the first (eager)
        step, as :meth:`nhwc_weight`'s copies are."""
        if not self.fused_units or unit.conv1.in_channels > FUSED_CHANNELS:
            return None
        if not _kernels_run_on(x):
            return None
        cached = self._unit_weights.get(self._key(unit))
        if cached is None or not cached.matches(unit):
            cached = self._unit_weights[self._key(unit)] = UnitWeights.of(unit)
        return cached

    @property
    def units_take_activation(self) -> bool:
        """Whether a fused unit's kernel takes its first activation too."""
        return self.fused_units in ("activation", "narrow")

    def upsample_weights(self, block: DecoderBlock, x: torch.Tensor) -> UpsampleWeights | None:
        """The block's activation and transposed convolution for
        :func:`fused_upsample`, or None where they run layer by layer: not
        :attr:`fused_units` ``"narrow"``, over ``FUSED_IN_CHANNELS`` input
        channels, or as :meth:`unit_weights`. Made on the first (eager) step."""
        if self.fused_units != "narrow" or block.conv_t1.in_channels > FUSED_IN_CHANNELS:
            return None
        if not _kernels_run_on(x):
            return None
        cached = self._upsample_weights.get(self._key(block))
        if cached is None or not cached.matches(block):
            cached = self._upsample_weights[self._key(block)] = UpsampleWeights.of(block)
        return cached

    def output_weights(self, x: torch.Tensor) -> OutputWeights | None:
        """The output layer's activation and convolution for :func:`fused_output`,
        or None where they run layer by layer (as :meth:`upsample_weights`, over
        ``MAX_FUSED_OUTPUT_CHANNELS``)."""
        conv = self.dac.conv2
        if self.fused_units != "narrow" or conv.in_channels > MAX_FUSED_OUTPUT_CHANNELS:
            return None
        if not _kernels_run_on(x):
            return None
        cached = self._output_weights
        if cached is None or not cached.matches(conv):
            cached = self._output_weights = OutputWeights.of(self.dac.snake1, conv)
        return cached

    def _may_fold(self, unit: ResidualUnit) -> bool:
        """Whether ``unit``'s second activation may be folded (one host read of
        its ``alpha``, at construction; assumed so on the meta device)."""
        if self.fused:
            return False
        alpha = unit.snake2.alpha.detach()
        if alpha.is_meta:
            return True
        return bool((alpha.abs() >= _MIN_FOLDED_ALPHA).all())

    def _inverse(self, snake: Snake1d) -> torch.Tensor:
        """``1 / alpha``, computed when first needed on the parameter's device and
        dtype (build the streaming view after the weights are loaded)."""
        alpha = snake.alpha
        cached = self._inverses.get(self._key(snake))
        if cached is None or cached.device != alpha.device or cached.dtype != alpha.dtype:
            with torch.no_grad():
                cached = torch.reciprocal(_widened(alpha) + 1e-9).to(alpha.dtype)
            self._inverses[self._key(snake)] = cached
        return cached

    def as_gemm(self, conv: nn.Conv1d) -> bool:
        """Whether ``conv`` runs as one matrix product (see ``gemm_channels``)."""
        return (
            self.gemm_channels is not None
            and conv.kernel_size[0] > 1
            and conv.in_channels >= self.gemm_channels
        )

    def _key(self, module: nn.Module) -> str:
        """``module``'s name in the decoder: the same in every process."""
        return self._names[id(module)]

    def shifted(self, conv: nn.Conv1d, length: int) -> bool:
        """Whether a product of ``conv`` with ``length`` outputs a slot takes its
        taps as shifted views (see ``gemm_taps``)."""
        return self.gemm_taps == "shifted" and _conv_history(conv) <= SHIFTED_MAX_HISTORY * length

    def tap_weights(self, owner: nn.Module, side: int, weight: torch.Tensor) -> torch.Tensor:
        """``weight`` ``[O, I, K]`` as ``[K, I, O]``, contiguous: one ``[I, O]``
        matrix per tap, made once per ``owner`` and ``side`` (as
        :meth:`nhwc_weight`) and kept, outside any CUDA graph's capture."""
        key = (self._key(owner), side)
        cached = self._tap_weights.get(key)
        if cached is None or cached.device != weight.device or cached.dtype != weight.dtype:
            with torch.no_grad():
                cached = weight.detach().permute(2, 1, 0).contiguous()
            self._tap_weights[key] = cached
        return cached

    def nhwc_weight(self, owner: nn.Module, side: int, weight: torch.Tensor) -> torch.Tensor | None:
        """``weight`` ``[O, I, K]`` as ``[O, I, 1, K]`` in channels-last memory, made once
        per ``owner`` module and ``side`` (a convolution's own weight: 0; a folded
        residual unit's convolutions: 1 and 2) and kept; None unless
        :attr:`channels_last`. The first call must not be inside a CUDA
        graph's capture (the streaming paths run a step eagerly first)."""
        if not self.channels_last:
            return None
        key = (self._key(owner), side)
        cached = self._nhwc.get(key)
        if cached is None or cached.device != weight.device or cached.dtype != weight.dtype:
            with torch.no_grad():
                cached = weight.detach().unsqueeze(2).contiguous(memory_format=torch.channels_last)
            self._nhwc[key] = cached
        return cached

    def step_mask(self, frames: int, device: torch.device) -> _StepMask:
        """Where each layer's output may lie before the utterance's start, for a
        step of ``frames`` new frames (built once per frame count and device)."""
        key = (frames, device)
        mask = self._step_masks.get(key)
        if mask is None:
            mask = _StepMask(self._layer_timing, frames, device)
            self._step_masks[key] = mask
        return mask

    def advance(
        self, state: State, frames_fed: torch.Tensor, x: torch.Tensor
    ) -> tuple[torch.Tensor, State]:
        """x [B, C_in, n] (frames) -> (pcm [B, n * hop], the new state)."""
        return _Pass(self, state, frames_fed, final=False).run(x)

    def tail(
        self, state: State, frames_fed: torch.Tensor, samples: int | None = None
    ) -> torch.Tensor:
        """The last :attr:`delay` samples of a whole decode of the frames fed
        so far, or only the first ``samples`` of them (computing only what
        they depend on): [B, samples]."""
        samples = self.delay if samples is None else samples
        if not 0 < samples <= self.delay:
            raise ValueError(f"samples must be in [1, {self.delay}]; got {samples}")
        x = state[0].new_zeros(state[0].shape[0], state[0].shape[1], 0)
        keep = self.tail_lengths(samples)
        pcm, _ = _Pass(self, state, frames_fed, final=True, keep=keep).run(x)
        return pcm


def _kernels_run_on(x: torch.Tensor) -> bool:
    """Whether the fused kernels take ``x``: on CUDA or through Triton's
    interpreter, and not float64 (they accumulate in float32)."""
    if x.dtype == torch.float64:
        return False
    return x.device.type == "cuda" or interpreting()


def _widened(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached, in float32 if it is narrower (float64 stays float64)."""
    return t.detach().to(torch.promote_types(t.dtype, torch.float32))


def conv_transpose_2s(x: torch.Tensor, weight: torch.Tensor, stride: int) -> torch.Tensor:
    """conv_transpose1d for kernel 2 * stride, no bias: [B, C_in, n] ->
    [B, C_out, (n + 1) * stride] (fresh). One matmul, then each input's two
    halves overlap-added; PyTorch's CPU transposed convolution takes a path
    ~10x slower for some short inputs, which are the streaming shapes."""
    batch, _, n = x.shape
    c_out = weight.shape[1]
    cols = torch.matmul(x.transpose(1, 2), weight.reshape(weight.shape[0], -1))
    halves = cols.reshape(batch, n, c_out, 2, stride).permute(3, 0, 2, 1, 4)
    halves = halves.reshape(2, batch, c_out, n * stride)
    y = x.new_zeros(batch, c_out, (n + 1) * stride)
    y[..., : n * stride] = halves[0]
    y[..., stride:] += halves[1]
    return y


def _layer_timing(steps: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    """Per masked layer output, its rate (samples per frame) and cumulative delay."""
    rate, delay, timing = 1, 0, []
    for stride, lead in steps:
        if stride == 1:  # a conv reaching ``-lead`` samples to the right
            delay -= lead
        else:
            rate, delay = rate * stride, delay * stride + lead
        timing.append((rate, delay))
    return timing


class _StepMask:
    """Every layer's start-of-utterance mask of a step, as one computation: each
    layer's first ``min(frames * rate, delay)`` samples, concatenated, are kept
    where ``fed * rate - delay + j >= 0``. Four kernels a step instead of five
    per layer."""

    def __init__(self, timing: list[tuple[int, int]], frames: int, device: torch.device) -> None:
        rates, offsets, self.bounds = [], [], []
        at = 0
        for rate, delay in timing:
            head = min(frames * rate, delay)
            rates += [rate] * head
            offsets += [j - delay for j in range(head)]
            self.bounds.append((at, at + head))
            at += head
        self.rates = torch.tensor(rates, dtype=torch.int64, device=device)
        self.offsets = torch.tensor(offsets, dtype=torch.int64, device=device)

    def keep(self, frames_fed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[B, total heads]: 1 where a sample is at or after the start, else 0."""
        pos = frames_fed[:, None] * self.rates + self.offsets
        return (pos >= 0).to(dtype)


class _Pass:
    """One call through the layers: a step (``final=False``) or the tail."""

    def __init__(
        self,
        net: CausalDac,
        state: State,
        frames_fed: torch.Tensor,
        final: bool,
        keep: list[int] | None = None,
    ) -> None:
        self.net = net
        self.keep = keep or []
        self.layer = 0
        self.old = state
        self.new: State = []
        self.frames_fed = frames_fed
        self.final = final
        self.rate = 1
        self.delay = 0
        self.step_mask: _StepMask | None = None
        self.step_keep: torch.Tensor | None = None

    def _cached(self) -> torch.Tensor:
        return self.old[len(self.new)]

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, State]:
        dac = self.net.dac
        if not self.final and x.shape[-1] > 0:
            self.step_mask = self.net.step_mask(x.shape[-1], x.device)
            self.step_keep = self.step_mask.keep(self.frames_fed, self.old[0].dtype)
        x = self._conv(dac.conv1, x)
        for block in _blocks(dac):
            x = self._upsample(block, x)
            for unit in _units(block):
                x = self._residual(unit, x)
        x = self._output(x)
        return x[:, 0].to(self.old[0].dtype), self.new

    def _mask(self, x: torch.Tensor) -> torch.Tensor:
        """A layer's output: zero the samples before the utterance's start;
        on a cut tail, drop the samples no wanted output depends on."""
        # Only the first ``delay`` samples can lie before the start (frames_fed
        # >= 0); x is always a fresh tensor here, so mask it in place.
        head = min(x.shape[-1], self.delay)
        if self.step_mask is not None and self.step_keep is not None:
            lo, hi = self.step_mask.bounds[self.layer]
            assert hi - lo == head, "a step's layer lengths are fixed by its frame count"
            x[..., :head].mul_(self.step_keep[:, None, lo:hi].to(x.dtype))
        else:
            first = self.frames_fed * self.rate - self.delay  # [B]
            pos = first[:, None, None] + torch.arange(head, device=x.device)
            x[..., :head].mul_((pos >= 0).to(x.dtype))
        if self.keep:
            x = x[..., : self.keep[self.layer]]
        self.layer += 1
        return x

    def _conv(self, conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
        return self._mask(self._conv_unmasked(conv, x))

    def _output(self, x: torch.Tensor) -> torch.Tensor:
        """The output activation and convolution: ``[B, 1, n]``."""
        dac = self.net.dac
        if self.step_mask is not None:  # a step with new samples
            weights = self.net.output_weights(x)
            if weights is not None:
                return self._fused_output(weights, x)
        return self._conv(dac.conv2, self.net.activation(dac.snake1, x))

    def _fused_output(self, weights: OutputWeights, x: torch.Tensor) -> torch.Tensor:
        """:meth:`_output` of a step as one kernel, its start mask included; the
        state (the activation's last samples), timing and layer count advance
        as :meth:`_conv`'s."""
        assert self.step_mask is not None and self.step_keep is not None
        dac = self.net.dac
        cache = self._cached()
        history, n = cache.shape[-1], x.shape[-1]
        # the kernel activates x itself: only the new history's share here
        recent = self.net.activation(dac.snake1, x[..., max(0, n - history) :])
        self.new.append(torch.cat([cache, recent.to(cache.dtype)], dim=-1)[..., -history:])
        self.delay += _conv_delay(dac.conv2)
        lo, hi = self.step_mask.bounds[self.layer]
        assert hi - lo == min(n, self.delay), "fixed by the frame count"
        self.layer += 1
        return fused_output(weights, cache, x, self.step_keep[:, lo:hi])[:, None]

    def _upsample(self, block: DecoderBlock, x: torch.Tensor) -> torch.Tensor:
        """The block's activation and transposed convolution."""
        if self.step_mask is not None:  # a step with new samples
            weights = self.net.upsample_weights(block, x)
            if weights is not None:
                return self._fused_upsample(block.conv_t1, weights, x)
        return self._conv_t(block.conv_t1, self.net.activation(block.snake1, x))

    def _fused_upsample(
        self, conv: nn.ConvTranspose1d, weights: UpsampleWeights, x: torch.Tensor
    ) -> torch.Tensor:
        """:meth:`_upsample` of a step as one kernel, its start mask included;
        the state, timing and layer count advance as :meth:`_conv_t`'s."""
        assert self.step_mask is not None and self.step_keep is not None
        stride = conv.stride[0]
        self.rate *= stride
        self.delay = self.delay * stride + int(conv.padding[0])
        lo, hi = self.step_mask.bounds[self.layer]
        assert hi - lo == min(x.shape[-1] * stride, self.delay), "fixed by the frame count"
        self.layer += 1
        y, partial = fused_upsample(weights, x, self._cached(), self.step_keep[:, lo:hi])
        self.new.append(partial)
        return y

    def _conv_t(self, conv: nn.ConvTranspose1d, x: torch.Tensor) -> torch.Tensor:
        """Transposed conv: new inputs' sums plus the partial sums cached
        from the previous input; the last ``stride`` samples stay partial."""
        stride = conv.stride[0]
        lead = int(conv.padding[0])
        partial = self._cached()
        n = x.shape[-1]
        if n == 0:  # a cut tail may need only the cached partial sums
            y = partial
        else:
            y = conv_transpose_2s(x.to(partial.dtype), conv.weight, stride)
            y[..., :stride] += partial
        keep = n * stride + (lead if self.final else 0)
        self.new.append(y[..., n * stride :])
        out = y[..., :keep]
        out = out + conv.bias[:, None] if conv.bias is not None else out.clone()
        self.rate *= stride
        self.delay = self.delay * stride + lead
        return self._mask(out)

    def _residual(self, unit: ResidualUnit, x: torch.Tensor) -> torch.Tensor:
        act = self.net.activation
        if self.step_mask is not None:  # a step with new samples
            weights = self.net.unit_weights(unit, x)
            if weights is not None:
                return self._fused_residual(unit, weights, x)
        folded = self.net.folded_unit(unit)
        if folded is None:
            branch = unit.conv2(
                act(unit.snake2, self._conv_unmasked(unit.conv1, act(unit.snake1, x)))
            )
        else:
            z = self._conv_unmasked(
                unit.conv1, act(unit.snake1, x), folded.weight1, folded.bias1, owner=unit
            )
            s = torch.sin(z)
            nhwc = self.net.nhwc_weight(unit, 2, folded.weight2)
            branch = _conv1d(torch.addcmul(z, s, s), folded.weight2, unit.conv2.bias, 1, nhwc)
        cache = self._cached()  # the skip path's last ``lag`` inputs
        lag, n = cache.shape[-1], x.shape[-1]
        x = x.to(cache.dtype)
        if n < lag:
            skip = torch.cat([cache, x], dim=-1)
            self.new.append(skip[..., n:])
            return self._mask(skip[..., : branch.shape[-1]] + branch)
        # branch is fresh: add the delayed skip into it without a concatenation
        self.new.append(x[..., n - lag :])
        branch[..., :lag] += cache
        branch[..., lag:] += x[..., : branch.shape[-1] - lag]
        return self._mask(branch)

    def _fused_residual(
        self, unit: ResidualUnit, weights: UnitWeights, x: torch.Tensor
    ) -> torch.Tensor:
        """:meth:`_residual` of a step through one kernel for the branch, skip and
        mask; the state and the layer count advance as there."""
        assert self.step_mask is not None and self.step_keep is not None
        cache = self._cached()  # the first activation's last outputs
        history, n = cache.shape[-1], x.shape[-1]
        if self.net.units_take_activation:
            # the kernel activates x itself: only the new history's share here
            recent = self.net.activation(unit.snake1, x[..., max(0, n - history) :])
            self.new.append(torch.cat([cache, recent.to(cache.dtype)], dim=-1)[..., -history:])
            source, activate = cache, True
        else:
            act = self.net.activation(unit.snake1, x).to(cache.dtype)
            source, activate = torch.cat([cache, act], dim=-1), False
            self.new.append(source[..., n:])
        self.delay += _conv_delay(unit.conv1)
        skip = self._cached()  # the skip path's last ``lag`` inputs
        lag = skip.shape[-1]
        x = x.to(skip.dtype)
        self.new.append(torch.cat([skip, x], dim=-1)[..., n:] if n < lag else x[..., n - lag :])
        lo, hi = self.step_mask.bounds[self.layer]
        assert hi - lo == min(n, self.delay), "a step's layer lengths are fixed by its frame count"
        self.layer += 1
        keep = self.step_keep[:, lo:hi]
        return fused_residual(weights, source, skip, x, keep, activate=activate)

    def _conv_unmasked(
        self,
        conv: nn.Conv1d,
        x: torch.Tensor,
        weight: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        owner: nn.Module | None = None,
    ) -> torch.Tensor:
        """Causal conv over [cache, x]; on the tail, right zero padding too.
        Outputs before the utterance's start are junk until masked.
        ``weight``: instead of the layer's own (then ``bias`` too, and the
        folded unit ``owner`` its channels-last copy is kept for)."""
        delay = _conv_delay(conv)
        cache = self._cached()
        x = x.to(cache.dtype)
        parts = [cache, x]
        if self.final:
            parts.append(x.new_zeros(x.shape[0], x.shape[1], delay))
        full = torch.cat(parts, dim=-1)
        self.new.append(full[..., full.shape[-1] - cache.shape[-1] :])
        self.delay += delay
        if weight is None:
            weight, bias, owner, side = conv.weight, conv.bias, conv, 0
        else:
            assert owner is not None, "a weight of its own needs the unit it is kept for"
            side = 1
        if self.net.as_gemm(conv):
            if self.net.shifted(conv, full.shape[-1] - _conv_history(conv)):
                taps = self.net.tap_weights(owner, side, weight)
                return conv1d_as_shifted_gemms(full, taps, bias, conv.dilation[0])
            return conv1d_as_gemm(full, weight, bias, conv.dilation[0])
        nhwc = self.net.nhwc_weight(owner, side, weight)
        return _conv1d(full, weight, bias, conv.dilation[0], nhwc)


# ``gemm_channels`` for the real codec: its first convolution and first two blocks
# (256 to 1024 channels, 1 to 40 samples a frame)
GEMM_CHANNELS: Final = 256

# A codec's choice of matrix products: a threshold, None (none), or "auto" (by the
# weights' type, :func:`resolve_gemm_channels`).
GemmChannels = int | Literal["auto"] | None


# Shifted products compute every position of the input, the history's too, for
# each tap: ``history / length`` more rows than the outputs. Beyond this the
# gathered copy is the cheaper one (the real codec's first block, 40 samples a
# frame, stays within it at dilations 1, 3 and 9; the 8-sample block only at 1).
SHIFTED_MAX_HISTORY: Final = 1.5


def resolve_gemm_channels(value: GemmChannels, half_weights: bool) -> int | None:
    """``"auto"``: :data:`GEMM_CHANNELS` for float16 weights, else none. In float16,
    cuDNN runs the first block's dilated convolutions through a slow generic kernel
    and the products make the compiled step faster at every batch (0.54 / 1.05 /
    1.57 / 2.63 ms at 2 / 64 / 128 / 256 slots on an H200, against 0.62 / 1.55 /
    2.45 / 3.35 without); in TF32 they make it slower (3.63 against 3.26 ms at
    256). docs/bench/RESULTS.md, section 30."""
    if value == "auto":
        return GEMM_CHANNELS if half_weights else None
    return value


def conv1d_as_gemm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int
) -> torch.Tensor:
    """``F.conv1d(x, weight, bias, dilation=dilation)`` (stride 1, no padding) as
    one matrix product: every output column's ``K`` dilated taps gathered as
    ``[I * K, B * T]`` and multiplied by ``weight`` seen as ``[O, I * K]``. The
    result is ``[B, O, T]``, laid out as ``[O, B, T]`` (a permuted view).

    The taps are stacked from ``x`` seen as ``[I, B, L]``, so the stack is
    already ``[I, K, B, T]`` and the gather is one copy: stacked from
    ``[B, I, L]`` it needs a second, transposing copy (Inductor made both on
    CUDA: RESULTS.md section 30)."""
    out_channels, in_channels, taps = weight.shape
    batch, length = x.shape[0], x.shape[-1] - dilation * (taps - 1)
    by_channel = x.transpose(0, 1)  # [I, B, L], a view
    columns = torch.stack(
        [by_channel[..., k * dilation : k * dilation + length] for k in range(taps)], 1
    ).view(in_channels * taps, batch * length)
    y = (weight.reshape(out_channels, in_channels * taps) @ columns).view(
        out_channels, batch, length
    )
    if bias is not None:
        y = y + bias[:, None, None]
    return y.permute(1, 0, 2)


def conv1d_as_shifted_gemms(
    x: torch.Tensor, tap_weights: torch.Tensor, bias: torch.Tensor | None, dilation: int
) -> torch.Tensor:
    """``F.conv1d(x, weight, bias, dilation=dilation)`` (stride 1, no padding), with
    ``tap_weights`` the weight as ``[K, I, O]``, as ``K`` accumulated products
    with no copy of the taps: ``x`` laid out once as rows ``[B * L, I]`` (each
    slot's ``L`` samples, then zero rows for the last slot's history), tap ``k``
    is the rows shifted by ``k * dilation``. Every row gets an output, the rows
    of each slot's history too; only each slot's first ``L - history`` are
    kept. The result is ``[B, O, T]``, laid out as ``[B, T, O]`` (a permuted
    view)."""
    taps, in_channels, out_channels = tap_weights.shape
    batch, full = x.shape[0], x.shape[-1]
    history = dilation * (taps - 1)
    rows = torch.cat(
        [x.transpose(1, 2).reshape(batch * full, in_channels), x.new_zeros(history, in_channels)]
    )
    span = batch * full
    first = rows[:span]
    y = first @ tap_weights[0] if bias is None else torch.addmm(bias, first, tap_weights[0])
    for k in range(1, taps):
        y = torch.addmm(y, rows[k * dilation : k * dilation + span], tap_weights[k])
    return y.view(batch, full, out_channels)[:, : full - history].transpose(1, 2)


def _conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dilation: int,
    nhwc_weight: torch.Tensor | None,
) -> torch.Tensor:
    """``F.conv1d``; given ``nhwc_weight`` (``weight`` as ``[O, I, 1, K]``, channels-last),
    a ``conv2d`` over the input made channels-last, whose output stays so
    (``[B, O, T]`` with the channels innermost)."""
    if nhwc_weight is None:
        return F.conv1d(x, weight, bias, dilation=dilation)
    x = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
    return F.conv2d(x, nhwc_weight, bias, dilation=(1, dilation)).squeeze(2)
