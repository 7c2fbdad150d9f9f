"""Write the protocol as a JavaScript module for the browser demo.

The demo imports ``web_demo/protocol.js`` for every message type, enum,
default, limit and the binary frame header layout. The file is generated from
the pydantic models here, so the page cannot drift from the server:

    python -m gateway.protocol.export web_demo/protocol.js
    python -m gateway.protocol.export --check web_demo/protocol.js   # exit 1 if stale
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gateway import protocol as p

# Names of the header fields, in the order of FRAME_HEADER's format (docs/protocol.md).
FRAME_HEADER_FIELDS = ("version", "kind", "stream", "seq", "pts_ms")

_CLIENT_MODELS: tuple[type[BaseModel], ...] = (
    p.SessionUpdate,
    p.TextAppend,
    p.TextFlush,
    p.ContextEnd,
    p.ContextCancel,
    p.VoiceCreate,
    p.Ping,
)
_SERVER_MODELS: tuple[type[BaseModel], ...] = tuple(
    typing.get_args(typing.get_args(p.ServerEvent)[0])
)
_HEADER = (
    "// Generated from gateway/protocol/ by `python -m gateway.protocol.export "
    "web_demo/protocol.js`.\n// Do not edit: regenerate it when the protocol changes.\n"
)


def _type_name(model: type[BaseModel]) -> str:
    value = model.model_fields["type"].default
    if not isinstance(value, str):
        raise TypeError(f"{model.__name__} has no literal 'type' default")
    return value


def _constant_key(event_type: str) -> str:
    """``session.update`` -> ``SESSION_UPDATE``."""
    return event_type.replace(".", "_").upper()


def _literal_values(annotation: Any) -> list[Any]:
    values = list(typing.get_args(annotation))
    if not values:
        raise TypeError(f"{annotation!r} is not a Literal")
    return values


def _header_layout() -> dict[str, Any]:
    fmt = p.FRAME_HEADER.format
    byte_order, codes = fmt[0], fmt[1:]
    if byte_order not in "><!" or len(codes) != len(FRAME_HEADER_FIELDS):
        raise ValueError(f"unexpected frame header format {fmt!r}")
    fields = []
    offset = 0
    for name, code in zip(FRAME_HEADER_FIELDS, codes, strict=True):
        size = struct.calcsize(byte_order + code)
        fields.append({"name": name, "offset": offset, "bytes": size})
        offset += size
    if offset != p.FRAME_HEADER_BYTES:
        raise ValueError(f"frame header fields add up to {offset}, not {p.FRAME_HEADER_BYTES}")
    return {
        "bytes": p.FRAME_HEADER_BYTES,
        "version": p.FRAME_VERSION,
        "kind_audio": p.FRAME_KIND_AUDIO,
        "big_endian": True,
        "fields": fields,
    }


def _field_limits() -> dict[str, dict[str, Any]]:
    """Length and range bounds a client should check before sending."""
    keep = ("minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum")

    def bounds(schema: dict[str, Any]) -> dict[str, Any]:
        options = schema.get("anyOf", [schema])
        out: dict[str, Any] = {}
        for option in options:
            out.update({k: option[k] for k in keep if k in option})
        return out

    limits: dict[str, dict[str, Any]] = {}
    events: tuple[type[BaseModel], ...] = (p.TextAppend, p.TextFlush, p.VoiceCreate)
    for event in events:
        for name, schema in event.model_json_schema()["properties"].items():
            found = bounds(schema)
            if found:
                limits.setdefault(name, found)
    sections: dict[str, type[BaseModel]] = {
        "sampling": p.Sampling,
        "text_buffering": p.TextBuffering,
        "chunking": p.Chunking,
    }
    for section, model in sections.items():
        for name, schema in model.model_json_schema()["properties"].items():
            found = bounds(schema)
            if found:
                limits[f"{section}.{name}"] = found
    session = p.SessionConfig.model_json_schema()["properties"]
    limits["max_audio_seconds"] = bounds(session["max_audio_seconds"])
    return limits


def protocol_constants() -> dict[str, Any]:
    """Everything the JavaScript module exports, as plain JSON values."""
    output = p.OutputConfig.model_fields
    session = p.SessionConfig.model_fields
    return {
        "PROTOCOL_VERSION": p.PROTOCOL_VERSION,
        "SUBPROTOCOL": p.SUBPROTOCOL,
        "CLIENT_EVENTS": {_constant_key(_type_name(m)): _type_name(m) for m in _CLIENT_MODELS},
        "SERVER_EVENTS": {_constant_key(_type_name(m)): _type_name(m) for m in _SERVER_MODELS},
        "AUDIO_FORMATS": _literal_values(output["format"].annotation),
        "SAMPLE_RATES": _literal_values(output["sample_rate"].annotation),
        "FRAME_MS": _literal_values(output["frame_ms"].annotation),
        "NATIVE_SAMPLE_RATE": p.NATIVE_SAMPLE_RATE,
        "LATENCY_PRESETS": _literal_values(session["latency_preset"].annotation),
        "AUDIO_TRANSPORTS": _literal_values(session["audio_transport"].annotation),
        "TEXT_BUFFERING_MODES": _literal_values(p.TextBuffering.model_fields["mode"].annotation),
        "PRESETS": {name: c.model_dump() for name, c in p.PRESETS.items()},
        "SESSION_DEFAULTS": p.SessionConfig().model_dump(),
        "READ_ONLY_SESSION_FIELDS": list(p.READ_ONLY_SESSION_FIELDS),
        "LIMIT_DEFAULTS": p.Limits().model_dump(),
        "FIELD_LIMITS": _field_limits(),
        "CONTEXT_METRICS": list(p.ContextMetrics.model_fields),
        "ERROR_TYPES": _literal_values(p.ErrorType),
        "ERROR_CODES": {c.name: c.value for c in p.ErrorCode},
        "CLOSE_CODES": {
            "NORMAL": p.CLOSE_NORMAL,
            "GOING_AWAY": p.CLOSE_GOING_AWAY,
            "POLICY": p.CLOSE_POLICY,
            "TOO_BIG": p.CLOSE_TOO_BIG,
            "SERVER_ERROR": p.CLOSE_SERVER_ERROR,
            "TRY_AGAIN": p.CLOSE_TRY_AGAIN,
        },
        "FRAME_HEADER": _header_layout(),
    }


def _js_value(value: Any) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False)
    if isinstance(value, dict | list):
        return f"Object.freeze({text})"
    return text


def render_protocol_js() -> str:
    """The full text of ``protocol.js``."""
    parts = [_HEADER]
    for name, value in protocol_constants().items():
        parts.append(f"export const {name} = {_js_value(value)};\n")
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="where to write protocol.js")
    parser.add_argument(
        "--check", action="store_true", help="only compare; exit 1 if the file is stale"
    )
    args = parser.parse_args(argv)
    text = render_protocol_js()
    if args.check:
        current = args.path.read_text(encoding="utf-8") if args.path.is_file() else None
        if current != text:
            print(f"{args.path} is stale: run python -m gateway.protocol.export {args.path}")
            return 1
        return 0
    args.path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
