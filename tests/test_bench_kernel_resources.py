"""bench.gpu.kernel_resources: the tiny codec's fused kernels built for the H200
(sm_90) on the CPU and read back from their machine code. As served, every
kernel's Snake takes the approximate sine: special-function instructions and
no float64 (the exact sine's slow path). Also the occupancy arithmetic and the
disassembly's parsing, on known values, and the sweep of launches. The build
runs as a process of its own, as bench.gpu.kernel_build_time's test explains."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu.kernel_resources import _INSTRUCTION, _USAGE, blocks_an_sm

pytest.importorskip("triton", reason="the kernels are Triton's (a vLLM dependency)")


def test_an_sm_holds_what_its_registers_shared_memory_and_warps_allow() -> None:
    # 255 registers round up to 256 a thread: one 8-warp block fills the file
    assert blocks_an_sm(255, 8, 0) == 1
    assert blocks_an_sm(128, 16, 0) == 1
    # registers allow 8 blocks of 4 warps at 64; 20 KiB of shared memory 10
    assert blocks_an_sm(64, 4, 20 * 1024) == 8
    # 100 KiB (plus the 1 KiB kept a block) twice in 228 KiB
    assert blocks_an_sm(32, 4, 100 * 1024) == 2
    assert blocks_an_sm(32, 4, 240 * 1024) == 0  # does not fit at all
    assert blocks_an_sm(16, 1, 0) == 32  # at most 32 blocks


def test_the_disassembly_and_resource_lines_parse() -> None:
    lines = {
        "        /*0070*/                   IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;": "IMAD",
        "        /*cfa0*/                   HGMMA.64x64x8.F32.TF32 R24, gdesc[UR4], RZ ;": "HGMMA",
        "        /*1d30*/              @!P0 BRA `(.L_x_12) ;": "BRA",
        "        /*1d40*/               @P1 MUFU.SIN R7, R7 ;": "MUFU",
    }
    for line, opcode in lines.items():
        found = _INSTRUCTION.match(line)
        assert found is not None and found.group(1) == opcode
    assert _INSTRUCTION.match("\t.target\tsm_90a") is None
    usage = _USAGE.search("  REG:255 STACK:144 SHARED:1024 LOCAL:0 CONSTANT[0]:624")
    assert usage is not None and usage.groups() == ("255", "144", "1024", "0")


def test_each_kernel_of_the_tiny_codec_is_read_from_its_hopper_build(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    argv = ["--tiny", "--threads", "2", "--slots", "4", "--tiles", "16,32", "--warps", "4"]
    argv += ["--out", str(tmp_path)]
    run = [sys.executable, "-m", "bench.gpu.kernel_resources", *argv]
    subprocess.run(run, env=env, check=True, timeout=600, capture_output=True)
    report = json.loads((tmp_path / "kernel_resources.json").read_text())
    summary, rows = report["summary"], report["rows"]
    assert summary["kernels"] == len(rows) == len({r["kernel"] for r in rows})
    assert {r["kernel"].split("{")[0] for r in rows} == {
        "unit_kernel", "upsample_kernel", "output_kernel",
    }  # fmt: skip
    assert summary["with_float64"] == 0
    for row in rows:
        kinds = row["instructions"]
        assert kinds["special_function"] > 0 and kinds["float64"] == 0, row
        assert kinds["tensor_core"] > 0 and 0 < row["registers"] <= 255, row
        assert row["blocks_an_sm"] >= 1 and row["programs"] >= 4, row  # a program a slot at least
        assert "'FAST_SINE': True" in row["kernel"]
    # the swept launches: each kernel at each tile, none its own launch again
    swept = {row["kernel"] for row in report["sweep"]}
    assert swept and not swept & {row["kernel"] for row in rows}
    assert {("'TILE': 16" in k) or ("'TILE': 32" in k) for k in swept} == {True}
    assert all(row["programs"] is None and row["registers"] > 0 for row in report["sweep"])
