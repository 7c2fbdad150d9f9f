// The playground page: connect, pick settings, send text (at once or token by
// token like an LLM), play the audio as it streams, and show what happened.

import { listVoices, mintToken, realtimeUrl, SpeechClient } from "./client.js";
import { opusSupported, StreamPlayer, unlockAudio } from "./player.js";
import {
  AUDIO_FORMATS,
  CONTEXT_METRICS,
  LATENCY_PRESETS,
  SAMPLE_RATES,
  SERVER_EVENTS,
  SESSION_DEFAULTS,
} from "./protocol.js";
import { Timeline } from "./timeline.js";

const $ = (id) => document.getElementById(id);
const MAX_LOG_LINES = 300;
const BYTES_PER_SAMPLE = { pcm16: 2, pcm_f32: 4, mulaw: 1 };

const ui = {
  client: null,
  player: null,
  session: null,
  settingsDirty: true,
  context: null, // the context being spoken: { id, handle }
  turn: 0,
  llmTimer: null,
  firstTextAt: null,
  firstAudioAt: null,
  frames: 0,
  audioMs: 0,
  timeline: null,
};

function fillSelect(select, values, selected, label = String) {
  select.replaceChildren(
    ...values.map((value) => {
      const option = new Option(label(value), String(value));
      option.selected = value === selected;
      return option;
    }),
  );
}

function log(text, kind = "") {
  const item = document.createElement("li");
  item.textContent = `${new Date().toISOString().slice(11, 23)}  ${text}`;
  if (kind) item.className = kind;
  const list = $("log");
  list.prepend(item);
  while (list.children.length > MAX_LOG_LINES) list.lastChild.remove();
}

function setStatus(text, kind) {
  const status = $("status");
  status.textContent = text;
  status.className = `status ${kind}`;
}

function setConnected(connected) {
  $("connect").disabled = connected;
  $("disconnect").disabled = !connected;
  $("api-key").disabled = connected;
  for (const id of ["speak", "stream"]) $(id).disabled = !connected;
  $("cancel").disabled = !connected || ui.context === null;
}

function sinceFirstText() {
  return ui.firstTextAt === null ? 0 : performance.now() - ui.firstTextAt;
}

function resetStats() {
  ui.firstTextAt = null;
  ui.firstAudioAt = null;
  ui.frames = 0;
  ui.audioMs = 0;
  $("ttfa").textContent = "–";
  $("first-sound").textContent = "–";
  $("metrics").tBodies[0].replaceChildren();
  ui.timeline.reset();
  ui.player?.resetCounters();
}

function showMetrics(metrics, audioMs) {
  const rows = [...CONTEXT_METRICS.map((name) => [name, metrics[name]]), ["audio_ms", audioMs]];
  $("metrics").tBodies[0].replaceChildren(
    ...rows.map(([name, value]) => {
      const row = document.createElement("tr");
      const shown = value === null || value === undefined ? "–" : value;
      const cells = [name, typeof shown === "number" ? +shown.toFixed(3) : shown];
      for (const cell of cells) {
        const td = document.createElement("td");
        td.textContent = String(cell);
        row.append(td);
      }
      return row;
    }),
  );
}

// ------------------------------------------------------------------ settings

async function chosenOutput() {
  let format = $("format").value;
  const sampleRate = Number($("sample-rate").value);
  if (format === "opus" && !(await opusSupported(sampleRate))) {
    log("this browser has no WebCodecs Opus decoder: asking for pcm16 instead");
    format = "pcm16";
    $("format").value = format;
  }
  return { format, sample_rate: format === "mulaw" ? 8000 : sampleRate };
}

async function applySettings() {
  const patch = {
    voice: $("voice").value || SESSION_DEFAULTS.voice,
    latency_preset: $("preset").value,
    output: await chosenOutput(),
  };
  ui.session = await ui.client.updateSession(patch);
  ui.player?.close();
  ui.player = new StreamPlayer({
    format: ui.session.output.format,
    sampleRate: ui.session.output.sample_rate,
    jitterMs: Number($("jitter").value),
  });
  ui.player.onFirstSound = (startsAt) => {
    const waitMs = (startsAt - ui.player.audio.currentTime) * 1000;
    if (ui.firstTextAt !== null) {
      $("first-sound").textContent = `${(sinceFirstText() + waitMs).toFixed(0)} ms`;
    }
  };
  ui.player.onError = (error) => log(`audio decoder: ${error.message}`, "error");
  ui.settingsDirty = false;
  const { output } = ui.session;
  log(`session: voice=${ui.session.voice} preset=${ui.session.latency_preset} ` +
      `${output.format}@${output.sample_rate} ${output.frame_ms} ms frames`);
}

// ------------------------------------------------------------------ connection

async function connect(event) {
  event.preventDefault();
  setStatus("connecting…", "idle");
  try {
    await unlockAudio();
    const apiKey = $("api-key").value.trim();
    // The key stays in this page: the socket URL only ever carries a short-lived token.
    const token = apiKey ? await mintToken(apiKey) : null;
    const voices = await listVoices(token);
    fillSelect($("voice"), voices.map((v) => v.voice_id), SESSION_DEFAULTS.voice);
    const client = new SpeechClient(realtimeUrl(location, { token }));
    wireClient(client);
    const { session } = await client.connect();
    ui.client = client;
    ui.session = session;
    ui.settingsDirty = true;
    await applySettings();
    setStatus(`connected · ${session.model}`, "live");
    setConnected(true);
  } catch (error) {
    setStatus("connection failed", "error");
    log(`connect: ${error.message}`, "error");
    ui.client?.close();
    ui.client = null;
  }
}

function wireClient(client) {
  client.addEventListener("audio", (e) => onAudio(e.detail));
  client.addEventListener("event", (e) => onEvent(e.detail));
  client.addEventListener("frame-error", (e) => log(`frame: ${e.detail.error.message}`, "error"));
  client.addEventListener("close", (e) => {
    stopLlm();
    ui.context = null;
    ui.client = null;
    setConnected(false);
    setStatus(`closed (${e.detail.code}${e.detail.reason ? ` ${e.detail.reason}` : ""})`, "idle");
  });
}

function onEvent(event) {
  const { type } = event;
  const current = ui.context !== null && event.context_id === ui.context.id;
  if (type === SERVER_EVENTS.ERROR) {
    log(`error ${event.error.type}/${event.error.code}: ${event.error.message}`, "error");
    return;
  }
  if (type === SERVER_EVENTS.CONTEXT_DONE && current) {
    showMetrics(event.metrics, event.audio_ms);
    ui.player?.endOfStream().catch(reportError);
    finishContext();
  } else if (type === SERVER_EVENTS.CONTEXT_CANCELLED && current) {
    finishContext();
  }
  const { event_id: _id, reply_to: _reply, type: _type, session: _session, ...rest } = event;
  log(`${type} ${JSON.stringify(rest)}`);
}

function onAudio(frame) {
  if (ui.context === null || frame.contextId !== ui.context.id) return; // late or stale
  const now = sinceFirstText();
  if (ui.firstAudioAt === null) {
    ui.firstAudioAt = now;
    $("ttfa").textContent = `${now.toFixed(0)} ms`;
  }
  ui.frames += 1;
  const { format, sample_rate: rate, frame_ms: frameMs } = ui.session.output;
  const frameAudioMs = format in BYTES_PER_SAMPLE
    ? (frame.payload.byteLength / BYTES_PER_SAMPLE[format] / rate) * 1000
    : frameMs;
  ui.audioMs = frame.ptsMs + frameAudioMs;
  ui.timeline.addArrival(now);
  const underrunsBefore = ui.player.underruns;
  ui.player.push(frame.payload, frame.ptsMs);
  if (ui.player.underruns > underrunsBefore) ui.timeline.addUnderrun(now);
}

// ------------------------------------------------------------------ speaking

function startContext() {
  ui.turn += 1;
  const id = `turn-${ui.turn}`;
  ui.context = { id, handle: ui.client.context(id) };
  resetStats();
  $("cancel").disabled = false;
  return ui.context.handle;
}

function finishContext() {
  stopLlm();
  ui.context = null;
  $("cancel").disabled = true;
}

function stopLlm() {
  if (ui.llmTimer !== null) clearInterval(ui.llmTimer);
  ui.llmTimer = null;
}

async function speak(asLlm) {
  const text = $("text").value;
  if (!text.trim() || ui.client === null) return;
  if (ui.context !== null) bargeIn();
  // Settings may take a round trip: no second utterance may start meanwhile.
  for (const id of ["speak", "stream"]) $(id).disabled = true;
  try {
    await unlockAudio(); // before any network wait: browsers start audio only in a gesture
    if (ui.settingsDirty) await applySettings();
    await ui.player.start();
  } finally {
    setConnected(ui.client !== null);
  }
  if (ui.client === null) return; // the connection closed meanwhile
  const context = startContext();
  ui.firstTextAt = performance.now();
  if (!asLlm) {
    context.append(text);
    context.end();
    return;
  }
  const tokens = text.match(/\s*\S+/g) ?? [];
  const intervalMs = 1000 / Math.max(1, Number($("token-rate").value));
  let next = 0;
  ui.llmTimer = setInterval(() => {
    if (ui.context === null || ui.context.handle !== context) return stopLlm();
    if (next < tokens.length) {
      context.append(tokens[next++]);
    } else {
      context.end();
      stopLlm();
    }
  }, intervalMs);
}

function bargeIn() {
  if (ui.context === null) return;
  stopLlm();
  ui.context.handle.cancel();
  ui.player?.stop();
  log(`cancel ${ui.context.id} (buffered audio dropped)`);
  ui.context = null; // frames still in flight are ignored from now on
  $("cancel").disabled = true;
}

// ------------------------------------------------------------------ live stats

function refresh() {
  if (ui.player !== null) {
    const bufferedMs = ui.player.bufferedS() * 1000;
    $("buffer").textContent = `${bufferedMs.toFixed(0)} ms`;
    $("underruns").textContent = String(ui.player.underruns);
    if (ui.context !== null) ui.timeline.sampleBuffer(sinceFirstText(), bufferedMs);
  }
  $("frames").textContent = String(ui.frames);
  $("audio-ms").textContent = `${ui.audioMs.toFixed(0)} ms`;
  ui.timeline.draw();
  requestAnimationFrame(refresh);
}

function init() {
  ui.timeline = new Timeline($("timeline"));
  const presets = LATENCY_PRESETS.filter((p) => p !== "custom");
  fillSelect($("preset"), presets, SESSION_DEFAULTS.latency_preset);
  fillSelect($("format"), AUDIO_FORMATS, SESSION_DEFAULTS.output.format);
  fillSelect($("sample-rate"), SAMPLE_RATES, SESSION_DEFAULTS.output.sample_rate, (r) => `${r} Hz`);
  fillSelect($("voice"), [SESSION_DEFAULTS.voice], SESSION_DEFAULTS.voice);
  for (const id of ["voice", "preset", "format", "sample-rate", "jitter"]) {
    $(id).addEventListener("change", () => {
      ui.settingsDirty = true; // applied before the next utterance, never mid-stream
    });
  }
  $("format").addEventListener("change", () => {
    $("sample-rate").disabled = $("format").value === "mulaw";
  });
  $("connect-form").addEventListener("submit", connect);
  $("disconnect").addEventListener("click", () => ui.client?.close());
  $("speak").addEventListener("click", () => speak(false).catch(reportError));
  $("stream").addEventListener("click", () => speak(true).catch(reportError));
  $("cancel").addEventListener("click", bargeIn);
  setConnected(false);
  requestAnimationFrame(refresh);
}

function reportError(error) {
  log(error.message, "error");
}

init();
