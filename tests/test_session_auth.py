"""Admission pieces on their own: API keys, ephemeral tokens, per-key counters."""

from __future__ import annotations

import pytest
from clock_support import FakeClock

from gateway.auth import ANONYMOUS, Authenticator, AuthError, Principal, key_id_of
from gateway.state import Admission


def test_open_server_admits_everyone_anonymously() -> None:
    auth = Authenticator()
    assert not auth.enabled
    assert auth.authenticate(None, None) == Principal(ANONYMOUS)
    assert auth.authenticate("Bearer whatever", "junk") == Principal(ANONYMOUS)


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, "auth_required"),
        ("", "auth_required"),
        ("Basic abc", "auth_invalid"),
        ("Bearer", "auth_invalid"),
        ("Bearer ", "auth_invalid"),
        ("Bearer k-wrong", "auth_invalid"),
        ("Bearer k-onex", "auth_invalid"),
    ],
)
def test_bad_bearer_headers(header: str | None, code: str) -> None:
    with pytest.raises(AuthError) as info:
        Authenticator(("k-one",)).check_bearer(header)
    assert info.value.code == code


def test_keys_map_to_stable_ids_never_the_key() -> None:
    auth = Authenticator(("k-one", "k-two"))
    one = auth.check_bearer("Bearer k-one")
    assert one == auth.check_bearer("bearer  k-one ".replace("  ", " "))
    assert one.key_id == key_id_of("k-one") != auth.check_bearer("Bearer k-two").key_id
    assert "k-one" not in one.key_id


def test_tokens_expire_and_cannot_be_forged() -> None:
    clock = FakeClock(1_000.0)
    auth = Authenticator(("k",), secret="s3cret", clock=clock)
    principal = auth.check_bearer("Bearer k")
    minted = auth.mint(principal, ttl_s=60)
    assert minted.expires_at == 1_060.0 and minted.token.startswith("ek_")
    assert auth.authenticate(None, minted.token) == principal
    assert auth.mint(principal, 60).token != minted.token  # a nonce in each
    # Another server with the same secret accepts it; a different secret does not.
    assert (
        Authenticator(("k",), secret="s3cret", clock=clock).check_token(minted.token) == principal
    )
    with pytest.raises(AuthError):
        Authenticator(("k",), secret="other", clock=clock).check_token(minted.token)
    body, _, mac = minted.token.partition(".")
    for forged in (body + "." + mac[::-1], body[:-2] + "AA." + mac, "ek_nodot", "k", ""):
        with pytest.raises(AuthError) as info:
            auth.check_token(forged)
        assert info.value.code == "auth_invalid"
    clock.now += 61
    with pytest.raises(AuthError) as info:
        auth.authenticate(None, minted.token)
    assert info.value.code == "token_expired"


def test_a_token_dies_with_its_key() -> None:
    clock = FakeClock(1_000.0)
    old = Authenticator(("k-old", "k-new"), secret="s", clock=clock)
    token = old.mint(old.check_bearer("Bearer k-old"), 60).token
    rotated = Authenticator(("k-new",), secret="s", clock=clock)
    with pytest.raises(AuthError):
        rotated.check_token(token)


def test_admission_counts_sessions_and_contexts_per_key() -> None:
    admission = Admission(max_sessions=3, max_sessions_per_key=2, max_contexts_per_key=1)
    admission.open_session("a")
    admission.open_session("a")
    assert admission.session_refusal("a") == "key"
    assert admission.session_refusal("b") is None
    admission.open_session("b")
    assert admission.session_refusal("c") == "server"
    admission.close_session("a")
    assert admission.session_refusal("a") is None
    assert admission.try_open_context("a") and not admission.try_open_context("a")
    admission.close_context("a")
    assert admission.try_open_context("a")
    assert all(admission.try_open_context(ANONYMOUS) for _ in range(5))  # keys only
    admission.close_session("a")
    admission.close_session("b")
    assert admission.sessions == 0 and admission.sessions_by_key == {}
