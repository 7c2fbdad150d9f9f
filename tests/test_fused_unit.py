"""The fused residual-unit kernel (the CUDA codec step's), run by Triton's
interpreter on the CPU, equals the eager streaming pass up to float32
rounding: one unit's steps (output and both new caches, through the
start-of-utterance mask), and a whole streaming codec's steps, peek and
flush. Each check runs in a subprocess with the interpreter's environment,
and counts the kernel's launches so that a silent fallback to the eager
path fails."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_COUNT_LAUNCHES = """
import torch
from realtime_engine.codec import fused_unit

launches = []
_step = fused_unit.fused_residual_step

def counted(*args, **kwargs):
    launches.append(args[0].shape)
    return _step(*args, **kwargs)

fused_unit.fused_residual_step = counted

def peak_error(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())
"""

_UNIT_CHECK = (
    _COUNT_LAUNCHES
    + """
from realtime_engine.codec.dac import ResidualUnit
from realtime_engine.codec.fused_unit_bench import one_unit_step, unit_mask, unit_net

gen = torch.Generator().manual_seed(3)
nets = {fused: unit_net(fused) for fused in (False, True)}
units, worst, steps = [], 0.0, 0
for channels in (32, 64):
    for dilation in (1, 3, 9):
        unit = ResidualUnit(channels, dilation)
        units.append(unit)  # alive: the streaming view caches by module id
        with torch.no_grad():
            for snake in (unit.snake1, unit.snake2):
                snake.alpha.uniform_(0.3, 3.0, generator=gen)
        batch, rate = 3, 37 if channels == 32 else 5  # 37: some steps span tiles
        delay = 3 * dilation + 2 * rate + 3  # the mask spans steps
        caches = {f: [torch.zeros(batch, channels, 6 * dilation),
                      torch.randn(batch, channels, 3 * dilation, generator=gen)]
                  for f in (False, True)}
        caches[True] = [c.clone() for c in caches[False]]
        fed = torch.tensor([0, 1, 5])  # rows at and after the utterance's start
        for step in range(4):
            frames = int(torch.randint(1, 5, (), generator=gen))
            x = torch.randn(batch, channels, frames * rate, generator=gen)
            layer = (rate, delay, unit_mask(rate, delay, frames, x.device))
            out = {}
            with torch.inference_mode():
                for fused, net in nets.items():
                    y, new = one_unit_step(net, unit, caches[fused], fed, x, layer)
                    caches[fused] = new
                    out[fused] = [y, *new]
            if step == 0:  # row 0 is at the utterance's start
                assert (out[False][0][0, :, :delay] == 0).all(), "the mask is untested"
            for got, want in zip(out[True], out[False], strict=True):
                assert got.shape == want.shape, (got.shape, want.shape)
                worst = max(worst, peak_error(got, want))
            fed = fed + frames
            steps += 1
assert len(launches) == steps, (len(launches), steps)
print(worst)
"""
)

_CODEC_CHECK = (
    _COUNT_LAUNCHES
    + """
import dataclasses
from realtime_engine.codec.decoder import load_codec_decoder
from realtime_engine.codec.layout import CodecDims, random_codec_state_dict
from realtime_engine.codec.stream_core import StreamingCodec

# the tiny codec's strides and kernels, with units of 64 and 32 channels
dims = dataclasses.replace(CodecDims.tiny(), decoder_channels=(128, 64, 32, 32, 32, 32))
state = random_codec_state_dict(dims, torch.Generator().manual_seed(0), include_encoder=False)
codec = load_codec_decoder(state)
codec64 = load_codec_decoder(state).to(dtype=torch.float64)
codes = torch.randint(0, 1024, (2, 8, 12), generator=torch.Generator().manual_seed(7))
frames = [1, 2, 1, 3, 1, 2]  # frames per step; slot 1 restarts after the third step
out = {}
for fused, model in ((False, codec), (True, codec), (None, codec64)):
    core = StreamingCodec(model, 3, fused_units=bool(fused))
    pcm, at = [], 0
    for i, count in enumerate(frames):
        if i == 3:
            core.reset([2])
        pcm.append(core.step([0, 2], codes[:, :, at : at + count]))
        at += count
    pcm += [core.peek([0, 2], 5000), core.flush([0, 2])]
    out[fused] = torch.cat(pcm, dim=-1)
assert len(launches) == 15 * len(frames), len(launches)
assert {shape[1] for shape in launches} == {32, 64}
# and as close to a float64 decode as the eager float32 one
assert peak_error(out[True], out[None]) < 2 * peak_error(out[False], out[None])
print(peak_error(out[True], out[False]))
"""
)


def _run_interpreted(script: str) -> float:
    pytest.importorskip("triton")
    from vllm_support.cpu_env import SUPPORT_DIR, cpu_vllm_env

    env = {**os.environ, **cpu_vllm_env()}
    env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT_DIR.parent), env["PYTHONPATH"]])
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return float(done.stdout.strip().splitlines()[-1])


def test_fused_unit_steps_equal_the_eager_unit() -> None:
    """32 and 64 channels, dilations 1, 3, 9, steps of random length from the
    utterance's start: output and both new caches within 1e-5 of the peak."""
    assert _run_interpreted(_UNIT_CHECK) < 1e-5


def test_fused_units_give_the_eager_stream() -> None:
    """Every unit of a codec with 64- and 32-channel blocks fused: steps of
    1-3 frames, a slot restarted mid-way, a peek and the flush; and no
    further from a float64 decode than the eager float32 stream."""
    assert _run_interpreted(_CODEC_CHECK) < 1e-5


def test_the_unit_kernel_compiles_for_hopper() -> None:
    """The interpreter does not compile: build the kernel's GPU code for an H200
    (sm_90) ahead of time, so a construct the compiler refuses (a name
    redefined with another shape in a branch, say) fails here, not on a GPU."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from realtime_engine.codec.fused_unit import LAUNCH, _unit_kernel

    kernel = _unit_kernel()
    pointers = [a for a in kernel.arg_names if a.endswith("_ptr")]
    signature = {a: "*fp32" for a in pointers}
    signature.update({a: "i32" for a in ("n", "keep_stride", "keep_lo", "head")})
    block_t, warps = LAUNCH[32]
    consts = {"C": 32, "D": 3, "BLOCK_T": block_t, "BLOCK_H": 32, "PRECISION": "tf32"}
    signature.update({a: "constexpr" for a in consts})
    source = ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(kernel.arg_names.index(a),): v for a, v in consts.items()},
    )
    compiled = triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}
    )
    assert "tl.dot" not in compiled.asm["ptx"] and "mma" in compiled.asm["ptx"]
