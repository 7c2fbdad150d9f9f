"""``python -m bench.codec_throughput`` end to end at tiny size (CPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from bench.codec_throughput import Variant, main, variant_of
from realtime_engine.codec.causal import GEMM_CHANNELS


@pytest.mark.usefixtures("one_torch_thread")
def test_writes_one_row_per_setting_with_consistent_rates_and_small_errors(
    tmp_path: Path,
) -> None:
    argv = ["--tiny", "--batches", "1,2", "--precisions", "fp32,tf32", "--error-frames", "12"]
    argv += ["--kernels", "fp32:snake,fp32:eager+nhwc,fp32:eager+nchw"]
    assert main([*argv, "--iters", "1", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "codec_throughput.json").read_text())
    rows = report["results"]
    assert [(r["precision"], r["kernels"], r["batch"]) for r in rows] == [
        ("fp32", "eager", 1),
        ("fp32", "eager", 2),
        ("tf32", "eager", 1),
        ("tf32", "eager", 2),
        ("fp32", "snake", 1),  # the Triton activation is CUDA's: eager arithmetic on the CPU
        ("fp32", "snake", 2),
        ("fp32", "eager+nhwc", 1),  # the convolutions on channels-last tensors
        ("fp32", "eager+nhwc", 2),
    ]
    for r in rows:
        assert r["ms_per_step"] > 0
        seconds = r["batch"] / 25  # one 40 ms frame per slot per step
        assert abs(r["audio_s_per_s"] - seconds / (r["ms_per_step"] / 1000)) < (
            0.2 + 0.01 * r["audio_s_per_s"]
        )
    # the CPU computes fp32 whatever the precision: the streamed audio is the exact decode
    assert set(report["errors"]) == {
        "fp32/eager",
        "tf32/eager",
        "fp32/snake",
        "fp32/eager+nhwc",
        "fp32/eager+nchw",
    }
    # a layout the bench does not know fails its variant, named, instead of timing the default
    assert "unknown suffix 'nchw'" in report["errors"].pop("fp32/eager+nchw")
    assert all(0 <= e < 1e-5 for e in report["errors"].values())


@pytest.mark.usefixtures("one_torch_thread")
def test_no_eager_precisions_times_only_the_named_variants(tmp_path: Path) -> None:
    # the way to time a compiled variant alone (its eager baseline skipped), fp16 among them
    argv = ["--tiny", "--batches", "2", "--precisions=", "--error-frames", "12"]
    argv += ["--kernels", "fp16:eager,fp32:eager", "--iters", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    report = json.loads((tmp_path / "codec_throughput.json").read_text())
    assert [(r["precision"], r["kernels"]) for r in report["results"]] == [
        ("fp16", "eager"),
        ("fp32", "eager"),
    ]
    # the CPU keeps float32 weights for fp16 (CUDA casts a copy): both are the exact decode
    assert set(report["errors"]) == {"fp16/eager", "fp32/eager"}
    assert all(0 <= e < 1e-5 for e in report["errors"].values())


@pytest.mark.usefixtures("one_torch_thread")
def test_the_codec_profile_names_the_steps_operators(tmp_path: Path) -> None:
    from bench.gpu.codec_profile import main as profile

    assert profile(["--tiny", "--batch", "2", "--steps", "1", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "codec_profile_2.txt").read_text()
    assert table.startswith("codec step, batch 2, 1 steps")
    assert "convolution" in table and "aten::sin" in table  # the layers and the activations
    argv = ["--tiny", "--batch", "3", "--steps", "1", "--channels-last", "--out", str(tmp_path)]
    assert profile(argv) == 0
    table = (tmp_path / "codec_profile_3.txt").read_text()
    assert "channels-last" in table.splitlines()[0] and "aten::conv2d" in table
    assert (tmp_path / "codec_profile_2.json.gz").stat().st_size > 0
    # the summary by kind of kernel: on the CPU the trace has no device kernels
    kinds = (tmp_path / "codec_profile_2_kinds.txt").read_text()
    assert kinds.startswith("codec step, batch 2") and "0 kernels, 0 us a step" in kinds


@pytest.mark.usefixtures("one_torch_thread")
def test_the_codec_soak_runs_streams_through_their_whole_lives(tmp_path: Path) -> None:
    from bench.gpu.codec_soak import main as soak

    argv = ["--tiny", "--kernels", "eager", "--slots", "3", "--seconds", "1.5"]
    argv += ["--min-frames", "3", "--max-frames", "9", "--replay-rate", "0.1"]
    argv += ["--verify", "6", "--tolerance", "1e-5"]
    assert soak([*argv, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "codec_soak.json").read_text())
    assert report["stall"] is None
    assert report["ended"] >= 3 and report["streams"] == report["ended"] + 3  # slots refilled
    assert report["chunks"] >= report["ended"]  # every ended stream had its final chunk
    assert report["replays"] > 0 and report["steps"] > 0
    # the first six streams, replays and reused slots included, are the whole decode
    assert report["verified"]["streams"] == 6
    assert report["verified"]["worst_error_of_peak"] <= 1e-5


@pytest.mark.usefixtures("one_torch_thread")
def test_the_codec_soak_catches_audio_that_is_not_the_whole_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verification can fail: one sample of every chunk off by a little is caught
    (exit status 4, the stream named)."""
    from bench.gpu import codec_soak

    real = codec_soak.SlotCodec.decode

    def off_by_a_little(self: object, plans: object) -> torch.Tensor:
        pcm = real(self, plans)  # type: ignore[arg-type]
        pcm[:, 0] += 0.01 * float(pcm.abs().max())
        return pcm

    monkeypatch.setattr(codec_soak.SlotCodec, "decode", off_by_a_little)
    argv = ["--tiny", "--kernels", "eager", "--slots", "2", "--seconds", "0.5"]
    argv += ["--min-frames", "3", "--max-frames", "6", "--verify", "4", "--tolerance", "1e-3"]
    assert codec_soak.main([*argv, "--out", str(tmp_path)]) == 4
    assert "of the peak off its whole decode" in (tmp_path / "codec_soak.json").read_text()


def test_the_tails_bench_times_each_edge_both_ways_and_compares_them(tmp_path: Path) -> None:
    from bench.gpu.codec_tails import main as tails

    assert (
        tails(["--tiny", "--slots", "2", "--frames", "12", "--reps", "1", "--out", str(tmp_path)])
        == 0
    )
    lines = (tmp_path / "codec_tails.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in lines if "warm-up" in line] == ["compiled", "eager"]
    timed = [line for line in lines if ": tails at batch " in line]
    assert any(line.startswith("compiled: tails at batch 2: 5618: ") for line in timed)
    assert any(line.startswith("eager: tails at batch 1: 5618: ") for line in timed)
    agreement = [line for line in lines if "compiled against eager" in line]
    assert len(agreement) == 3
    for line in agreement:
        error = float(line.split("max error ")[1].split()[0])
        peak = float(line.split(" of peak ")[1])
        assert error <= 1e-5 and peak > 0  # audio compared, not silence


def test_the_warm_up_bench_times_a_cold_and_a_warm_compile_per_worker_count(
    tmp_path: Path,
) -> None:
    from bench.gpu.codec_warm_up import main as warm_up

    argv = ["--tiny", "--slots", "2", "--workers", "2", "--out", str(tmp_path)]
    assert warm_up(argv) == 0
    lines = (tmp_path / "codec_warm_up.txt").read_text().splitlines()
    assert lines[0] == "slots 2, precision tf32, tiny True"
    (cold_workers, cold, cold_result), (warm_workers, warm, warm_result) = (
        line.split(" | ") for line in lines[-2:]
    )
    assert (cold_workers, cold, warm_workers, warm) == ("2", "cold", "2", "warm")
    assert "aot_autograd.autograd_cache_miss 1" in cold_result  # empty caches
    # the second process compiles from what the first cached, AOTAutograd included
    assert "aot_autograd.autograd_cache_hit 1" in warm_result, warm_result
    assert "inductor.fxgraph_cache_hit 1" in warm_result, warm_result
    assert float(warm_result.split(" s ")[0]) < float(cold_result.split(" s ")[0])


@pytest.mark.usefixtures("one_torch_thread")
def test_the_audio_host_bench_times_the_hooks_of_streams_that_end_and_restart(
    tmp_path: Path,
) -> None:
    from bench.gpu.audio_host import main as audio_host

    argv = ["--tiny", "--kernels", "eager", "--slots", "4", "--frames", "6", "--steps", "30"]
    argv += ["--warmup", "5", "--host-ms", "0", "--breakdown", "--out", str(tmp_path)]
    assert audio_host(argv) == 0
    report = json.loads((tmp_path / "audio_host.json").read_text())
    assert report["ended"] >= 4 and report["streams"] == report["ended"] + 4  # slots refilled
    # the chunks reached a reader: every ended stream's frames at least, 3840 bytes each
    assert report["messages_received"] > 0
    assert report["bytes_received"] >= report["ended"] * 960 * 4
    spent = report["host_ms_per_step"]
    assert spent["after_step"] > 0 and spent["remove"] > 0 and spent["open"] > 0
    parts = report["breakdown_ms_and_calls_per_step"]
    # at most one codec step an engine step (none while no frame is complete),
    # and the chunks were cut and queued
    assert 0 < parts["CodecSlots.step"][1] <= 1.0
    assert parts["VllmAudio._decode"][1] > 0 and parts["CodecSlots.chunks"][0] > 0


def test_the_audio_host_bench_runs_large_steps_through_the_decode_thread(
    tmp_path: Path,
) -> None:
    """``--decode-thread`` above the watcher's batch: on the CPU a status is on the
    host at once, so the hand-over decodes inline, and streams still end."""
    from bench.gpu.audio_host import main as audio_host

    argv = ["--tiny", "--kernels", "eager", "--slots", "12", "--frames", "6", "--steps", "30"]
    argv += ["--warmup", "5", "--host-ms", "0", "--decode-thread", "--out", str(tmp_path)]
    before = sys.getswitchinterval()
    try:
        assert audio_host([*argv, "--switch-interval-ms", "0.5"]) == 0
    finally:
        sys.setswitchinterval(before)
    report = json.loads((tmp_path / "audio_host.json").read_text())
    assert report["decode_thread"] is True and report["switch_interval_ms"] == 0.5
    assert report["ended"] >= 12 and report["streams"] == report["ended"] + 12


def test_the_audio_host_bench_counts_the_codec_calls_a_step_by_frame_count(
    tmp_path: Path,
) -> None:
    """With several frames a call, a step's slots split into a call per frame count:
    the streams before their first chunk and those with a chunk due go at once."""
    from bench.gpu.audio_host import main as audio_host

    argv = ["--tiny", "--null-codec", "--slots", "24", "--frames", "40", "--steps", "80"]
    argv += ["--warmup", "20", "--host-ms", "0"]
    census = {}
    for frames in (1, 4):
        out = tmp_path / str(frames)
        assert audio_host([*argv, "--frames-per-call", str(frames), "--out", str(out)]) == 0
        report = json.loads((out / "audio_host.json").read_text())
        assert report["frames_per_call"] == frames and report["ended"] >= 24
        census[frames] = report["codec_calls"]
    one = census[1]
    assert list(one["by_frames"]) == ["1"] and set(one["steps_by_calls"]) <= {"0", "1"}
    four = census[4]
    assert "4" in four["by_frames"] and "1" in four["by_frames"]
    assert max(int(n) for n in four["steps_by_calls"]) >= 2
    assert four["calls_per_step"] > one["calls_per_step"]


@pytest.mark.usefixtures("one_torch_thread")
def test_the_precision_bench_orders_the_casts_by_their_mantissas(tmp_path: Path) -> None:
    from bench.codec_precision import main as precision

    assert precision(["--tiny", "--frames", "6", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "codec_precision.json").read_text())
    errors = report["peak_relative_error"]
    # 24, 11 and 8 significant bits: each cast rounds more than the one before
    assert errors["float32"] < 1e-5 < errors["float16"] < errors["bfloat16"] < 1.0
    assert 0 < report["peak"] <= 1.01 * report["largest_activation_float32"]


def test_the_handoff_bench_reports_a_latency_per_switch_interval(tmp_path: Path) -> None:
    from bench.gil_handoff import main as handoff

    before = sys.getswitchinterval()
    argv = ["--intervals", "5,0.5", "--busy-ms", "2", "--wait-ms", "0.5", "--sender-ms", "0.1"]
    assert handoff([*argv, "--steps", "20", "--repeats", "1", "--out", str(tmp_path)]) == 0
    assert sys.getswitchinterval() == before  # put back
    runs = json.loads((tmp_path / "gil_handoff.json").read_text())["runs"]
    assert [r["switch_interval_ms"] for r in runs] == [5.0, 0.5]
    for r in runs:
        latency = r["batch_latency_ms"]
        # a step holds at least its wait
        assert r["step_ms"] >= 0.5 and 0 < latency["p50"] <= latency["p95"] <= latency["max"]


def test_a_variant_names_its_layout_and_the_channels_taken_as_products() -> None:
    assert variant_of("compiled") == Variant("compiled")  # the codec chooses, as served
    assert variant_of("compiled+nhwc") == Variant("compiled", channels_last=True)
    assert variant_of("compiled+gemm") == Variant("compiled", gemm_channels=GEMM_CHANNELS)
    assert variant_of("eager+gemm64") == Variant("eager", gemm_channels=64)
    assert variant_of("compiled+conv") == Variant("compiled", gemm_channels=None)
    assert variant_of("compiled+gemm+autotune") == Variant(
        "compiled", gemm_channels=GEMM_CHANNELS, compile_mode="max-autotune-no-cudagraphs"
    )
    assert variant_of("compiled+units") == Variant("compiled", fused_units=True)
    assert variant_of("compiled+unitsact") == Variant("compiled", fused_units="activation")
    assert variant_of("compiled+narrow") == Variant("compiled", fused_units="narrow")
    assert variant_of("compiled+gemm+shift") == Variant(
        "compiled", gemm_channels=GEMM_CHANNELS, gemm_taps="shifted"
    )
    for bad in ("eager+gemm0", "eager+gemmx", "eager+nchw", "eager+gemm-1", "eager+"):
        with pytest.raises(ValueError, match="suffix"):
            variant_of(bad)
