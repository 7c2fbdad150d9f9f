// The playground page: connect, pick settings, send text (at once or token by
// token like an LLM), play the audio as it streams, and show what happened.

import { listVoices, mintToken, ProtocolError, realtimeUrl, SpeechClient } from "./client.js";
import { describeClose, describeEvent, Reconnector } from "./connection.js";
import { opusSupported, outputPeak, StreamPlayer, unlockAudio } from "./player.js";
import {
  AUDIO_FORMATS,
  CONTEXT_METRICS,
  FRAME_MS,
  LATENCY_PRESETS,
  SAMPLE_RATES,
  SERVER_EVENTS,
  SESSION_DEFAULTS,
} from "./protocol.js";
import { Timeline } from "./timeline.js";

const $ = (id) => document.getElementById(id);
const MAX_LOG_LINES = 300;
const BYTES_PER_SAMPLE = { pcm16: 2, pcm_f32: 4, mulaw: 1 };
const MULAW_RATE = 8000; // G.711 has one rate: the server always sends mu-law at 8 kHz

const ui = {
  client: null,
  player: null,
  session: null,
  settingsDirty: true,
  context: null, // the context being spoken: { id, handle }
  outcome: null, // how the last utterance ended: "cancelled" | null
  turn: 0,
  llmTimer: null,
  firstTextAt: null,
  firstAudioAt: null,
  frames: 0,
  audioMs: 0,
  timeline: null,
  connecting: false,
  lost: null, // plain-words reason the connection was lost, while reconnecting
  reconnect: null,
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

/** One log line: plain words, and the raw event (if any) under them. */
function log(text, kind = "", raw = null) {
  const item = document.createElement("li");
  item.textContent = `${new Date().toISOString().slice(11, 23)}  ${text}`;
  if (raw !== null) {
    const code = document.createElement("code");
    code.textContent = raw;
    item.append(code);
  }
  if (kind) item.className = kind;
  const list = $("log");
  list.prepend(item);
  while (list.children.length > MAX_LOG_LINES) list.lastChild.remove();
}

function hint(text, kind = "") {
  $("hint").textContent = text;
  $("hint").className = kind ? `hint ${kind}` : "hint";
}

// ------------------------------------------------------------------ page state

/** What the page is doing, in plain words: [text, css class]. */
function pageState() {
  if (ui.lost !== null) {
    const wait = ui.reconnect.waitS();
    const retry = wait === null ? "reconnecting…" : `reconnecting in ${wait.toFixed(1)} s`;
    return [`connection lost: ${ui.lost} · ${retry}`, "error"];
  }
  if (ui.connecting) return ["connecting…", "busy"];
  if (ui.client === null) return ["disconnected", "idle"];
  if (ui.player !== null && ui.player.bufferedS() > 0) return ["speaking", "live speaking"];
  if (ui.context !== null) return ["buffering", "busy"];
  if (ui.outcome === "cancelled") return ["cancelled", "live cancelled"];
  return ["ready", "live"];
}

function showState() {
  const [text, kind] = pageState();
  const status = $("status");
  if (status.textContent !== text) status.textContent = text;
  if (status.className !== `status ${kind}`) status.className = `status ${kind}`;
}

function playing() {
  return ui.player !== null && ui.player.bufferedS() > 0;
}

function updateButtons() {
  const connected = ui.client !== null;
  const wanted = connected || ui.connecting || ui.lost !== null;
  $("connect").disabled = wanted;
  $("disconnect").disabled = !wanted; // also stops a reconnect in progress
  $("api-key").disabled = wanted;
  for (const id of ["speak", "stream"]) $(id).disabled = !connected;
  // Barge-in works as long as there is anything to stop, not only while the server generates.
  $("cancel").disabled = ui.context === null && !playing();
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
    showFormatRate();
  }
  const rate = format === "mulaw" ? MULAW_RATE : sampleRate;
  return { format, sample_rate: rate, frame_ms: Number($("frame-ms").value) };
}

/** mu-law runs at 8 kHz only: the rate box says so and is locked while it is chosen. */
let rateBeforeMulaw = null;
function showFormatRate() {
  const mulaw = $("format").value === "mulaw";
  const rate = $("sample-rate");
  if (mulaw && rateBeforeMulaw === null) {
    rateBeforeMulaw = rate.value;
    rate.value = String(MULAW_RATE);
  } else if (!mulaw && rateBeforeMulaw !== null) {
    rate.value = rateBeforeMulaw;
    rateBeforeMulaw = null;
  }
  rate.disabled = mulaw;
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
  // Counted where audio is scheduled: for Opus that is when the decoder returns it.
  ui.player.onUnderrun = () => ui.timeline.addUnderrun(sinceFirstText());
  ui.player.onError = (error) => log(`audio decoder: ${error.message}`, "error");
  ui.settingsDirty = false;
  const { output } = ui.session;
  log(`settings: voice ${ui.session.voice}, preset ${ui.session.latency_preset}, ` +
      `${output.format} at ${output.sample_rate} Hz, ${output.frame_ms} ms frames`);
}

// ------------------------------------------------------------------ connection

async function connect(event) {
  event?.preventDefault();
  ui.reconnect.start();
  await unlockAudio(); // inside the click: browsers start audio only in a gesture
  await openConnection();
}

async function openConnection() {
  ui.connecting = true;
  updateButtons();
  showState();
  try {
    const apiKey = $("api-key").value.trim();
    // The key stays in this page: the socket URL only ever carries a short-lived token.
    const token = apiKey ? await mintToken(apiKey) : null;
    const voices = await listVoices(token);
    const chosen = $("voice").value || SESSION_DEFAULTS.voice;
    fillSelect($("voice"), voices.map((v) => v.voice_id), chosen);
    const client = new SpeechClient(realtimeUrl(location, { token }));
    const { session } = await client.connect();
    if (!ui.reconnect.wanted) {
      client.close(); // Disconnect was pressed while this attempt was under way
      return;
    }
    wireClient(client);
    ui.client = client;
    ui.session = session;
    ui.settingsDirty = true;
    log(`connected to ${session.model}`);
    await applySettings();
    ui.reconnect.succeeded();
    if (ui.lost !== null) log("reconnected", "ok");
    ui.lost = null;
  } catch (error) {
    onConnectFailed(error);
  } finally {
    ui.connecting = false;
    updateButtons();
    showState();
  }
}

function onConnectFailed(error) {
  ui.client?.close();
  ui.client = null;
  // Not wanted: Disconnect was pressed. Pending: the socket's close already reported it.
  if (!ui.reconnect.wanted || ui.reconnect.pending) return;
  const refusal = error instanceof ProtocolError ? error.error : null;
  if (refusal !== null && !refusal.retryable) {
    // A refusal that waiting cannot fix (a bad key, an unknown model): say so and stop.
    ui.reconnect.stop();
    ui.lost = null;
    log(`connect refused: ${refusal.message} (${refusal.code})`, "error");
    hint(`The server refused the connection: ${refusal.message}.`, "error");
    return;
  }
  const reason = refusal !== null ? refusal.message : "the server cannot be reached";
  connectionLost(reason, refusal?.retry_after_ms ?? null);
}

/** Stop the sound, say why in plain words and try again (honouring the server's hint). */
function connectionLost(reason, retryAfterMs = null) {
  stopLlm();
  ui.context = null;
  ui.player?.stop();
  ui.lost = reason;
  const delayMs = ui.reconnect.schedule(retryAfterMs, () => openConnection());
  log(`connection lost: ${reason}; reconnecting in ${(delayMs / 1000).toFixed(1)} s`, "error");
  updateButtons();
  showState();
}

function disconnect() {
  ui.reconnect.stop();
  ui.lost = null;
  stopLlm();
  ui.context = null;
  ui.player?.stop();
  const client = ui.client;
  ui.client = null;
  client?.close();
  log("disconnected");
  updateButtons();
  showState();
}

function wireClient(client) {
  client.addEventListener("audio", (e) => onAudio(e.detail));
  client.addEventListener("event", (e) => onEvent(e.detail));
  client.addEventListener("frame-error", (e) => log(`frame: ${e.detail.error.message}`, "error"));
  client.addEventListener("close", (e) => {
    if (ui.client !== client) return; // a connection this page already let go of
    ui.client = null;
    const { code, reason } = e.detail;
    if (ui.reconnect.wanted) {
      connectionLost(describeClose(code, reason));
    } else {
      ui.player?.stop();
      updateButtons();
      showState();
    }
  });
}

function onEvent(event) {
  const { type } = event;
  const current = ui.context !== null && event.context_id === ui.context.id;
  const { event_id: _id, reply_to: _reply, type: _type, session: _session, ...rest } = event;
  const raw = `${type} ${JSON.stringify(rest)}`;
  if (type === SERVER_EVENTS.ERROR) {
    log(describeEvent(event), "error", raw);
    return;
  }
  if (type === SERVER_EVENTS.CONTEXT_DONE && current) {
    showMetrics(event.metrics, event.audio_ms);
    ui.player?.endOfStream().catch(reportError);
    finishContext(null);
  } else if (type === SERVER_EVENTS.CONTEXT_CANCELLED && current) {
    finishContext("cancelled");
  }
  if (type !== SERVER_EVENTS.SESSION_UPDATED) log(describeEvent(event), "", raw);
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
  ui.player.push(frame.payload, frame.ptsMs);
}

// ------------------------------------------------------------------ speaking

function startContext() {
  ui.turn += 1;
  const id = `turn-${ui.turn}`;
  ui.context = { id, handle: ui.client.context(id) };
  ui.outcome = null;
  resetStats();
  updateButtons();
  return ui.context.handle;
}

function finishContext(outcome) {
  stopLlm();
  ui.context = null;
  ui.outcome = outcome;
  updateButtons();
}

function stopLlm() {
  if (ui.llmTimer !== null) clearInterval(ui.llmTimer);
  ui.llmTimer = null;
}

async function speak(asLlm) {
  const text = $("text").value;
  if (ui.client === null) return;
  if (!text.trim()) {
    hint("Nothing to speak: type some text first.", "error");
    log("nothing to speak: the text box is empty", "error");
    return;
  }
  hint("");
  // A new utterance interrupts the old one, even when only its audio is left.
  if (ui.context !== null || playing()) bargeIn();
  // Settings may take a round trip: no second utterance may start meanwhile.
  for (const id of ["speak", "stream"]) $(id).disabled = true;
  try {
    await unlockAudio(); // before any network wait: browsers start audio only in a gesture
    if (ui.settingsDirty) await applySettings();
    await ui.player.start();
  } finally {
    updateButtons();
  }
  if (ui.client === null) return; // the connection closed meanwhile
  const context = startContext();
  if (!asLlm) {
    ui.firstTextAt = performance.now();
    context.append(text);
    context.end();
    return;
  }
  const tokens = text.match(/\s*\S+/g) ?? [];
  const intervalMs = 1000 / Math.max(1, Number($("token-rate").value));
  // TTFA counts from the first append, which goes out now, not one interval later.
  ui.firstTextAt = performance.now();
  context.append(tokens[0]);
  let next = 1;
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

/** Barge-in: silence at once, and cancel the server's work if it is still going. */
function bargeIn() {
  stopLlm();
  ui.player?.stop();
  if (ui.context !== null) {
    if (ui.client?.connected) ui.context.handle.cancel();
    log(`cancel ${ui.context.id}: buffered audio dropped`);
    ui.context = null; // frames still in flight are ignored from now on
  } else {
    log("stopped the audio still playing");
  }
  ui.outcome = "cancelled";
  updateButtons();
  showState();
}

// ------------------------------------------------------------------ live stats

function refresh() {
  if (ui.player !== null) {
    const bufferedMs = ui.player.bufferedS() * 1000;
    $("buffer").textContent = `${bufferedMs.toFixed(0)} ms`;
    $("underruns").textContent = String(ui.player.underruns);
    $("decoded").textContent = ui.player.format === "opus"
      ? String(ui.player.decodedFrames)
      : "– (PCM)";
    if (ui.context !== null || bufferedMs > 0) ui.timeline.sampleBuffer(sinceFirstText(), bufferedMs);
  }
  $("frames").textContent = String(ui.frames);
  $("audio-ms").textContent = `${ui.audioMs.toFixed(0)} ms`;
  ui.timeline.draw();
  updateButtons();
  showState();
  requestAnimationFrame(refresh);
}

function init() {
  ui.timeline = new Timeline($("timeline"));
  ui.reconnect = new Reconnector();
  const presets = LATENCY_PRESETS.filter((p) => p !== "custom");
  fillSelect($("preset"), presets, SESSION_DEFAULTS.latency_preset);
  fillSelect($("format"), AUDIO_FORMATS, SESSION_DEFAULTS.output.format);
  fillSelect($("sample-rate"), SAMPLE_RATES, SESSION_DEFAULTS.output.sample_rate, (r) => `${r} Hz`);
  fillSelect($("frame-ms"), FRAME_MS, SESSION_DEFAULTS.output.frame_ms, (ms) => `${ms} ms`);
  fillSelect($("voice"), [SESSION_DEFAULTS.voice], SESSION_DEFAULTS.voice);
  for (const id of ["voice", "preset", "format", "sample-rate", "frame-ms", "jitter"]) {
    $(id).addEventListener("change", () => {
      ui.settingsDirty = true; // applied before the next utterance, never mid-stream
    });
  }
  $("format").addEventListener("change", showFormatRate);
  showFormatRate();
  $("connect-form").addEventListener("submit", (e) => connect(e).catch(reportError));
  $("disconnect").addEventListener("click", disconnect);
  $("speak").addEventListener("click", () => speak(false).catch(reportError));
  $("stream").addEventListener("click", () => speak(true).catch(reportError));
  $("cancel").addEventListener("click", bargeIn);
  updateButtons();
  showState();
  requestAnimationFrame(refresh);
}

function reportError(error) {
  log(error.message, "error");
}

// For tests and the curious (devtools): what the page is playing, read only.
globalThis.speechDemo = Object.freeze({
  state: () => pageState()[0],
  player: () => ui.player,
  outputPeak,
});

init();
