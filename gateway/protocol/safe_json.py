"""Client JSON made safe before anything else touches it (sans-I/O).

Three dangers of text a client controls, handled here once for the WebSocket
and HTTP boundaries alike:

- nesting: ``json.loads`` recurses per level, so a few KB of ``[`` raise
  ``RecursionError``; the depth is measured before parsing and bounded;
- lone surrogates: the JSON escape ``\\ud800`` decodes to a ``str`` that no
  encoder (UTF-8 socket, engine tokenizer, serializer) accepts; every string
  (keys too) is checked after parsing and the first bad one is named;
- echoes: values copied into replies (``reply_to``, messages) are cut to a
  bounded prefix and made encodable, so a reply is never larger or less
  valid than the limits allow.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

# Protocol events nest a few levels (session.update → output → ...); anything
# deeper is an attack or a bug, and is refused before parsing.
MAX_JSON_DEPTH = 32
# The longest client string copied into a reply.
MAX_ECHO_CHARS = 128

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OPEN = np.frombuffer(b"[{", dtype=np.uint8)
_CLOSE = np.frombuffer(b"]}", dtype=np.uint8)


class JsonRejected(ValueError):
    """The text is not acceptable JSON; ``param`` names the field when one is to blame."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class JsonTooDeep(JsonRejected):
    """Nesting beyond ``MAX_JSON_DEPTH``."""


class InvalidText(JsonRejected):
    """A string that is not made of Unicode scalar values (a lone surrogate)."""


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (strings do not count)."""
    bare = _STRING.sub('""', text).encode("utf-8", "surrogatepass")
    data = np.frombuffer(bare, dtype=np.uint8)
    steps = np.isin(data, _OPEN).astype(np.int32) - np.isin(data, _CLOSE).astype(np.int32)
    return int(np.cumsum(steps).max(initial=0))


def loads(data: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` with the depth bounded first; raises ``JsonRejected`` subclasses.

    Plain ``ValueError`` (not JSON) passes through, as from ``json.loads``.
    """
    text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
    # Cheap first: fewer brackets than the limit cannot nest deeper than it.
    if text.count("[") + text.count("{") > max_depth and json_depth(text) > max_depth:
        raise JsonTooDeep(f"JSON nests deeper than {max_depth} levels")
    try:
        value = json.loads(text)
    except RecursionError as e:  # a belt to the braces above
        raise JsonTooDeep(f"JSON nests deeper than {max_depth} levels") from e
    bad = find_invalid_text(value)
    if bad is not None:
        where = bad or "the message"
        raise InvalidText(f"{where}: text must be valid Unicode (no lone surrogates)", bad or None)
    return value


def is_valid_text(text: str) -> bool:
    """True when ``text`` encodes as UTF-8 (no lone surrogates)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def find_invalid_text(value: Any, path: str = "") -> str | None:
    """The dotted path of the first key or string with a lone surrogate, else None.

    The empty path means the top-level value itself.
    """
    if isinstance(value, str):
        return None if is_valid_text(value) else path
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{echo(key)}" if path else echo(key)
            if not is_valid_text(key):
                return here
            found = find_invalid_text(item, here)
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = find_invalid_text(item, f"{path}.{index}" if path else str(index))
            if found is not None:
                return found
    return None


def echo(value: object, limit: int = MAX_ECHO_CHARS) -> str:
    """``value`` as text fit to copy into a reply: at most ``limit`` chars, always encodable."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        text = text[: max(limit - 1, 0)] + "…"
    if not is_valid_text(text):
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text
