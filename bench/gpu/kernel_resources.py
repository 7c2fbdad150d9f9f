"""What each of the codec's fused kernels costs an H200 in registers, local
memory and instructions, read from its sm_90 build on this host's CPU: no GPU
needed.

Records one streaming step of the real-size codec with random weights, its
fused launches deferred (as :mod:`bench.gpu.kernel_build_time` does), builds
each distinct kernel for sm_90 with Triton's compiler and ptxas, and reads
the cubin with the CUDA tools Triton ships (``cuobjdump``, ``nvdisasm``):

- registers a thread, the stack frame, and the spill instructions (``STL`` /
  ``LDL``: a kernel that spills moves its registers through local memory);
- the shared memory Triton asked for, and from registers, shared memory and
  warps the blocks an SM holds and the occupancy;
- the programs a step launches at ``--slots`` slots, and in how many waves
  of the H200's 132 SMs they run;
- the machine code's static instructions by kind: tensor-core products
  (``HGMMA``/``HMMA``), the special-function unit (``MUFU``: sine, exp),
  float64 arithmetic (``D*``: a precise ``sin``'s slow path), global loads and
  stores, and the total.

Static counts, not a profile: a loop's body counts once (the kernels unroll
theirs), and a branch's code counts whether it runs or not. ``--tiles`` and
``--warps`` also build every distinct kernel at each tile and warp count, the
launches the GPU benches sweep, for their registers and spills (``sweep``
rows, without programs). Writes ``$OUT/kernel_resources.json``; ``--tiny``
the tiny codec.

    python -m bench.gpu.kernel_resources [--fused-units narrow] [--slots 256]
        [--tiles 16,32,64,128 --warps 4,8,16]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.gpu.kernel_build_time import (
    add_step_args,
    compile_for_hopper,
    describe,
    fused_units_mode,
    recorded_step,
    served_constants,
)
from realtime_engine.codec.kernel_launch import Launch, distinct_launches

# The H200 (sm_90): what an SM holds
SMS = 132
REGISTERS_AN_SM = 65536
REGISTER_GRANULE = 256  # registers a warp is given, in steps of
WARPS_AN_SM = 64
BLOCKS_AN_SM = 32
SHARED_AN_SM = 233472  # bytes (228 KiB)
SHARED_RESERVED_A_BLOCK = 1024  # bytes the system keeps per block
MAX_REGISTERS = 255  # a thread's most; at it, ptxas spills what does not fit

_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
_USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def cuda_tool(name: str) -> str:
    """A CUDA binary tool as shipped with Triton's NVIDIA backend."""
    import triton.backends.nvidia as nvidia

    return str(Path(nvidia.__file__).parent / "bin" / name)


def resource_usage(cubin: Path) -> dict[str, int]:
    """Registers a thread, stack, static shared and local memory, from cuobjdump."""
    text = subprocess.run(
        [cuda_tool("cuobjdump"), "--dump-resource-usage", str(cubin)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found = _USAGE.search(text)
    if found is None:
        raise RuntimeError(f"no resource usage in cuobjdump's output: {text[:400]}")
    registers, stack, shared, local = (int(v) for v in found.groups())
    return {"registers": registers, "stack": stack, "static_shared": shared, "local": local}


def instruction_kinds(cubin: Path) -> Counter[str]:
    """The cubin's static instructions by opcode (its first name, ``HGMMA`` for
    ``HGMMA.64x64x8.F32.TF32``), from nvdisasm."""
    text = subprocess.run(
        [cuda_tool("nvdisasm"), "-c", str(cubin)], check=True, capture_output=True, text=True
    ).stdout
    kinds: Counter[str] = Counter()
    for line in text.splitlines():
        found = _INSTRUCTION.match(line)
        if found:
            kinds[found.group(1)] += 1
    return kinds


def blocks_an_sm(registers: int, warps: int, shared: int) -> int:
    """How many of a kernel's blocks one SM holds at once (sm_90's limits)."""
    granules = math.ceil(registers * 32 / REGISTER_GRANULE) * REGISTER_GRANULE
    by_registers = REGISTERS_AN_SM // (granules * warps)
    by_shared = SHARED_AN_SM // (shared + SHARED_RESERVED_A_BLOCK)
    return max(0, min(by_registers, by_shared, WARPS_AN_SM // warps, BLOCKS_AN_SM))


def summarize(kinds: Counter[str]) -> dict[str, int]:
    """The instruction kinds that say where a fused kernel's time can go."""
    return {
        "total": sum(kinds.values()),
        "tensor_core": kinds["HGMMA"] + kinds["HMMA"],
        "special_function": kinds["MUFU"],
        "float64": sum(v for k, v in kinds.items() if k in ("DMUL", "DFMA", "DADD", "DSETP")),
        "spill_stores": kinds["STL"],
        "spill_loads": kinds["LDL"],
        "global_loads": kinds["LDG"],
        "global_stores": kinds["STG"],
    }


def kernel_resources(launch: Launch, slots: int, launches_a_step: int) -> dict[str, Any]:
    """The sm_90 build's costs for one distinct launch (see the module's notes)."""
    compiled = compile_for_hopper(launch)
    warps = served_constants(launch)["num_warps"]
    shared = int(compiled.metadata.shared)
    with tempfile.TemporaryDirectory() as folder:
        cubin = Path(folder) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = resource_usage(cubin)
        kinds = instruction_kinds(cubin)
    blocks = blocks_an_sm(usage["registers"], warps, shared)
    # the grid's first axis is the slot (a swept launch's tiling is not the grid's)
    programs = slots * math.prod(launch.grid[1:]) if slots else None
    return {
        "kernel": describe(launch),
        "launches_a_step": launches_a_step,
        "warps": warps,
        **usage,
        "shared": shared,
        "blocks_an_sm": blocks,
        "occupancy": round(blocks * warps / WARPS_AN_SM, 3),
        "programs": programs,
        "waves": round(programs / (SMS * blocks), 2) if blocks and programs else None,
        "instructions": summarize(kinds),
    }


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def swept_launches(kernels: list[Launch], tiles: list[int], warps: list[int]) -> list[Launch]:
    """Each kernel at each tile and warp count asked for (a kernel's own where
    none is)."""
    swept = []
    for kernel in kernels:
        own = served_constants(kernel)
        for tile, warp in itertools.product(tiles or [own["TILE"]], warps or [own["num_warps"]]):
            if (tile, warp) != (own["TILE"], own["num_warps"]):
                constants = {**kernel.constants, "TILE": tile, "num_warps": warp}
                swept.append(dataclasses.replace(kernel, constants=constants))
    return swept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    add_step_args(ap)
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--tiles", default="", help="comma-separated TILE values to sweep")
    ap.add_argument("--warps", default="", help="comma-separated warp counts to sweep")
    args = ap.parse_args(argv)
    mode = fused_units_mode(ap, args)
    launches = recorded_step(mode, args.tiny)
    kernels = distinct_launches(launches)
    uses = Counter(launch.build_key() for launch in launches)
    with tempfile.TemporaryDirectory() as cache, ThreadPoolExecutor(max(1, args.threads)) as pool:
        os.environ["TRITON_CACHE_DIR"] = cache
        rows = list(
            pool.map(lambda k: kernel_resources(k, args.slots, uses[k.build_key()]), kernels)
        )
        swept = swept_launches(kernels, ints(args.tiles), ints(args.warps))
        sweep = list(pool.map(lambda k: kernel_resources(k, 0, 0), swept))
    for row in rows:
        print(json.dumps(row), flush=True)
    summary = {
        "fused_units": mode,
        "slots": args.slots,
        "kernels": len(rows),
        "spilling": sum(1 for r in rows if r["instructions"]["spill_stores"] > 0),
        "at_register_limit": sum(1 for r in rows if r["registers"] >= MAX_REGISTERS),
        "with_float64": sum(1 for r in rows if r["instructions"]["float64"] > 0),
    }
    print(json.dumps(summary), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"summary": summary, "rows": rows, "sweep": sweep}
    (out / "kernel_resources.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
