"""The demo's own client.js and player.js against a real gateway, run by Node.

Browsers are not available here; Node (20+, with its WebSocket) runs the same
ES modules the page loads: connect, session.update, a context spoken with a
flush, a barge-in, the voice list, and PCM decoding of the frames.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.protocol import NATIVE_SAMPLE_RATE, ContextMetrics, pack_audio_frame
from realtime_engine.audio.pcm import mulaw_to_s16
from tests.gateway_support import fake_app, serve

DEMO = Path(__file__).resolve().parent.parent / "web_demo"
NODE = shutil.which("node")


def _node_supports_websocket() -> bool:
    if NODE is None:
        return False
    probe = subprocess.run(
        [
            NODE,
            "--experimental-websocket",
            "-e",
            "process.exit(typeof WebSocket === 'function' ? 0 : 1)",
        ],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(
    not _node_supports_websocket(), reason="needs Node 20+ (a JavaScript runtime with WebSocket)"
)

SCRIPT = r"""
const [base, demo] = process.argv.slice(2);
const { SpeechClient, realtimeUrl, listVoices } = await import(`${demo}/client.js`);
const { decodePcm16 } = await import(`${demo}/player.js`);
const nodeFetch = globalThis.fetch;
globalThis.fetch = (url, init) => nodeFetch(new URL(url, base), init); // the page's relative URLs
const once = (target, name) => new Promise((resolve) => {
  target.addEventListener(name, (e) => resolve(e.detail), { once: true });
});

const voices = await listVoices();
const page = new URL(base);
const client = new SpeechClient(realtimeUrl({ protocol: page.protocol, host: page.host }));
const { session: created } = await client.connect();
const session = await client.updateSession({
  output: { format: "pcm16" },
  latency_preset: "latency",
});

const audio = {};
client.addEventListener("audio", (e) => {
  const { contextId, seq, payload } = e.detail;
  const entry = (audio[contextId] ??= { frames: 0, samples: 0, seqs: [] });
  entry.frames += 1;
  entry.samples += decodePcm16(payload).length;
  entry.seqs.push(seq);
});
const flushed = once(client, "text.flushed");
const done = once(client, "context.done");
const first = client.context("first");
first.append("Hello there. ");
first.flush("f1");
first.append("Goodbye now.");
first.end();
const flushedEvent = await flushed;
const doneEvent = await done;

const second = client.context("second");
const cancelled = once(client, "context.cancelled");
await new Promise((resolve) => {
  client.addEventListener("audio", (e) => e.detail.contextId === "second" && resolve());
  second.append("A long sentence that will be interrupted before it ends. ".repeat(20));
});
second.cancel();
const cancelledEvent = await cancelled;
let rejected = null;
try {
  await client.updateSession({ voice: "no-such-voice" });
} catch (error) {
  rejected = error.error;
}
const closed = once(client, "close");
client.close();
console.log(JSON.stringify({
  voices: voices.map((v) => v.voice_id), created, session, audio, flushedEvent, doneEvent,
  cancelledEvent, rejected, closed: await closed,
}));
"""


DECODE_SCRIPT = r"""
const [demo, input] = process.argv.slice(2);
const { parseAudioFrame } = await import(`${demo}/client.js`);
const { decodeMulaw, decodePcm16, decodePcmF32 } = await import(`${demo}/player.js`);
const bytes = (hex) => Uint8Array.from(Buffer.from(hex, "hex"));
const cases = JSON.parse(input);
const frame = bytes(cases.frame);
const parsed = parseAudioFrame(frame.buffer); // a fresh array: its buffer is the frame
console.log(JSON.stringify({
  mulaw: Array.from(decodeMulaw(bytes(cases.mulaw))),
  pcm16: Array.from(decodePcm16(bytes(cases.pcm16))),
  pcm_f32: Array.from(decodePcmF32(bytes(cases.pcm_f32))),
  frame: { ...parsed, payload: Buffer.from(parsed.payload).toString("hex") },
}));
"""


async def _run_node(script_text: str, tmp_path: Path, *args: str) -> dict[str, Any]:
    assert NODE is not None
    script = tmp_path / "script.mjs"
    script.write_text(script_text)
    process = await asyncio.create_subprocess_exec(
        NODE,
        "--experimental-websocket",
        "--experimental-default-type=module",
        "--no-warnings",
        str(script),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def test_the_demo_client_speaks_flushes_and_barges_in(tmp_path: Path) -> None:
    async with serve(fake_app()) as ws_url:
        base_url = ws_url.replace("ws://", "http://")
        result = await _run_node(SCRIPT, tmp_path, base_url, DEMO.as_uri())

    assert "default" in result["voices"]
    assert result["created"]["output"]["format"] == "opus"
    assert result["session"]["output"] == {
        "format": "pcm16",
        "sample_rate": NATIVE_SAMPLE_RATE,
        "frame_ms": 20,
    }
    assert result["session"]["latency_preset"] == "latency"

    first = result["audio"]["first"]
    assert first["seqs"] == list(range(first["frames"]))
    assert first["frames"] > 0
    # Every sample the server counted reached the page's decoder.
    done = result["doneEvent"]
    assert done["context_id"] == "first" and done["status"] == "completed"
    assert done["audio_ms"] == first["samples"] * 1000 // NATIVE_SAMPLE_RATE
    assert result["flushedEvent"]["context_id"] == "first"
    assert result["flushedEvent"]["flush_id"] == "f1"

    cancelled = result["cancelledEvent"]
    assert cancelled["context_id"] == "second"
    second = result["audio"]["second"]
    assert cancelled["audio_ms_sent"] == second["samples"] * 1000 // NATIVE_SAMPLE_RATE
    assert cancelled["text_spoken"] + cancelled["text_unspoken"] == (
        "A long sentence that will be interrupted before it ends. " * 20
    )

    assert result["rejected"]["code"] == "voice_not_found"
    assert result["closed"]["code"] == 1000


async def test_the_demo_decoders_match_the_server_encodings(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    codes = np.arange(256, dtype=np.uint8)
    s16 = rng.integers(-32768, 32768, size=64, dtype=np.int16)
    f32 = rng.uniform(-1, 1, size=64).astype(np.float32)
    frame = pack_audio_frame(stream=65535, seq=2**32 - 1, pts_ms=123_456, payload=b"\x01\x02")
    cases = {
        "mulaw": codes.tobytes().hex(),
        "pcm16": s16.astype("<i2").tobytes().hex(),
        "pcm_f32": f32.astype("<f4").tobytes().hex(),
        "frame": frame.hex(),
    }
    result = await _run_node(DECODE_SCRIPT, tmp_path, DEMO.as_uri(), json.dumps(cases))

    assert np.array_equal(np.array(result["mulaw"]) * 32768, mulaw_to_s16(codes))
    assert np.array_equal(np.array(result["pcm16"]) * 32768, s16)
    assert np.array_equal(np.array(result["pcm_f32"], dtype=np.float32), f32)
    assert result["frame"] == {
        "stream": 65535,
        "seq": 2**32 - 1,
        "ptsMs": 123_456,
        "payload": "0102",
    }


# A page stand-in: just the DOM and Web Audio surface app.js touches, with an
# AudioContext whose clock is the wall clock. It records what the page shows.
PAGE_SCRIPT = r"""
const [base, demo, ids] = process.argv.slice(2);
const nodeFetch = globalThis.fetch;
globalThis.fetch = (url, init) => nodeFetch(new URL(url, base), init);
const page = new URL(base);
globalThis.location = { protocol: page.protocol, host: page.host };

class Element {
  constructor(tag) {
    this.tagName = tag; this.children = []; this.listeners = {}; this.textContent = "";
    this.className = ""; this.disabled = false; this._value = ""; this.width = 560;
    this.height = 120; this.tBodies = tag === "table" ? [new Element("tbody")] : [];
  }
  get value() {
    if (this.tagName !== "select") return this._value;
    return (this.children.find((o) => o.selected) ?? this.children[0])?._value ?? "";
  }
  set value(v) {
    if (this.tagName !== "select") { this._value = v; return; }
    for (const o of this.children) o.selected = o._value === String(v);
  }
  get lastChild() { return this.children[this.children.length - 1]; }
  append(...nodes) { this.children.push(...nodes); }
  prepend(...nodes) { this.children.unshift(...nodes); }
  replaceChildren(...nodes) { this.children = nodes; }
  remove() { this.parent?.children.splice(this.parent.children.indexOf(this), 1); }
  addEventListener(name, fn) { (this.listeners[name] ??= []).push(fn); }
  fire(name) { for (const fn of this.listeners[name] ?? []) fn({ preventDefault() {} }); }
  getContext() { return new Proxy({}, { get: () => () => {}, set: () => true }); }
}
const elements = Object.fromEntries(JSON.parse(ids).map(([id, tag]) => [id, new Element(tag)]));
elements.log.prepend = function (...nodes) {
  for (const n of nodes) n.parent = this;
  this.children.unshift(...nodes);
};
elements.text._value = "Hello there. This is a test of the playground. Goodbye.";
elements.jitter._value = "60";
elements["token-rate"]._value = "200";
globalThis.document = {
  getElementById: (id) => elements[id],
  createElement: (tag) => new Element(tag),
};
globalThis.Option = function (label, value) {
  const o = new Element("option"); o.textContent = label; o._value = value; o.selected = false;
  return o;
};
globalThis.requestAnimationFrame = (fn) => setTimeout(() => fn(performance.now()), 16);
const started = performance.now();
globalThis.AudioContext = class {
  constructor() { this.state = "running"; this.destination = {}; this.scheduled = 0; }
  get currentTime() { return (performance.now() - started) / 1000; }
  async resume() {}
  createBuffer(channels, length, rate) {
    return { duration: length / rate, copyToChannel() {} };
  }
  createBufferSource() {
    return { connect() {}, start: () => { this.scheduled += 1; }, stop() {} };
  }
  createGain() {
    return { gain: { value: 1 }, connect() {}, disconnect() {} };
  }
  createAnalyser() {
    return { fftSize: 2048, connect() {}, getFloatTimeDomainData(out) { out.fill(0); } };
  }
};

const until = async (what, check) => {
  for (let i = 0; i < 3000; i++) {
    if (check()) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`timed out waiting for ${what}`);
};
const logText = () => elements.log.children.map((li) => li.textContent);
const errors = () => elements.log.children.filter((li) => li.className === "error");

await import(`${demo}/app.js`);
elements["connect-form"].fire("submit");
await until("connected", () => elements.status.className === "status live");
elements.speak.fire("click");
await until("metrics", () => elements.metrics.tBodies[0].children.length > 0);
// the frame counter is redrawn on the page's own timer: wait for it, never sample it
await until("frames counted", () => Number(elements.frames.textContent) > 0);
const afterSpeak = {
  ttfa: elements.ttfa.textContent,
  frames: Number(elements.frames.textContent),
  metrics: elements.metrics.tBodies[0].children.map((row) => row.children[0].textContent),
};
elements.stream.fire("click");
const turnStarted = (turn) => (line) => line.includes(`${turn}: speaking “`);
await until("streamed audio", () => logText().some(turnStarted("turn-2")));
elements.cancel.fire("click");
const stateAfterCancel = elements.status.textContent;
await until("cancelled", () => logText().some((line) => line.includes("turn-2: cancelled after")));
const cancelDisabled = elements.cancel.disabled;
elements.disconnect.fire("click");
await until("closed", () => elements.status.textContent === "disconnected");
console.log(JSON.stringify({
  afterSpeak, cancelDisabled, stateAfterCancel, log: logText(),
  errors: errors().map((e) => e.textContent),
  format: elements.format.value, status: elements.status.textContent,
}));
process.exit(0);
"""


async def test_the_page_connects_speaks_streams_and_barges_in(tmp_path: Path) -> None:
    html = (DEMO / "index.html").read_text(encoding="utf-8")
    ids = re.findall(r"<(\w+)[^>]*\bid=\"([^\"]+)\"", html)
    elements = json.dumps([[element_id, tag] for tag, element_id in ids])
    async with serve(fake_app()) as ws_url:
        base_url = ws_url.replace("ws://", "http://")
        page = await _run_node(PAGE_SCRIPT, tmp_path, base_url, DEMO.as_uri(), elements)

    assert page["errors"] == []
    # Node has no WebCodecs: the page falls back from Opus to PCM by itself.
    assert page["format"] == "pcm16"
    assert any("asking for pcm16" in line for line in page["log"])
    assert re.fullmatch(r"\d+ ms", page["afterSpeak"]["ttfa"])
    assert page["afterSpeak"]["frames"] > 0
    assert page["afterSpeak"]["metrics"] == [*ContextMetrics.model_fields, "audio_ms"]
    assert page["cancelDisabled"] is True
    assert page["stateAfterCancel"] == "cancelled"
    assert page["status"] == "disconnected"
    assert any(line.endswith("  disconnected") for line in page["log"])


RECONNECT_SCRIPT = r"""
const [demo] = process.argv.slice(2);
const { Reconnector, describeClose } = await import(`${demo}/connection.js`);
const fixed = (r) => new Reconnector({ baseMs: 500, maxMs: 10000, random: () => r });
const steps = [];
const backoff = fixed(0.5); // no jitter: 0.8 + 0.4 * 0.5 = 1
for (let i = 0; i < 7; i++) { steps.push(backoff.delayMs()); backoff.attempt += 1; }
const hinted = fixed(0.5);
const low = fixed(0);
const high = fixed(1);
console.log(JSON.stringify({
  steps,
  hinted: hinted.delayMs(1000),
  hintedLater: (hinted.attempt = 3, hinted.delayMs(1000)),
  jitter: [low.delayMs(), high.delayMs()],
  words: [describeClose(1012), describeClose(1006), describeClose(4999, "odd")],
}));
"""


async def test_reconnect_backs_off_and_honours_the_retry_hint(tmp_path: Path) -> None:
    result = await _run_node(RECONNECT_SCRIPT, tmp_path, DEMO.as_uri())
    assert result["steps"] == [500, 1000, 2000, 4000, 8000, 10000, 10000]
    assert result["hinted"] == 1000  # the server's retry_after_ms beats a shorter backoff
    assert result["hintedLater"] == 4000  # and a longer backoff beats the hint
    assert result["jitter"] == pytest.approx([400, 600])
    assert result["words"] == [
        "the server is restarting (code 1012)",
        "the connection dropped (code 1006)",
        "the connection closed: odd (code 4999)",
    ]
