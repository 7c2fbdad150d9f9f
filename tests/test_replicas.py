"""Many gateways, the docker compose topology without Docker: a real redis-server,
two ``speech-gateway serve`` processes on CPU (the tiny Higgs checkpoint, which
carries the codec encoder) sharing it through ``--voice-store``, and a
round-robin TCP proxy in front (and HAProxy with the shipped deploy/haproxy.cfg).
A voice made through one replica speaks through the other; deleted through one,
it is refused by the other with a clear error.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import pytest_asyncio
from gateway_support import open_session, send_event, speak_context
from haproxy_support import haproxy
from prometheus_client.parser import text_string_to_metric_families
from redis_support import redis_server, require_redis_client
from server_process import ServerProcess, server_process
from tcp_proxy import RoundRobinProxy
from voice_clips_support import tone, wav_s16

pytestmark = pytest.mark.slow

KEYS = ("key-one", "key-two")
CLIP = wav_s16(tone(1.5))
SESSION = {"output": {"format": "pcm16"}, "sampling": {"seed": 3}, "max_audio_seconds": 0.4}


class Topology:
    def __init__(self, replicas: list[ServerProcess], proxy: RoundRobinProxy, url: str) -> None:
        self.replicas = replicas
        self.proxy = proxy
        self.url = url  # the load balancer


@pytest_asyncio.fixture
async def topology(tmp_path: Path, tiny_checkpoint: Path) -> AsyncIterator[Topology]:
    require_redis_client()
    async with contextlib.AsyncExitStack() as stack:
        store = await stack.enter_async_context(redis_server(tmp_path))
        # fmt: off
        args = [
            "--model", "tiny", "--talker", "reference", "--device", "cpu",
            "--voice-store", store.url, "--api-key", KEYS[0], "--api-key", KEYS[1],
        ]
        # fmt: on
        # Both replicas start at once; each is yielded when it says it is ready.
        replicas = list(
            await asyncio.gather(
                *(stack.enter_async_context(server_process(args)) for _ in range(2))
            )
        )
        backends = [_host_port(r.url) for r in replicas]
        proxy = RoundRobinProxy(backends)
        url = await stack.enter_async_context(proxy.serving())
        yield Topology(replicas, proxy, url)


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _voice_metrics(replica: ServerProcess) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=replica.url) as http:
        text = (await http.get("/metrics")).text
    return {
        family.name: family.samples[0].value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("speech_voice_") and family.samples
    }


async def test_a_voice_made_through_one_replica_speaks_through_the_other(
    topology: Topology,
) -> None:
    a, b = topology.replicas
    # Connections through the balancer alternate: the first lands on a, the second on b.
    on_a = await open_session(topology.url, KEYS[0])
    on_b = await open_session(topology.url, KEYS[0])
    try:
        assert topology.proxy.picks == [0, 1]
        audio = base64.b64encode(CLIP).decode()
        created = await send_event(
            on_a, {"type": "voice.create", "audio": audio, "voice_id": "shared", "text": "A tone."}
        )
        assert created["type"] == "voice.created" and created["cached"] is False, created

        update = {"type": "session.update", "session": {**SESSION, "voice": "shared"}}
        updated = await send_event(on_b, update)  # b never saw this voice: it asks the store
        assert updated["type"] == "session.updated", updated
        events, audio_bytes = await speak_context(on_b, "one", "Hello from the other replica.")
        assert events[-1]["status"] == "completed", events
        assert audio_bytes > 0
        on_a_metrics, on_b_metrics = await _voice_metrics(a), await _voice_metrics(b)
        assert on_a_metrics["speech_voice_encodes"] == 1
        # b spoke with the codes a encoded: read from the store, never encoded on b
        assert on_b_metrics["speech_voice_encodes"] == 0
        assert on_b_metrics["speech_voice_cache_entries"] == 1

        async with httpx.AsyncClient() as http:
            speech = {
                "input": "Hi.",
                "voice": "shared",
                "response_format": "pcm",
                "max_new_tokens": 16,
            }
            spoken = await http.post(
                f"{b.url}/v1/audio/speech", json=speech, headers=_auth(KEYS[0])
            )
            assert spoken.status_code == 200 and len(spoken.content) > 0
            # the other key sees nothing of it, on either replica
            for replica in (a, b):
                other = await http.get(f"{replica.url}/v1/voices", headers=_auth(KEYS[1]))
                assert "shared" not in [v["voice_id"] for v in other.json()["data"]]
            refused = await http.post(
                f"{b.url}/v1/audio/speech", json=speech, headers=_auth(KEYS[1])
            )
            assert refused.status_code == 400
            assert refused.json()["error"]["code"] == "voice_not_found"

            # deleted through a: b refuses it at once, as a client error, not a 5xx
            deleted = await http.delete(f"{a.url}/v1/voices/shared", headers=_auth(KEYS[0]))
            assert deleted.status_code == 200, deleted.text
            gone = await http.post(f"{b.url}/v1/audio/speech", json=speech, headers=_auth(KEYS[0]))
            assert gone.status_code == 400, gone.text
            assert gone.json()["error"]["code"] == "voice_not_found"

        # the session on b still has the voice selected: its next context is refused
        events, _ = await speak_context(on_b, "two", "Still there?")
        errors = [e for e in events if e["type"] == "error"]
        assert errors and errors[0]["error"]["code"] == "voice_not_found", events
        assert events[-1]["status"] == "failed"
        # and choosing it again is refused too, while the session lives on
        await send_event(on_b, {"type": "session.update", "session": {"voice": "default"}})
        again = await send_event(on_b, {"type": "session.update", "session": {"voice": "shared"}})
        assert again["type"] == "error" and again["error"]["code"] == "voice_not_found", again
    finally:
        await on_a.close()
        await on_b.close()


async def test_the_shipped_haproxy_config_carries_websockets_and_http(
    topology: Topology, tmp_path: Path
) -> None:
    backends = [_host_port(r.url) for r in topology.replicas]
    async with haproxy(tmp_path, backends) as url:
        first = await open_session(url, KEYS[0])
        second = await open_session(url, KEYS[0])  # leastconn: the replica without a session
        try:
            sessions = [await _gauge(r, "speech_sessions_active") for r in topology.replicas]
            assert sessions == [1.0, 1.0]
            audio = base64.b64encode(CLIP).decode()
            created = await send_event(
                first, {"type": "voice.create", "audio": audio, "voice_id": "lb"}
            )
            assert created["type"] == "voice.created", created
            update = {"type": "session.update", "session": {**SESSION, "voice": "lb"}}
            assert (await send_event(second, update))["type"] == "session.updated"
            events, audio_bytes = await speak_context(second, "one", "Through the balancer.")
            assert events[-1]["status"] == "completed" and audio_bytes > 0, events
            encodes = sorted(
                [(await _voice_metrics(r))["speech_voice_encodes"] for r in topology.replicas]
            )
            assert encodes == [0.0, 1.0]  # made on one replica, spoken on the other
            async with httpx.AsyncClient(base_url=url, headers=_auth(KEYS[0])) as http:
                speech = {
                    "input": "Hi.",
                    "voice": "lb",
                    "response_format": "pcm",
                    "max_new_tokens": 16,
                }
                spoken = await http.post("/v1/audio/speech", json=speech)
                assert spoken.status_code == 200 and len(spoken.content) > 0
                assert (await http.delete("/v1/voices/lb")).status_code == 200
                gone = await http.post("/v1/audio/speech", json=speech)
                assert gone.status_code == 400 and gone.json()["error"]["code"] == "voice_not_found"
        finally:
            await first.close()
            await second.close()


async def _gauge(replica: ServerProcess, name: str) -> float:
    async with httpx.AsyncClient(base_url=replica.url) as http:
        text = (await http.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return float(family.samples[0].value)
    raise AssertionError(f"no metric {name}")
