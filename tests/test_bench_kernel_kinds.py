"""``bench.gpu.kernel_kinds``: kernels sorted by kind, per step, from a Chrome trace."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench.gpu.kernel_kinds import (
    OTHER,
    by_kind,
    kernels_by_call,
    kind_of,
    load_events,
    main,
    render,
)

# kernel names as an H200 trace of the codec step spells them
NAMES = {
    "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true>": (
        "layout transpose"
    ),
    "triton_poi_fused__to_copy_add_addcmul_clone_convolution_sin_79": "triton fused",
    "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw": "conv (cuDNN/cutlass)",
    "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_64x64>": (
        "conv (cuDNN/cutlass)"
    ),
    "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64": "gemm (half precision)",
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x128_32x3_nn_align4>": "gemm (TF32)",
    "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x128x8_stage3": "gemm (fp32 FFMA)",
    "nvjet_sm90_hsh_64x128_64x8_1x2_h_ssched_bz_NNN": "gemm (half precision)",
    "nvjet_sm90_tst_128x64_64x4_1x1_v_bz_NNN": "gemm (cuBLAS nvjet)",
    "void at::native::index_elementwise_kernel<128, 4>": "index copy",
    "void at::native::vectorized_elementwise_kernel<4, at::native::sin_kernel_cuda>": (
        "elementwise (eager)"
    ),
    "Memcpy DtoD (Device -> Device)": OTHER,
}


@pytest.mark.parametrize(("name", "kind"), NAMES.items())
def test_each_kernel_gets_its_kind(name: str, kind: str) -> None:
    assert kind_of(name) == kind


def trace_events() -> list[dict]:
    events = [{"cat": "cpu_op", "name": "aten::conv1d", "dur": 999.0}]  # host time: left out
    for step in range(2):
        for i, name in enumerate(NAMES):
            events.append({"cat": "kernel", "name": name, "dur": 10.0 * (i + 1) + step})
    return events


def test_device_time_is_summed_by_kind_per_step_largest_first() -> None:
    kinds = by_kind(trace_events(), steps=2)
    # two conv kernels a step: 30 + 40 us in the first, 31 + 41 in the second
    assert kinds["conv (cuDNN/cutlass)"] == {"kernels_per_step": 2.0, "us_per_step": 71.0}
    assert kinds["gemm (half precision)"]["kernels_per_step"] == 2.0  # cutlass's and cuBLAS's
    assert kinds[OTHER]["kernels_per_step"] == 1.0
    assert kinds["layout transpose"] == {"kernels_per_step": 1.0, "us_per_step": 10.5}
    spent = [k["us_per_step"] for k in kinds.values()]
    assert spent == sorted(spent, reverse=True)
    assert sum(k["kernels_per_step"] for k in kinds.values()) == len(NAMES)
    with pytest.raises(ValueError, match="steps"):
        by_kind(trace_events(), steps=0)


def test_the_summary_reads_from_a_gzipped_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": trace_events()}, f)
    assert len(load_events(path)) == 1 + 2 * len(NAMES)
    assert main([str(path), "--steps", "2"]) == 0
    text = capsys.readouterr().out
    total_us = sum(10.0 * (i + 1) + 0.5 for i in range(len(NAMES)))
    assert text.splitlines()[0] == f"trace.json.gz: {len(NAMES)} kernels, {total_us:.0f} us a step"
    assert "layout transpose" in text and "%" in text
    assert render({}, "empty") == "empty: 0 kernels, 0 us a step\n"


def call_events() -> list[dict]:
    """Two steps of two convolution calls: the first launches a transpose and a
    kernel through the runtime, the second a cuBLAS kernel through the driver."""
    events: list[dict] = []
    ts = 0.0
    for step in range(2):
        for call, launches in enumerate(
            [
                [("cuda_runtime", "nchwToNhwcKernel", 4.0), ("cuda_runtime", "xmma_fprop", 10.0)],
                [("cuda_driver", "nvjet_sm90_hsh_64x128", 6.0 + step)],
            ]
        ):
            events.append({"cat": "cpu_op", "name": "aten::conv", "ts": ts, "dur": 50.0})
            for n, (cat, name, dur) in enumerate(launches):
                corr = 100 * step + 10 * call + n
                events.append(
                    {
                        "cat": cat,
                        "name": "launch",
                        "ts": ts + 1 + n,
                        "dur": 1.0,
                        "args": {"correlation": corr},
                    }
                )
                events.append(
                    {
                        "cat": "kernel",
                        "name": name,
                        "ts": ts + 60 + n,
                        "dur": dur,
                        "args": {"correlation": corr},
                    }
                )
            ts += 100.0
    # a kernel launched outside any call is no call's
    events.append(
        {
            "cat": "cuda_runtime",
            "name": "launch",
            "ts": ts + 5,
            "dur": 1.0,
            "args": {"correlation": 999},
        }
    )
    events.append(
        {
            "cat": "kernel",
            "name": "xmma_fprop",
            "ts": ts + 9,
            "dur": 500.0,
            "args": {"correlation": 999},
        }
    )
    return events


def test_each_call_of_an_operator_gets_the_kernels_it_launched(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    calls = kernels_by_call(call_events(), "aten::conv", steps=2)
    assert calls == [
        {"layout transpose": 4.0, "conv (cuDNN/cutlass)": 10.0},
        {"gemm (half precision)": 6.5},
    ]
    with pytest.raises(ValueError, match="do not split into 3 steps"):
        kernels_by_call(call_events(), "aten::conv", steps=3)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(call_events()))
    assert main([str(path), "--steps", "2", "--calls", "aten::conv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["0", "14.0", "us"]
    assert "gemm (half precision) 6.5" in lines[1]
