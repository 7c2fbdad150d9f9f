"""``--audio-seconds``: a fixed audio length per stream (random weights never
stop on their own), on the WebSocket target and for HTTP requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cli import _run, build_parser
from bench.records import derive
from bench.server import gateway_app, serve
from bench.targets import GatewayTarget, steps_for_audio
from realtime_engine.engines.fake import FakeEngine

# ~3.9 s of fake audio in two segments (0.05 s per character)
TEXT = "A first clause of this sentence, and then a second clause follows it."


def test_steps_for_audio_matches_the_gateway_budget() -> None:
    # 25 codec frames per second plus the 7 rows of the delay pattern
    assert steps_for_audio(10.0) == 257
    assert steps_for_audio(0.5) == 20
    patch = GatewayTarget("ws://x", audio_seconds=2.5).session_patch()
    assert patch["max_audio_seconds"] == 2.5
    # an explicit session value wins
    patch = GatewayTarget(
        "ws://x", audio_seconds=2.5, session={"max_audio_seconds": 9}
    ).session_patch()
    assert patch["max_audio_seconds"] == 9
    assert "max_audio_seconds" not in GatewayTarget("ws://x").session_patch()


async def test_gateway_stream_is_cut_at_the_fixed_length() -> None:
    engine = FakeEngine()
    async with serve(gateway_app(engine)) as url:
        capped = await GatewayTarget(
            url, tokens_per_s=None, output_format="pcm16", audio_seconds=1.0
        )(1, TEXT)
        full = await GatewayTarget(url, tokens_per_s=None, output_format="pcm16")(2, TEXT)
    assert capped.ok, capped.error
    assert capped.tags.get("capped") is True
    assert derive(capped).audio_s == pytest.approx(1.0, abs=0.011)
    assert capped.t_done == capped.chunks[-1].t_s  # done when the last counted frame arrived
    assert full.ok and "capped" not in full.tags
    assert derive(full).audio_s > 3.0
    # the engine gets the cap in seconds and budgets its own model steps
    first = next(r for r in engine.log.requests if r.request_id.endswith(":0"))
    assert first.max_audio_seconds == 1.0


async def test_without_the_cut_a_stream_ends_on_its_own_each_segment_capped() -> None:
    engine = FakeEngine()
    async with serve(gateway_app(engine)) as url:
        whole = await GatewayTarget(
            url, tokens_per_s=None, output_format="pcm16", audio_seconds=1.0, cut_at_cap=False
        )(1, TEXT)
    assert whole.ok, whole.error
    assert "capped" not in whole.tags
    assert whole.server_metrics is not None  # context.done: it completed, not cancelled
    segments = list(engine.log.requests)  # the one stream's two segments
    assert len(segments) == 2 and all(r.max_audio_seconds == 1.0 for r in segments)
    # each segment ran to its 1 s cap (where the gateway stops it), about 2 s in all
    assert derive(whole).audio_s == pytest.approx(2.0, abs=0.05)
    assert list(engine.log.aborted) == [r.request_id for r in segments]


async def test_run_command_fixed_length_and_peer_only(tmp_path: Path) -> None:
    async with serve(gateway_app(FakeEngine(realtime_factor=0.05))) as url:
        common = ["--levels", "1", "--warmup", "0", "--duration", "0.8", "--no-progress"]
        argv = [
            "run",
            "--url",
            url,
            "--audio-seconds",
            "0.6",
            "--format",
            "pcm16",
            "--out",
            str(tmp_path / "ws"),
            *common,
        ]
        assert await _run(build_parser().parse_args(argv), argv) == 0
        peer = ["run", "--peer-url", url, "--audio-seconds", "0.6", "--out", str(tmp_path / "p")]
        assert await _run(build_parser().parse_args(peer + common), peer + common) == 0
        neither = ["run", "--levels", "1"]
        assert await _run(build_parser().parse_args(neither), neither) == 2
    ws = json.loads((tmp_path / "ws" / "run.json").read_text())
    assert ws["config"]["audio_seconds"] == 0.6
    level = ws["levels"][0]
    assert level["ok"] >= 1 and level["errors"] == 0
    assert level["audio_s"]["max"] == pytest.approx(0.6, abs=0.011)
    only_peer = json.loads((tmp_path / "p" / "run.json").read_text())
    assert [lv["target"] for lv in only_peer["levels"]] == ["peer"]
    assert only_peer["config"]["max_new_tokens"] == steps_for_audio(0.6)
