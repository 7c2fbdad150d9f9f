"""The fused upsampling against the block's layers, one block at a time, and the
fused output layer against its layers.

For every decoder block the codec would fuse (up to 256 input channels: the
real codec's last three), at the inputs one frame brings it and ``--batch``
slots, this times one streaming step of the block's activation and transposed
convolution two ways, each compiled as the served step is and captured as a
CUDA graph, graph replays back to back:

- ``layers``: Snake, the transposed convolution as one matrix product and the
  overlap-add of its halves, the cached partial sums, the bias and the start
  mask, as the codec's step runs them (cuBLAS and Inductor's fused passes);
- ``fused``: :func:`~realtime_engine.codec.fused_upsample.fused_upsample`,
  for every launch in ``--tiles`` x ``--out-blocks`` x ``--warps`` (a tile
  of 0: the kernel's own choice; out blocks wider than a block's padded output
  channels are skipped).

Then the same for the output layer (Snake, the 7-tap convolution to the audio
and the mask, at the samples one frame brings it; row ``output``):
:func:`~realtime_engine.codec.fused_output.fused_output` for every tile and
warp count (its rows' ``out_block`` is 0: one output channel).

It reports microseconds a call, each launch's error against ``layers``
(relative to the peak, output and partial sums), the best launch per block
and the sum over the blocks: what fusing them would take off a codec step at
this batch. Writes ``$OUT/fused_upsample_bench.json``. ``--tiny`` runs the
tiny codec on the CPU through Triton's interpreter, eager and untimed (a
smoke check).

    python -m bench.gpu.fused_upsample_bench [--batch 256] [--precision tf32|fp16]
        [--tiles 0,16,32,64,128] [--out-blocks 32,64,128] [--warps 4,8] [--iters 200]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F

from bench.gpu.kernel_timing import (
    add_common_args,
    bench_codec,
    build_first,
    compiled_on_cuda,
    peak_error,
    timed,
    write_report,
)
from realtime_engine.codec.causal import CausalDac, conv_transpose_2s
from realtime_engine.codec.dac import DecoderBlock
from realtime_engine.codec.fused import snake
from realtime_engine.codec.fused_output import (
    MAX_FUSED_OUTPUT_CHANNELS,
    OutputWeights,
    fused_output,
)
from realtime_engine.codec.fused_upsample import (
    MAX_FUSED_IN_CHANNELS,
    UpsampleWeights,
    fused_upsample,
)


def step_inputs(
    block: DecoderBlock, batch: int, n: int, head: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """A step's new input, the cached partial sums, the output's start mask."""
    conv = block.conv_t1
    g = torch.Generator(device).manual_seed(0)
    x = torch.randn(batch, conv.in_channels, n, generator=g, device=device).to(dtype)
    partial = torch.randn(batch, conv.out_channels, conv.stride[0], generator=g, device=device)
    keep = (torch.rand(batch, head, generator=g, device=device) > 0.5).to(dtype)
    return x, partial.to(dtype), keep


def layers_step(block: DecoderBlock) -> Callable[..., torch.Tensor]:
    """The output and the new partial sums, concatenated (one tensor to compare)."""
    conv = block.conv_t1
    stride = conv.stride[0]
    bias = conv.bias
    assert bias is not None, "the codec's transposed convolutions have biases"

    def step(x: torch.Tensor, partial: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        n, head = x.shape[-1], keep.shape[-1]
        y = conv_transpose_2s(snake(x, block.snake1.alpha), conv.weight, stride)
        y[..., :stride] += partial
        out = y[..., : n * stride] + bias[:, None]
        out = torch.cat([out[..., :head] * keep[:, None], out[..., head:]], -1)
        return torch.cat([out, y[..., n * stride :]], -1)

    return step


def fused_step(
    weights: UpsampleWeights, tile: int, out_block: int, warps: int
) -> Callable[..., torch.Tensor]:
    def step(x: torch.Tensor, partial: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        y, carry = fused_upsample(
            weights, x, partial, keep, tile=tile or None, out_block=out_block, warps=warps
        )
        return torch.cat([y, carry], -1)

    return step


def samples_per_frame(net: CausalDac) -> int:
    strides: list[int] = [cast(DecoderBlock, b).conv_t1.stride[0] for b in net.dac.block]
    return math.prod(strides)


def output_inputs(
    net: CausalDac, batch: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """The output layer's activation history, a frame's new samples, the mask."""
    channels, mask = net.dac.conv2.in_channels, net.step_mask(1, torch.device("cpu"))
    lo, hi = mask.bounds[-1]
    g = torch.Generator(device).manual_seed(0)
    history = torch.randn(batch, channels, 6, generator=g, device=device).to(dtype)
    x = torch.randn(batch, channels, samples_per_frame(net), generator=g, device=device).to(dtype)
    keep = (torch.rand(batch, hi - lo, generator=g, device=device) > 0.5).to(dtype)
    return history, x, keep


def output_layers_step(net: CausalDac) -> Callable[..., torch.Tensor]:
    conv, alpha = net.dac.conv2, net.dac.snake1.alpha

    def step(history: torch.Tensor, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        full = torch.cat([history, snake(x, alpha)], -1)
        y = F.conv1d(full, conv.weight, conv.bias)[:, 0]
        head = keep.shape[-1]
        return torch.cat([y[:, :head] * keep, y[:, head:]], -1)

    return step


def output_fused_step(weights: OutputWeights, tile: int, warps: int) -> Callable[..., torch.Tensor]:
    def step(history: torch.Tensor, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return fused_output(weights, history, x, keep, tile=tile or None, warps=warps)

    return step


def time_output_layer(
    net: CausalDac, args: argparse.Namespace, tiles: list[int], warps: list[int], **on: Any
) -> list[dict[str, Any]]:
    """The output layer's rows: its layers, then every fused launch."""
    cuda = on["device"].type == "cuda"
    inputs = output_inputs(net, args.batch, on["dtype"], on["device"])
    layers = compiled_on_cuda(output_layers_step(net), cuda)
    us, want = timed(layers, inputs, args.iters, cuda)
    conv = net.dac.conv2
    base = {"block": "output", "in": conv.in_channels, "out": 1, "inputs": samples_per_frame(net)}
    rows = [{**base, "variant": "layers", "us": round(us, 2)}]
    weights = OutputWeights.of(net.dac.snake1, conv)
    launches = list(itertools.product(tiles, warps))
    build_first((output_fused_step(weights, *launch) for launch in launches), inputs)
    for tile, w in launches:
        us, got = timed(output_fused_step(weights, tile, w), inputs, args.iters, cuda)
        launch = {"tile": tile, "out_block": 0, "warps": w}
        rows.append({**base, "variant": "fused", **launch, "us": round(us, 2)})
        rows[-1]["error"] = peak_error(got, want)
    return rows


def fused_blocks(net: CausalDac) -> list[tuple[str, DecoderBlock, int, int]]:
    """(name, block, new inputs a frame, masked head) of every block the codec fuses."""
    dac, mask = net.dac, net.step_mask(1, torch.device("cpu"))
    rate, layer, found = 1, 1, []
    for b, module in enumerate(dac.block):
        block: DecoderBlock = module  # type: ignore[assignment]
        lo, hi = mask.bounds[layer]
        if block.conv_t1.in_channels <= MAX_FUSED_IN_CHANNELS:
            found.append((f"block{b}", block, rate, hi - lo))
        rate *= block.conv_t1.stride[0]
        layer += 4  # the transposed convolution's output and three units'
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    add_common_args(ap)
    ap.add_argument("--tiles", default="0,16,32,64,128")
    ap.add_argument("--out-blocks", default="32,64,128")
    ap.add_argument("--warps", default="4,8")
    args = ap.parse_args(argv)
    codec = bench_codec(args)
    device, cuda = codec.device, codec.device.type == "cuda"
    dtype = codec.fc2.weight.dtype
    tiles = [int(t) for t in args.tiles.split(",")]
    out_blocks = [int(b) for b in args.out_blocks.split(",")]
    warps = [int(w) for w in args.warps.split(",")]
    net = CausalDac(codec.acoustic_decoder)
    rows: list[dict[str, Any]] = []
    with torch.inference_mode(), codec.compute_context():
        for name, block, n, head in fused_blocks(net):
            inputs = step_inputs(block, args.batch, n, head, dtype, device)
            us, want = timed(compiled_on_cuda(layers_step(block), cuda), inputs, args.iters, cuda)
            conv = block.conv_t1
            base = {"block": name, "in": conv.in_channels, "out": conv.out_channels, "inputs": n}
            rows.append({**base, "variant": "layers", "us": round(us, 2)})
            weights = UpsampleWeights.of(block)
            launches = [
                (tile, out_block, w)
                for tile, out_block, w in itertools.product(tiles, out_blocks, warps)
                if out_block <= weights.out_padded
            ]
            build_first((fused_step(weights, *launch) for launch in launches), inputs)
            for tile, out_block, w in launches:
                us, got = timed(fused_step(weights, tile, out_block, w), inputs, args.iters, cuda)
                launch = {"tile": tile, "out_block": out_block, "warps": w}
                rows.append({**base, "variant": "fused", **launch, "us": round(us, 2)})
                rows[-1]["error"] = peak_error(got, want)
            print(json.dumps([r for r in rows if r["block"] == name]), flush=True)
        if net.dac.conv2.in_channels <= MAX_FUSED_OUTPUT_CHANNELS:
            rows += time_output_layer(net, args, tiles, warps, device=device, dtype=dtype)
            print(json.dumps([r for r in rows if r["block"] == "output"]), flush=True)
    report = {"batch": args.batch, "precision": args.precision, "rows": rows}
    report["summary"] = summary(rows)
    write_report(args, "fused_upsample_bench.json", report)
    return 0


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The best launch per block, the sum over the blocks, the saving."""
    layers = sum(r["us"] for r in rows if r["variant"] == "layers")
    best: dict[str, tuple[float, str]] = {}
    for r in rows:
        if r["variant"] != "fused":
            continue
        key = f"tile{r['tile']}:out{r['out_block']}x{r['warps']}"
        if r["block"] not in best or r["us"] < best[r["block"]][0]:
            best[r["block"]] = (r["us"], key)
    fused_best = sum(us for us, _ in best.values())
    return {
        "layers_us": round(layers, 2),
        "best_launch_by_block": best,
        "fused_best_us": round(fused_best, 2),
        "saving_us": round(layers - fused_best, 2),
        "worst_error": max((r["error"] for r in rows if r["variant"] == "fused"), default=0.0),
    }


if __name__ == "__main__":
    sys.exit(main())
