"""The fused residual unit against the unit layer by layer, one unit at a time.

For every residual unit the codec would fuse (up to 128 channels: the real
codec's last three blocks), at the samples one frame brings it and ``--batch``
slots, this times one streaming step of the unit two ways, each compiled as
the served step is and captured as a CUDA graph, graph replays back to back:

- ``layers``: the first activation and the history, the dilated convolution,
  the second activation, the 1×1 convolution, the delayed skip and the start
  mask, as PyTorch operators (cuDNN's convolutions and Inductor's fused passes,
  as served);
- ``fused``: the same first activation and history, then
  :func:`~realtime_engine.codec.fused_unit.fused_residual` (``branch``), or the
  kernel taking the first activation too (``activation``), for every launch in
  ``--tiles`` x ``--warps``.

It reports microseconds a call and each fused launch's error against
``layers`` (relative to the peak), the best launch per width, and the sum over
the units: what fusing them would take off a codec step at this batch.
Writes ``$OUT/fused_unit_bench.json``. ``--tiny`` runs the tiny codec on the
CPU through Triton's interpreter, eager and untimed (a smoke check).

    python -m bench.gpu.fused_unit_bench [--batch 256] [--precision tf32|fp16]
        [--tiles 32,64,128] [--warps 4,8] [--iters 200]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable
from typing import Any

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
from realtime_engine.codec.causal import CausalDac
from realtime_engine.codec.dac import DecoderBlock, ResidualUnit
from realtime_engine.codec.fused import snake
from realtime_engine.codec.fused_unit import (
    MAX_FUSED_CHANNELS,
    UnitWeights,
    fused_residual,
)


def unit_inputs(
    unit: ResidualUnit, batch: int, n: int, head: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """A step's new input, the activation's history, the skip's history, the mask."""
    c, d = unit.conv1.in_channels, unit.conv1.dilation[0]
    g = torch.Generator(device).manual_seed(0)
    x = torch.randn(batch, c, n, generator=g, device=device).to(dtype)
    history = torch.randn(batch, c, 6 * d, generator=g, device=device).to(dtype)
    skip = torch.randn(batch, c, 3 * d, generator=g, device=device).to(dtype)
    keep = (torch.rand(batch, head, generator=g, device=device) > 0.5).to(dtype)
    return x, history, skip, keep


def layers_step(unit: ResidualUnit) -> Callable[..., torch.Tensor]:
    def step(
        x: torch.Tensor, history: torch.Tensor, skip: torch.Tensor, keep: torch.Tensor
    ) -> torch.Tensor:
        full = torch.cat([history, snake(x, unit.snake1.alpha)], -1)
        z = F.conv1d(full, unit.conv1.weight, unit.conv1.bias, dilation=unit.conv1.dilation[0])
        y = F.conv1d(snake(z, unit.snake2.alpha), unit.conv2.weight, unit.conv2.bias)
        y = y + torch.cat([skip, x], -1)[..., : x.shape[-1]]
        head = keep.shape[-1]
        return torch.cat([y[..., :head] * keep[:, None], y[..., head:]], -1)

    return step


def first_activation(unit: ResidualUnit) -> Callable[..., torch.Tensor]:
    """The history followed by the new samples' first activation (one pass, as
    Inductor fuses it in the served step)."""

    def activation(x: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        return torch.cat([history, snake(x, unit.snake1.alpha)], -1)

    return activation


def fused_step(
    activation: Callable[..., torch.Tensor],
    weights: UnitWeights,
    activate: bool,
    tile: int,
    warps: int,
) -> Callable[..., torch.Tensor]:
    """The fused unit after its first activation, or (``activate``) taking it too
    (the codec then also activates the last ``history`` new samples for the
    state, a small pass left out here)."""

    def step(
        x: torch.Tensor, history: torch.Tensor, skip: torch.Tensor, keep: torch.Tensor
    ) -> torch.Tensor:
        if activate:
            return fused_residual(
                weights, history, skip, x, keep, activate=True, tile=tile, warps=warps
            )
        full = activation(x, history)
        return fused_residual(weights, full, skip, x, keep, tile=tile, warps=warps)

    return step


def fused_units(net: CausalDac) -> list[tuple[str, ResidualUnit, int, int]]:
    """(name, unit, new samples a frame, masked head) of every unit the codec fuses."""
    dac, mask = net.dac, net.step_mask(1, torch.device("cpu"))
    rate, layer, found = 1, 1, []
    for b, module in enumerate(dac.block):
        block: DecoderBlock = module  # type: ignore[assignment]
        rate *= block.conv_t1.stride[0]
        layer += 1  # the transposed convolution's output
        for u, unit in enumerate((block.res_unit1, block.res_unit2, block.res_unit3)):
            lo, hi = mask.bounds[layer]
            layer += 1
            if unit.conv1.in_channels <= MAX_FUSED_CHANNELS:
                found.append((f"block{b}.unit{u + 1}", unit, rate, hi - lo))
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    add_common_args(ap)
    ap.add_argument("--tiles", default="32,64,128")
    ap.add_argument("--warps", default="4,8")
    args = ap.parse_args(argv)
    codec = bench_codec(args)
    device, cuda = codec.device, codec.device.type == "cuda"
    dtype = codec.fc2.weight.dtype
    tiles = [int(t) for t in args.tiles.split(",")]
    warps = [int(w) for w in args.warps.split(",")]
    net = CausalDac(codec.acoustic_decoder)
    rows: list[dict[str, Any]] = []
    with torch.inference_mode(), codec.compute_context():
        for name, unit, n, head in fused_units(net):
            inputs = unit_inputs(unit, args.batch, n, head, dtype, device)
            us, want = timed(compiled_on_cuda(layers_step(unit), cuda), inputs, args.iters, cuda)
            base = {"unit": name, "channels": unit.conv1.in_channels, "samples": n}
            rows.append({**base, "variant": "layers", "us": round(us, 2)})
            weights = UnitWeights.of(unit)
            activation = compiled_on_cuda(first_activation(unit), cuda)
            launches = list(itertools.product((False, True), tiles, warps))
            build_first((fused_step(activation, weights, *launch) for launch in launches), inputs)
            for activate, tile, w in launches:
                step = fused_step(activation, weights, activate, tile, w)
                us, got = timed(step, inputs, args.iters, cuda)
                row = {**base, "variant": "fused", "activate": activate, "tile": tile}
                rows.append({**row, "warps": w, "us": round(us, 2)})
                rows[-1]["error"] = peak_error(got, want)
            print(json.dumps([r for r in rows if r["unit"] == name]), flush=True)
    report = {"batch": args.batch, "precision": args.precision, "rows": rows}
    report["summary"] = summary(rows)
    write_report(args, "fused_unit_bench.json", report)
    return 0


def launch_key(row: dict[str, Any]) -> str:
    mode = "activation" if row["activate"] else "branch"
    return f"{mode}:tile{row['tile']}x{row['warps']}"


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per launch, the sum over the units; the best launch per width; the saving."""
    layers = sum(r["us"] for r in rows if r["variant"] == "layers")
    launches: dict[str, float] = {}
    best: dict[int, tuple[float, str]] = {}
    for r in rows:
        if r["variant"] != "fused":
            continue
        key = launch_key(r)
        launches[key] = launches.get(key, 0.0) + r["us"]
    for channels in sorted({r["channels"] for r in rows}):
        by_launch: dict[str, float] = {}
        for r in rows:
            if r["variant"] == "fused" and r["channels"] == channels:
                key = launch_key(r)
                by_launch[key] = by_launch.get(key, 0.0) + r["us"]
        key = min(by_launch, key=lambda k: by_launch[k])
        best[channels] = (round(by_launch[key], 2), key)
    fused_best = sum(us for us, _ in best.values())
    return {
        "layers_us": round(layers, 2),
        "fused_us_by_launch": {k: round(v, 2) for k, v in launches.items()},
        "best_launch_by_channels": best,
        "fused_best_us": round(fused_best, 2),
        "saving_us": round(layers - fused_best, 2),
        "worst_error": max((r["error"] for r in rows if r["variant"] == "fused"), default=0.0),
    }


if __name__ == "__main__":
    sys.exit(main())
