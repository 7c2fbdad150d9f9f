"""The deployment files agree with the code and with each other: every gateway
command line parses with the real CLI, the balancer names every replica the
compose file starts, and everything points at the port the image serves."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from redis_support import require_redis_client

from gateway.cli import build_parser, settings_from_args
from gateway.voice_backends import check_voice_store

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def _entrypoint() -> list[str]:
    match = re.search(r"^ENTRYPOINT (\[.*\])$", (ROOT / "Dockerfile").read_text(), re.M)
    assert match is not None
    words: list[str] = json.loads(match.group(1))
    assert words[:2] == ["speech-gateway", "serve"]
    return words[2:]


def _expand(word: str) -> str:
    """Compose's ``${NAME:-default}`` with the default."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", word)


def _checked_command(args: list[str]) -> None:
    require_redis_client()  # check_voice_store needs the [redis] extra installed
    parsed = build_parser().parse_args(["serve", *_entrypoint(), *args])
    settings = settings_from_args(parsed)
    assert settings.port == 8000 and settings.host == "0.0.0.0"
    assert settings.voice_store.startswith("redis://redis:6379/")
    check_voice_store(settings.voice_store, settings.voice_dir)


def _compose() -> dict[str, Any]:
    compose: dict[str, Any] = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    return compose


def test_every_compose_replica_runs_a_valid_command_against_the_shared_store() -> None:
    services = _compose()["services"]
    gateways = sorted(name for name in services if name.startswith("gateway-"))
    assert gateways == ["gateway-1", "gateway-2"]
    for name in gateways:
        service = services[name]
        assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
        _checked_command([_expand(word) for word in service["command"]])
    assert "redis" in services and "7.2" in services["redis"]["image"]  # BSD-3 line


def test_the_balancer_sends_to_every_replica_and_checks_ready() -> None:
    config = (DEPLOY / "haproxy.cfg").read_text()
    servers = re.findall(r"^\s*server (\S+) (\S+):(\d+) check$", config, re.M)
    assert sorted(s[0] for s in servers) == ["gateway-1", "gateway-2"]
    assert all(name == host and port == "8000" for name, host, port in servers)
    assert re.search(r"^\s*mode tcp$", config, re.M)  # sticky per WebSocket connection
    assert re.search(r"^\s*option httpchk GET /ready$", config, re.M)
    balancer = _compose()["services"]["balancer"]
    assert "./haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in balancer["volumes"]


def test_the_kubernetes_deployment_runs_a_valid_command() -> None:
    documents = list(
        yaml.safe_load_all((DEPLOY / "kubernetes" / "speech-gateway.yaml").read_text())
    )
    deployment = next(d for d in documents if d and d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    _checked_command(container["args"])
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    redis = next(
        d for d in documents if d and d["kind"] == "Service" and d["metadata"]["name"] == "redis"
    )
    assert redis["spec"]["ports"][0]["port"] == 6379
