"""Inline audio in client requests (voice cloning references): base64 or ``data:`` URIs.

Re-exported by ``gateway.protocol``; import from there.
"""

from __future__ import annotations

import base64
import binascii
import re


def decode_audio_payload(value: str, param: str = "audio") -> bytes:
    """The bytes of inline audio: a base64 ``data:`` URI or plain base64.

    Paths and URLs are refused outright (``ValueError`` naming ``param``);
    nothing is ever read from disk or fetched on a client's say-so.
    """
    text = value.strip()
    if not text:
        raise ValueError(f"'{param}' is empty")
    match = _DATA_URI.match(text)
    if match is not None:
        if ";base64" not in match.group(2).lower():
            raise ValueError(f"'{param}' data: URI must be base64-encoded")
        payload = text[match.end() :]
    elif ":" in text and not _WINDOWS_PATH.match(text):  # ':' is never part of base64
        raise ValueError(
            f"'{param}' must be inline audio (base64 or a data: URI); URLs are not fetched"
        )
    elif _looks_like_path(text):
        raise ValueError(f"'{param}' must be inline audio (base64 or a data: URI); {_NO_PATHS}")
    else:
        payload = text
    payload = re.sub(r"\s+", "", payload).replace("-", "+").replace("_", "/")
    try:
        data = base64.b64decode(payload + "=" * (-len(payload) % 4), validate=True)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"'{param}' is not valid base64: {e}") from e
    if not data:
        raise ValueError(f"'{param}' holds no audio data")
    return data


_NO_URLS = "URLs are not fetched"
_NO_PATHS = "server file paths are not read"
_WINDOWS_PATH = re.compile(r"^[A-Za-z]:[\\/]")
_DATA_URI = re.compile(r"^data:([^,;]*)((?:;[^,;]*)*),", re.IGNORECASE)
# Base64 of even 50 ms of 24 kHz audio is longer than this; a shorter string
# that starts with "/" is a path, not data.
_MIN_INLINE_CHARS = 1024


def _looks_like_path(text: str) -> bool:
    """Path-only characters, or a short slash-led string (real clips are kilobytes)."""
    if any(ch in text for ch in ".\\~"):
        return True
    return text.startswith("/") and len(text) < _MIN_INLINE_CHARS
