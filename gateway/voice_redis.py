"""Voices in Redis, shared by every gateway replica (``--voice-store redis://host:6379/0``).

Layout, all of one API key's data under one hash tag (one cluster slot):

    <prefix>{<sha256(key id)>}:voices            hash: voice id -> StoredName JSON
    <prefix>{<sha256(key id)>}:codes:<digest>    hash: codes (int16 LE [frames, 8]), text

Adding a name is one Lua script (is the id free, is the key below its
maximum, store codes and name), so two replicas creating voices for one key
at once cannot pass the limit or overwrite each other. Deleting a name also
drops its codes when no other name of the key uses them, so the store holds
at most ``max_voices`` clips per key. Nothing expires on its own: a voice
lives until it is deleted (size the store's memory accordingly: a 10 s voice
is 4 KB).

The client is redis-py (MIT), an optional extra: ``pip install
'realtime-speech-gateway[redis]'``.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import asdict
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from gateway.voice_backends import AddOutcome, AddResult, VoiceStoreError
from gateway.voice_store import CODEBOOKS, StoredName, checked_codes

DEFAULT_PREFIX = "speech-gateway:"
# A store that does not answer within this long fails the request (retryable)
# instead of holding a session or HTTP call.
STORE_TIMEOUT_S = 2.0
# Names this process saw in the store, for the synchronous ``known`` (a hint
# only: every use reads the name from the store again).
SEEN_NAMES = 65_536

_ADD = """
local existing = redis.call('HGET', KEYS[1], ARGV[1])
if existing then return {'exists', existing} end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return {'full', ''} end
redis.call('HSET', KEYS[2], 'codes', ARGV[4], 'text', ARGV[5])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return {'added', ARGV[2]}
"""

# Returns 0: no such name; 1: deleted; -1: the name changed since it was read (retry).
_DELETE = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
if cjson.decode(raw)['digest'] ~= ARGV[2] then return -1 end
redis.call('HDEL', KEYS[1], ARGV[1])
for _, other in ipairs(redis.call('HVALS', KEYS[1])) do
  if cjson.decode(other)['digest'] == ARGV[2] then return 1 end
end
redis.call('DEL', KEYS[2])
return 1
"""


class RedisVoiceBackend:
    def __init__(self, client: Any, description: str, prefix: str = DEFAULT_PREFIX) -> None:
        self._client = client
        self._description = description
        self._prefix = prefix
        self._add = client.register_script(_ADD)
        self._delete = client.register_script(_DELETE)
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()

    @classmethod
    def from_url(cls, url: str, prefix: str = DEFAULT_PREFIX) -> RedisVoiceBackend:
        import redis.asyncio as redis

        client = redis.Redis.from_url(
            url,
            socket_timeout=STORE_TIMEOUT_S,
            socket_connect_timeout=STORE_TIMEOUT_S,
            decode_responses=False,
        )
        return cls(client, _redacted(url), prefix)

    @property
    def description(self) -> str:
        return self._description

    def _names_key(self, key_id: str) -> str:
        return f"{self._prefix}{{{hashlib.sha256(key_id.encode()).hexdigest()}}}:voices"

    def _codes_key(self, key_id: str, digest: str) -> str:
        return f"{self._prefix}{{{hashlib.sha256(key_id.encode()).hexdigest()}}}:codes:{digest}"

    def known(self, key_id: str, voice_id: str) -> bool:
        return (key_id, voice_id) in self._seen

    def _saw(self, key_id: str, voice_id: str, present: bool) -> None:
        if not present:
            self._seen.pop((key_id, voice_id), None)
            return
        self._seen[(key_id, voice_id)] = None
        self._seen.move_to_end((key_id, voice_id))
        while len(self._seen) > SEEN_NAMES:
            self._seen.popitem(last=False)

    async def _call(self, coro: Any) -> Any:
        from redis.exceptions import RedisError

        try:
            return await coro
        except RedisError as e:
            raise VoiceStoreError(f"the voice store ({self._description}) failed: {e}") from e

    async def get_name(self, key_id: str, voice_id: str) -> StoredName | None:
        raw = await self._call(self._client.hget(self._names_key(key_id), voice_id))
        self._saw(key_id, voice_id, raw is not None)
        return None if raw is None else _name_of(raw)

    async def list_names(self, key_id: str) -> list[StoredName]:
        raw = await self._call(self._client.hgetall(self._names_key(key_id)))
        names = [_name_of(value) for value in raw.values()]
        for name in names:
            self._saw(key_id, name.voice_id, True)
        return sorted(names, key=lambda n: (n.created_at, n.voice_id))

    async def add_name(
        self, name: StoredName, codes: np.ndarray, text: str | None, max_voices: int
    ) -> AddResult:
        payload = json.dumps(asdict(name))
        outcome, raw = await self._call(
            self._add(
                keys=[self._names_key(name.key_id), self._codes_key(name.key_id, name.digest)],
                args=[
                    name.voice_id,
                    payload,
                    max_voices,
                    codes_blob(codes),
                    text or "",
                ],
            ),
        )
        result = AddOutcome(outcome.decode())
        if result is not AddOutcome.FULL:
            self._saw(name.key_id, name.voice_id, True)
        return AddResult(result, _name_of(raw) if raw else None)

    async def delete_name(self, key_id: str, voice_id: str) -> bool:
        while True:
            name = await self.get_name(key_id, voice_id)
            if name is None:
                return False
            done = await self._call(
                self._delete(
                    keys=[self._names_key(key_id), self._codes_key(key_id, name.digest)],
                    args=[voice_id, name.digest],
                ),
            )
            if done != -1:  # -1: replaced between the read and the script; read again
                self._saw(key_id, voice_id, False)
                return bool(done)

    async def load_codes(self, key_id: str, digest: str) -> tuple[np.ndarray, str | None] | None:
        raw = await self._call(
            self._client.hmget(self._codes_key(key_id, digest), ["codes", "text"])
        )
        blob, text = raw
        codes = None if blob is None else codes_of(blob)
        if codes is None:
            return None
        return codes, (text or b"").decode() or None

    async def close(self) -> None:
        await self._client.aclose()


def codes_blob(codes: np.ndarray) -> bytes:
    """``[frames, 8]`` codes as little-endian int16, row after row."""
    return np.ascontiguousarray(codes, dtype="<i2").tobytes()


def codes_of(blob: bytes) -> np.ndarray | None:
    """The codes of ``codes_blob``; None for anything that is not whole rows of codes."""
    if not blob or len(blob) % (2 * CODEBOOKS):
        return None
    codes = np.frombuffer(blob, dtype="<i2").reshape(-1, CODEBOOKS).astype(np.int64)
    return checked_codes(codes)


def _name_of(raw: bytes) -> StoredName:
    try:
        return StoredName(**json.loads(raw))
    except (ValueError, TypeError) as e:
        raise VoiceStoreError(f"the voice store holds an unreadable voice record: {e}") from e


def _redacted(url: str) -> str:
    """The URL without credentials, for logs and /ready."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"
