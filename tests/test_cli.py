"""``speech-gateway serve``: argument handling and a real process serving a session."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.cli import (
    build_parser,
    main,
    resolve_engine_kind,
    settings_from_args,
)
from gateway.protocol import Limits
from gateway.serving import build_server
from gateway.settings import GatewaySettings
from realtime_engine.engines.fake import FakeEngine


@pytest.mark.parametrize(
    ("engine", "model", "kind"),
    [
        ("auto", None, "cpu-voice"),
        ("auto", "tiny", "higgs"),
        ("auto", "/models/higgs", "higgs"),
        ("fake", None, "fake"),
        ("cpu-voice", "ignored", "cpu-voice"),
        ("higgs", "tiny", "higgs"),
    ],
)
def test_engine_choice(engine: str, model: str | None, kind: str) -> None:
    assert resolve_engine_kind(engine, model) == kind


def test_higgs_without_a_model_is_refused() -> None:
    with pytest.raises(SystemExit):
        resolve_engine_kind("higgs", None)


def test_flags_become_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEECH_GATEWAY_API_KEYS", "env-key")
    args = build_parser().parse_args(
        ["serve", "--port", "0", "--host", "0.0.0.0", "--max-sessions", "5", "--idle-timeout", "9"]
    )
    settings = settings_from_args(args)
    assert (settings.host, settings.port) == ("0.0.0.0", 0)
    assert settings.limits.max_sessions == 5 and settings.limits.idle_timeout_s == 9
    assert settings.api_keys == ("env-key",)
    assert settings.encode_threads == 4  # the default when the flag is absent
    assert settings.freeze_gc_heap  # a served gateway keeps full collections off its heap
    args = build_parser().parse_args(["serve", "--api-key", "a", "--api-key", "b"])
    assert settings_from_args(args).api_keys == ("a", "b")
    args = build_parser().parse_args(["serve", "--encode-threads", "2"])
    assert settings_from_args(args).encode_threads == 2
    assert settings.read_ahead_s == 0  # contexts read in step unless told otherwise
    args = build_parser().parse_args(["serve", "--read-ahead", "2.5"])
    assert settings_from_args(args).read_ahead_s == 2.5
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--engine", "nope"])


def test_an_invalid_setting_is_an_error_message_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--engine", "fake", "--encode-threads", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("speech-gateway: error: invalid settings: encode_threads:")
    assert "Traceback" not in err


async def test_serve_process_prints_its_url_and_speaks() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("SPEECH_GATEWAY_API_KEYS", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--engine",
            "fake",
            "--port",
            "0",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        url = None
        while url is None:
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
            assert line, "".join(lines)
            lines.append(line)
            if match := re.search(r"open (http://\S+)/ ", line):
                url = match.group(1)
        assert any("loading the fake engine" in line for line in lines)
        assert any("ready in" in line for line in lines)
        async with connect(url.replace("http", "ws") + "/v1/realtime") as ws:
            created = json.loads(await ws.recv())
            assert created["type"] == "session.created"
            await ws.send(json.dumps({"type": "text.append", "context_id": "c", "text": "Hi."}))
            await ws.send(json.dumps({"type": "context.end", "context_id": "c"}))
            while True:
                message = await asyncio.wait_for(ws.recv(), 10)
                if isinstance(message, str) and json.loads(message)["type"] == "context.done":
                    break
    finally:
        proc.send_signal(signal.SIGINT)
        code = await asyncio.to_thread(proc.wait, 20)
    assert code == 0


async def test_server_transport_limits_and_pings() -> None:
    settings = GatewaySettings(port=0, limits=Limits(max_message_bytes=1000), ws_ping_interval_s=5)
    server, state = build_server(settings, FakeEngine(), log_level="warning")
    assert server.config.ws_ping_interval == 5 and server.config.ws_max_size == 2000
    assert server.config.ws_per_message_deflate is False  # audio does not compress
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done()
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        assert state.ready
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            over = {"type": "text.append", "context_id": "c", "text": "x" * 1200}
            await ws.send(json.dumps(over))
            assert json.loads(await ws.recv())["error"]["code"] == "message_too_big"
            await ws.send(json.dumps({**over, "text": "x" * 3000}))  # past what the transport takes
            with pytest.raises(ConnectionClosed) as info:
                await asyncio.wait_for(ws.recv(), 10)
            assert info.value.rcvd is not None and info.value.rcvd.code == 1009
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


def test_the_bench_has_its_own_entry_point_and_serve_does_not_import_it() -> None:
    from gateway.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench"])
    code = (
        "import sys, gateway.cli; "
        "sys.exit(1 if any(m.split('.')[0] == 'bench' for m in sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_model_name_flag_names_the_served_model() -> None:
    args = build_parser().parse_args(["serve", "--model-name", "house-voice"])
    assert settings_from_args(args).model_name == "house-voice"
    assert settings_from_args(build_parser().parse_args(["serve"])).model_name == ""
