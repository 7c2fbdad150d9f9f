"""bench.gpu.load_trace's device-time summary, on kernels named as torch's profiler names them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from script_support import dry_run

from bench.gpu.load_trace import Workload, device_report, device_time, kernel_kind, workload_prompts
from gateway.protocol.config import SessionConfig
from realtime_engine.model.prompts import TalkerPrompt
from realtime_engine.model.tokenizer import HiggsTokenizer


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


PROMPTS = (TalkerPrompt(token_ids=(1, 2, 3)), TalkerPrompt(token_ids=(4, 5, 6, 7)))


@pytest.mark.parametrize("share", [0.0, 0.36, 1.0])
def test_the_clone_share_holds_over_any_stretch_of_requests(share: float) -> None:
    work = Workload(clone_share=share)
    for streams, per_stream in [(256, 4), (4, 256)]:
        clones = [work.is_clone(n, i) for n in range(streams) for i in range(per_stream)]
        assert abs(sum(clones) / len(clones) - share) < 0.01


def test_requests_have_a_fixed_length_unless_they_end_freely() -> None:
    fixed = Workload(rows=257, clone_share=0.5).request(PROMPTS, 3, 7)
    assert fixed.fixed_rows == 257
    assert fixed.request_id == "s3-7" and fixed.sampling.seed == 7
    free = Workload(rows=257, free_end=True).request(PROMPTS, 0, 1)
    assert free.fixed_rows is None and free.max_new_tokens == 257
    assert free.prompt is PROMPTS[0]  # no clone share: every prompt zero-shot
    assert Workload(clone_share=1.0).request(PROMPTS, 0, 0).prompt is PROMPTS[1]


def test_the_clone_prompt_carries_its_anchor(tiny_checkpoint: Path) -> None:
    zero, clone = workload_prompts(
        HiggsTokenizer.from_dir(tiny_checkpoint), Workload(anchor_frames=50)
    )
    assert zero.ref_rows is None
    assert clone.ref_rows is not None and clone.ref_rows.shape == (50 + 7, 8)  # delay-patterned
    assert len(clone.token_ids) > len(zero.token_ids) + 50


def test_the_h200_script_runs_the_served_mix_after_the_sweep(tmp_path: Path) -> None:
    lines = dry_run(
        "bench/gpu/run_h200.sh",
        tmp_path,
        LEVELS="64",
        LOAD_TRACE="256",
        LOAD_TRACE_ARGS="--clone-share 0.36 --free-end",
    )
    trace = next(i for i, line in enumerate(lines) if "bench.gpu.load_trace" in line)
    assert lines[trace].split(" > ")[0].endswith("--clone-share 0.36 --free-end")
    assert "--concurrency 256" in lines[trace]
    sweep = max(i for i, line in enumerate(lines) if "sweep_c64" in line)
    assert sweep < trace  # the engine alone after the served levels


def test_a_served_engines_trace_folder_is_packed_and_summarised(tmp_path: Path) -> None:
    from bench.gpu.load_trace import main

    traces = tmp_path / "served_trace"
    traces.mkdir()
    events = [
        {
            "ph": "X",
            "cat": "kernel",
            "name": "nvjet_gemm",
            "ts": 0,
            "dur": 600,
            "args": {"stream": 7},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "sin_kernel",
            "ts": 100,
            "dur": 300,
            "args": {"stream": 21},
        },
    ]
    trace = {"traceEvents": events}
    (traces / "engine.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))
    out = tmp_path / "out"
    assert main(["--from-trace-dir", str(traces), "--out", str(out)]) == 0
    assert (out / "load_trace.tar.gz").is_file()
    text = (out / "load_trace.txt").read_text()
    assert text.startswith("device span 0.6 ms, kernels 0.9 ms")
    assert "gemm | 0.6" in text and "21 | 0.3" in text  # by kind and by CUDA stream


def test_the_h200_script_traces_the_served_engine_on_request(tmp_path: Path) -> None:
    lines = dry_run(
        "bench/gpu/run_h200.sh",
        tmp_path,
        LEVELS="256",
        SERVED_TRACE="256",
        TALKER_OPTIONS='{"engine_args": {"quantization": "fp8"}}',
    )
    serve = next(line for line in lines if "gateway.cli serve" in line)
    options = json.loads(serve.split("--talker-options ")[1].split(" > ")[0])
    assert options["engine_args"]["quantization"] == "fp8"  # the run's own options kept
    profiler = options["engine_args"]["profiler_config"]
    assert profiler["profiler"] == "torch"
    assert profiler["torch_profiler_dir"] == str(tmp_path / "work" / "served_trace_gateway")
    summary = next(line for line in lines if "--from-trace-dir" in line)
    assert str(tmp_path / "work" / "served_trace_gateway") in summary
    # traced in a level of its own after the sweep (writing the trace stalls every
    # stream), which no table includes
    traced = [i for i, line in enumerate(lines) if "trace_c256_p" in line and "bench run" in line]
    swept = [i for i, line in enumerate(lines) if "sweep_c256_p" in line and "bench run" in line]
    assert traced and swept and min(traced) > max(swept)
    merged = next(line for line in lines if "report merge" in line and " sweep " in line)
    assert "trace_c256" not in merged


def test_the_h200_script_runs_a_second_sweep_on_the_same_server(tmp_path: Path) -> None:
    lines = dry_run(
        "bench/gpu/run_h200.sh", tmp_path, LEVELS="64", SWEEP_B_LEVELS="256", HTTP_LEVELS=""
    )
    starts = [i for i, line in enumerate(lines) if "gateway.cli serve" in line]
    assert len(starts) == 1  # one server for both sweeps
    second = [line for line in lines if "sweep_b_c256" in line and "bench" in line]
    assert second and all("--no-cut" in line for line in second if "--url" in line)
    first = [line for line in lines if "sweep_c64" in line and "--url" in line]
    assert first and not any("--no-cut" in line for line in first)
    merged = next(line for line in lines if "report merge" in line and " sweep_b " in line)
    assert "sweep_b_c256.json" in merged


def test_the_h200_script_sweeps_each_preset_or_chunking_on_one_server(tmp_path: Path) -> None:
    lines = dry_run(
        "bench/gpu/run_h200.sh",
        tmp_path,
        LEVELS="64",
        SWEEP_PRESETS="latency,balanced,exact4=4:25:12:10",
        SWEEP_PRESET_LEVELS="256",
        HTTP_LEVELS="",
        PRESETS="latency,exact4=4:25:12:10",
    )
    assert len([line for line in lines if "gateway.cli serve" in line]) == 1
    exact4 = {
        "latency_preset": "custom",
        "chunking": {
            "first_chunk_frames": 4,
            "chunk_frames": 25,
            "left_context_frames": 12,
            "right_holdback_frames": 10,
        },
    }
    asked = {"latency": {"latency_preset": "latency"}, "balanced": {"latency_preset": "balanced"}}
    asked["exact4"] = exact4
    for preset, session_asks in asked.items():
        runs = [line for line in lines if f"sweep_{preset}_c256_p" in line and "--url" in line]
        assert len(runs) == 4  # 256 streams: four clients
        for line in runs:
            session = json.loads(line.split("--session ")[1].split(" --no-decode")[0])
            assert session == {"output": {"frame_ms": 60}, **session_asks}
            SessionConfig.model_validate(session)  # the server would take it
        merged = next(
            line for line in lines if "report merge" in line and f" sweep_{preset} " in line
        )
        assert f"sweep_{preset}_c256.json" in merged
    first = [line for line in lines if "/sweep_c64 " in line and "--url" in line]
    assert first and all("latency_preset" not in line for line in first)
    # one stream per preset or chunking, before the sweeps
    for preset, session_asks in (("latency", asked["latency"]), ("exact4", exact4)):
        (line,) = [line for line in lines if f"/preset_{preset} " in line and "--url" in line]
        session = json.loads(line.split("--session ")[1].split(" > ")[0])
        assert session == {"max_audio_seconds": 2, **session_asks}
        SessionConfig.model_validate(session)
    merged = next(line for line in lines if "report merge" in line and " presets " in line)
    assert "latency=" in merged and "exact4=" in merged and "preset_exact4.json" in merged


def _kernel(stream: int, ts: float, dur: float) -> dict[str, object]:
    return {
        "ph": "X",
        "cat": "kernel",
        "name": "k",
        "ts": ts,
        "dur": dur,
        "args": {"stream": stream},
    }


def test_the_timeline_tells_overlap_and_idle_apart() -> None:
    # talker stream 7: [0, 400) and [500, 900); codec stream 21: [300, 600)
    # overlaps it for 100 + 100 µs; the device idles over nothing but the
    # span's remaining 100 µs ([900, 1000)) before the last copy.
    events = [
        _kernel(7, 0.0, 400.0),
        _kernel(7, 500.0, 400.0),
        _kernel(21, 300.0, 300.0),
        _kernel(7, 1000.0, 100.0),
    ]
    line = device_time(events)["timeline"]
    assert line["span_us"] == 1100.0
    assert line["busy_us"] == 1000.0
    assert line["idle_us"] == 100.0
    assert line["streams"] == [
        {"stream": "7", "busy_us": 900.0, "hidden_us": 200.0},
        {"stream": "21", "busy_us": 300.0, "hidden_us": 200.0},
    ]
    text = device_report(device_time(events), steps=1)
    assert "device busy (any stream) 1.0 ms = 91% of the span; idle 0.1 ms = 9%" in text
    assert "21 | 0.3 | 27% | 0.2 | 67%" in text


def test_kernels_of_one_stream_that_touch_are_not_counted_twice() -> None:
    events = [_kernel(7, 0.0, 100.0), _kernel(7, 50.0, 100.0), _kernel(9, 400.0, 100.0)]
    line = device_time(events)["timeline"]
    assert line["busy_us"] == 250.0
    assert line["idle_us"] == 250.0
    assert [s["hidden_us"] for s in line["streams"]] == [0.0, 0.0]
