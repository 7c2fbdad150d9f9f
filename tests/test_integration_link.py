"""``GatewayLink``, the connection both framework plug-ins share: retry hints, tokens, rates."""

from __future__ import annotations

import pytest
from agent_support import mint_token
from gateway_support import fake_app
from live_server import live_server

from gateway.client import AuthenticationError, EngineOverloadedError
from gateway.integrations._link import GatewayLink, GatewayOptions


async def test_a_refusal_with_a_retry_hint_is_retried_after_that_hint() -> None:
    app = fake_app()
    app.state.gateway.ready = False  # warming up: refused with 1013 and retry_after_ms
    waits: list[float] = []

    async def clock(seconds: float) -> None:  # a fake clock: the server is ready "later"
        waits.append(seconds)
        app.state.gateway.ready = True

    async with live_server(app) as url:
        link = GatewayLink(GatewayOptions(url=url), sleep=clock)
        conn = await link.connection()
        assert waits == [1.0]  # the server's retry_after_ms
        assert conn.session.config.output.format == "pcm16"
        assert conn.session.config.output.sample_rate == 24_000
        assert await link.connection() is conn and link.connects == 1
        await link.aclose()
        assert link.current is None


async def test_a_hint_past_the_limit_or_the_last_attempt_raises_the_refusal() -> None:
    app = fake_app()
    app.state.gateway.ready = False
    waits: list[float] = []

    async def clock(seconds: float) -> None:
        waits.append(seconds)

    async with live_server(app) as url:
        impatient = GatewayLink(GatewayOptions(url=url, max_retry_after_s=0.5), sleep=clock)
        with pytest.raises(EngineOverloadedError):
            await impatient.connection()
        assert waits == []
        link = GatewayLink(GatewayOptions(url=url, connect_attempts=3), sleep=clock)
        with pytest.raises(EngineOverloadedError) as caught:
            await link.connection()
        assert caught.value.detail.retry_after_ms == 1000
        assert waits == [1.0, 1.0] and link.connects == 0


async def test_a_wrong_key_is_not_retried() -> None:
    waits: list[float] = []

    async def clock(seconds: float) -> None:
        waits.append(seconds)

    async with live_server(fake_app(api_keys=("sk-right",))) as url:
        link = GatewayLink(GatewayOptions(url=url, api_key="sk-wrong"), sleep=clock)
        with pytest.raises(AuthenticationError):
            await link.connection()
        assert waits == []


async def test_a_token_provider_is_asked_for_each_new_connection() -> None:
    async with live_server(fake_app(api_keys=("sk-right",)), lifespan="on") as url:
        calls = 0

        async def token() -> str:
            nonlocal calls
            calls += 1
            return await mint_token(url, "sk-right")

        link = GatewayLink(GatewayOptions(url=url, token=token, sample_rate=48_000))
        first = await link.connection()
        assert first.session.config.output.sample_rate == 48_000
        await first.close()  # a drop: the next utterance reconnects with a fresh token
        second = await link.connection()
        assert second is not first and calls == 2 and link.connects == 2
        await link.aclose()


@pytest.mark.parametrize("rate", [22_050, 44_100])
def test_rates_the_gateway_does_not_send_are_refused_up_front(rate: int) -> None:
    with pytest.raises(ValueError, match="8000, 16000, 24000, 48000"):
        GatewayOptions(url="http://127.0.0.1:1", sample_rate=rate)


async def test_a_discarded_connection_is_replaced_at_once() -> None:
    async with live_server(fake_app(), lifespan="on") as url:
        link = GatewayLink(GatewayOptions(url=url))
        first = await link.connection()
        await link.discard(first)  # a send on it failed
        assert first.closed and link.current is None
        second = await link.connection()
        assert second is not first and link.connects == 2
        await link.discard(first)  # late news of the old one changes nothing
        assert link.current is second
        await link.aclose()
