"""The fused residual unit against the eager one, one unit's step at a time.

``one_unit_step`` runs a single :class:`ResidualUnit`'s step through the
streaming pass (eager or fused, as ``net.fused_units`` says), with the
start-of-utterance mask of a layer of the given rate and delay: the tests
compare the two with it. ``bench_units`` times both on CUDA, each captured
as a CUDA graph (as the codec step runs), at the codec's three fused
channel counts with their samples per frame::

        python -m realtime_engine.codec.fused_unit_bench --batch 64 256 --precision tf32

``--codec`` also times a whole streaming step of the Higgs-sized codec
(random weights, one frame per slot), with and without fused units, and
``--launch C:BLOCK_T:WARPS`` tries other launch shapes.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable

import torch

from realtime_engine.codec import fused_unit
from realtime_engine.codec.causal import CausalDac, _Pass, _StepMask
from realtime_engine.codec.dac import DacDecoder, ResidualUnit
from realtime_engine.codec.decoder import load_codec_decoder
from realtime_engine.codec.layout import CodecDims, random_codec_state_dict
from realtime_engine.codec.stream_core import StreamingCodec

# (channels, samples per frame) of the Higgs codec's last three blocks
CODEC_UNITS = ((128, 160), (64, 320), (32, 960))


def unit_net(fused_units: bool) -> CausalDac:
    """A streaming view whose activations serve any unit (the tiny decoder is
    only there to build one)."""
    return CausalDac(DacDecoder(CodecDims.tiny()), fused_units=fused_units)


def unit_mask(rate: int, layer_delay: int, frames: int, device: torch.device) -> _StepMask:
    """The start-of-utterance mask of a step of ``frames`` frames at a layer of
    ``rate`` samples per frame and cumulative delay ``layer_delay`` (built
    outside a graph capture: it copies from the host)."""
    return _StepMask([(rate, layer_delay)], frames, device)


def one_unit_step(
    net: CausalDac,
    unit: ResidualUnit,
    caches: list[torch.Tensor],
    frames_fed: torch.Tensor,
    x: torch.Tensor,
    layer: tuple[int, int, _StepMask],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``unit``'s step on ``x`` ([B, C, frames * rate]) as a pass reaches it at
    a layer ``(rate, layer_delay, unit_mask(rate, layer_delay, frames))``:
    (output, [new conv cache, new skip cache])."""
    rate, layer_delay, mask = layer
    step = _Pass(net, caches, frames_fed, final=False)
    step.step_mask = mask
    step.step_keep = step.step_mask.keep(frames_fed, caches[0].dtype)
    step.rate = rate
    step.delay = layer_delay - 3 * unit.conv1.dilation[0]  # what conv1 adds
    y = step._residual(unit, x)
    return y, step.new


def _graph_ms(fn: Callable[[], object], iters: int) -> float:
    """Mean milliseconds of a replay of ``fn`` captured as a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # compiles, packs weights, allocates
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _time_step(
    net: CausalDac,
    unit: ResidualUnit,
    args: tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, tuple[int, int, _StepMask]],
    iters: int,
) -> tuple[float, torch.Tensor]:
    """Milliseconds of the unit's step as a graph replay, and its output."""
    out: list[torch.Tensor] = []

    def step() -> None:
        out[:] = [one_unit_step(net, unit, *args)[0]]

    with torch.inference_mode():
        return _graph_ms(step, iters), out[0]


def bench_units(
    batch: int,
    precision: str = "tf32",
    frames: int = 1,
    iters: int = 200,
    device_name: str = "cuda",
) -> list[dict[str, float]]:
    """Per (channels, dilation): milliseconds of one unit's step, eager and
    fused, and the fused output's error relative to the eager peak. CUDA."""
    if precision not in ("tf32", "ieee"):
        raise ValueError(f"precision must be 'tf32' or 'ieee'; got {precision!r}")
    device = torch.device(device_name)
    tf32_before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = precision == "tf32"  # both paths follow it
    rows = []
    try:
        gen = torch.Generator(device).manual_seed(0)
        for channels, rate in CODEC_UNITS:
            for dilation in (1, 3, 9):
                unit = ResidualUnit(channels, dilation).to(device).eval()
                n = frames * rate

                def rand(*shape: int) -> torch.Tensor:
                    return torch.randn(*shape, device=device, generator=gen)

                caches = [rand(batch, channels, 6 * dilation), rand(batch, channels, 3 * dilation)]
                x = rand(batch, channels, n)
                fed = torch.randint(0, 3, (batch,), device=device, generator=gen)
                delay = 3 * dilation + n // 2  # masks part of a step at the start
                args = (caches, fed, x, (rate, delay, unit_mask(rate, delay, frames, device)))
                out, ms = {}, {}
                # fresh views: they cache per-module tensors by id, and ids of
                # freed units get reused
                for fused in (False, True):
                    net = unit_net(fused)
                    ms[fused], out[fused] = _time_step(net, unit, args, iters)
                peak = out[False].abs().max().clamp_min(1e-30)
                error = float((out[True] - out[False]).abs().max() / peak)
                rows.append(
                    {
                        "channels": channels,
                        "dilation": dilation,
                        "samples": n,
                        "eager_ms": ms[False],
                        "fused_ms": ms[True],
                        "error": error,
                    }
                )
    finally:
        torch.backends.cudnn.allow_tf32 = tf32_before
    return rows


def bench_codec(
    batch: int,
    precision: str = "tf32",
    iters: int = 50,
    dims: CodecDims | None = None,
    device_name: str = "cuda",
) -> dict[str, float]:
    """Milliseconds of one streaming step (one frame for ``batch`` slots, a
    CUDA graph replay) of a random codec (Higgs-sized by default), eager units
    and fused units, and the fused stream's error relative to the eager peak
    over 12 steps (past the start-of-utterance mask)."""
    device = torch.device(device_name)
    state = random_codec_state_dict(
        dims or CodecDims.higgs_v3(), torch.Generator().manual_seed(0), include_encoder=False
    )
    codec = load_codec_decoder(state, device)
    codec.set_precision("fp32" if precision == "ieee" else precision)
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(
        0, codec.dims.codebook_size, (batch, codec.dims.num_quantizers, 12), generator=gen
    )
    codes = codes.to(device)
    slots = torch.arange(batch, device=device)
    result: dict[str, float] = {}
    pcm: dict[bool, torch.Tensor] = {}
    for fused in (False, True):
        core = StreamingCodec(codec, batch, fused_units=fused)
        with torch.inference_mode():
            pcm[fused] = torch.cat([core.step(slots, codes[..., t : t + 1]) for t in range(12)], -1)
            frame = codes[..., :1].clone()
            step = functools.partial(core.step, slots, frame)
            result["fused_ms" if fused else "eager_ms"] = _graph_ms(step, iters)
    peak = pcm[False].abs().max().clamp_min(1e-30)
    result["error"] = float((pcm[True] - pcm[False]).abs().max() / peak)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--precision", choices=("tf32", "ieee"), default="tf32")
    parser.add_argument("--frames", type=int, default=1)
    parser.add_argument("--codec", action="store_true", help="also time a whole codec step")
    parser.add_argument("--launch", nargs="*", default=[], help="C:BLOCK_T:WARPS overrides")
    args = parser.parse_args()
    for shape in args.launch:
        channels, block_t, warps = (int(v) for v in shape.split(":"))
        fused_unit.LAUNCH[channels] = (block_t, warps)
    print("launch shapes (C: BLOCK_T, warps):", fused_unit.LAUNCH)
    print("batch channels dilation samples eager_ms fused_ms speedup error")
    for batch in args.batch:
        for r in bench_units(batch, args.precision, args.frames):
            print(
                f"{batch:5d} {r['channels']:8.0f} {r['dilation']:8.0f} {r['samples']:7.0f} "
                f"{r['eager_ms']:8.4f} {r['fused_ms']:8.4f} "
                f"{r['eager_ms'] / r['fused_ms']:7.2f} {r['error']:.1e}"
            )
    if args.codec:
        print("whole step, one frame a slot: batch eager_ms fused_ms error")
        for batch in args.batch:
            r = bench_codec(batch, args.precision)
            print(f"{batch:5d} {r['eager_ms']:8.3f} {r['fused_ms']:8.3f} {r['error']:.1e}")


if __name__ == "__main__":
    main()
