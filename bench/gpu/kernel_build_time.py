"""How long Triton takes to build the codec's fused kernels for an H200, timed
on this host's CPU: no GPU needed.

Records the launches of one streaming step of the real-size codec with random
weights (``fused_units``, by default ``"narrow"``: every narrow layer), with
the launches deferred (:mod:`realtime_engine.codec.kernel_launch`), so no
kernel runs. Then builds each distinct kernel for sm_90 (Hopper) with Triton's
own compiler and ptxas, one at a time, timing each; then all of them again
from scratch on ``--threads`` threads, as the engine's warm-up builds them.
Products in TF32 (the served codec is float16 by default); pointers typed as the step's
tensors. Writes ``$OUT/kernel_build_time.json``; ``--tiny`` the tiny codec.

    python -m bench.gpu.kernel_build_time [--fused-units narrow] [--threads 16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from bench.gpu.random_codec import random_codec
from realtime_engine.codec import fused_output, fused_unit, fused_upsample
from realtime_engine.codec.fused_unit import FUSED_UNITS_VALUES
from realtime_engine.codec.kernel_launch import Launch, deferred_launches, distinct_launches
from realtime_engine.codec.stream_core import StreamingCodec

HOPPER = 90  # sm_90: the H100 and H200
# the kernels' builders by the kernel's name (compiled, not interpreted, kernels)
_BUILDERS = {
    "unit_kernel": fused_unit._unit_kernel,
    "upsample_kernel": fused_upsample._upsample_kernel,
    "output_kernel": fused_output._output_kernel,
}
_TRITON_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def recorded_step(fused_units: Any, tiny: bool) -> list[Launch]:
    """One step's launches: the kernels as Triton's interpreter has them, never run."""
    # Triton's code generator, imported while the interpreter is off (imported
    # with it on, it cannot build for a GPU)
    import triton.compiler.code_generator  # noqa: F401

    os.environ["TRITON_INTERPRET"] = "1"  # where the fused layers take CPU tensors
    codec = random_codec("fp32", tiny)
    core = StreamingCodec(codec, 1, fused_units=fused_units)
    core.reset([0])
    codes = torch.zeros(1, codec.dims.num_quantizers, 1, dtype=torch.int64)
    with torch.inference_mode(), deferred_launches() as launches:
        core.step([0], codes)
    del os.environ["TRITON_INTERPRET"]
    return launches


def compile_for_hopper(launch: Launch) -> Any:
    """The launch's kernel built for sm_90 by Triton's compiler and ptxas: the
    compiled kernel, with its PTX and cubin in ``asm``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = _BUILDERS[launch.kernel.__name__]()  # the compiled kind (no TRITON_INTERPRET)
    constants = served_constants(launch)
    del constants["num_warps"]
    signature: dict[str, str] = {}
    for arg_name, value in zip(kernel.arg_names, launch.args, strict=False):
        if isinstance(value, torch.Tensor):
            signature[arg_name] = "*" + _TRITON_TYPES[value.dtype]
        else:
            signature[arg_name] = "i32"
    signature.update({k: "constexpr" for k in constants})
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    return triton.compile(
        source,
        target=GPUTarget("cuda", HOPPER, 32),
        options={"num_warps": served_constants(launch)["num_warps"]},
    )


def build(launch: Launch) -> tuple[str, float]:
    """Build the launch's kernel for sm_90; its name and seconds."""
    started = time.perf_counter()
    compile_for_hopper(launch)
    return describe(launch), time.perf_counter() - started


def served_constants(launch: Launch) -> dict[str, Any]:
    """The launch's constants as served on the GPU: TF32 products and the
    approximate sine (Triton's interpreter recorded IEEE and the exact one)."""
    constants = dict(launch.constants)
    constants.setdefault("num_warps", 4)
    constants.update(PRECISION="tf32", FAST_SINE=True)
    return constants


def describe(launch: Launch) -> str:
    shown = {k: v for k, v in served_constants(launch).items() if k != "PRECISION"}
    return f"{launch.kernel.__name__}{shown}"


def add_step_args(ap: argparse.ArgumentParser) -> None:
    """The flags of the benches that build a recorded step's kernels."""
    ap.add_argument("--fused-units", default="narrow")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))


def fused_units_mode(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    """``--fused-units`` as the codec takes it (any mode that fuses something)."""
    mode: Any = {"true": True, "false": False}.get(args.fused_units, args.fused_units)
    if mode not in FUSED_UNITS_VALUES or not mode:
        ap.error(f"--fused-units must be one of {FUSED_UNITS_VALUES[1:]}")
    return mode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    add_step_args(ap)
    args = ap.parse_args(argv)
    mode = fused_units_mode(ap, args)
    launches = recorded_step(mode, args.tiny)
    kernels = distinct_launches(launches)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TRITON_CACHE_DIR"] = cache  # every build from scratch
        for launch in kernels:
            name, seconds = build(launch)
            rows.append({"kernel": name, "seconds": round(seconds, 2)})
            print(json.dumps(rows[-1]), flush=True)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TRITON_CACHE_DIR"] = cache
        started = time.perf_counter()
        with ThreadPoolExecutor(max(1, args.threads)) as pool:
            list(pool.map(build, kernels))
        threaded = time.perf_counter() - started
    summary = {
        "fused_units": mode,
        "launches_a_step": len(launches),
        "kernels": len(kernels),
        "one_at_a_time_s": round(sum(r["seconds"] for r in rows), 1),
        "threads": args.threads,
        "on_threads_s": round(threaded, 1),
    }
    print(json.dumps(summary), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"summary": summary, "rows": rows}
    (out / "kernel_build_time.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
