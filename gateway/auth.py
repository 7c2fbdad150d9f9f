"""API keys and short-lived HMAC tokens for browsers.

Tokens are stateless (``ek_<payload>.<mac>``) so any replica sharing the secret
accepts them; they name the key they were minted with so per-key limits apply.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.protocol import ErrorCode

ANONYMOUS = "anonymous"
TOKEN_PREFIX = "ek_"


class AuthError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Principal:
    """Who is calling: a stable key id (never the key itself)."""

    key_id: str


@dataclass(frozen=True)
class MintedToken:
    token: str
    expires_at: float
    expires_in_s: float


def key_id_of(api_key: str) -> str:
    return "key_" + hashlib.sha256(api_key.encode()).hexdigest()[:16]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Authenticator:
    def __init__(
        self,
        api_keys: tuple[str, ...] = (),
        secret: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._keys = {key_id_of(k): k.encode() for k in api_keys}
        self._secret = secret.encode() if secret else secrets.token_bytes(32)
        self._clock = clock

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def check_bearer(self, authorization: str | None) -> Principal:
        """Validate an ``Authorization: Bearer <key>`` header value."""
        if not self.enabled:
            return Principal(ANONYMOUS)
        if not authorization:
            raise AuthError(
                ErrorCode.AUTH_REQUIRED, "an API key is required (Authorization: Bearer)"
            )
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise AuthError(
                ErrorCode.AUTH_INVALID, "the Authorization header must be 'Bearer <key>'"
            )
        candidate = value.strip().encode()
        for key_id, key in self._keys.items():
            if hmac.compare_digest(candidate, key):
                return Principal(key_id)
        raise AuthError(ErrorCode.AUTH_INVALID, "invalid API key")

    def mint(self, principal: Principal, ttl_s: float) -> MintedToken:
        expires_at = self._clock() + ttl_s
        payload = json.dumps(
            {"k": principal.key_id, "e": round(expires_at, 3), "n": secrets.token_hex(8)},
            separators=(",", ":"),
        ).encode()
        mac = hmac.new(self._secret, payload, hashlib.sha256).digest()
        return MintedToken(TOKEN_PREFIX + _b64(payload) + "." + _b64(mac), expires_at, ttl_s)

    def check_token(self, token: str) -> Principal:
        if not token.startswith(TOKEN_PREFIX) or "." not in token:
            raise AuthError(ErrorCode.AUTH_INVALID, "malformed token")
        body, _, mac_text = token[len(TOKEN_PREFIX) :].partition(".")
        try:
            payload, mac = _unb64(body), _unb64(mac_text)
        except ValueError as e:
            raise AuthError(ErrorCode.AUTH_INVALID, "malformed token") from e
        expected = hmac.new(self._secret, payload, hashlib.sha256).digest()
        if not hmac.compare_digest(mac, expected):
            raise AuthError(ErrorCode.AUTH_INVALID, "invalid token")
        claims = json.loads(payload)
        if float(claims["e"]) < self._clock():
            raise AuthError(ErrorCode.TOKEN_EXPIRED, "the token has expired")
        key_id = str(claims["k"])
        if self.enabled and key_id not in self._keys:
            raise AuthError(ErrorCode.AUTH_INVALID, "the token's key is no longer valid")
        return Principal(key_id)

    def authenticate(self, authorization: str | None, token: str | None) -> Principal:
        """A WebSocket handshake: a bearer key, or an ephemeral ``?token=``."""
        if not self.enabled:
            return Principal(ANONYMOUS)
        if token:
            return self.check_token(token)
        return self.check_bearer(authorization)
