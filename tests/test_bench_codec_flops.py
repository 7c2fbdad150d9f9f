"""``python -m bench.codec_flops`` at tiny size (CPU): the counts add up and match
the layers' shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.codec_flops import STATE_PASSES, achieved, count, main
from realtime_engine.codec.causal import CausalDac
from realtime_engine.codec.decoder import CodecDecoder
from realtime_engine.codec.layout import CodecDims


@pytest.fixture(scope="module")
def tiny_counts() -> tuple[CodecDecoder, dict]:
    torch.manual_seed(0)
    codec = CodecDecoder(CodecDims.tiny()).eval()
    return codec, count(codec, frames=6)


def test_the_stages_add_up_to_the_whole(tiny_counts: tuple[CodecDecoder, dict]) -> None:
    codec, counts = tiny_counts
    stages = counts["by_stage"]
    assert set(stages) == {"conv1", "snake1", "conv2"} | {
        f"block.{i}" for i in range(len(codec.acoustic_decoder.block))
    }
    total = sum(s["gflop_per_frame"] for s in stages.values())
    assert total == pytest.approx(counts["gflop_per_frame"], rel=1e-9)
    assert counts["gflop_per_frame"] > 0
    assert counts["mb_written_per_frame"] == pytest.approx(
        sum(s["mb_written_per_frame"] for s in stages.values()), rel=1e-9
    )


def test_the_first_convolution_counts_as_its_shape_says(
    tiny_counts: tuple[CodecDecoder, dict],
) -> None:
    codec, counts = tiny_counts
    out_channels, in_channels, kernel = codec.acoustic_decoder.conv1.weight.shape
    # one output column per frame at the latent rate; a multiply-add is two operations
    assert counts["by_stage"]["conv1"]["gflop_per_frame"] * 1e9 == pytest.approx(
        2 * out_channels * in_channels * kernel
    )
    assert counts["by_stage"]["conv1"]["mb_written_per_frame"] * 1e6 == pytest.approx(
        out_channels * 4
    )
    assert counts["samples_per_frame"] == codec.dims.hop


def test_achieved_rates_follow_from_the_step() -> None:
    per_frame = {"gflop_per_frame": 0.5, "mb_written_per_frame": 4.0}
    rates = achieved(
        per_frame | {"state_mb_per_slot": 0.0}, batch=250, step_ms=2.5, bandwidth_gbs=1.0
    )
    assert rates["tflop_per_s"] == pytest.approx(0.5 * 250 / 0.0025 / 1000)
    assert rates["gb_written_per_s"] == pytest.approx(4.0 * 250 / 0.0025 / 1000)
    assert rates["audio_s_per_s"] == pytest.approx(250 * 0.04 / 0.0025)


@pytest.mark.usefixtures("one_torch_thread")
def test_main_writes_the_report(tmp_path: Path) -> None:
    argv = ["--tiny", "--frames", "3", "--batch", "4", "--step-ms", "1.5", "--out", str(tmp_path)]
    assert main(argv) == 0
    report = json.loads((tmp_path / "codec_flops.json").read_text())
    assert report["dims"] == "tiny" and report["frames"] == 3
    assert report["achieved"]["batch"] == 4
    with pytest.raises(SystemExit):
        main(["--tiny", "--frames", "0", "--out", str(tmp_path)])


def test_the_state_is_the_streaming_layers_buffers(tiny_counts: tuple[CodecDecoder, dict]) -> None:
    codec, counts = tiny_counts
    buffers = CausalDac(codec.acoustic_decoder).buffers
    # float32: four bytes an element; the first buffer is conv1's input history
    assert counts["state_mb_per_slot"] * 1e6 == pytest.approx(
        4 * sum(spec.channels * spec.length for spec in buffers)
    )
    first = codec.acoustic_decoder.conv1
    assert buffers[0].channels == first.in_channels
    assert buffers[0].length == (first.kernel_size[0] - 1) * first.dilation[0]


def test_the_state_traffic_follows_from_its_size() -> None:
    per_frame = {"gflop_per_frame": 0.5, "mb_written_per_frame": 4.0, "state_mb_per_slot": 0.5}
    rates = achieved(per_frame, batch=256, step_ms=3.0, bandwidth_gbs=4000.0)
    moved = 0.5 * 256 * STATE_PASSES / 1000
    assert rates["state_gb_moved_per_step"] == pytest.approx(moved)
    assert rates["state_ms_at_bandwidth"] == pytest.approx(moved / 4000.0 * 1000)
