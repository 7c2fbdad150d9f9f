"""bench.gpu.load_trace's device-time summary, on kernels named as torch's profiler names them."""

from __future__ import annotations

import pytest

from bench.gpu.load_trace import device_report, device_time, kernel_kind


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64>>", "attention"),
        ("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNN", "gemm"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
        ("void cudnn::engines_precompiled::conv1d_kernel", "codec conv"),
        ("triton_poi_fused_snake_0", "norm / activation"),
        ("void at::native::radixSortKVInPlace<float>", "sampling"),
        ("Memcpy HtoD (Pinned -> Device)", "copy / fill"),
        ("void at::native::reduce_kernel<512, 1>", "reduce / elementwise"),
        ("mystery_kernel", "other"),
    ],
)
def test_kernels_are_sorted_into_kinds(name: str, kind: str) -> None:
    assert kernel_kind(name) == kind


def test_device_time_sums_by_kind_over_the_span() -> None:
    events = [
        {
            "ph": "X",
            "cat": "kernel",
            "name": "nvjet_gemm",
            "ts": 0.0,
            "dur": 600.0,
            "args": {"stream": 7},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "flash_fwd",
            "ts": 600.0,
            "dur": 300.0,
            "args": {"stream": 7},
        },
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy DtoH",
            "ts": 950.0,
            "dur": 50.0,
            "args": {"stream": 21},
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 5000.0},  # host
    ]
    summary = device_time(events)
    assert summary["span_us"] == 1000.0
    assert summary["busy_us"] == 950.0
    assert summary["by_kind"] == {"gemm": 600.0, "attention": 300.0, "copy / fill": 50.0}
    assert summary["by_stream"] == {"7": 900.0, "21": 50.0}  # the codec's stream apart
    text = device_report(summary, steps=2)
    assert "gemm | 0.6 | 0.30 | 63.2%" in text
    assert "21 | 0.1 | 5.3% | 5%" in text
    assert summary["top"][0] == ("nvjet_gemm", 600.0)


def test_an_empty_trace_reports_nothing_busy() -> None:
    assert device_time([])["busy_us"] == 0.0
