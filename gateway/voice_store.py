"""Optional disk persistence of encoded voices (``--voice-dir``).

Layout under the directory the operator names (never one a client names):

    codes/<sha256>.npz        the codec codes of one clip, with its transcript
    names/<sha256>.json       one named voice: key id, voice id, clip digest

Every file name is a hex digest computed here, so nothing a client sends
becomes part of a path. Files are written to a temporary name in the same
directory, flushed, then renamed: a crash leaves either the old file or the
new one, never half of one. Unreadable files are skipped with a warning.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger("gateway.voices")

_DIGEST = re.compile(r"^[0-9a-f]{64}$")
CODEBOOKS = 8
CODEBOOK_SIZE = 1024


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


class VoiceStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._codes = self.root / "codes"
        self._names = self.root / "names"
        self._codes.mkdir(parents=True, exist_ok=True)
        self._names.mkdir(parents=True, exist_ok=True)

    # -- codes -------------------------------------------------------------------

    def save_codes(self, digest: str, codes: np.ndarray, text: str | None) -> None:
        path = self._codes / f"{_checked(digest)}.npz"
        buffer = io.BytesIO()
        np.savez(buffer, codes=codes.astype(np.int16), text=np.array(text or ""))
        _atomic_write(path, buffer.getvalue())

    def load_codes(self, digest: str) -> tuple[np.ndarray, str | None] | None:
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

    def save_name(self, name: StoredName) -> None:
        path = self._names / f"{name_digest(name.key_id, name.voice_id)}.json"
        _atomic_write(path, json.dumps(asdict(name)).encode())

    def delete_name(self, key_id: str, voice_id: str) -> None:
        path = self._names / f"{name_digest(key_id, voice_id)}.json"
        path.unlink(missing_ok=True)

    def load_names(self) -> list[StoredName]:
        names = []
        for path in sorted(self._names.glob("*.json")):
            try:
                name = StoredName(**json.loads(path.read_text(encoding="utf-8")))
                _checked(name.digest)
            except (OSError, ValueError, TypeError) as e:
                log.warning("skipping unreadable voice name %s: %s", path.name, e)
                continue
            names.append(name)
        return names


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
