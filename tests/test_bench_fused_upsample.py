"""bench.gpu.fused_upsample_bench's smoke check: the tiny codec on the CPU through
Triton's interpreter, every block and launch checked against the layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu.fused_upsample_bench import main

pytest.importorskip("triton", reason="the kernel is Triton's (a vLLM dependency)")


def test_every_fused_launch_matches_the_layers_and_the_summary_adds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    argv = ["--tiny", "--batch", "2", "--tiles", "0,16", "--out-blocks", "16,32"]
    assert main([*argv, "--warps", "4", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "fused_upsample_bench.json").read_text())
    rows = report["rows"]
    blocks = {r["block"] for r in rows}
    # the tiny codec's blocks are all narrow, and so is its output layer
    assert blocks == {f"block{b}" for b in range(5)} | {"output"}
    assert [r["inputs"] for r in rows if r["variant"] == "layers"] == [1, 8, 40, 160, 320, 960]
    fused = [r for r in rows if r["variant"] == "fused"]
    # out blocks of 32 exceed the tiny blocks' 16 padded output channels: skipped
    launches = {(r["tile"], r["out_block"]) for r in fused if r["block"] != "output"}
    assert launches == {(0, 16), (16, 16)}
    assert {(r["tile"], r["out_block"]) for r in fused if r["block"] == "output"} == {
        (0, 0),
        (16, 0),
    }
    assert len(fused) == 2 * len(blocks)
    # each block's and the output layer's launches were built together first, one
    # build a distinct kernel: the first two blocks' default tile (1 and 8 inputs)
    # is the explicit 16, the later ones' (40 inputs and up) a wider one
    builds = [json.loads(line) for line in capsys.readouterr().out.splitlines() if "built_" in line]
    assert [b["built_kernels"] for b in builds] == [1, 1, 2, 2, 2, 2]
    assert report["summary"]["worst_error"] < 1e-5
    assert set(report["summary"]["best_launch_by_block"]) == blocks
