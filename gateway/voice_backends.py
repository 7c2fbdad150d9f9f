"""Where named voices and their codes live: one process, or a store shared by replicas.

``VoiceLibrary`` (gateway/voices.py) keeps encoded codes in an in-memory LRU
and asks a ``VoiceBackend`` for everything that must be the same on every
replica: which voice ids a key holds, and the codes behind them.

- ``LocalVoiceBackend``: the names in this process's memory (right for one
  gateway process only), or in a ``VoiceStore`` directory (``--voice-dir``)
  that every gateway process of one host opening it shares: the workers of
  ``serve --workers N`` (``shared_voice_dir_for_workers``). The default.
- ``gateway.voice_redis.RedisVoiceBackend`` (``--voice-store redis://...``):
  names and codes in Redis, the source of truth for every replica.

Codes are addressed by a content hash (API key, clip, transcript), so they
never change once written and any replica may cache them forever; only names
can change (create, delete), and the library asks the backend for a name on
every use (docs/scaling.md, "Many gateways").
"""

from __future__ import annotations

import asyncio
import atexit
import fcntl
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np

from gateway.voice_store import StoredName, VoiceStore

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings

_T = TypeVar("_T")

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
    """Names in this process's memory, or in a directory every process on the host
    that opens it shares (gateway/voice_store.py says how it stays atomic).

    Memory only: the names live here and nowhere else, so they are right for one
    gateway process and invisible to any other. With a directory the directory
    is the truth: every ``get_name`` and ``list_names`` reads it, creates and
    deletes act on it at once, and the memory copy only answers ``known``
    between reads. ``serve --workers N`` gives its workers one directory
    (``shared_voice_dir_for_workers``).
    """

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

    def _saw(self, key_id: str, voice_id: str, name: StoredName | None) -> None:
        if name is not None:
            self._named.setdefault(key_id, {})[voice_id] = name
            return
        named = self._named.get(key_id)
        if named is not None:
            named.pop(voice_id, None)
            if not named:
                del self._named[key_id]

    async def _on_disk(self, call: Callable[..., _T], *args: object) -> _T:
        assert self._disk is not None
        try:
            return await asyncio.to_thread(call, *args)
        except OSError as e:
            raise VoiceStoreError(f"the voice directory {self._disk.root} failed: {e}") from e

    async def get_name(self, key_id: str, voice_id: str) -> StoredName | None:
        if self._disk is None:
            return self._named.get(key_id, {}).get(voice_id)
        # On the loop, not a worker thread: reading one small file from the page
        # cache costs the loop less than the hop to a thread would (every use of a
        # voice reads its name: the start of a context, a speech request).
        name = self._disk.read_name(key_id, voice_id)
        self._saw(key_id, voice_id, name)
        return name

    async def list_names(self, key_id: str) -> list[StoredName]:
        if self._disk is None:
            return list(self._named.get(key_id, {}).values())
        names = await self._on_disk(self._disk.list_names, key_id)
        if names:
            self._named[key_id] = {n.voice_id: n for n in names}
        else:
            self._named.pop(key_id, None)
        return names

    async def add_name(
        self, name: StoredName, codes: np.ndarray, text: str | None, max_voices: int
    ) -> AddResult:
        if self._disk is not None:
            outcome, held = await self._on_disk(self._disk.add_name, name, codes, text, max_voices)
            if held is not None:
                self._saw(name.key_id, name.voice_id, held)
            return AddResult(AddOutcome(outcome), held)
        named = self._named.setdefault(name.key_id, {})
        existing = named.get(name.voice_id)
        if existing is not None:
            return AddResult(AddOutcome.EXISTS, existing)
        if len(named) >= max_voices:
            return AddResult(AddOutcome.FULL)
        named[name.voice_id] = name  # no await in between: no other create can slip in
        return AddResult(AddOutcome.ADDED, name)

    async def delete_name(self, key_id: str, voice_id: str) -> bool:
        if self._disk is None:
            return self._named.get(key_id, {}).pop(voice_id, None) is not None
        deleted = await self._on_disk(self._disk.delete_name, key_id, voice_id)
        self._saw(key_id, voice_id, None)
        return bool(deleted)

    async def load_codes(self, key_id: str, digest: str) -> tuple[np.ndarray, str | None] | None:
        if self._disk is None:
            return None  # the library's memory cache held the only copy
        return await asyncio.to_thread(self._disk.load_codes, key_id, digest)

    async def close(self) -> None:
        return None


def shared_voice_dir_for_workers(
    settings: GatewaySettings, parent: str | None = None
) -> tuple[str, Callable[[], None]]:
    """The ``voice_dir`` every worker of ``serve --workers N`` must get, and the
    function that removes what this call made.

    Call it once in the supervising process (gateway/workers.py, ``_run``),
    after the settings are final and before any worker starts; put the answer
    in every worker's settings; clean up once the last worker has exited::

        voice_dir, cleanup = shared_voice_dir_for_workers(settings, parent=run_dir)
        try:
            ...  # each worker: settings.model_copy(update={"voice_dir": voice_dir, ...})
            ...  # start the N workers, serve, wait for them
        finally:
            cleanup()

    - One worker, ``voice_dir`` set, or ``voice_store`` set: nothing to make.
      The answer is ``settings.voice_dir`` as it is (the operator's directory,
      or empty: memory for one process, Redis for the store) and a ``cleanup``
      that does nothing.
    - Several workers and neither set: a new private directory (mode 0700,
      named ``speech-gateway-voices-*``, in ``parent`` or else in ``$TMPDIR``),
      so that a voice created through one worker is listed, used and deleted
      through all of them, with the per-key maximum held across them. The
      voices mean what memory-only voices mean: ``cleanup`` removes the
      directory (not ``parent``), so they are gone when the server stops.
      Until then this process holds a ``flock`` on the directory, which keeps
      systemd-tmpfiles' age-based cleaning of ``/tmp`` away from it
      (tmpfiles.d(5)).

    ``cleanup`` may be called more than once; it is also registered with
    ``atexit`` and acts only in the process that called this function, so a
    forked worker exiting never removes the directory under the others. A
    supervisor killed with SIGKILL leaves the directory behind.
    """
    if settings.workers <= 1 or settings.voice_dir or settings.voice_store:
        return settings.voice_dir, lambda: None
    root = tempfile.mkdtemp(prefix="speech-gateway-voices-", dir=parent)  # mode 0700
    owner = os.getpid()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # held until cleanup: systemd-tmpfiles skips it
    done = False

    def cleanup() -> None:
        nonlocal done
        if done or os.getpid() != owner:
            return
        done = True
        atexit.unregister(cleanup)
        shutil.rmtree(root, ignore_errors=True)
        os.close(fd)

    atexit.register(cleanup)
    return root, cleanup


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
