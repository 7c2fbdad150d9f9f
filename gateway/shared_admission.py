"""Session and context limits counted across the worker processes of one server.

``serve --workers N`` runs N processes that each accept connections; the
limits an operator sets (``--max-sessions``, ``max_sessions_per_key``,
``max_contexts_per_key``) are for the server, not for each of them. The
supervisor makes one small file in its private run directory; every worker
maps it and counts there, under an exclusive ``flock`` of the file:

    header   int64                             sessions open on the whole server
    entries  capacity x (uint64, int64, int64)  key hash, its sessions, its contexts

Only a key with a session open has counts (its contexts live in its
sessions), so a table of twice ``--max-sessions`` entries never fills.

Keys live in an open-addressing table (linear probing) by the first 8 bytes
of the SHA-256 of the key id. An entry whose counts fall to zero is removed,
the entries after it moved back as linear probing's deletion does, so the
table holds exactly the keys with something open. Anonymous sessions (an
open server) count towards the total only: no key limit applies to them.

Each call locks, reads and writes a few dozen bytes: microseconds, on the
event loop thread of its worker (the lock orders processes, not threads).
A worker that dies leaves its counts behind, but a worker that dies stops
the whole server (gateway/workers.py), and the file goes with its run
directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import struct
from collections.abc import Iterator
from typing import Literal

from gateway.auth import ANONYMOUS

_TOTAL = struct.Struct("<q")
_ENTRY = struct.Struct("<Qqq")  # key hash, sessions, contexts

Refusal = Literal["server", "key"]


def admission_capacity(max_sessions: int) -> int:
    """Table entries for a server of at most ``max_sessions`` sessions."""
    return max(1024, 2 * max_sessions)


def admission_file_size(capacity: int) -> int:
    return _TOTAL.size + capacity * _ENTRY.size


def create_admission_file(path: str, capacity: int) -> str:
    """A zeroed counter file at ``path`` (private to the server's user) with
    ``capacity`` entries (:func:`admission_capacity`)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, admission_file_size(capacity))
    finally:
        os.close(fd)
    return path


def key_hash(key_id: str) -> int:
    """The key's table hash; never 0, which marks a free entry."""
    return int.from_bytes(hashlib.sha256(key_id.encode()).digest()[:8], "little") or 1


class AdmissionTableFull(RuntimeError):
    """More keys have something open at once than the table holds (a table too
    small for the server's session limit)."""


class SharedAdmission:
    """The counters of :class:`gateway.state.Admission`, kept in a file all workers map."""

    def __init__(
        self,
        path: str,
        *,
        max_sessions: int,
        max_sessions_per_key: int,
        max_contexts_per_key: int,
    ) -> None:
        self.max_sessions = max_sessions
        self.max_sessions_per_key = max_sessions_per_key
        self.max_contexts_per_key = max_contexts_per_key
        self._fd = os.open(path, os.O_RDWR)
        size = os.fstat(self._fd).st_size
        self._capacity = (size - _TOTAL.size) // _ENTRY.size
        if self._capacity < 1 or admission_file_size(self._capacity) != size:
            os.close(self._fd)
            raise ValueError(f"{path} is not an admission file ({size} bytes)")
        self._map = mmap.mmap(self._fd, size)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    # -- the table -------------------------------------------------------------------

    def _total(self) -> int:
        return int(_TOTAL.unpack_from(self._map, 0)[0])

    def _set_total(self, value: int) -> None:
        _TOTAL.pack_into(self._map, 0, value)

    def _offset(self, index: int) -> int:
        return _TOTAL.size + index * _ENTRY.size

    def _entry(self, index: int) -> tuple[int, int, int]:
        found: tuple[int, int, int] = _ENTRY.unpack_from(self._map, self._offset(index))
        return found

    def _find(self, key_id: str, *, create: bool) -> int | None:
        """The index of the key's entry; with ``create``, a new one if it has none
        (the free entry that ends its probe chain)."""
        wanted = key_hash(key_id)
        start = wanted % self._capacity
        for step in range(self._capacity):
            index = (start + step) % self._capacity
            hashed = self._entry(index)[0]
            if hashed == wanted:
                return index
            if hashed == 0:
                if not create:
                    return None
                _ENTRY.pack_into(self._map, self._offset(index), wanted, 0, 0)
                return index
        if create:
            raise AdmissionTableFull(f"more than {self._capacity} keys have sessions open")
        return None

    def _counts(self, key_id: str) -> tuple[int, int]:
        index = self._find(key_id, create=False)
        if index is None:
            return 0, 0
        _, sessions, contexts = self._entry(index)
        return sessions, contexts

    def _add(self, key_id: str, sessions: int, contexts: int) -> None:
        index = self._find(key_id, create=True)
        assert index is not None
        hashed, had_sessions, had_contexts = self._entry(index)
        now_sessions = max(0, had_sessions + sessions)
        now_contexts = max(0, had_contexts + contexts)
        if now_sessions == 0 and now_contexts == 0:
            self._remove(index)
        else:
            _ENTRY.pack_into(self._map, self._offset(index), hashed, now_sessions, now_contexts)

    def _remove(self, hole: int) -> None:
        """Free entry ``hole``, moving back each later entry of its cluster that
        would no longer be found past the hole (linear probing's deletion, so the
        table holds only keys with something open, and no markers)."""
        _ENTRY.pack_into(self._map, self._offset(hole), 0, 0, 0)
        index = hole
        for _ in range(self._capacity):
            index = (index + 1) % self._capacity
            entry = self._entry(index)
            if entry[0] == 0:
                return
            home = entry[0] % self._capacity
            # the entry stays when its home lies cyclically in (hole, index]
            if (hole < home <= index) if hole <= index else (home > hole or home <= index):
                continue
            _ENTRY.pack_into(self._map, self._offset(hole), *entry)
            _ENTRY.pack_into(self._map, self._offset(index), 0, 0, 0)
            hole = index

    # -- what the gateway asks (gateway.state.Admission's interface) -------------------

    @property
    def sessions(self) -> int:
        with self._locked():
            return self._total()

    def session_refusal(self, key_id: str) -> Refusal | None:
        with self._locked():
            return self._refusal(key_id)

    def _refusal(self, key_id: str) -> Refusal | None:
        if self._total() >= self.max_sessions:
            return "server"
        if key_id != ANONYMOUS and self._counts(key_id)[0] >= self.max_sessions_per_key:
            return "key"
        return None

    def try_open_session(self, key_id: str) -> Refusal | None:
        """Open a session unless a limit refuses it (one step for every worker)."""
        with self._locked():
            refusal = self._refusal(key_id)
            if refusal is None:
                self._open(key_id)
            return refusal

    def open_session(self, key_id: str) -> None:
        with self._locked():
            self._open(key_id)

    def _open(self, key_id: str) -> None:
        self._set_total(self._total() + 1)
        if key_id != ANONYMOUS:
            self._add(key_id, 1, 0)

    def close_session(self, key_id: str) -> None:
        with self._locked():
            self._set_total(max(0, self._total() - 1))
            if key_id != ANONYMOUS:
                self._add(key_id, -1, 0)

    def try_open_context(self, key_id: str) -> bool:
        if key_id == ANONYMOUS:
            return True
        with self._locked():
            if self._counts(key_id)[1] >= self.max_contexts_per_key:
                return False
            self._add(key_id, 0, 1)
            return True

    def close_context(self, key_id: str) -> None:
        if key_id == ANONYMOUS:
            return
        with self._locked():
            self._add(key_id, 0, -1)
