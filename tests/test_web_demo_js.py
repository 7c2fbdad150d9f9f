"""The browser demo's JavaScript agrees with the protocol models and with itself.

No JavaScript engine runs here, so these checks read the sources: the
generated protocol mirror is current, imports resolve to real exports, every
event the demo sends is a client event with only that event's fields, and
every element the UI looks up exists in the page.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from gateway import protocol as p
from gateway.protocol.export import main, protocol_constants, render_protocol_js

DEMO = Path(__file__).resolve().parent.parent / "web_demo"
JS_FILES = sorted(DEMO.glob("*.js"))
HAND_WRITTEN = [f for f in JS_FILES if f.name != "protocol.js"]
CLIENT_MODELS: dict[str, type[BaseModel]] = {
    "SESSION_UPDATE": p.SessionUpdate,
    "TEXT_APPEND": p.TextAppend,
    "TEXT_FLUSH": p.TextFlush,
    "CONTEXT_END": p.ContextEnd,
    "CONTEXT_CANCEL": p.ContextCancel,
    "VOICE_CREATE": p.VoiceCreate,
    "PING": p.Ping,
}

_IMPORT = re.compile(r"import\s*\{([^}]*)\}\s*from\s*\"([^\"]+)\"")
_EXPORT = re.compile(r"export\s+(?:async\s+)?(?:const|let|function|class)\s+(\w+)")
_SEND = re.compile(r"\b(?:client|this)\.(?:send|request)\(\s*([^,)]+)(?:,\s*(\{[^}]*\}))?")
_OBJECT_KEY = re.compile(r"(?:^|[{,])\s*(\w+)\s*(?=[:,}])")


def _source(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _strip_comments_and_strings(source: str) -> str:
    """Code only: string, template and comment contents blanked (for bracket checks)."""
    out: list[str] = []
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if source.startswith("//", i):
            i = source.find("\n", i)
            i = n if i < 0 else i
        elif source.startswith("/*", i):
            end = source.find("*/", i + 2)
            assert end >= 0, "unterminated block comment"
            i = end + 2
        elif c in "\"'`":
            j = i + 1
            while j < n and source[j] != c:
                j += 2 if source[j] == "\\" else 1
            assert j < n, f"unterminated string at offset {i}"
            if c == "`":  # keep ${...} expressions of templates as code
                out.extend(re.findall(r"\$\{([^}]*)\}", source[i + 1 : j]))
            out.append('""')
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def test_protocol_js_is_generated_from_the_current_models(tmp_path: Path) -> None:
    assert _source(DEMO / "protocol.js") == render_protocol_js(), (
        "web_demo/protocol.js is stale: python -m gateway.protocol.export web_demo/protocol.js"
    )
    assert main(["--check", str(DEMO / "protocol.js")]) == 0
    stale = tmp_path / "protocol.js"
    stale.write_text(render_protocol_js().replace('"speech.v1"', '"speech.v0"'))
    assert main(["--check", str(stale)]) == 1
    assert main([str(stale)]) == 0
    assert _source(stale) == render_protocol_js()


def test_the_exported_constants_match_the_models() -> None:
    constants = protocol_constants()
    assert set(constants["CLIENT_EVENTS"].values()) == p.CLIENT_EVENT_TYPES
    assert constants["SESSION_DEFAULTS"] == p.SessionConfig().model_dump()
    header = constants["FRAME_HEADER"]
    frame = p.pack_audio_frame(stream=0x0102, seq=0x03040506, pts_ms=0x0708090A, payload=b"xy")
    values = {
        f["name"]: int.from_bytes(frame[f["offset"] : f["offset"] + f["bytes"]], "big")
        for f in header["fields"]
    }
    assert values == {
        "version": p.FRAME_VERSION,
        "kind": p.FRAME_KIND_AUDIO,
        "stream": 0x0102,
        "seq": 0x03040506,
        "pts_ms": 0x0708090A,
    }
    assert frame[header["bytes"] :] == b"xy"


@pytest.mark.parametrize("path", JS_FILES, ids=lambda f: f.name)
def test_brackets_balance(path: Path) -> None:
    code = _strip_comments_and_strings(_source(path))
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for c in code:
        if c in "([{":
            stack.append(c)
        elif c in pairs:
            assert stack and stack.pop() == pairs[c], f"unbalanced {c!r} in {path.name}"
    assert not stack, f"unclosed {stack[-1]!r} in {path.name}"


def test_every_import_names_an_export_of_an_existing_file() -> None:
    checked = 0
    for path in [*JS_FILES, DEMO / "index.html"]:
        for names, target in _IMPORT.findall(_source(path)):
            module = (path.parent / target).resolve()
            assert target.startswith("./") and module.parent == DEMO, (path.name, target)
            assert module.is_file(), f"{path.name} imports missing {target}"
            exported = set(_EXPORT.findall(_source(module)))
            for name in names.split(","):
                imported = name.split(" as ")[0].strip()
                if imported:
                    assert imported in exported, f"{path.name}: {target} has no {imported}"
                    checked += 1
    assert checked > 10


def test_the_demo_sends_only_client_events_with_their_own_fields() -> None:
    constants = protocol_constants()["CLIENT_EVENTS"]
    sent: set[str] = set()
    for path in HAND_WRITTEN:
        for event, fields in _SEND.findall(_source(path)):
            event = event.strip()
            if event == "type":  # the generic send/request forwarding its argument
                continue
            key = event.removeprefix("CLIENT_EVENTS.")
            assert key != event, f"{path.name} sends {event!r}, not a CLIENT_EVENTS constant"
            assert key in constants, f"{path.name} sends unknown event {key}"
            model = CLIENT_MODELS[key]
            assert model.model_fields["type"].default == constants[key]
            keys = set(_OBJECT_KEY.findall(fields)) if fields else set()
            unknown = keys - set(model.model_fields)
            assert not unknown, f"{path.name}: {key} has no field(s) {unknown}"
            sent.add(key)
    assert {"SESSION_UPDATE", "TEXT_APPEND", "TEXT_FLUSH", "CONTEXT_END", "CONTEXT_CANCEL"} <= sent


def test_event_constants_used_by_the_demo_exist() -> None:
    constants = protocol_constants()
    for path in HAND_WRITTEN:
        source = _source(path)
        for group in ("CLIENT_EVENTS", "SERVER_EVENTS"):
            for key in re.findall(rf"\b{group}\.(\w+)", source):
                assert key in constants[group], f"{path.name}: {group}.{key} does not exist"
        # Event names come from protocol.js only, never typed by hand.
        all_types = {*constants["CLIENT_EVENTS"].values(), *constants["SERVER_EVENTS"].values()}
        literals = set(re.findall(r"[\"']([a-z_]+\.[a-z_]+)[\"']", source))
        assert not literals & all_types, f"{path.name} spells out {literals & all_types}"


def test_the_session_update_asks_only_for_session_fields() -> None:
    app = _source(DEMO / "app.js")
    patch = re.search(r"const patch = \{(.*?)\n  \};", app, re.S)
    output = re.search(r"return \{ (format, sample_rate:[^}]*)\}", app)
    assert patch is not None and output is not None
    patch_keys = set(re.findall(r"^\s*(\w+):", patch.group(1), re.M))
    assert patch_keys and patch_keys <= set(p.SessionConfig.model_fields)
    assert not patch_keys & set(p.READ_ONLY_SESSION_FIELDS)
    output_keys = set(_OBJECT_KEY.findall("{" + output.group(1) + "}"))
    assert output_keys == {"format", "sample_rate", "frame_ms"} <= set(p.OutputConfig.model_fields)


def test_every_element_the_ui_looks_up_is_in_the_page() -> None:
    page_ids = set(re.findall(r'\bid="([^"]+)"', _source(DEMO / "index.html")))
    used = set(re.findall(r"\$\(\"([\w-]+)\"\)", _source(DEMO / "app.js")))
    assert used, "app.js looks up no elements"
    assert used <= page_ids, f"missing from index.html: {used - page_ids}"
