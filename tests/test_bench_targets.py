"""Stream functions against a real gateway: the WebSocket target through the SDK
(paced text) and the streaming-PCM HTTP target (as used for the peer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cli import _run, build_parser
from bench.records import derive
from bench.server import gateway_app, serve
from bench.targets import GatewayTarget, SpeechHttpTarget
from bench.textfeed import tokenize
from realtime_engine.engines.fake import FakeEngine

TEXT = "Pacing a sentence token by token, like a language model."


async def test_gateway_target_paces_text_and_records_everything() -> None:
    rate = 40.0
    async with serve(gateway_app(FakeEngine(first_chunk_delay_s=0.02))) as url:
        target = GatewayTarget(url, tokens_per_s=rate, output_format="opus")
        record = await target(7, TEXT)
    assert record.ok, record.error
    assert record.t_first_text is not None and record.t_last_text is not None
    # the last token leaves (n - 1) / rate after the first, never earlier
    assert record.t_last_text - record.t_first_text >= (len(tokenize(TEXT)) - 1) / rate - 1e-3
    assert record.t_start <= record.t_connected <= record.t_first_text  # type: ignore[operator]
    assert record.t_first_text < record.t_first_audio_byte <= record.t_first_sample  # type: ignore[operator]
    assert record.server_metrics is not None and record.server_metrics["ttfa_ms"] > 0
    assert record.segments and record.segments[0][0] == 0
    pts = [c.pts_ms for c in record.chunks]
    assert pts == sorted(pts) and all(c.duration_ms == 20.0 for c in record.chunks)
    m = derive(record)
    assert m.audio_s == pytest.approx(len(record.chunks) * 0.02)
    assert m.ttfa_s is not None and m.ttfa_s >= 0.02


async def test_http_target_streams_pcm() -> None:
    engine = FakeEngine()
    async with serve(gateway_app(engine)) as url:
        target = SpeechHttpTarget(url, label="gateway-http")
        try:
            record = await target(1, TEXT)
            refused = await SpeechHttpTarget(url + "/nowhere")(2, TEXT)
        finally:
            await target.aclose()
    assert record.ok, record.error
    assert record.target == "gateway-http"
    total_bytes = sum(c.nbytes for c in record.chunks)
    assert total_bytes % 2 == 0
    m = derive(record)
    assert m.audio_s == pytest.approx(total_bytes / 48000)
    assert m.audio_s >= 0.9 * len(TEXT) * engine.config.seconds_per_char
    # chunk pts are the running byte count, in ms
    assert [c.pts_ms for c in record.chunks][:2] == [0.0, record.chunks[0].duration_ms]
    assert not refused.ok and refused.error is not None and "HTTP 404" in refused.error


async def test_run_command_side_by_side(tmp_path: Path) -> None:
    """``bench run`` against a gateway, with the same server's HTTP endpoint as the peer."""
    async with serve(gateway_app(FakeEngine(realtime_factor=0.05))) as url:
        argv = [
            "run",
            "--url",
            url,
            "--peer-url",
            url,
            "--levels",
            "2",
            "--warmup",
            "0",  # the first streams are measured even on a slow machine
            "--duration",
            "1.0",
            "--tokens-per-s",
            "0",
            "--no-progress",
            "--raw",
            "--out",
            str(tmp_path),
        ]
        assert await _run(build_parser().parse_args(argv), argv) == 0
    result = json.loads((tmp_path / "run.json").read_text())
    assert [lv["target"] for lv in result["levels"]] == ["gateway", "peer"]
    for level in result["levels"]:
        assert level["ok"] >= 1 and level["errors"] == 0
        assert level["ttfa_ms"]["p50"] > 0 and level["throughput_audio_s_per_s"] > 0
    assert {r["target"] for r in result["streams"]} == {"gateway", "peer"}
    assert result["config"]["peer_url"] == url
    record = result["streams"][0]["record"]
    assert 0 <= record["t_start"] <= record["t_first_text"] < record["t_first_audio_byte"]
    t, pts, dur, nbytes = record["chunks"][0]
    assert t == record["t_first_audio_byte"] and pts == 0 and dur > 0 and nbytes > 0
    for name in ("run_ttfa_cdf.png", "run_vs_load.png", "run_gap_hist.png"):
        assert (tmp_path / name).stat().st_size > 1000
