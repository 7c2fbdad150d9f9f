"""Where named voices and their codes live: one process, or a store shared by replicas.

``VoiceLibrary`` (gateway/voices.py) keeps encoded codes in an in-memory LRU
and asks a ``VoiceBackend`` for everything that must be the same on every
replica: which voice ids a key holds, and the codes behind them.

- ``LocalVoiceBackend``: the names in this process's memory, optionally
  written through to a ``VoiceStore`` directory (``--voice-dir``). The
  default; right for one gateway process, wrong for several.
- ``gateway.voice_redis.RedisVoiceBackend`` (``--voice-store redis://...``):
  names and codes in Redis, the source of truth for every replica.

Codes are addressed by a content hash (API key, clip, transcript), so they
never change once written and any replica may cache them forever; only names
can change (create, delete), and the library asks the backend for a name on
every use (docs/scaling.md, "Many gateways").
"""

from __future__ import annotations

import asyncio
import importlib.util
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import numpy as np

from gateway.voice_store import StoredName, VoiceStore

VOICE_STORE_SCHEMES = ("redis", "rediss", "unix")


class VoiceStoreError(RuntimeError):
    """The shared voice store cannot be reached or answered nonsense (retryable)."""


class AddOutcome(Enum):
    ADDED = "added"
    EXISTS = "exists"  # the id was already taken; ``AddResult.name`` is what holds it
    FULL = "full"  # the key holds its maximum of voices


@dataclass(frozen=True)
class AddResult:
    outcome: AddOutcome
    name: StoredName | None = None


class VoiceBackend(Protocol):
    """Named voices per API key plus content-addressed codes. Methods raise
    ``VoiceStoreError`` when the store cannot answer."""

    @property
    def description(self) -> str:
        """What /ready and the logs say about the store (no credentials)."""
        ...

    def known(self, key_id: str, voice_id: str) -> bool:
        """The backend's last word on this name, without I/O (``refresh`` it first)."""
        ...

    async def get_name(self, key_id: str, voice_id: str) -> StoredName | None:
        """The name as the store holds it now (a shared store: one round trip)."""
        ...

    async def list_names(self, key_id: str) -> list[StoredName]: ...

    async def add_name(
        self, name: StoredName, codes: np.ndarray, text: str | None, max_voices: int
    ) -> AddResult:
        """Store the codes, then name them unless the id is taken or the key is full
        (one atomic step for the name)."""
        ...

    async def delete_name(self, key_id: str, voice_id: str) -> bool:
        """False when the key holds no such voice."""
        ...

    async def load_codes(self, key_id: str, digest: str) -> tuple[np.ndarray, str | None] | None:
        """The codes of a clip this key encoded; None when the store has none."""
        ...

    async def close(self) -> None: ...


class LocalVoiceBackend:
    """Names in this process's memory, optionally persisted to a directory."""

    def __init__(self, disk: VoiceStore | None = None) -> None:
        self._disk = disk
        self._named: dict[str, dict[str, StoredName]] = {}  # key id -> voice id -> name
        if disk is not None:
            for name in disk.load_names():
                self._named.setdefault(name.key_id, {})[name.voice_id] = name

    @property
    def description(self) -> str:
        return f"directory {self._disk.root}" if self._disk is not None else "memory"

    def known(self, key_id: str, voice_id: str) -> bool:
        return voice_id in self._named.get(key_id, {})

    async def get_name(self, key_id: str, voice_id: str) -> StoredName | None:
        return self._named.get(key_id, {}).get(voice_id)

    async def list_names(self, key_id: str) -> list[StoredName]:
        return list(self._named.get(key_id, {}).values())

    async def add_name(
        self, name: StoredName, codes: np.ndarray, text: str | None, max_voices: int
    ) -> AddResult:
        named = self._named.setdefault(name.key_id, {})
        existing = named.get(name.voice_id)
        if existing is not None:
            return AddResult(AddOutcome.EXISTS, existing)
        if len(named) >= max_voices:
            return AddResult(AddOutcome.FULL)
        named[name.voice_id] = name  # before any await: no other create can slip in
        if self._disk is not None:
            await asyncio.to_thread(self._disk.save_codes, name.digest, codes, text)
            await asyncio.to_thread(self._disk.save_name, name)
        return AddResult(AddOutcome.ADDED, name)

    async def delete_name(self, key_id: str, voice_id: str) -> bool:
        if self._named.get(key_id, {}).pop(voice_id, None) is None:
            return False
        if self._disk is not None:
            await asyncio.to_thread(self._disk.delete_name, key_id, voice_id)
        return True

    async def load_codes(self, key_id: str, digest: str) -> tuple[np.ndarray, str | None] | None:
        if self._disk is None:
            return None  # the library's memory cache held the only copy
        return await asyncio.to_thread(self._disk.load_codes, digest)

    async def close(self) -> None:
        return None


def check_voice_store(store_url: str, voice_dir: str) -> None:
    """``ValueError`` naming the problem when the settings cannot open a backend."""
    if not store_url:
        return
    if voice_dir:
        raise ValueError("--voice-store and --voice-dir exclude each other")
    scheme = store_url.split("://", 1)[0].lower() if "://" in store_url else ""
    if scheme not in VOICE_STORE_SCHEMES:
        raise ValueError("--voice-store must be a redis://, rediss:// or unix:// URL")
    if importlib.util.find_spec("redis") is None:
        raise ValueError(
            "--voice-store needs the redis client: pip install 'realtime-speech-gateway[redis]'"
        )
