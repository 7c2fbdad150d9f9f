"""Disk persistence of encoded voices (``--voice-dir``), shared safely by the
gateway processes of one host that open the same directory.

Layout under the directory the operator names (never one a client names):

    names/<sha256(key id)>/<sha256>.json         one named voice: key id, voice id, clip digest
    names/<sha256(key id)>/codes/<sha256>.npz    the codec codes of one of the key's clips,
                                                 with its transcript
    names/<sha256(key id)>/.lock                 the key's lock file (``flock``)
    codes/<sha256>.npz                           codes written before they were kept per key
                                                 (still read, never deleted)

Every file and folder name is a hex digest computed here, so nothing a client
sends becomes part of a path. Files are written to a temporary name in the
same directory, flushed, then renamed: a crash leaves either the old file or
the new one, never half of one, and a reader in another process sees a name
or code file whole or not at all. Unreadable files are skipped with a warning.

Several processes (``serve --workers N``) may share one directory:

- Naming a voice holds the key's lock, an exclusive ``flock(2)`` on its
  ``.lock`` file, while it checks that the id is free and that the key is
  below its maximum, then writes the codes and the name. Each call opens the
  lock file anew, so the lock also orders threads of one process, and the
  kernel drops it when its holder dies: a crashed worker leaves no stale lock.
- Deleting a name holds the key's lock too: the name goes, and its clip's
  codes go with it unless another name of the key still uses them, so a key
  holds at most its maximum of clips (as in Redis). Of two concurrent deletes
  exactly one finds the name.
- Reading takes no lock: names are read from the directory on every use, so a
  voice named or deleted by one process is seen by the others at their next use.

``flock`` needs a local filesystem (the workers of one host); replicas on
several hosts share voices through Redis instead (gateway/voice_redis.py).

Directories written before the per-key folders kept names as
``names/<sha256>.json``; opening the store moves them into their key's folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np

log = logging.getLogger("gateway.voices")

_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_NAME_FILE = re.compile(r"^[0-9a-f]{64}\.json$")
# A name record is a few hundred bytes (the transcript is at most 2,000 characters).
_MAX_NAME_BYTES = 1 << 16
CODEBOOKS = 8
CODEBOOK_SIZE = 1024

AddOutcomeName = Literal["added", "exists", "full"]


def checked_codes(codes: np.ndarray) -> np.ndarray | None:
    """``codes`` when they are ``[frames, 8]`` codebook indices, else None."""
    if codes.ndim != 2 or codes.shape[1] != CODEBOOKS or codes.size == 0:
        return None
    if codes.min() < 0 or codes.max() >= CODEBOOK_SIZE:
        return None
    return codes


@dataclass(frozen=True)
class StoredName:
    key_id: str
    voice_id: str
    digest: str
    duration_s: float
    frames: int
    text: str | None
    created_at: int


def name_digest(key_id: str, voice_id: str) -> str:
    return hashlib.sha256(f"{key_id}\0{voice_id}".encode()).hexdigest()


def key_digest(key_id: str) -> str:
    return hashlib.sha256(key_id.encode()).hexdigest()


class VoiceStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._codes = self.root / "codes"
        self._names = self.root / "names"
        self._names_str = os.fspath(self._names)
        self._codes.mkdir(parents=True, exist_ok=True)
        self._names.mkdir(parents=True, exist_ok=True)
        self._move_flat_names()

    # -- codes -------------------------------------------------------------------

    def _codes_path(self, key_id: str, digest: str) -> Path:
        return self._key_dir(key_id) / "codes" / f"{_checked(digest)}.npz"

    def save_codes(self, key_id: str, digest: str, codes: np.ndarray, text: str | None) -> None:
        path = self._codes_path(key_id, digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        np.savez(buffer, codes=codes.astype(np.int16), text=np.array(text or ""))
        _atomic_write(path, buffer.getvalue())

    def load_codes(self, key_id: str, digest: str) -> tuple[np.ndarray, str | None] | None:
        """The key's codes of clip ``digest`` (or a directory's older shared copy)."""
        path = self._codes_path(key_id, digest)
        if not path.is_file():
            path = self._codes / f"{_checked(digest)}.npz"
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                codes = np.asarray(data["codes"], dtype=np.int64)
                text = str(data["text"]) or None
        except (OSError, ValueError, KeyError) as e:
            log.warning("skipping unreadable voice codes %s: %s", path.name, e)
            return None
        if checked_codes(codes) is None:
            log.warning("skipping voice codes %s: not [frames, 8] codes", path.name)
            return None
        return codes, text

    # -- names -------------------------------------------------------------------

    def _key_dir(self, key_id: str) -> Path:
        return self._names / key_digest(key_id)

    def _name_path(self, key_id: str, voice_id: str) -> Path:
        return self._key_dir(key_id) / f"{name_digest(key_id, voice_id)}.json"

    @contextlib.contextmanager
    def locked(self, key_id: str) -> Iterator[None]:
        """Hold the key's exclusive lock (every process and thread on this directory)."""
        folder = self._key_dir(key_id)
        folder.mkdir(exist_ok=True)
        fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the last descriptor of the open file drops the lock

    def read_name(self, key_id: str, voice_id: str) -> StoredName | None:
        """The name as the directory holds it now; None when there is none (or it is
        unreadable). One small file read: tens of microseconds from the page cache."""
        return _read_name(
            f"{self._names_str}/{key_digest(key_id)}/{name_digest(key_id, voice_id)}.json"
        )

    def list_names(self, key_id: str) -> list[StoredName]:
        """Every name of the key, oldest first."""
        found = self._scan(self._key_dir(key_id))
        return [name for _, name in sorted(found, key=lambda item: item[0])]

    def count_names(self, key_id: str) -> int:
        try:
            return sum(1 for e in os.scandir(self._key_dir(key_id)) if _NAME_FILE.match(e.name))
        except FileNotFoundError:
            return 0

    def add_name(
        self, name: StoredName, codes: np.ndarray, text: str | None, max_voices: int
    ) -> tuple[AddOutcomeName, StoredName | None]:
        """Store the codes and name them, unless the id is taken (``exists`` and what
        holds it) or the key holds ``max_voices`` names (``full``): one step under the
        key's lock, so concurrent creates in any number of processes cannot pass the
        maximum or overwrite each other's voice."""
        with self.locked(name.key_id):
            existing = self.read_name(name.key_id, name.voice_id)
            if existing is not None:
                return "exists", existing
            if self.count_names(name.key_id) >= max_voices:
                return "full", None
            self.save_codes(name.key_id, name.digest, codes, text)  # first: a reader finds both
            self.save_name(name)
        return "added", name

    def save_name(self, name: StoredName) -> None:
        path = self._name_path(name.key_id, name.voice_id)
        path.parent.mkdir(exist_ok=True)
        _atomic_write(path, json.dumps(asdict(name)).encode())

    def delete_name(self, key_id: str, voice_id: str) -> bool:
        """Delete the name, and its clip's codes once no other name of the key uses
        them; False when the key holds no such name (or another process deleted
        it first)."""
        with self.locked(key_id):
            name = self.read_name(key_id, voice_id)
            try:
                self._name_path(key_id, voice_id).unlink()
            except FileNotFoundError:
                return False
            if name is not None and all(
                other.digest != name.digest for other in self.list_names(key_id)
            ):
                self._codes_path(key_id, name.digest).unlink(missing_ok=True)
        return True

    def load_names(self) -> list[StoredName]:
        """Every name of every key."""
        names: list[tuple[tuple[int, int, str], StoredName]] = []
        for folder in sorted(self._names.iterdir()):
            if folder.is_dir() and _DIGEST.match(folder.name):
                names.extend(self._scan(folder))
        return [name for _, name in sorted(names, key=lambda item: item[0])]

    def _scan(self, folder: Path) -> list[tuple[tuple[int, int, str], StoredName]]:
        """The names in one key's folder with their sort key: creation second, then
        the file's write time (creation order within a second), then the id."""
        found = []
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            return []
        for entry in entries:
            if not _NAME_FILE.match(entry.name):
                continue  # the lock file, another process's temporary file
            name = _read_name(entry.path)
            if name is None:
                continue
            try:
                written = entry.stat().st_mtime_ns
            except FileNotFoundError:
                continue  # deleted since the read
            found.append(((name.created_at, written, name.voice_id), name))
        return found

    def _move_flat_names(self) -> None:
        """Names of a directory written before the per-key folders, moved into them."""
        for path in sorted(self._names.glob("*.json")):
            if not _NAME_FILE.match(path.name):
                continue
            name = _read_name(path)
            if name is None:
                continue  # left where it is, skipped like any unreadable file
            target = self._name_path(name.key_id, name.voice_id)
            target.parent.mkdir(exist_ok=True)
            with contextlib.suppress(FileExistsError, FileNotFoundError):
                os.link(path, target)  # never replaces a name already in the folder
            path.unlink(missing_ok=True)


def _read_name(path: str | Path) -> StoredName | None:
    try:
        fd = os.open(path, os.O_RDONLY)  # os.* rather than Path.read_text: 4x cheaper
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("skipping unreadable voice name %s: %s", os.path.basename(path), e)
        return None
    try:
        raw = os.read(fd, _MAX_NAME_BYTES)
    except OSError as e:
        log.warning("skipping unreadable voice name %s: %s", os.path.basename(path), e)
        return None
    finally:
        os.close(fd)
    try:
        name = StoredName(**json.loads(raw))
        _checked(name.digest)
    except (ValueError, TypeError) as e:
        log.warning("skipping unreadable voice name %s: %s", os.path.basename(path), e)
        return None
    return name


def _checked(digest: str) -> str:
    if not _DIGEST.match(digest):
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return digest


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
